package cluster

import (
	"fmt"
	"math/bits"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/prefetch"
	"github.com/weir-dev/weir/quota"
)

// Sketch gating (quota.Sketch, docs/overshoot.md "Sketch gating").
//
// A gated rule keeps, per node, a count-min sketch of what each identity
// spent there in the current period. When Decide meets an identity that has
// no entry on this node (a nodeEntry, or the ownerEntry on the owner), it
// looks the identity up in the sketch. While the estimate plus the cost
// stays within θ_eff = min(Threshold, Slack(n), Burst), the request is
// admitted here with no entry, no sync and no owner bucket (SourceSketch)
// and the sketch is raised by the cost (conservative update: each of the
// identity's counters becomes at least estimate + cost, none more). When it
// would pass θ_eff the identity is promoted: it gets a real entry, with a
// full view as on any first sight, and follows the normal path from then
// on; what it spent through the sketch is never reported.
//
// The estimate never undercounts, so on one node an identity is admitted
// through the sketch at most θ_eff tokens per period, whatever the sketch's
// error; the error only promotes light identities that collided with
// others (memory, not accuracy). Over any interval Δ this adds at most
// N·θ_eff·(⌈Δ/P⌉+1) to the envelope, N the nodes that admit for the
// identity, owner included, and P the period (the interval meets at most
// ⌈Δ/P⌉+1 aligned periods).
//
// The sketch starts over at multiples of P counted from time 0, so that the
// periods depend on the time alone, not on when a node started or ticked.
// Gating is off while Slack(n) < 1 (every admission needs the owner then),
// and Decide does not gate an identity whose owner is down: on_failure
// decides it, as without gating.

// SketchParams is the coordinator's view of a rule's sketch gating: a
// quota.Sketch with its defaults filled in. The zero value (Threshold 0)
// means no gating.
type SketchParams struct {
	// Threshold is the most tokens an identity may spend on one node in
	// one period before it gets an entry, in [1, quota.MaxSketchThreshold];
	// the coordinator uses min(Threshold, Slack(n), Burst).
	Threshold int64
	// Period is how often the sketch starts over (at multiples of Period).
	Period time.Duration
	// Width and Depth are the sketch's counters per row and rows.
	Width, Depth int
}

// newSketchParams fills in the defaults of a rule's sketch and checks it.
func newSketchParams(r *quota.Rule) (SketchParams, error) {
	sk := r.Sketch
	p := SketchParams{Threshold: sk.Threshold, Period: sk.Period, Width: int(sk.Width), Depth: int(sk.Depth)}
	if p.Period == 0 {
		p.Period = r.Window
	}
	if p.Width == 0 {
		p.Width = quota.DefaultSketchWidth
	}
	if p.Depth == 0 {
		p.Depth = quota.DefaultSketchDepth
	}
	switch {
	case r.Mode != quota.ModeShared:
		return SketchParams{}, fmt.Errorf("sketch gating needs mode shared, not %s", r.Mode)
	case p.Threshold < 1 || p.Threshold > quota.MaxSketchThreshold:
		return SketchParams{}, fmt.Errorf("sketch threshold %d is not in [1, %d]", p.Threshold, quota.MaxSketchThreshold)
	case p.Period <= 0:
		return SketchParams{}, fmt.Errorf("sketch period %s is not positive", p.Period)
	case p.Period < r.Window:
		// The envelope's term grows by N·θ per period: a period shorter
		// than the window would let it outgrow a·L per window.
		return SketchParams{}, fmt.Errorf("sketch period %s is shorter than the window %s", p.Period, r.Window)
	case p.Width < 1 || p.Width > quota.MaxSketchWidth:
		return SketchParams{}, fmt.Errorf("sketch width %d is not in [1, %d]", p.Width, quota.MaxSketchWidth)
	case p.Depth < 1 || p.Depth > quota.MaxSketchDepth:
		return SketchParams{}, fmt.Errorf("sketch depth %d is not in [1, %d]", p.Depth, quota.MaxSketchDepth)
	}
	return p, nil
}

// sameShape reports whether a sketch built for p can go on counting for q:
// the threshold may change (the counters stay upper bounds), the period
// and the layout may not.
func (p SketchParams) sameShape(q SketchParams) bool {
	return p.Period == q.Period && p.Width == q.Width && p.Depth == q.Depth
}

// countMin is one rule's sketch on one node: Depth rows of Width one-byte
// counters, row-major, allocated on first use and freed after a period with
// no use. Counters never exceed the threshold (an addition happens only
// when the estimate plus the cost fits under it), so one byte holds them.
type countMin struct {
	p      SketchParams
	seed   uint64
	counts []uint8 // nil until used; len Width·Depth
	start  int64   // the current period is [start, start+Period)
	used   bool    // an addition since start
}

func newCountMin(p SketchParams, seed uint64) *countMin {
	return &countMin{p: p, seed: seed}
}

// periodStart returns the start of the period that holds now: the largest
// multiple of the period not after now.
func (s *countMin) periodStart(now int64) int64 {
	per := int64(s.p.Period)
	q := now / per
	if now%per < 0 {
		q--
	}
	return q * per
}

// roll starts a new period when now has left the current one. A sketch
// not used during the period it leaves gives its memory back.
func (s *countMin) roll(now int64) {
	if s.counts != nil && now >= s.start && now-s.start < int64(s.p.Period) {
		return
	}
	if now < s.start {
		// The clock went back: keep counting in the current period
		// (conservative: nothing is forgotten early).
		return
	}
	s.start = s.periodStart(now)
	if s.counts != nil {
		if s.used {
			clear(s.counts)
		} else {
			s.counts = nil
		}
	}
	s.used = false
}

