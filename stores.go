package weir

import (
	"fmt"
	"sync"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// limiter is one rule's algorithm bound to the store holding its keys.
// Entries record the parameters they were written under (rulegen.go): an
// entry of other parameters is converted to the limiter's before it is
// decided or looked at.
type limiter interface {
	// take charges cost to key, identity id's key, at now and reports the
	// decision.
	take(key uint64, id ident, now, cost int64) bucket.Decision
	// peek reports what take would decide for cost, changing nothing a
	// decision can observe.
	peek(key uint64, id ident, now, cost int64) bucket.Decision
	// bind sets the tag entries are written under, in rule history h, and
	// the parameters p they are written with.
	bind(rec *tagRec, h *ruleHist, p *params)
}

// releaser is implemented by limiters whose admissions must be given back
// when the request ends (concurrency limits).
type releaser interface {
	release(key uint64, now, cost int64)
}

// tagging is a limiter's tag, the rule history that defines it and the
// parameters the limiter decides with.
type tagging struct {
	rec          *tagRec
	h            *ruleHist
	p            *params
	migrateUntil int64 // h.migrateUntil, kept beside the limiter's parameters
}

func (t *tagging) bind(rec *tagRec, h *ruleHist, p *params) {
	t.rec, t.h, t.p, t.migrateUntil = rec, h, p, h.migrateUntil
}

// storeLimiter binds a stepper to a store. peekFn decides on a copy of the
// state; it must not write through any pointer the state holds. field
// selects the store's state in a carried-over state.
type storeLimiter[S any, P bucket.State[S]] struct {
	tagging
	s      *stores
	st     *bucket.Store[S, P]
	alg    bucket.Stepper[S]
	peekFn func(s S, now, cost int64) bucket.Decision
	field  func(a *anyState) *S
}

func (l *storeLimiter[S, P]) take(key uint64, id ident, now, cost int64) bucket.Decision {
	if now < l.migrateUntil {
		l.s.migrate(l.h, l.rec, l.p, key, id, now)
	}
	for range 2 {
		if d, ok := l.st.ApplyTagged(key, l.rec.tag, now, l.alg, cost); ok {
			return d
		}
		l.retag(key, id, now)
	}
	// Re-tagged meanwhile by a decision under other rules (one racing a
	// rule change): decide on the entry as it is.
	return l.st.Apply(key, now, l.alg, cost)
}

// retag converts p's entry, if it is of another tag, to the limiter's.
func (l *storeLimiter[S, P]) retag(key uint64, id ident, now int64) {
	l.st.Retag(key, l.rec.tag, now, func(from uint16, s *S) bool {
		a := anyState{alg: l.p.alg}
		*l.field(&a) = *s
		if l.h.carry(from, &a, id, l.p, now) {
			*s = *l.field(&a)
		}
		return true // an unknown tag is adopted as it is
	})
}

// ready converts p's entry for a look.
func (l *storeLimiter[S, P]) ready(key uint64, id ident, now int64) {
	if now < l.migrateUntil {
		l.s.migrate(l.h, l.rec, l.p, key, id, now)
	}
	if _, tag, ok := l.st.PeekTagged(key, now); ok && tag != l.rec.tag {
		l.retag(key, id, now)
	}
}

func (l *storeLimiter[S, P]) peek(key uint64, id ident, now, cost int64) bucket.Decision {
	l.ready(key, id, now)
	s, _ := l.st.Peek(key, now)
	return l.peekFn(s, now, cost)
}

// valuePeek decides on a copy of a plain-value state with the stepper itself.
func valuePeek[S any](alg bucket.Stepper[S]) func(s S, now, cost int64) bucket.Decision {
	return func(s S, now, cost int64) bucket.Decision { return alg.Step(&s, now, cost) }
}

// gcraLimiter is a token bucket in the lock-free GCRA store.
type gcraLimiter struct {
	tagging
	s  *stores
	st *bucket.GCRAStore
	g  bucket.GCRA
}

func (l *gcraLimiter) take(key uint64, id ident, now, cost int64) bucket.Decision {
	if now < l.migrateUntil {
		l.s.migrate(l.h, l.rec, l.p, key, id, now)
	}
	v, ok := l.st.AllowTagged(key, l.rec.tag, now, &l.g, cost)
	if !ok {
		v = l.takeSlow(key, id, now, cost)
	}
	return l.g.Decision(v)
}

// takeSlow is take for an entry of another tag: convert it, then decide.
func (l *gcraLimiter) takeSlow(key uint64, id ident, now, cost int64) bucket.Verdict {
	l.retag(key, id, now)
	if v, ok := l.st.AllowTagged(key, l.rec.tag, now, &l.g, cost); ok {
		return v
	}
	return l.st.Allow(key, now, &l.g, cost) // re-tagged meanwhile: as it is
}

// retag converts p's entry, if it is of another tag, to the limiter's.
func (l *gcraLimiter) retag(key uint64, id ident, now int64) {
	l.st.Retag(key, l.rec.tag, now, func(from uint16, tat bucket.TAT) (bucket.TAT, bool) {
		a := anyState{alg: quota.AlgorithmGCRA, tat: tat}
		if l.h.carry(from, &a, id, l.p, now) {
			return a.tat, true
		}
		return tat, true // an unknown tag is adopted as it is
	})
}

func (l *gcraLimiter) peek(key uint64, id ident, now, cost int64) bucket.Decision {
	if now < l.migrateUntil {
		l.s.migrate(l.h, l.rec, l.p, key, id, now)
	}
	tat, tag, ok := l.st.PeekTagged(key, now)
	if ok && tag != l.rec.tag {
		l.retag(key, id, now)
		tat, _ = l.st.Peek(key, now)
	}
	return l.g.Step(&tat, now, cost) // on a copy: nothing is charged
}

// logLimiter is a sliding log. Its state shares a ring buffer with every
// copy, so it is peeked under the store's lock rather than on a copy.
type logLimiter struct {
	storeLimiter[bucket.SlidingLogState, *bucket.SlidingLogState]
	log *bucket.SlidingLog
}

func (l *logLimiter) peek(key uint64, id ident, now, cost int64) bucket.Decision {
	l.ready(key, id, now)
	var d bucket.Decision
	l.st.Update(key, now, func(s *bucket.SlidingLogState) { d = l.log.Peek(*s, now) })
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

// release gives slots back to the entry whatever its tag: requests in
// flight stay in flight across a rule change.
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
	// migrating serializes decisions on a key while its entry may still
	// have to be carried over from another algorithm's store (migrate).
	migrating [64]sync.Mutex
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

// spec builds the limiter of rule r at the given limit and burst, and the
// parameters its entries are written under (bound to a tag by install).
func (s *stores) spec(r *quota.Rule, limit, burst int64) (limitSpec, error) {
	out := limitSpec{limit: limit, burst: burst, window: r.Window}
	pr := &params{alg: r.Algorithm, limit: limit, burst: burst, window: r.Window}
	switch r.Algorithm {
	case quota.AlgorithmGCRA:
		g, err := bucket.NewGCRA(limit, r.Window, burst)
		if err != nil {
			return out, err
		}
		pr.gcra = g
		out.lim = &gcraLimiter{s: s, st: s.gcra, g: g}
	case quota.AlgorithmFixedWindow:
		f, err := bucket.NewFixedWindow(limit, r.Window)
		if err != nil {
			return out, err
		}
		if r.CountRejected {
			f = f.CountingRejected()
		}
		out.burst, pr.fixed = limit, f
		out.lim = &storeLimiter[bucket.FixedState, *bucket.FixedState]{s: s, st: s.fixed, alg: &f, peekFn: valuePeek[bucket.FixedState](&f),
			field: func(a *anyState) *bucket.FixedState { return &a.fixed }}
	case quota.AlgorithmSlidingWindow:
		f, err := bucket.NewSlidingWindow(limit, r.Window)
		if err != nil {
			return out, err
		}
		out.burst, pr.sliding = limit, f
		out.lim = &storeLimiter[bucket.SlidingState, *bucket.SlidingState]{s: s, st: s.sliding, alg: &f, peekFn: valuePeek[bucket.SlidingState](&f),
			field: func(a *anyState) *bucket.SlidingState { return &a.sliding }}
	case quota.AlgorithmSlidingLog:
		f, err := bucket.NewSlidingLog(limit, r.Window)
		if err != nil {
			return out, err
		}
		out.burst, pr.log = limit, f
		out.lim = &logLimiter{storeLimiter: storeLimiter[bucket.SlidingLogState, *bucket.SlidingLogState]{s: s, st: s.log, alg: &f,
			field: func(a *anyState) *bucket.SlidingLogState { return &a.log }}, log: &f}
	case quota.AlgorithmLeakyBucket:
		maxDelay := r.QueueDelay(limit, burst)
		f, err := bucket.NewLeaky(limit, r.Window, maxDelay)
		if err != nil {
			return out, err
		}
		pr.leaky, pr.delay = f, maxDelay
		out.lim = &storeLimiter[bucket.Departure, *bucket.Departure]{s: s, st: s.leaky, alg: &f, peekFn: valuePeek[bucket.Departure](&f),
			field: func(a *anyState) *bucket.Departure { return &a.dep }}
	case quota.AlgorithmConcurrency:
		f, err := bucket.NewConcurrency(limit)
		if err != nil {
			return out, err
		}
		out.burst, pr.conc = limit, f
		rel := f.Release()
		out.lim = &concLimiter{
			storeLimiter: storeLimiter[bucket.Inflight, *bucket.Inflight]{s: s, st: s.conc, alg: &f, peekFn: valuePeek[bucket.Inflight](&f),
				field: func(a *anyState) *bucket.Inflight { return &a.inf }},
			rel: &rel,
		}
	default:
		return out, fmt.Errorf("unknown algorithm %q", r.Algorithm)
	}
	out.p = pr
	out.rel, _ = out.lim.(releaser)
	return out, nil
}

// migrate carries p's entry over from the store of another algorithm the
// rule used before (h.otherAlgs) into want's store, once: the first
// decision after an algorithm change takes the old entry, converts it
// (rulegen.go) and puts it where the new algorithm reads it. Decisions on
// one key are serialized here while a migration may be pending, so no two
// take the same entry's spend or decide between its take and its put.
func (s *stores) migrate(h *ruleHist, want *tagRec, wantP *params, key uint64, id ident, now int64) {
	mu := &s.migrating[key%uint64(len(s.migrating))]
	mu.Lock()
	defer mu.Unlock()
	for _, alg := range h.otherAlgs {
		a, tag, ok := s.take(alg, key, now)
		if !ok || !h.carry(tag, &a, id, wantP, now) || s.present(wantP.alg, key, now) {
			continue // nothing there, of a forgotten tag, or already carried
		}
		s.put(want.tag, key, now, &a)
	}
}

// take removes key's entry from alg's store and returns it.
func (s *stores) take(alg quota.Algorithm, key uint64, now int64) (anyState, uint16, bool) {
	a := anyState{alg: alg}
	var tag uint16
	var ok bool
	switch alg {
	case quota.AlgorithmGCRA:
		a.tat, tag, ok = s.gcra.Take(key, now)
	case quota.AlgorithmFixedWindow:
		a.fixed, tag, ok = s.fixed.Take(key, now)
	case quota.AlgorithmSlidingWindow:
		a.sliding, tag, ok = s.sliding.Take(key, now)
	case quota.AlgorithmSlidingLog:
		a.log, tag, ok = s.log.Take(key, now)
	case quota.AlgorithmLeakyBucket:
		a.dep, tag, ok = s.leaky.Take(key, now)
	case quota.AlgorithmConcurrency:
		a.inf, tag, ok = s.conc.Take(key, now)
	}
	return a, tag, ok
}

// present reports whether alg's store holds a live entry for key.
func (s *stores) present(alg quota.Algorithm, key uint64, now int64) bool {
	var ok bool
	switch alg {
	case quota.AlgorithmGCRA:
		_, ok = s.gcra.Peek(key, now)
	case quota.AlgorithmFixedWindow:
		_, ok = s.fixed.Peek(key, now)
	case quota.AlgorithmSlidingWindow:
		_, ok = s.sliding.Peek(key, now)
	case quota.AlgorithmSlidingLog:
		_, ok = s.log.Peek(key, now)
	case quota.AlgorithmLeakyBucket:
		_, ok = s.leaky.Peek(key, now)
	case quota.AlgorithmConcurrency:
		_, ok = s.conc.Peek(key, now)
	}
	return ok
}

// put stores a, of its algorithm, under tag for key.
func (s *stores) put(tag uint16, key uint64, now int64, a *anyState) {
	switch a.alg {
	case quota.AlgorithmGCRA:
		s.gcra.Put(key, tag, now, a.tat)
	case quota.AlgorithmFixedWindow:
		s.fixed.Put(key, tag, now, a.fixed)
	case quota.AlgorithmSlidingWindow:
		s.sliding.Put(key, tag, now, a.sliding)
	case quota.AlgorithmSlidingLog:
		s.log.Put(key, tag, now, a.log)
	case quota.AlgorithmLeakyBucket:
		s.leaky.Put(key, tag, now, a.dep)
	case quota.AlgorithmConcurrency:
		s.conc.Put(key, tag, now, a.inf)
	}
}
