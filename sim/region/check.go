package region

import (
	"math"
	"slices"
)

// The checks of docs/overshoot.md's envelope, run as streams over each identity's
// admissions in time order (so that a ten-minute run with a hundred
// thousand decisions a second needs no record of them):
//
//   - upper: max over intervals [tᵢ, tⱼ] between admissions of admitted −
//     r·Δ − B, the slack term the run actually used, against S plus the
//     stated fault terms;
//   - lower: max over intervals strictly between admissions (and the ends
//     of a fault-free segment) of r·Δ − admitted, for saturating clients,
//     against S + c + ⌈r·ℓ⌉.
//
// Admissions arrive out of order (a remote admission counts at the owner's
// decision time, up to one call timeout before the requester learns it), so
// they pass through a reorder buffer first: each drain sorts what came in
// since the last one and merges it into the sorted backlog, whose head up
// to the drain's time it feeds to the checks in (time, arrival) order.

// upStream is the streaming upper check: rate is tokens per ns, times are
// ns since the run's start.
type upStream struct {
	prefix, minStart, best float64
	n                      int64
}

func newUp() upStream { return upStream{minStart: math.Inf(1), best: math.Inf(-1)} }

func (u *upStream) add(t int64, cost int64, rate float64) {
	v := u.prefix - rate*float64(t)
	if v < u.minStart {
		u.minStart = v
	}
	u.prefix += float64(cost)
	if w := u.prefix - rate*float64(t) - u.minStart; w > u.best {
		u.best = w
	}
	u.n++
}

// lowStream is the streaming lower check over one fault-free segment.
type lowStream struct {
	prefix, maxStart, worst float64
	// startAt is the time of maxStart; from and to bound the worst interval.
	startAt, from, to int64
}

func newLow() lowStream { return lowStream{maxStart: math.Inf(-1), worst: math.Inf(-1)} }

// point adds an admission (or, with cost 0, a segment end) at t.
func (l *lowStream) point(t int64, cost int64, rate float64) {
	if v := l.maxStart - (l.prefix - rate*float64(t)); v > l.worst {
		l.worst, l.from, l.to = v, l.startAt, t
	}
	l.prefix += float64(cost)
	if v := l.prefix - rate*float64(t); v > l.maxStart {
		l.maxStart, l.startAt = v, t
	}
}

// segment is a half-open fault-free interval [from, to) of run time (ns).
type segment struct{ from, to int64 }

// cleanSegments returns the complement of the fault windows within [0, end).
func cleanSegments(windows []segment, end int64) []segment {
	ws := slices.Clone(windows)
	slices.SortFunc(ws, func(a, b segment) int { return int(a.from - b.from) })
	var out []segment
	at := int64(0)
	for _, w := range ws {
		if w.from > at {
			out = append(out, segment{at, min(w.from, end)})
		}
		at = max(at, w.to)
		if at >= end {
			break
		}
	}
	if at < end {
		out = append(out, segment{at, end})
	}
	var keep []segment
	for _, s := range out {
		if s.to > s.from {
			keep = append(keep, s)
		}
	}
	return keep
}

// idCheck is the state of one identity's checks.
type idCheck struct {
	acc upStream // accounted (not degraded) admissions, every interval
	// all is every admission, every interval, once split: until the
	// identity's first degraded admission it is acc (the same
	// admissions), and only acc is kept.
	all   upStream
	split bool
	clean upStream // every admission, intervals within one fault-free segment
	low   lowStream
	// pts holds every admission of a gated run, in time order, for the
	// exact pass (gatedPass).
	pts []gPoint
	seg int // index of the clean segment the clean and low streams are in; -1 none yet
	// lowSeen is the number of clean segments the low stream has closed
	// or is in, for segments with no admission at all.
	lowSeen int
}

