package weir

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// How a rule change reaches the state of identities already counted
// (docs/rules.md, "When a rule changes"). SetRules does not touch the
// stores: it costs O(rules) whatever the number of live keys. Every entry
// records, in a tag, the parameters it was written under; an identity's
// next decision finds an entry of another tag and converts it, through each
// change at the instant that change was installed, to the parameters that
// apply now. So a conversion is lazy but gives what converting every entry
// at the change, then letting time run under the new rule, would give.
//
// A rule's history (ruleHist) lists its generations: each install that
// changes what a stored state depends on (algorithm, limit, burst, window,
// max delay, overrides, tiers) adds one, with the instant it was installed
// and a tag per distinct parameter set of it (the rule and its overrides
// share a tag where their parameters are equal; each tier has its own). A
// tag is dropped once no entry can still hold it: an entry written under a
// generation is idle by its horizon after the next generation began.

// params is what a stored state depends on, for one variant of a rule.
type params struct {
	alg    quota.Algorithm
	limit  int64
	burst  int64
	window time.Duration
	delay  time.Duration // leaky: the max delay in force
	// The compiled algorithm (the one of alg is set).
	gcra    bucket.GCRA
	fixed   bucket.FixedWindow
	sliding bucket.SlidingWindow
	log     bucket.SlidingLog
	leaky   bucket.Leaky
	conc    bucket.Concurrency
}

// same reports whether p and q describe the same stored state.
func (p *params) same(q *params) bool {
	return p.alg == q.alg && p.limit == q.limit && p.burst == q.burst && p.window == q.window && p.delay == q.delay
}

// horizon bounds how long a state written under p can stay non-idle after
// its last write, with a wide margin (a bound too short would read a live
// entry with the wrong parameters; one too long only keeps history longer).
// A concurrency slot has none: in-flight requests hold it until they end.
func (p *params) horizon() int64 {
	var h int64
	switch p.alg {
	case quota.AlgorithmGCRA:
		h = int64(p.gcra.Interval()) * (p.burst + 2)
	case quota.AlgorithmFixedWindow, quota.AlgorithmSlidingLog:
		h = int64(p.window)
	case quota.AlgorithmSlidingWindow:
		h = 2 * int64(p.window)
	case quota.AlgorithmLeakyBucket:
		h = int64(p.delay) + int64(p.leaky.Interval())*(p.burst+2)
	default:
		return math.MaxInt64
	}
	if h > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return 2*h + int64(time.Minute)
}

// tagRec is one tag of a rule: the parameters entries under it were written
// with, and the generation it belongs to.
type tagRec struct {
	tag  uint16
	gen  int    // the generation's number
	tier string // the tier it is for; "" for the rule and its overrides
	p    *params
}

// genRec is one generation of a rule.
type genRec struct {
	at        int64 // when it was installed, ns
	maxH      int64 // the longest horizon of its tags
	base      *tagRec
	overrides map[string]*tagRec // by identity
	tiers     map[string]*tagRec // by name
}

// variant returns the tag an identity under tier is decided with in g, as
// crule.specFor picks its limits: its override, else its tier, else the
// rule's own.
func (g *genRec) variant(identity, tier string) *tagRec {
	if r, ok := g.overrides[identity]; ok {
		return r
	}
	if r, ok := g.tiers[tier]; ok && tier != "" {
		return r
	}
	return g.base
}

// ruleHist is the history of one incarnation of a rule. A published
// ruleHist is immutable: an install that changes the rule publishes a new
// one, so a decision reads one consistent history without a lock.
type ruleHist struct {
	id          string
	incarnation int
	salt        uint64
	first       int       // the number of gens[0]
	gens        []*genRec // oldest first; the last is in force
	tags        map[uint16]*tagRec
	next        uint16 // where the search for a free tag starts
	// migrateUntil is the instant until which an entry of this rule may
	// still sit in another algorithm's store (0: none can).
	migrateUntil int64
	otherAlgs    []quota.Algorithm // the algorithms of those entries
	// penalty is whether the rule has a penalty box, penaltyInc its
	// incarnation (a box removed and added again starts empty).
	penalty    bool
	penaltyInc int
}

// cur returns the generation in force.
func (h *ruleHist) cur() *genRec { return h.gens[len(h.gens)-1] }

// gen returns generation number g, nil if it was pruned.
func (h *ruleHist) gen(g int) *genRec {
	if g < h.first || g-h.first >= len(h.gens) {
		return nil
	}
	return h.gens[g-h.first]
}

