package weir

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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
// A concurrency slot is held until its request ends, and carries over
// changes of the limit as it is, so any entry of a forgotten tag is right
// as it is; its horizon only bounds how long its generation is kept.
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
		h = int64(time.Hour)
	}
	if h > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return 2*h + int64(time.Minute)
}

// tagRec is one tag of a rule: the generation entries under it were
// written in and the tier they were written under. The parameters of an
// entry follow from these and its identity (genRec.params).
type tagRec struct {
	tag  uint16
	gen  int    // the generation's number
	tier string // the tier it is for, one of the generation's; "" for none
}

// genRec is one generation of a rule.
type genRec struct {
	at     int64 // when it was installed, ns
	maxH   int64 // the longest horizon of its variants
	window time.Duration
	alg    quota.Algorithm
	v      *variants          // the parameters of each variant
	base   *tagRec            // the tag of identities under no tier (or one the rule does not name)
	tiers  map[string]*tagRec // the tag of each tier, by name
	tags   []*tagRec          // all of the above, once each
	// deadline is the instant after which no entry written under this
	// generation can be live, even converted through the later ones (a
	// lengthened window keeps a converted entry live longer than its own
	// state says); math.MaxInt64 while it is in force. Only installs read
	// and write it, under histories.mu.
	deadline int64
}

// tagFor returns the tag of identities under tier in g.
func (g *genRec) tagFor(tier string) *tagRec {
	if r, ok := g.tiers[tier]; ok && tier != "" {
		return r
	}
	return g.base
}

// tagTable maps a rule's tags to their records: shared by every history of
// one incarnation, written by installs only (under histories.mu) and read
// by decisions lock-free. Chunks are allocated as tags are.
type tagTable struct {
	chunks [1 << (bucket.TagBits - 6)]atomic.Pointer[[64]atomic.Pointer[tagRec]]
	n      int    // tags in use
	next   uint16 // where the search for a free tag starts
}

func (tt *tagTable) get(t uint16) *tagRec {
	c := tt.chunks[t>>6&(1<<(bucket.TagBits-6)-1)].Load()
	if c == nil {
		return nil
	}
	return c[t&63].Load()
}

func (tt *tagTable) set(t uint16, r *tagRec) {
	i := t >> 6 & (1<<(bucket.TagBits-6) - 1)
	c := tt.chunks[i].Load()
	if c == nil {
		c = new([64]atomic.Pointer[tagRec])
		tt.chunks[i].Store(c)
	}
	if old := c[t&63].Swap(r); old == nil && r != nil {
		tt.n++
	} else if old != nil && r == nil {
		tt.n--
	}
}

// free returns a tag not in use (tag 0 is never used: it is what untagged
// writes record).
func (tt *tagTable) free() (uint16, bool) {
	const n = 1 << bucket.TagBits
	if tt.n >= n-1 {
		return 0, false
	}
	for {
		t := tt.next
		if tt.next++; tt.next >= n {
			tt.next = 1
		}
		if t != 0 && tt.get(t) == nil {
			return t, true
		}
	}
}

// maxGens bounds the generations a rule keeps: a rule changed that often
// within its identities' horizon starts a new incarnation instead, which
// forgets their spend (and is logged).
const maxGens = 256