// checker holds every identity's checks and the reorder buffer.
type checker struct {
	rate      float64 // tokens per ns
	segs      []segment
	lowEnd    int64 // the lower bound is checked up to here (end of traffic)
	saturated bool
	lastSeg   int // the segment segOf found last (a hint)
	ids       []idCheck
	seq       uint64
	// fresh holds the admissions recorded since the last drain, in
	// arrival order; backlog those not fed yet, sorted, from head on;
	// tail is scratch space for merging.
	fresh, backlog, tail []admission
	head                 int

	worstAcc, worstAll, worstClean, worstLow float64
	worstAccID, worstCleanID, worstLowID     int
	lowFrom, lowTo                           int64 // the worst shortfall\'s interval

	// Sketch gating: gated runs keep every admission for an exact pass
	// at the end (gatedPass), with the sketch term K·(⌈Δ/P⌉ + 1), K =
	// N·θ_eff, P the sketch period (ns).
	gated                       bool
	gK                          float64
	gP                          int64
	gAcc, gAll, gClean, gSketch float64
	gAccID, gSketchID           int

	// Key cap runs: capTerm[i] is the key cap term identity i has
	// gathered (Region.evicted): each identity's excess is scored beyond
	// its own term. worstAccRaw is the worst accounted excess without it.
	capTerm       []float64
	worstAccRaw   float64
	worstAccRawID int

	// Multi-rule runs: refundTerm[i] is identity i's refund term
	// (ruleRun.noteRefund): the most tokens of its refunded charges made
	// by one instant and given back after it. A refund gives tokens back
	// to the bucket, so over [t₁, t₂] the charges that stood are at most
	// B + r·Δ (+ S and the fault terms) plus what was refunded in
	// (t₁, t₂] of charges made before t₁: each identity's excess is
	// scored beyond its term.
	refundTerm []float64

	// late counts admissions fed before one fed earlier: the reorder
	// horizon was too short (a simulator error, reported); fedAt is the
	// time of the last one fed.
	late  int64
	fedAt int64
}

// term returns identity i's key cap term and refund term so far (0
// without a key cap, in a one-rule run).
func (c *checker) term(i int) float64 {
	t := 0.0
	if c.capTerm != nil {
		t = c.capTerm[i]
	}
	if c.refundTerm != nil {
		t += c.refundTerm[i]
	}
	return t
}

// gPoint is one admission of a gated run.
type gPoint struct {
	at              int64
	cost            float64
	degraded, gated bool
}

type admission struct {
	at       int64 // ns since start
	seq      uint64
	ident    int32
	cost     int64
	degraded bool
	sketch   bool // admitted through the sketch
}

// before orders admissions by time, then by arrival.
func (a *admission) before(b *admission) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func cmpAdmission(a, b admission) int {
	if a.before(&b) {
		return -1
	}
	if b.before(&a) {
		return 1
	}
	return 0
}

func newChecker(ids int, rate float64, segs []segment, lowEnd int64, saturated bool) *checker {
	c := &checker{rate: rate, segs: segs, lowEnd: lowEnd, saturated: saturated, ids: make([]idCheck, ids),
		worstAcc: math.Inf(-1), worstAll: math.Inf(-1), worstClean: math.Inf(-1), worstLow: math.Inf(-1), worstAccRaw: math.Inf(-1)}
	for i := range c.ids {
		c.ids[i] = idCheck{acc: newUp(), all: newUp(), clean: newUp(), low: newLow(), seg: -1}
	}
	return c
}

// gate turns on the exact pass of a gated run: the sketch term is
// k·(⌈Δ/P⌉ + 1) tokens over an interval of length Δ, p = P in ns.
func (c *checker) gate(k float64, p int64) {
	c.gated, c.gK, c.gP = true, k, p
	c.gAcc, c.gAll, c.gClean, c.gSketch = math.Inf(-1), math.Inf(-1), math.Inf(-1), math.Inf(-1)
}

// record queues an admission at t (ns since start); sketch marks one
// admitted through the sketch.
func (c *checker) record(t int64, ident int, cost int64, degraded, sketch bool) {
	c.seq++
	c.fresh = append(c.fresh, admission{at: t, seq: c.seq, ident: int32(ident), cost: cost, degraded: degraded, sketch: sketch})
}