// ruleSalt is the salt mixed into the keys of a rule's incarnation, so that
// rules never share a key and a rule removed and added again starts empty.
// Incarnation 0 keeps the salt of the rule id alone.
func ruleSalt(hs bucket.Hasher, id string, incarnation int) uint64 {
	if incarnation == 0 {
		return hs.Sum("rule\x00" + id)
	}
	return hs.Sum("rule\x00" + id + "\x00" + strconv.Itoa(incarnation))
}

// penaltyKey is the penalty box's key for an identity's key under h: the
// key itself for a rule's first box, else mixed with the box's incarnation.
func (h *ruleHist) penaltyKey(key uint64) uint64 {
	if h.penaltyInc == 0 {
		return key
	}
	return bucket.Mix(key, uint64(h.penaltyInc))
}

// histories holds the latest history of every rule id a node has seen,
// removed rules included (so that a rule added again is a new incarnation).
type histories struct {
	mu    sync.Mutex // serializes installs
	rules map[string]*ruleHist
	seen  map[string]bool // ids in the set in force
}

// variants are the parameters of one rule's variants in a new install.
type variants struct {
	base      *params
	overrides map[string]*params
	tiers     map[string]*params
}

// sameAs reports whether v equals the variants of generation g.
func (v *variants) sameAs(g *genRec) bool {
	if !v.base.same(g.base.p) || len(v.overrides) != len(g.overrides) || len(v.tiers) != len(g.tiers) {
		return false
	}
	for id, p := range v.overrides {
		r, ok := g.overrides[id]
		if !ok || !p.same(r.p) {
			return false
		}
	}
	for name, p := range v.tiers {
		r, ok := g.tiers[name]
		if !ok || !p.same(r.p) {
			return false
		}
	}
	return true
}

// advance returns the history of rule id after an install at now with
// variants v (and a penalty box or not), given its history before (nil for
// a rule not in force). It reuses old when nothing a stored state depends
// on changed. ok is false when the rule ran out of tags: then it starts a
// new incarnation, which forgets its identities' spend.
func advance(hs bucket.Hasher, old *ruleHist, id string, v *variants, penalty bool, now int64, removedBefore bool) (h *ruleHist, ok bool) {
	if old != nil && !removedBefore && v.sameAs(old.cur()) && old.penalty == penalty {
		return old, true
	}
	if old == nil || removedBefore {
		inc := 0
		if old != nil {
			inc = old.incarnation + 1
		}
		h = &ruleHist{id: id, incarnation: inc, salt: ruleSalt(hs, id, inc), tags: map[uint16]*tagRec{}, next: 1, penalty: penalty}
		if !h.addGen(v, now) {
			panic("weir: a new rule history has no room for its tags") // 4 095 tags: NewSet caps overrides and tiers below that
		}
		return h, true
	}
	h = old.pruned(now)
	h.penalty = penalty
	if penalty && !old.penalty {
		h.penaltyInc = old.penaltyInc + 1
	}
	if !h.addGen(v, now) {
		// Every tag is held by an entry that may still be live: forget the
		// rule's state rather than read an entry under wrong parameters.
		nh := &ruleHist{id: id, incarnation: old.incarnation + 1, tags: map[uint16]*tagRec{}, next: 1, penalty: penalty, penaltyInc: h.penaltyInc}
		nh.salt = ruleSalt(hs, id, nh.incarnation)
		nh.addGen(v, now)
		return nh, false
	}
	return h, true
}

// pruned returns a copy of h without the tags and generations no entry can
// still need at now.
func (h *ruleHist) pruned(now int64) *ruleHist {
	nh := *h
	nh.tags = make(map[uint16]*tagRec, len(h.tags))
	oldest := h.first + len(h.gens) - 1
	for t, r := range h.tags {
		if now > h.deadline(r) {
			continue // every entry of it is idle, converted or not
		}
		nh.tags[t] = r
		oldest = min(oldest, r.gen)
	}
	nh.gens = h.gens[oldest-h.first:]
	nh.first = oldest
	return &nh
}

// deadline is the instant after which no entry written under r can be
// live, even converted through the later generations (a lengthened window
// keeps a converted entry live longer than its own state says).
// math.MaxInt64 while r is of the generation in force, and for concurrency
// (a slot is held until its request ends).
func (h *ruleHist) deadline(r *tagRec) int64 {
	next := h.gen(r.gen + 1)
	if next == nil || r.p.alg == quota.AlgorithmConcurrency {
		return math.MaxInt64
	}
	d := satAdd(next.at, max(r.p.horizon(), next.maxH))
	for g := r.gen + 2; ; g++ {
		gr := h.gen(g)
		if gr == nil {
			return d
		}
		if gr.at < d {
			d = max(d, satAdd(gr.at, gr.maxH))
		}
	}
}

