package bucket

import (
	"math"
	"time"
)

// Never is the RetryAfter of a request that can never pass: its cost exceeds
// the capacity of the rule.
const Never = time.Duration(math.MaxInt64)

// Decision is the outcome of one step of an algorithm on one key's state.
// It is returned by value; the zero Decision is a rejection with no
// information.
type Decision struct {
	// Allowed reports whether the request was admitted (and charged).
	Allowed bool
	// Limit is the capacity in tokens: the GCRA burst, the window limit, the
	// leaky bucket's queue positions, the concurrency N, the penalty
	// threshold.
	Limit int64
	// Remaining is how many tokens could still pass now, after this decision
	// (>= 0).
	Remaining int64
	// Reset is the time until the state equals no entry again: bucket full,
	// window ended, queue drained; 0 for concurrency.
	Reset time.Duration
	// RetryAfter is 0 when allowed; otherwise the time until the same cost
	// would fit, or Never when it never can.
	RetryAfter time.Duration
	// Delay is set by the leaky bucket only: how long the caller must hold an
	// admitted request before forwarding it. 0 elsewhere.
	Delay time.Duration
}

// Stepper is an algorithm applied to one key's state S: Step decides a
// request of cost tokens at now (ns) and updates *s in place when it admits.
// Implementations are value types with pointer-receiver methods, so a
// *GCRA is a Stepper[TAT] with no allocation. Steppers in this package are
// immutable after construction and safe for concurrent use; the state is
// not (the Store serializes access per key).
type Stepper[S any] interface {
	Step(s *S, now, cost int64) Decision
}

// State is the pointer constraint on a state type S: Idle reports whether the
// state equals "no entry" at now (a full bucket, an ended window), so a store
// may drop it. Idle takes no rule parameters, so every state type records
// whatever it needs (for example the time after which it is empty).
type State[S any] interface {
	*S
	Idle(now int64) bool
}

// satAdd returns a+b for b >= 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul returns a*b for a, b >= 0, saturating at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// floorDiv is a/b rounded toward negative infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