// drain feeds the checks every queued admission at or before upTo, in
// (time, arrival) order.
func (c *checker) drain(upTo int64) {
	if len(c.fresh) > 0 {
		c.merge()
	}
	for c.head < len(c.backlog) && c.backlog[c.head].at <= upTo {
		c.feed(c.backlog[c.head])
		c.head++
	}
	if c.head == len(c.backlog) {
		c.backlog, c.head = c.backlog[:0], 0
	} else if c.head >= 1024 && c.head >= len(c.backlog)/2 {
		n := copy(c.backlog, c.backlog[c.head:])
		c.backlog, c.head = c.backlog[:n], 0
	}
}

// merge sorts the fresh admissions into the backlog. They are mostly
// later than the backlog's: only the backlog's part after the earliest
// fresh one moves.
func (c *checker) merge() {
	f := c.fresh
	sortAdmissions(f)
	b := c.backlog[c.head:]
	p, _ := slices.BinarySearchFunc(b, f[0], cmpAdmission) // seqs are unique: never found
	c.tail = append(c.tail[:0], b[p:]...)
	c.backlog = c.backlog[:c.head+p]
	i, j := 0, 0
	for i < len(c.tail) && j < len(f) {
		if c.tail[i].before(&f[j]) {
			c.backlog = append(c.backlog, c.tail[i])
			i++
		} else {
			c.backlog = append(c.backlog, f[j])
			j++
		}
	}
	c.backlog = append(c.backlog, c.tail[i:]...)
	c.backlog = append(c.backlog, f[j:]...)
	c.fresh = f[:0]
}

// sortAdmissions sorts a by (time, arrival). The admissions come in
// arrival order, which is mostly time order (a remote admission counts at
// its owner's decision, a little earlier than it arrives): an insertion
// sort from the back moves each only past the few it precedes. Should a
// batch be far out of order (a long fault), it falls back to a general
// sort past a budget of moves. (time, arrival) is a total order, so both
// give the same result.
func sortAdmissions(a []admission) {
	budget := 16 * len(a)
	for i := 1; i < len(a); i++ {
		if !a[i].before(&a[i-1]) {
			continue
		}
		x := a[i]
		j := i
		for j > 0 && x.before(&a[j-1]) {
			a[j] = a[j-1]
			j--
		}
		a[j] = x
		if budget -= i - j; budget < 0 {
			slices.SortFunc(a, cmpAdmission)
			return
		}
	}
}

// segIndex returns the index of the segment of segs (sorted, disjoint:
// cleanSegments) that holds t, or -1.
func segIndex(segs []segment, t int64) int {
	i, found := slices.BinarySearchFunc(segs, t, func(s segment, t int64) int {
		switch {
		case s.to <= t:
			return -1
		case s.from > t:
			return 1
		}
		return 0
	})
	if !found {
		return -1
	}
	return i
}

// segOf returns the index of the clean segment holding t, or -1.
func (c *checker) segOf(t int64) int {
	// Admissions are fed in time order: mostly the last segment found.
	if k := c.lastSeg; k < len(c.segs) && c.segs[k].from <= t && t < c.segs[k].to {
		return k
	}
	i := segIndex(c.segs, t)
	if i >= 0 {
		c.lastSeg = i
	}
	return i
}

func (c *checker) feed(a admission) {
	if a.at < c.fedAt {
		c.late++
	}
	c.fedAt = a.at
	ic := &c.ids[a.ident]
	if c.gated {
		ic.pts = append(ic.pts, gPoint{at: a.at, cost: float64(a.cost), degraded: a.degraded, gated: a.sketch})
	}
	switch {
	case !a.degraded && !ic.split:
		ic.acc.add(a.at, a.cost, c.rate) // all is acc
	case !a.degraded:
		ic.acc.add(a.at, a.cost, c.rate)
		ic.all.add(a.at, a.cost, c.rate)
	default:
		if !ic.split {
			ic.all, ic.split = ic.acc, true
		}
		ic.all.add(a.at, a.cost, c.rate)
	}
	s := c.segOf(a.at)
	if s != ic.seg {
		c.closeSeg(int(a.ident), s)
	}
	if s >= 0 {
		ic.clean.add(a.at, a.cost, c.rate)
		if c.saturated && a.at <= c.lowEnd {
			ic.low.point(a.at, a.cost, c.rate)
		}
	}
}