// ruleHist is the history of one incarnation of a rule. A published
// ruleHist is immutable but for its generations' deadlines and its tag
// table, which only installs write: an install that changes the rule
// publishes a new one, so a decision reads one consistent history without a
// lock. (Generations are appended to a shared array beyond the length of
// every published history, and a tag is reused only once no entry can hold
// it.)
type ruleHist struct {
	id          string
	incarnation int
	salt        uint64
	tags        *tagTable
	first       int       // the number of gens[0]
	gens        []*genRec // oldest first; the last is in force
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

// gen returns generation number g, nil if it was pruned or is newer than h.
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

// ident is an identity as a rule's variants are picked by: its value and
// the position in the rule's key chain of the source that yielded it (an
// override matches within its source's namespace only).
type ident struct {
	v   string
	src int
}

// identTier is an overridden identity under one of the rule's tiers.
type identTier struct {
	id   ident
	tier string
}

// variants are the parameters of one rule's variants in a new install.
type variants struct {
	base      *params
	overrides map[ident]*params
	tiers     map[string]*params
	// overTiers holds an override's parameters under each tier: a field
	// the override leaves out is the tier's.
	overTiers map[identTier]*params
}

// params returns the parameters an identity under tier is decided with, as
// crule.specFor picks its limits: its override (whose missing fields are
// its tier's, else the rule's), else its tier, else the rule's own.
func (v *variants) params(id ident, tier string) *params {
	if tier != "" {
		if p, ok := v.overTiers[identTier{id, tier}]; ok {
			return p
		}
	}
	if p, ok := v.overrides[id]; ok {
		return p
	}
	if tier != "" {
		if p, ok := v.tiers[tier]; ok {
			return p
		}
	}
	return v.base
}

// all calls f with the parameters of every variant, in no set order.
func (v *variants) all(f func(*params)) {
	f(v.base)
	for _, p := range v.overrides {
		f(p)
	}
	for _, p := range v.tiers {
		f(p)
	}
	for _, p := range v.overTiers {
		f(p)
	}
}

// sameAs reports whether v equals the variants of generation g.
func (v *variants) sameAs(g *genRec) bool {
	w := g.v
	if !v.base.same(w.base) || len(v.overrides) != len(w.overrides) || len(v.tiers) != len(w.tiers) || len(v.overTiers) != len(w.overTiers) {
		return false
	}
	for id, p := range v.overrides {
		if q, ok := w.overrides[id]; !ok || !p.same(q) {
			return false
		}
	}
	for name, p := range v.tiers {
		if q, ok := w.tiers[name]; !ok || !p.same(q) {
			return false
		}
	}
	for k, p := range v.overTiers {
		if q, ok := w.overTiers[k]; !ok || !p.same(q) {
			return false
		}
	}
	return true
}

// advance returns the history of rule id after an install at now with
// variants v (and a penalty box or not), given its history before (nil for
// a rule never seen; removedBefore for one not in the set in force). It
// reuses old when nothing a stored state depends on changed, and costs
// O(generations kept), whatever the number of live keys. ok is false when
// the rule changed more than maxGens times, or ran out of tags, within its
// identities' horizon: then it starts a new incarnation, which forgets
// their spend.
func advance(hs bucket.Hasher, old *ruleHist, id string, v *variants, penalty bool, now int64, removedBefore bool) (h *ruleHist, ok bool) {
	if old != nil && !removedBefore && v.sameAs(old.cur()) && old.penalty == penalty {
		return old, true
	}
	fresh := func(inc, penaltyInc int) *ruleHist {
		h := &ruleHist{id: id, incarnation: inc, salt: ruleSalt(hs, id, inc), tags: &tagTable{next: 1}, penalty: penalty, penaltyInc: penaltyInc}
		if !h.addGen(v, now) {
			panic("weir: a new rule history has no room for its tags") // a generation takes 1 + tiers tags, and NewSet caps tiers at quota.MaxTiers
		}
		return h
	}
	if old == nil || removedBefore {
		inc := 0
		if old != nil {
			inc = old.incarnation + 1
		}
		return fresh(inc, 0), true
	}
	nh := *old
	h = &nh
	h.prune(now)
	h.penalty = penalty
	if penalty && !old.penalty {
		h.penaltyInc = old.penaltyInc + 1
	}
	if len(h.gens) >= maxGens || !h.addGen(v, now) {
		return fresh(old.incarnation+1, h.penaltyInc), false
	}
	return h, true
}

// prune drops, oldest first, the generations no entry can still need at
// now, and frees their tags. (A generation is kept while an older one is:
// pruning from the front keeps the chain of conversions whole.)
func (h *ruleHist) prune(now int64) {
	for len(h.gens) > 1 && h.gens[0].deadline < now {
		for _, r := range h.gens[0].tags {
			h.tags.set(r.tag, nil)
		}
		h.gens = h.gens[1:]
		h.first++
	}
}

// addGen appends a generation of variants v installed at now, allocating
// its tags (one for identities under no tier, one per tier: the tags of a
// generation do not grow with its overrides), updates the earlier
// generations' deadlines, and recomputes migrateUntil. It reports false if
// the tags ran out (h is then unusable).
func (h *ruleHist) addGen(v *variants, now int64) bool {
	num := h.first + len(h.gens)
	g := &genRec{at: now, alg: v.base.alg, v: v, deadline: math.MaxInt64}
	v.all(func(p *params) {
		g.maxH = max(g.maxH, p.horizon())
		g.window = max(g.window, p.window)
	})
	get := func(tier string) *tagRec {
		t, ok := h.tags.free()
		if !ok {
			return nil
		}
		r := &tagRec{tag: t, gen: num, tier: tier}
		h.tags.set(t, r)
		g.tags = append(g.tags, r)
		return r
	}
	if g.base = get(""); g.base == nil {
		return false
	}
	if len(v.tiers) > 0 {
		g.tiers = make(map[string]*tagRec, len(v.tiers))
		// In name order, so that tags are allocated the same way on
		// every install of the same rules.
		for _, name := range slices.Sorted(maps.Keys(v.tiers)) {
			if g.tiers[name] = get(name); g.tiers[name] == nil {
				return false
			}
		}
	}
	// An entry of an earlier generation converted at now lives at most
	// g.maxH longer: extend the deadlines it can still reach.
	if len(h.gens) > 0 {
		prev := h.cur()
		prev.deadline = satAdd(now, max(prev.maxH, g.maxH))
		for _, e := range h.gens[:len(h.gens)-1] {
			if e.deadline >= now {
				e.deadline = max(e.deadline, satAdd(now, g.maxH))
			}
		}
	}
	h.gens = append(h.gens, g)
	// Entries of another algorithm (other than concurrency, which starts
	// over) are carried over from their store until their deadline.
	h.migrateUntil, h.otherAlgs = 0, nil
	if g.alg != quota.AlgorithmConcurrency {
		for _, e := range h.gens[:len(h.gens)-1] {
			if e.alg == g.alg || e.alg == quota.AlgorithmConcurrency {
				continue
			}
			h.migrateUntil = max(h.migrateUntil, e.deadline)
			if !slices.Contains(h.otherAlgs, e.alg) {
				h.otherAlgs = append(h.otherAlgs, e.alg)
			}
		}
		slices.Sort(h.otherAlgs)
	}
	return true
}

// grace returns how long after an entry of an earlier generation of alg
// looks idle a conversion may still make it live: twice the longest window
// among the rule's generations of alg, while it has an earlier one (0
// otherwise).
func (h *ruleHist) grace(alg quota.Algorithm) time.Duration {
	if len(h.gens) < 2 {
		return 0
	}
	var w time.Duration
	for _, g := range h.gens {
		if g.alg == alg {
			w = max(w, g.window)
		}
	}
	return 2 * w
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
	if from == to || from.same(to) {
		return
	}
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
// identity keeping its override and the tier it was written under, where
// the generation has them, else the rule's own limits), then, if the
// variant that applies now has other parameters, at now. It reports false,
// leaving s alone, when from is not a tag of h of s's algorithm (a tag
// written under a newer history than h, by a decision racing an install, or
// one pruned because every entry of it is idle).
func (h *ruleHist) carry(from uint16, s *anyState, identity ident, want *params, now int64) bool {
	r := h.tags.get(from)
	if r == nil {
		return false
	}
	g := h.gen(r.gen)
	if g == nil || g.alg != s.alg {
		return false
	}
	p := g.v.params(identity, r.tier)
	for n := r.gen + 1; ; n++ {
		gr := h.gen(n)
		if gr == nil || gr.at > now {
			break
		}
		next := gr.v.params(identity, r.tier)
		convertState(p, next, s, gr.at)
		p = next
	}
	convertState(p, want, s, now)
	return true
}

// bindHistory advances compiled rule c's history to this install at now and
// binds its limiters to the tags of the generation in force.
func (n *Node) bindHistory(c *crule, now int64) {
	hs := &n.hist
	if hs.rules == nil {
		hs.rules, hs.seen = map[string]*ruleHist{}, map[string]bool{}
	}
	v := &variants{base: c.base.p}
	if len(c.overrides) > 0 {
		v.overrides = make(map[ident]*params)
		for src, m := range c.overrides {
			for id, o := range m {
				v.overrides[ident{id, src}] = o.p
				for i, s := range o.tiers {
					if v.overTiers == nil {
						v.overTiers = make(map[identTier]*params)
					}
					v.overTiers[identTier{ident{id, src}, c.r.Tiers[i].Name}] = s.p
				}
			}
		}
	}
	if len(c.tiers) > 0 {
		v.tiers = make(map[string]*params, len(c.tiers))
		for name, s := range c.tiers {
			v.tiers[name] = s.p
		}
	}
	old := hs.rules[c.r.ID]
	h, ok := advance(n.hasher, old, c.r.ID, v, c.r.Penalty != nil, now, old != nil && !hs.seen[c.r.ID])
	if !ok {
		n.log.Warn("rule changed too often within its identities' horizon: its identities start afresh",
			"rule", c.r.ID, "generations", maxGens)
	}
	hs.rules[c.r.ID] = h
	c.hist, c.salt = h, h.salt
	g := h.cur()
	c.base.lim.bind(g.base, h, c.base.p)
	for _, m := range c.overrides {
		for _, o := range m {
			o.lim.bind(g.base, h, o.p)
			for i, s := range o.tiers {
				s.lim.bind(g.tagFor(c.r.Tiers[i].Name), h, s.p)
			}
		}
	}
	for name, s := range c.tiers {
		s.lim.bind(g.tagFor(name), h, s.p)
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

// satAdd is a + b for b >= 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
