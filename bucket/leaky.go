package bucket

import (
	"fmt"
	"time"
)

// Departure is the state of one leaky-bucket queue: the time (ns) at which
// the queue has drained. The zero value (any Departure <= now) is an empty
// queue, which equals no entry.
type Departure int64

// Idle reports whether the queue is drained at now.
func (d *Departure) Idle(now int64) bool { return int64(*d) <= now }

// Leaky is a leaky bucket as a queue (virtual scheduling): it smooths output
// to one token every interval T = ceil(window/limit), holding requests up to
// MaxDelay instead of passing bursts through.
//
// A request of cost c at now: start = max(dep, now), wait = start − now. If
// wait > MaxDelay it is rejected with RetryAfter = wait − MaxDelay;
// otherwise it is admitted with Delay = wait (the caller holds it that long
// before forwarding) and dep becomes start + c·T. So forwarded requests are
// spaced at least c·T apart and none waits more than MaxDelay. Limit reports
// the queue capacity in cost-1 positions, MaxDelay/T + 1.
//
// Edge cases: cost 0 is a peek; negative cost counts as 0. A request of any
// cost is admitted when the queue is empty (the queue is then longer than
// MaxDelay for a while and later requests wait), so Leaky never answers
// Never. A clock going backwards makes the queue look longer: conservative.
// Immutable, safe for concurrent use; use NewLeaky.
type Leaky struct {
	t        int64
	maxDelay int64
}

// NewLeaky returns a Leaky forwarding limit tokens per window with at most
// maxDelay of queueing. It returns an error naming the bad parameter if
// limit < 1, window <= 0, limit exceeds the window in ns, or maxDelay < 0.
func NewLeaky(limit int64, window, maxDelay time.Duration) (Leaky, error) {
	switch {
	case limit < 1:
		return Leaky{}, fmt.Errorf("bucket: leaky limit %d: must be >= 1", limit)
	case window <= 0:
		return Leaky{}, fmt.Errorf("bucket: leaky window %v: must be > 0", window)
	case limit > int64(window):
		return Leaky{}, fmt.Errorf("bucket: leaky limit %d: exceeds the window %v in nanoseconds", limit, window)
	case maxDelay < 0:
		return Leaky{}, fmt.Errorf("bucket: leaky maxDelay %v: must be >= 0", maxDelay)
	}
	return Leaky{t: (int64(window) + limit - 1) / limit, maxDelay: int64(maxDelay)}, nil
}

// Interval returns the output spacing T per token.
func (l Leaky) Interval() time.Duration { return time.Duration(l.t) }

// Limit returns the queue capacity in cost-1 positions: MaxDelay/T + 1.
func (l Leaky) Limit() int64 { return l.maxDelay/l.t + 1 }

// Step decides a request of cost tokens at now and enqueues it when
// admitted; Decision.Delay says how long to hold it.
func (l *Leaky) Step(s *Departure, now, cost int64) Decision {
	d, dep := l.decide(int64(*s), now, cost)
	if d.Allowed && cost > 0 {
		*s = Departure(dep)
	}
	return d
}

// Peek reports what Step with cost 0 would, changing nothing.
func (l *Leaky) Peek(s Departure, now int64) Decision {
	d, _ := l.decide(int64(s), now, 0)
	return d
}

func (l *Leaky) decide(dep, now, cost int64) (Decision, int64) {
	cost = max(cost, 0)
	start := max(dep, now)
	wait := start - now
	d := Decision{Limit: l.Limit()}
	if wait > l.maxDelay {
		d.Reset = time.Duration(wait)
		d.RetryAfter = time.Duration(wait - l.maxDelay)
		return d, dep
	}
	n := satAdd(start, satMul(cost, l.t))
	d.Allowed = true
	d.Delay = time.Duration(wait)
	d.Reset = time.Duration(n - now)
	if w := n - now; w <= l.maxDelay {
		d.Remaining = (l.maxDelay-w)/l.t + 1
	}
	return d, n
}