// closeSeg ends identity i's current clean segment and opens segment s (-1:
// a fault window), scoring the segments skipped on the way, in which a
// saturating client admitted nothing.
func (c *checker) closeSeg(i, s int) {
	ic := &c.ids[i]
	if ic.seg >= 0 {
		c.scoreClean(i)
		if c.saturated {
			ic.low.point(min(c.segs[ic.seg].to, c.lowEnd), 0, c.rate)
			c.scoreLow(i)
		}
	}
	if s >= 0 && c.saturated {
		for j := ic.lowSeen; j < s; j++ {
			c.scoreGap(i, c.segs[j])
		}
	}
	ic.seg = s
	ic.clean = newUp()
	ic.low = newLow()
	if s >= 0 {
		ic.lowSeen = s + 1
		if c.saturated && c.segs[s].from <= c.lowEnd {
			ic.low.point(c.segs[s].from, 0, c.rate)
		}
	}
}

// scoreGap scores a whole segment with no admission as a shortfall of r·Δ.
func (c *checker) scoreGap(i int, s segment) {
	to := min(s.to, c.lowEnd)
	if to <= s.from {
		return
	}
	if v := c.rate * float64(to-s.from); v > c.worstLow {
		c.worstLow, c.worstLowID, c.lowFrom, c.lowTo = v, i, s.from, to
	}
}

func (c *checker) scoreClean(i int) {
	if v := c.ids[i].clean.best - c.term(i); v > c.worstClean {
		c.worstClean, c.worstCleanID = v, i
	}
}

func (c *checker) scoreLow(i int) {
	if l := &c.ids[i].low; l.worst > c.worstLow {
		c.worstLow, c.worstLowID, c.lowFrom, c.lowTo = l.worst, i, l.from, l.to
	}
}

// finish drains everything and scores what is still open.
func (c *checker) finish() {
	c.drain(math.MaxInt64)
	for i := range c.ids {
		ic := &c.ids[i]
		if ic.seg >= 0 {
			c.scoreClean(i)
			if c.saturated {
				ic.low.point(min(c.segs[ic.seg].to, c.lowEnd), 0, c.rate)
				c.scoreLow(i)
			}
		}
		if c.saturated {
			for j := ic.lowSeen; j < len(c.segs); j++ {
				c.scoreGap(i, c.segs[j])
			}
		}
		if v := ic.acc.best - c.term(i); v > c.worstAcc {
			c.worstAcc, c.worstAccID = v, i
		}
		if ic.acc.best > c.worstAccRaw {
			c.worstAccRaw, c.worstAccRawID = ic.acc.best, i
		}
		if !ic.split {
			ic.all = ic.acc
		}
		if v := ic.all.best - c.term(i); v > c.worstAll {
			c.worstAll = v
		}
		if c.gated {
			c.gatedPass(i)
		}
	}
}

// The sketch term depends on Δ through ⌈Δ/P⌉, which the streams above
// cannot carry (their running minimum is over starts of any age). Gated
// runs therefore keep every admission and take an exact pass over them at
// the end: for each end j and each k = ⌈Δ/P⌉, the best start lies in the
// index range whose times fall in [tⱼ − k·P, tⱼ − (k−1)·P) (k = 0: tᵢ =
// tⱼ), and a monotone deque per k gives its maximum as j advances. That
// is O(n·(D/P + 1)) per identity for n admissions over D, instead of the
// O(n²) of every pair, and exact: it scores every interval between
// admissions, as the streams do, against its own term.

