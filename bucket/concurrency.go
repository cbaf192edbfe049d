package bucket

import (
	"fmt"
	"time"
)

// ConcurrencyRetryHint is the RetryAfter of a rejected Concurrency
// acquisition: the time a slot frees is unknown, so this is only a hint.
const ConcurrencyRetryHint = time.Second

// Inflight is the state of one concurrency limit: the slots in use. The zero
// value (nothing in flight) equals no entry.
type Inflight int64

// Idle reports whether nothing is in flight.
func (f *Inflight) Idle(int64) bool { return *f <= 0 }

// Concurrency limits the requests in flight per key to N. Step acquires
// cost slots; release them with the stepper from Release once the request
// ends (for example with Store.Apply(key, now, &rel, cost)).
//
// Edge cases: cost 0 is a peek; negative cost counts as 0; cost > N is
// rejected with RetryAfter Never; a rejection otherwise carries
// ConcurrencyRetryHint. Time is not used; Reset is always 0. Immutable, safe
// for concurrent use; use NewConcurrency.
type Concurrency struct {
	n int64
}

// NewConcurrency returns a Concurrency limit of n slots. It returns an error
// naming the bad parameter if n < 1.
func NewConcurrency(n int64) (Concurrency, error) {
	if n < 1 {
		return Concurrency{}, fmt.Errorf("bucket: concurrency n %d: must be >= 1", n)
	}
	return Concurrency{n: n}, nil
}

// Step acquires cost slots if they are free.
func (c *Concurrency) Step(s *Inflight, now, cost int64) Decision {
	cost = max(cost, 0)
	cur := max(int64(*s), 0)
	d := Decision{Limit: c.n, Remaining: max(c.n-cur, 0)}
	switch {
	case cost > c.n:
		d.RetryAfter = Never
	case cur+cost > c.n:
		d.RetryAfter = ConcurrencyRetryHint
	default:
		d.Allowed = true
		*s = Inflight(cur + cost)
		d.Remaining = c.n - cur - cost
	}
	return d
}

// Release returns the stepper that gives slots back.
func (c Concurrency) Release() ConcurrencyRelease { return ConcurrencyRelease{n: c.n} }

// ConcurrencyRelease is the stepper that releases cost slots of a
// Concurrency limit, never going below 0 (releasing more than was acquired
// is ignored). It always reports Allowed. Immutable, safe for concurrent use.
type ConcurrencyRelease struct {
	n int64
}

// Step releases cost slots.
func (r *ConcurrencyRelease) Step(s *Inflight, now, cost int64) Decision {
	cur := max(int64(*s)-max(cost, 0), 0)
	*s = Inflight(cur)
	return Decision{Allowed: true, Limit: r.n, Remaining: max(r.n-cur, 0)}
}
