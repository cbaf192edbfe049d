package bucket

import (
	"fmt"
	"math"
	"time"
)

// TAT is the state of one GCRA bucket: its theoretical arrival time in
// nanoseconds on the caller's clock. The zero TAT (any TAT <= now) is a full
// bucket, which equals no entry. A TAT far in the future is a bucket in debt.
type TAT int64

// Idle reports whether the bucket is full at now (tat <= now), so the entry
// can be dropped.
func (t *TAT) Idle(now int64) bool { return int64(*t) <= now }

// GCRA is a token bucket implemented as the generic cell rate algorithm: one
// token is earned every emission interval T and at most Burst tokens are held.
//
// A request of cost c at now computes newTAT = max(tat, now) + c·T and passes
// iff newTAT − now <= Burst·T; so over any interval of length Δ at most
// Burst + Δ/T tokens pass (the reference of docs/overshoot.md).
//
// Edge cases: cost 0 is a peek (it reports, and never changes the state);
// a negative cost is treated as 0; cost > Burst is rejected with RetryAfter
// Never. If now goes backwards the bucket simply looks emptier: a clock step
// back can only reject more, never admit more. The bucket can go into debt
// (see Charge): tat may lie arbitrarily far in the future, debt is never
// capped and is paid back by refill. Times must stay below about 2^62 ns.
//
// The zero GCRA is not valid; use NewGCRA. A GCRA is immutable and safe for
// concurrent use.
type GCRA struct {
	t     int64   // emission interval, ns (>= 1)
	burst int64   // capacity, tokens (>= 1)
	tau   int64   // burst * t, ns
	inv   float64 // 1/t, for a division-free Remaining (corrected exactly)
}

// NewGCRA returns a GCRA admitting limit tokens per window with capacity
// burst. The emission interval is T = ceil(window/limit) ns, rounded up so
// the rule never admits more than stated. It returns an error naming the bad
// parameter if limit < 1, window <= 0, limit exceeds the window in ns (T would
// be below 1 ns), burst < 1, or burst·T overflows.
func NewGCRA(limit int64, window time.Duration, burst int64) (GCRA, error) {
	switch {
	case limit < 1:
		return GCRA{}, fmt.Errorf("bucket: gcra limit %d: must be >= 1", limit)
	case window <= 0:
		return GCRA{}, fmt.Errorf("bucket: gcra window %v: must be > 0", window)
	case limit > int64(window):
		return GCRA{}, fmt.Errorf("bucket: gcra limit %d: exceeds the window %v in nanoseconds", limit, window)
	case burst < 1:
		return GCRA{}, fmt.Errorf("bucket: gcra burst %d: must be >= 1", burst)
	}
	t := (int64(window) + limit - 1) / limit
	if burst > math.MaxInt64/4/t {
		return GCRA{}, fmt.Errorf("bucket: gcra burst %d: burst×interval overflows", burst)
	}
	return GCRA{t: t, burst: burst, tau: burst * t, inv: 1 / float64(t)}, nil
}

// Interval returns the emission interval T: one token is earned every T.
func (g GCRA) Interval() time.Duration { return time.Duration(g.t) }

// Burst returns the capacity in tokens.
func (g GCRA) Burst() int64 { return g.burst }

// Step decides a request of cost tokens at now and charges *s when it passes.
// See GCRA for the edge cases.
func (g *GCRA) Step(s *TAT, now, cost int64) Decision {
	if cost > 0 && cost <= g.burst { // the hot path, kept small
		n := satAdd(max(int64(*s), now), cost*g.t)
		if used := n - now; used <= g.tau {
			*s = TAT(n)
			return Decision{Allowed: true, Limit: g.burst, Remaining: g.tokens(g.tau - used), Reset: time.Duration(used)}
		}
	}
	d, n := g.decide(int64(*s), now, cost)
	if d.Allowed && cost > 0 {
		*s = TAT(n)
	}
	return d
}