// grace returns, per algorithm, how long after an entry of an earlier
// generation looks idle a conversion may still make it live: twice the
// longest window among the rule's tags of that algorithm, while it has any
// of an earlier generation (0 otherwise).
func (h *ruleHist) grace(alg quota.Algorithm) time.Duration {
	var w time.Duration
	old := false
	cur := h.first + len(h.gens) - 1
	for _, r := range h.tags {
		if r.p.alg == alg {
			w = max(w, r.p.window)
			old = old || r.gen < cur
		}
	}
	if !old {
		return 0
	}
	return 2 * w
}

// addGen appends a generation of variants v installed at now, allocating
// its tags, and recomputes migrateUntil. It reports false if the tags ran
// out (h is then unusable).
func (h *ruleHist) addGen(v *variants, now int64) bool {
	num := h.first + len(h.gens)
	g := &genRec{at: now}
	var shared []*tagRec // the rule's and its overrides' tags, by parameters
	get := func(p *params, tier string) *tagRec {
		if tier == "" {
			for _, r := range shared {
				if r.p.same(p) {
					return r
				}
			}
		}
		t, ok := h.freeTag()
		if !ok {
			return nil
		}
		r := &tagRec{tag: t, gen: num, tier: tier, p: p}
		h.tags[t] = r
		if tier == "" {
			shared = append(shared, r)
		}
		return r
	}
	if g.base = get(v.base, ""); g.base == nil {
		return false
	}
	if len(v.overrides) > 0 {
		g.overrides = make(map[string]*tagRec, len(v.overrides))
		for id, p := range v.overrides {
			if g.overrides[id] = get(p, ""); g.overrides[id] == nil {
				return false
			}
		}
	}
	if len(v.tiers) > 0 {
		g.tiers = make(map[string]*tagRec, len(v.tiers))
		for name, p := range v.tiers {
			if g.tiers[name] = get(p, name); g.tiers[name] == nil {
				return false
			}
		}
	}
	for _, r := range h.tags {
		if r.gen == num {
			g.maxH = max(g.maxH, r.p.horizon())
		}
	}
	h.gens = append(h.gens[:len(h.gens):len(h.gens)], g)
	// Entries of another algorithm (other than concurrency, which starts
	// over) are carried over from their store until their horizon.
	alg := v.base.alg
	h.migrateUntil, h.otherAlgs = 0, nil
	if alg != quota.AlgorithmConcurrency {
		for _, r := range h.tags {
			if r.p.alg == alg || r.p.alg == quota.AlgorithmConcurrency {
				continue
			}
			h.migrateUntil = max(h.migrateUntil, h.deadline(r)) // r is of an earlier generation
			if !slices.Contains(h.otherAlgs, r.p.alg) {
				h.otherAlgs = append(h.otherAlgs, r.p.alg)
			}
		}
		slices.Sort(h.otherAlgs)
	}
	return true
}

// freeTag returns a tag no live entry of the rule can hold (tag 0 is never
// used: it is what untagged writes record).
func (h *ruleHist) freeTag() (uint16, bool) {
	const n = 1 << bucket.TagBits
	if len(h.tags) >= n-1 {
		return 0, false
	}
	for {
		t := h.next
		h.next++
		if h.next >= n {
			h.next = 1
		}
		if _, used := h.tags[t]; !used && t != 0 {
			return t, true
		}
	}
}

// satAdd is a + b for b >= 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// anyState is an identity's stored state of any algorithm while it is
// carried over (the field of alg is set).
type anyState struct {
	alg     quota.Algorithm
	tat     bucket.TAT
	fixed   bucket.FixedState
	sliding bucket.SlidingState
	log     bucket.SlidingLogState
	dep     bucket.Departure
	inf     bucket.Inflight
}

// spent returns the whole tokens s, a state under p, has spent at at.
func (p *params) spent(s *anyState, at int64) int64 {
	switch p.alg {
	case quota.AlgorithmGCRA:
		return p.gcra.Spent(s.tat, at)
	case quota.AlgorithmFixedWindow:
		return p.fixed.Spent(s.fixed, at)
	case quota.AlgorithmSlidingWindow:
		return p.sliding.Spent(s.sliding, at)
	case quota.AlgorithmSlidingLog:
		return p.log.Spent(s.log, at)
	case quota.AlgorithmLeakyBucket:
		return p.leaky.Spent(s.dep, at)
	}
	return 0 // concurrency: to or from it starts over
}

// booked returns a fresh state under p charged k tokens at at (clamped to
// what p allows).
func (p *params) booked(k, at int64) anyState {
	a := anyState{alg: p.alg}
	switch p.alg {
	case quota.AlgorithmGCRA:
		a.tat = p.gcra.Booked(k, at)
	case quota.AlgorithmFixedWindow:
		a.fixed = p.fixed.Booked(k, at)
	case quota.AlgorithmSlidingWindow:
		a.sliding = p.sliding.Booked(k, at)
	case quota.AlgorithmSlidingLog:
		a.log = p.log.Booked(k, at)
	case quota.AlgorithmLeakyBucket:
		a.dep = p.leaky.Booked(k, at)
	}
	return a
}

