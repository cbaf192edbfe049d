package weir

import (
	"fmt"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// limiter is one rule's algorithm bound to the store holding its keys.
type limiter interface {
	// take charges cost to key at now and reports the decision.
	take(key uint64, now, cost int64) bucket.Decision
	// peek reports what take would decide, changing nothing.
	peek(key uint64, now, cost int64) bucket.Decision
}

// releaser is implemented by limiters whose admissions must be given back
// when the request ends (concurrency limits).
type releaser interface {
	release(key uint64, now, cost int64)
}

// storeLimiter binds a stepper to a store. peekFn decides on a copy of the
// state; it must not write through any pointer the state holds.
type storeLimiter[S any, P bucket.State[S]] struct {
	st     *bucket.Store[S, P]
	alg    bucket.Stepper[S]
	peekFn func(s S, now, cost int64) bucket.Decision
}

func (l *storeLimiter[S, P]) take(key uint64, now, cost int64) bucket.Decision {
	return l.st.Apply(key, now, l.alg, cost)
}

func (l *storeLimiter[S, P]) peek(key uint64, now, cost int64) bucket.Decision {
	s, _ := l.st.Peek(key, now)
	return l.peekFn(s, now, cost)
}

// valuePeek decides on a copy of a plain-value state with the stepper itself.
func valuePeek[S any](alg bucket.Stepper[S]) func(s S, now, cost int64) bucket.Decision {
	return func(s S, now, cost int64) bucket.Decision { return alg.Step(&s, now, cost) }
}

// gcraLimiter is a token bucket in the lock-free GCRA store.
type gcraLimiter struct {
	st *bucket.GCRAStore
	g  bucket.GCRA
}

func (l *gcraLimiter) take(key uint64, now, cost int64) bucket.Decision {
	return l.st.Apply(key, now, &l.g, cost)
}

func (l *gcraLimiter) peek(key uint64, now, cost int64) bucket.Decision {
	tat, _ := l.st.Peek(key, now)
	return l.g.Step(&tat, now, cost) // on a copy: nothing is charged
}

// logLimiter is a sliding log. Its state shares a ring buffer with every
// copy, so it is peeked under the store's lock rather than on a copy.
type logLimiter struct {
	st  *bucket.Store[bucket.SlidingLogState, *bucket.SlidingLogState]
	alg *bucket.SlidingLog
}

func (l *logLimiter) take(key uint64, now, cost int64) bucket.Decision {
	return l.st.Apply(key, now, l.alg, cost)
}

func (l *logLimiter) peek(key uint64, now, cost int64) bucket.Decision {
	var d bucket.Decision
	l.st.Update(key, now, func(s *bucket.SlidingLogState) { d = l.alg.Peek(*s, now) })
	if cost > 0 && d.Remaining < cost {
		d.Allowed = false
		if cost > d.Limit {
			d.RetryAfter = bucket.Never
		} else {
			// The exact wait needs the log's contents; until the oldest
			// entries leave, a second is a safe hint for a peek.
			d.RetryAfter = min(d.Reset, time.Second)
		}
	}
	return d
}

// concLimiter is a concurrency limit; it gives slots back on release.
type concLimiter struct {
	storeLimiter[bucket.Inflight, *bucket.Inflight]
	rel bucket.Stepper[bucket.Inflight]
}

func (l *concLimiter) release(key uint64, now, cost int64) { l.st.Apply(key, now, l.rel, cost) }

// stores holds one keyed store per algorithm state type, shared by every
// rule of that algorithm (keys are mixed with the rule's salt), so a rule
// costs no memory until its identities do.
type stores struct {
	gcra    *bucket.GCRAStore
	fixed   *bucket.Store[bucket.FixedState, *bucket.FixedState]
	sliding *bucket.Store[bucket.SlidingState, *bucket.SlidingState]
	log     *bucket.Store[bucket.SlidingLogState, *bucket.SlidingLogState]
	leaky   *bucket.Store[bucket.Departure, *bucket.Departure]
	conc    *bucket.Store[bucket.Inflight, *bucket.Inflight]
	penalty *bucket.Store[bucket.PenaltyState, *bucket.PenaltyState]
}

func newStores(maxKeys int) (*stores, error) {
	cfg := bucket.StoreConfig{MaxKeys: maxKeys}
	var s stores
	var err error
	if s.gcra, err = bucket.NewGCRAStore(cfg); err != nil {
		return nil, err
	}
	// The other algorithms are for smaller populations (login attempts,
	// per-endpoint windows); they get fewer shards to stay small when unused.
	small := bucket.StoreConfig{MaxKeys: maxKeys, Shards: 64}
	if s.fixed, err = bucket.NewStore[bucket.FixedState](small); err != nil {
		return nil, err
	}
	if s.sliding, err = bucket.NewStore[bucket.SlidingState](small); err != nil {
		return nil, err
	}
	if s.log, err = bucket.NewStore[bucket.SlidingLogState](small); err != nil {
		return nil, err
	}
	if s.leaky, err = bucket.NewStore[bucket.Departure](small); err != nil {
		return nil, err
	}
	if s.conc, err = bucket.NewStore[bucket.Inflight](small); err != nil {
		return nil, err
	}
	if s.penalty, err = bucket.NewStore[bucket.PenaltyState](small); err != nil {
		return nil, err
	}
	return &s, nil
}

// StoreStats are one key store's figures.
type StoreStats struct {
	// Name is the algorithm whose keys the store holds.
	Name string `json:"name"`
	// Live is the number of keys holding state now.
	Live int64 `json:"live"`
	// EvictedIdle counts keys dropped because their state equalled no entry.
	EvictedIdle uint64 `json:"evicted_idle"`
	// EvictedForgiven counts partly spent keys evicted at the key cap: each
	// one was forgiven what it had spent. At the cap a full key goes first,
	// else the least indebted of the keys examined (docs/overshoot.md).
	EvictedForgiven uint64 `json:"evicted_forgiven"`
	// ForgivenTokens sums what the forgiven keys had spent, in tokens, for
	// the stores that count tokens (fixed_window, sliding_window,
	// sliding_log, concurrency: slots in flight); 0 for the others.
	ForgivenTokens uint64 `json:"forgiven_tokens"`
	// ForgivenSeconds sums what the forgiven keys owed in time, for the
	// stores that hold a time (gcra: the time until the bucket is full
	// again, its spend times the rule's emission interval; leaky_bucket:
	// the queue's time to drain; penalty: the lockout's rest); 0 for the
	// others.
	ForgivenSeconds float64 `json:"forgiven_seconds"`
}

func storeStats(name string, s bucket.StoreStats) StoreStats {
	return StoreStats{Name: name, Live: int64(s.Live), EvictedIdle: s.EvictedIdle, EvictedForgiven: s.EvictedForgiven,
		ForgivenTokens: s.ForgivenTokens, ForgivenSeconds: float64(s.ForgivenNanos) / 1e9}
}

// timeStore reports whether the store named name forgives time at its key
// cap (StoreStats.ForgivenSeconds) rather than tokens (ForgivenTokens).
func timeStore(name string) bool {
	return name == "gcra" || name == "leaky_bucket" || name == "penalty"
}

// stats reports every store, in a fixed order.
func (s *stores) stats() []StoreStats {
	return []StoreStats{
		storeStats("gcra", s.gcra.Stats()),
		storeStats("fixed_window", s.fixed.Stats()),
		storeStats("sliding_window", s.sliding.Stats()),
		storeStats("sliding_log", s.log.Stats()),
		storeStats("leaky_bucket", s.leaky.Stats()),
		storeStats("concurrency", s.conc.Stats()),
		storeStats("penalty", s.penalty.Stats()),
	}
}

// spec builds the limiter of rule r at the given limit and burst.
func (s *stores) spec(r *quota.Rule, limit, burst int64) (limitSpec, error) {
	out := limitSpec{limit: limit, burst: burst, window: r.Window}
	switch r.Algorithm {
	case quota.AlgorithmGCRA:
		g, err := bucket.NewGCRA(limit, r.Window, burst)
		if err != nil {
			return out, err
		}
		out.lim = &gcraLimiter{st: s.gcra, g: g}
	case quota.AlgorithmFixedWindow:
		f, err := bucket.NewFixedWindow(limit, r.Window)
		if err != nil {
			return out, err
		}
		out.burst = limit
		out.lim = &storeLimiter[bucket.FixedState, *bucket.FixedState]{st: s.fixed, alg: &f, peekFn: valuePeek[bucket.FixedState](&f)}
	case quota.AlgorithmSlidingWindow:
		f, err := bucket.NewSlidingWindow(limit, r.Window)
		if err != nil {
			return out, err
		}
		out.burst = limit
		out.lim = &storeLimiter[bucket.SlidingState, *bucket.SlidingState]{st: s.sliding, alg: &f, peekFn: valuePeek[bucket.SlidingState](&f)}
	case quota.AlgorithmSlidingLog:
		f, err := bucket.NewSlidingLog(limit, r.Window)
		if err != nil {
			return out, err
		}
		out.burst = limit
		out.lim = &logLimiter{st: s.log, alg: &f}
	case quota.AlgorithmLeakyBucket:
		maxDelay := r.MaxDelay
		if maxDelay == 0 {
			maxDelay = time.Duration(burst-1) * (r.Window / time.Duration(limit))
		}
		f, err := bucket.NewLeaky(limit, r.Window, maxDelay)
		if err != nil {
			return out, err
		}
		out.lim = &storeLimiter[bucket.Departure, *bucket.Departure]{st: s.leaky, alg: &f, peekFn: valuePeek[bucket.Departure](&f)}
	case quota.AlgorithmConcurrency:
		f, err := bucket.NewConcurrency(limit)
		if err != nil {
			return out, err
		}
		out.burst = limit
		rel := f.Release()
		out.lim = &concLimiter{
			storeLimiter: storeLimiter[bucket.Inflight, *bucket.Inflight]{st: s.conc, alg: &f, peekFn: valuePeek[bucket.Inflight](&f)},
			rel:          &rel,
		}
	default:
		return out, fmt.Errorf("unknown algorithm %q", r.Algorithm)
	}
	out.rel, _ = out.lim.(releaser)
	return out, nil
}