// Allow decides and charges exactly as Step does, and returns the decision
// as a two-word Verdict (Decision(v) is what Step returns): for callers that
// need only whether a request passed, such as the simulator's reference
// bucket, without building the six-word Decision.
func (g *GCRA) Allow(s *TAT, now, cost int64) Verdict {
	v, n := g.verdict(int64(*s), now, cost)
	if v.RetryAfter == 0 && cost > 0 {
		*s = TAT(n)
	}
	return v
}

// Peek reports what Step with cost 0 would: Allowed is false only when the
// bucket is in debt (then RetryAfter is the time until it is out of debt).
func (g *GCRA) Peek(s TAT, now int64) Decision {
	d, _ := g.decide(int64(s), now, 0)
	return d
}

// Charge charges cost tokens unconditionally: the bucket can go into debt,
// tat may go arbitrarily far into the future and is never capped (it
// saturates at math.MaxInt64 rather than overflow). The cluster's owner uses
// it to account for spend that other nodes already admitted. A cost <= 0
// changes nothing.
func (g *GCRA) Charge(s *TAT, now, cost int64) {
	if cost <= 0 {
		return
	}
	*s = TAT(satAdd(max(int64(*s), now), satMul(cost, g.t)))
}

func (g *GCRA) decide(tat, now, cost int64) (Decision, int64) {
	v, n := g.verdict(tat, now, cost)
	return g.Decision(v), n
}

// verdict is decide in two words: the Verdict of a request of cost at now
// on tat, and the TAT after it (tat unchanged when it is rejected).
func (g *GCRA) verdict(tat, now, cost int64) (Verdict, int64) {
	base := max(tat, now)
	cost = max(cost, 0)
	if cost > g.burst {
		return Verdict{Reset: time.Duration(base - now), RetryAfter: Never}, tat
	}
	n := satAdd(base, cost*g.t)
	if n-now > g.tau {
		return Verdict{Reset: time.Duration(base - now), RetryAfter: time.Duration(n - now - g.tau)}, tat
	}
	return Verdict{Reset: time.Duration(n - now)}, n
}

// Verdict is a GCRA decision in two words, for callers that need to know
// whether a request passed and when to retry (GCRAStore.Allow returns it:
// a Decision is six words and has a token count to compute). GCRA.Decision
// turns it into the Decision that Step would have returned: for a GCRA,
// Allowed, Remaining and Limit follow from Reset, RetryAfter and the rule. The zero Verdict is
// an admission that leaves the bucket full (a cost 0 peek of a full bucket).
type Verdict struct {
	// Reset is the time until the bucket is full again after the decision
	// (Decision.Reset).
	Reset time.Duration
	// RetryAfter is 0 when the request was admitted (and charged);
	// otherwise > 0: the time until the same cost would fit, or Never when
	// it never can (Decision.RetryAfter).
	RetryAfter time.Duration
}

// Allowed reports whether the request was admitted (and charged).
func (v Verdict) Allowed() bool { return v.RetryAfter == 0 }

// Decision returns the whole Decision of a Verdict that g gave: what Step
// returns for the same request.
func (g *GCRA) Decision(v Verdict) Decision {
	return Decision{
		Allowed:    v.RetryAfter == 0,
		Limit:      g.burst,
		Remaining:  g.remaining(int64(v.Reset)),
		Reset:      v.Reset,
		RetryAfter: v.RetryAfter,
	}
}

// remaining is the whole number of tokens left when the bucket is spent by
// "used" ns (tat − now).
func (g *GCRA) remaining(used int64) int64 {
	free := g.tau - used
	if free <= 0 {
		return 0
	}
	return g.tokens(free)
}

// tokens is ⌊x/T⌋ for 0 <= x <= Burst·T, by a float multiply corrected to
// the exact integer quotient (a hardware divide costs more than the rest of
// Step).
func (g *GCRA) tokens(x int64) int64 {
	q := int64(float64(x) * g.inv)
	for q > 0 && q*g.t > x {
		q--
	}
	for (q+1)*g.t <= x {
		q++
	}
	return q
}