// convertState carries s, a state under from, over to the parameters to at
// the instant at (docs/rules.md, "When a rule changes").
func convertState(from, to *params, s *anyState, at int64) {
	if from.alg != to.alg {
		var k int64
		if from.alg != quota.AlgorithmConcurrency && to.alg != quota.AlgorithmConcurrency {
			k = from.spent(s, at)
		}
		*s = to.booked(k, at)
		return
	}
	switch to.alg {
	case quota.AlgorithmGCRA:
		s.tat = to.gcra.Convert(from.gcra, s.tat, at)
	case quota.AlgorithmFixedWindow:
		s.fixed = to.fixed.Convert(from.fixed, s.fixed, at)
	case quota.AlgorithmSlidingWindow:
		s.sliding = to.sliding.Convert(from.sliding, s.sliding, at)
	case quota.AlgorithmSlidingLog:
		s.log = to.log.Convert(from.log, s.log, at)
	case quota.AlgorithmLeakyBucket:
		s.dep = to.leaky.Convert(from.leaky, s.dep, at)
	case quota.AlgorithmConcurrency:
		s.inf = to.conc.Convert(from.conc, s.inf)
	}
}

// carry converts s, written under tag from, to want for identity at now:
// through each later generation at the instant it was installed (the
// identity keeping its override, or the tier it was under, else the rule's
// own limits), then, if the variant that applies now is another one, at
// now. It reports false, leaving s alone, when from is not a tag of h of
// s's algorithm (a tag written under a newer history than h, by a decision
// racing an install, or one pruned because every entry of it is idle).
func (h *ruleHist) carry(from uint16, s *anyState, identity string, want *tagRec, now int64) bool {
	r := h.tags[from]
	if r == nil || r.p.alg != s.alg {
		return false
	}
	for g := r.gen + 1; ; g++ {
		gr := h.gen(g)
		if gr == nil || gr.at > now {
			break
		}
		next := gr.variant(identity, r.tier)
		convertState(r.p, next.p, s, gr.at)
		r = next
	}
	if r != want {
		convertState(r.p, want.p, s, now)
	}
	return true
}

// bindHistory advances compiled rule c's history to this install at now and
// binds its limiters to the tags of the generation in force.
func (n *Node) bindHistory(c *crule, now int64) {
	hs := &n.hist
	if hs.rules == nil {
		hs.rules, hs.seen = map[string]*ruleHist{}, map[string]bool{}
	}
	v := variants{base: c.base.p}
	if len(c.overrides) > 0 {
		v.overrides = make(map[string]*params, len(c.overrides))
		for id, s := range c.overrides {
			v.overrides[id] = s.p
		}
	}
	if len(c.tiers) > 0 {
		v.tiers = make(map[string]*params, len(c.tiers))
		for name, s := range c.tiers {
			v.tiers[name] = s.p
		}
	}
	old := hs.rules[c.r.ID]
	h, ok := advance(n.hasher, old, c.r.ID, &v, c.r.Penalty != nil, now, old != nil && !hs.seen[c.r.ID])
	if !ok {
		n.log.Warn("rule changed too often within its identities' horizon: its identities start afresh",
			"rule", c.r.ID, "tags", 1<<bucket.TagBits-1)
	}
	hs.rules[c.r.ID] = h
	c.hist, c.salt = h, h.salt
	g := h.cur()
	c.base.lim.bind(g.base, h)
	for id, s := range c.overrides {
		s.lim.bind(g.overrides[id], h)
	}
	for name, s := range c.tiers {
		s.lim.bind(g.tiers[name], h)
	}
}

// installed records the ids of the rule set e now in force (a rule missing
// from it and added again later is a new incarnation) and sets the stores'
// grace (bucket.Store.SetGrace) for the entries its rules' earlier
// generations may still have to convert.
func (hs *histories) installed(e *engine, st *stores) {
	seen := make(map[string]bool, len(e.rules))
	var fixed, sliding, log time.Duration
	for i := range e.rules {
		seen[e.rules[i].r.ID] = true
		h := e.rules[i].hist
		fixed = max(fixed, h.grace(quota.AlgorithmFixedWindow))
		sliding = max(sliding, h.grace(quota.AlgorithmSlidingWindow))
		log = max(log, h.grace(quota.AlgorithmSlidingLog))
	}
	hs.seen = seen
	st.fixed.SetGrace(fixed)
	st.sliding.SetGrace(sliding)
	st.log.SetGrace(log)
}