// slots computes the identity's counter index in each row.
func (s *countMin) slots(identity string, idx *[quota.MaxSketchDepth]int) {
	sketchSlots(s.seed, s.p.Width, s.p.Depth, identity, idx)
}

// sketchSlots is slots for a sketch of the given seed and layout.
func sketchSlots(seed uint64, width, depth int, identity string, idx *[quota.MaxSketchDepth]int) {
	h := bucket.Splitmix64(xxhash.Sum64String(identity) ^ bucket.Splitmix64(seed+sketchGolden))
	w := uint64(width)
	for i := range depth {
		x := bucket.Splitmix64(h + uint64(i+1)*sketchGolden)
		hi, _ := bits.Mul64(x, w) // x·w ÷ 2⁶⁴: uniform in [0, w) for any w
		idx[i] = i*width + int(hi)
	}
}

// SketchHint is where a gated rule's counters live, published by the shell
// for its prefetch: read without the shell's lock, so it holds plain values
// (base is an address, not a pointer: it keeps nothing alive, and a
// prefetch of memory since freed is harmless, it never faults).
type SketchHint struct {
	rule         string
	seed         uint64
	base         uintptr // &counts[0]
	width, depth int
}

// SketchHint returns the hint for ruleID's sketch on this coordinator, or false
// when the rule is not gated or its sketch holds no counters now.
func (c *Coordinator) SketchHint(ruleID string) (SketchHint, bool) {
	r, ok := c.rule(ruleID)
	if !ok || r.sk == nil || r.sk.counts == nil {
		return SketchHint{}, false
	}
	s := r.sk
	return SketchHint{rule: ruleID, seed: s.seed, base: uintptr(unsafe.Pointer(&s.counts[0])), width: s.p.Width, depth: s.p.Depth}, true
}

// Rule returns the id of the rule whose sketch the hint is of.
func (h *SketchHint) Rule() string { return h.rule }

// Prefetch starts loading identity's counters into the cache.
func (h *SketchHint) Prefetch(identity string) {
	var idx [quota.MaxSketchDepth]int
	sketchSlots(h.seed, h.width, h.depth, identity, &idx)
	for i := range h.depth {
		prefetch.Line(h.base + uintptr(idx[i]))
	}
}

// estimate returns the smallest of the identity's counters: never below
// what the identity spent here this period.
func (s *countMin) estimate(idx *[quota.MaxSketchDepth]int) int64 {
	est := int64(255)
	for i := range s.p.Depth {
		est = min(est, int64(s.counts[idx[i]]))
	}
	return est
}

// raise sets each of the identity's counters to at least to (conservative
// update). to is at most the threshold, so it fits a byte.
func (s *countMin) raise(idx *[quota.MaxSketchDepth]int, to int64) {
	v := uint8(to)
	for i := range s.p.Depth {
		if c := &s.counts[idx[i]]; *c < v {
			*c = v
		}
	}
	s.used = true
}

// bytes is the memory the sketch holds now.
func (s *countMin) bytes() int { return len(s.counts) }

const sketchGolden = 0x9E3779B97F4A7C15

// gate decides a request of an identity with no entry on this node under a
// gated rule: admitted through the sketch (ok), or not gated (promoted, or
// gating off), and then the caller takes the normal path.
func (c *Coordinator) gate(now int64, r *RuleParams, identity string, cost int64) (Outcome, bool) {
	s := r.sk
	if s == nil {
		return Outcome{}, false
	}
	theta := min(r.Sketch.Threshold, r.Slack(c.n()), r.Burst)
	if theta < 1 {
		return Outcome{}, false // no slack: every admission needs the owner
	}
	s.roll(now)
	if s.counts == nil {
		s.counts = make([]uint8, s.p.Width*s.p.Depth)
	}
	var idx [quota.MaxSketchDepth]int
	s.slots(identity, &idx)
	spent := s.estimate(&idx) + cost
	if spent > theta {
		c.stats.SketchPromotions++
		return Outcome{}, false
	}
	s.raise(&idx, spent)
	c.stats.SketchAdmits++
	// As on first sight the owner's bucket is taken to be full; what
	// this node admitted for the identity this period (at most the
	// estimate) has been taken from it.
	t := r.gcra.Interval().Nanoseconds()
	return Outcome{Source: SourceSketch, Decision: bucket.Decision{
		Allowed:   true,
		Limit:     r.Burst,
		Remaining: r.Burst - spent,
		Reset:     time.Duration(spent * t),
	}}, true
}

// setSketches gives each gated rule of next its sketch: the one it had in
// prev when the period and layout are unchanged (a new threshold keeps the
// counts: they stay upper bounds), else a new, empty one. A reload that
// changes the period, width or depth thus forgets this period's counts:
// one more θ_eff per node and identity, once.
func (c *Coordinator) setSketches(prev, next map[string]*RuleParams) {
	for id, r := range next {
		r.sk = nil
		if r.Sketch.Threshold == 0 {
			continue
		}
		if p := prev[id]; p != nil && p.sk != nil && p.sk.p.sameShape(r.Sketch) {
			p.sk.p = r.Sketch
			r.sk = p.sk
			continue
		}
		r.sk = newCountMin(r.Sketch, c.cfg.SketchSeed)
	}
}