// bestByK returns, for each k = ⌈Δ/P⌉, the largest Σ cost − rate·Δ over
// the intervals [tᵢ, tⱼ] between the points (in time order) with
// Δ = tⱼ − tᵢ in that class; -Inf where there is none.
func bestByK(pts []gPoint, keep func(*gPoint) bool, rate float64, per int64) []float64 {
	var ts []int64
	var v []float64 // rate·tᵢ − Σ cost before i
	var cs []float64
	sum := 0.0
	for i := range pts {
		if !keep(&pts[i]) {
			continue
		}
		ts = append(ts, pts[i].at)
		v = append(v, rate*float64(pts[i].at)-sum)
		sum += pts[i].cost
		cs = append(cs, sum)
	}
	if len(ts) == 0 {
		return nil
	}
	kmax := int((ts[len(ts)-1]-ts[0]+per-1)/per) + 1
	best := make([]float64, kmax+1)
	for k := range best {
		best[k] = math.Inf(-1)
	}
	dq := make([][]int, kmax+1)
	head := make([]int, kmax+1)
	next := make([]int, kmax+1)
	group, groupBest := 0, math.Inf(-1)
	for j := range ts {
		end := cs[j] - rate*float64(ts[j])
		if ts[j] != ts[group] {
			group, groupBest = j, math.Inf(-1)
		}
		groupBest = max(groupBest, v[j])
		best[0] = max(best[0], end+groupBest)
		for k := 1; k <= kmax; k++ {
			lo, hi := ts[j]-int64(k)*per, ts[j]-int64(k-1)*per
			q := dq[k]
			for next[k] <= j && ts[next[k]] < hi {
				x := next[k]
				for len(q) > head[k] && v[q[len(q)-1]] <= v[x] {
					q = q[:len(q)-1]
				}
				q = append(q, x)
				next[k]++
			}
			for head[k] < len(q) && ts[q[head[k]]] < lo {
				head[k]++
			}
			if head[k] < len(q) {
				best[k] = max(best[k], end+v[q[head[k]]])
			}
			dq[k] = q
		}
	}
	return best
}

// worstWithTerm returns the largest best[k] − term·(k + 1).
func worstWithTerm(best []float64, term float64) float64 {
	w := math.Inf(-1)
	for k, b := range best {
		w = max(w, b-term*float64(k+1))
	}
	return w
}

// gatedPass scores identity i's admissions of a gated run: accounted,
// all and fault-free intervals against B + r·Δ + K·(⌈Δ/P⌉ + 1), and the
// sketch admissions alone per aligned period met, K·(⌈Δ/P⌉ + 1) ÷
// (⌈Δ/P⌉ + 1) = K at most.
func (c *checker) gatedPass(i int) {
	pts := c.ids[i].pts
	if v := worstWithTerm(bestByK(pts, func(p *gPoint) bool { return !p.degraded }, c.rate, c.gP), c.gK) - c.term(i); v > c.gAcc {
		c.gAcc, c.gAccID = v, i
	}
	c.gAll = max(c.gAll, worstWithTerm(bestByK(pts, func(*gPoint) bool { return true }, c.rate, c.gP), c.gK)-c.term(i))
	for k, b := range bestByK(pts, func(p *gPoint) bool { return p.gated }, 0, c.gP) {
		if v := b / float64(k+1); v > c.gSketch {
			c.gSketch, c.gSketchID = v, i
		}
	}
	for _, seg := range c.segs {
		lo, _ := slices.BinarySearchFunc(pts, seg.from, func(p gPoint, t int64) int { return cmpInt(p.at, t) })
		hi, _ := slices.BinarySearchFunc(pts, seg.to, func(p gPoint, t int64) int { return cmpInt(p.at, t) })
		if lo == hi {
			continue
		}
		c.gClean = max(c.gClean, worstWithTerm(bestByK(pts[lo:hi], func(*gPoint) bool { return true }, c.rate, c.gP), c.gK)-c.term(i))
	}
	c.ids[i].pts = nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
