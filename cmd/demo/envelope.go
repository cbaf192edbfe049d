package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
)

// This file computes what the clients' records are checked against: the
// reference (one exact GCRA bucket per identity, fed every request in send
// order, docs/overshoot.md's reference) and the envelope (over any interval Δ
// at most B + r·Δ + S admitted; docs/global.md's for a global rule).

// limits is one version of a rule, as far as the envelope needs it.
type limits struct {
	limit    int64
	window   time.Duration
	burst    int64
	accuracy float64
}

func limitsOf(r quota.Rule) limits {
	a := r.Accuracy
	if a == 0 {
		a = quota.DefaultAccuracy
	}
	return limits{limit: r.Limit, window: r.Window, burst: r.Burst, accuracy: a}
}

func (l limits) String() string {
	return fmt.Sprintf("%d/%v burst %d", l.limit, shortDuration(l.window), l.burst)
}

// rate is tokens per nanosecond.
func (l limits) rate() float64 { return float64(l.limit) / float64(l.window) }

// slackOne is one node's slack in a region of k nodes: ⌊a·L ÷ k⌋.
func (l limits) slackOne(k int) int64 {
	return int64(math.Floor(l.accuracy * float64(l.limit) / float64(k)))
}

// regionSlack is S for a region rule: the slack of the non-owner nodes,
// the largest over the region's sizes during the run (1 to n live nodes,
// as nodes stop and restart).
func (l limits) regionSlack(n int) int64 {
	var s int64
	for k := 1; k <= n; k++ {
		s = max(s, int64(k-1)*l.slackOne(k))
	}
	return s
}

// globalSlack is Σᵣ Nᵣ·sᵣ of docs/global.md for regions of n nodes, the
// largest over the sizes a region takes during the run.
func (l limits) globalSlack(regions, n int) int64 {
	var s int64
	for k := 1; k <= n; k++ {
		s = max(s, int64(k)*l.slackOne(k))
	}
	return int64(regions) * s
}

// timing is the allowance for the gap between a client's send time and
// the gateway's decision (the records carry send times): the tokens that
// refill in 100ms, plus one.
func (l limits) timing() int64 {
	return int64(math.Ceil(l.rate()*float64(100*time.Millisecond))) + 1
}

// phase is a rule's version in force over [from, to) (unix ns of send
// times), and the slack S that goes with it.
type phase struct {
	from, to int64
	lim      limits
	slack    int64
	// fault is the fault term: the tokens the decisions made by
	// on_failure (owner unreachable or slow: degraded, counted as
	// fail-open) may have admitted, each at most the rule's largest cost.
	// Zero in a run with no such decision.
	fault int64
}

// reference counts what one exact GCRA bucket admits of recs (sorted by
// send time), the rule switching versions at each phase's start (keeping
// its state, as the owner's bucket does on a rule change).
func reference(recs []record, phases []phase) int64 {
	var tat bucket.TAT
	var n int64
	p := 0
	g := mustGCRA(phases[0].lim)
	for _, r := range recs {
		for p+1 < len(phases) && r.at >= phases[p+1].from {
			p++
			g = mustGCRA(phases[p].lim)
		}
		if g.Step(&tat, r.at, r.cost).Allowed {
			n++
		}
	}
	return n
}

func mustGCRA(l limits) bucket.GCRA {
	g, err := bucket.NewGCRA(l.limit, l.window, l.burst)
	if err != nil {
		panic(err) // the rules validated
	}
	return g
}

// worstExcess is the largest amount by which the tokens admitted over any
// interval [t_i, t_j] of recs (sorted; only admitted records count) with
// send times in [from, to) exceed rate·(t_j − t_i): the envelope bounds it
// by B + S. It runs in one pass: excess(i, j) = (P_j − r·t_j) − (P_{i−1} −
// r·t_i), P the prefix sums of the costs.
func worstExcess(recs []record, rate float64, from, to int64) (worst float64, lo, hi int64) {
	minStart := math.Inf(1)
	var p float64 // P_{j}, relative to the first record in range
	var t0, minAt int64
	first := true
	for _, r := range recs {
		if !r.ok || r.at < from || r.at >= to {
			continue
		}
		if first {
			t0, first = r.at, false
		}
		x := rate * float64(r.at-t0)
		if p-x < minStart { // P_{i−1} − r·t_i with i = this record
			minStart, minAt = p-x, r.at
		}
		p += float64(r.cost)
		if v := p - x - minStart; v > worst {
			worst, lo, hi = v, minAt, r.at
		}
	}
	return worst, lo, hi
}

// ringChange is a node leaving its region's ring (gracefully: Close hands
// its buckets over) or joining it (a restart under the same name), from the
// call that started it to the moment every live node's ring agreed again.
type ringChange struct {
	region  string
	node    string
	join    bool
	from    int64 // unix ns
	settled int64
}

// changeTail is how long after the views agree a ring change still acts:
// a leaver decides for nodes whose view lagged for up to one call timeout;
// a new owner's warm-up ends by the handoff timeout at the latest.
func (c ringChange) tail() time.Duration {
	if c.join {
		return cluster.DefaultHandoffTimeout
	}
	return demoCallTimeout
}

// window is the span of send times the change's term applies to.
func (c ringChange) window() (from, to int64) {
	return c.from, c.settled + int64(c.tail())
}

// term is docs/overshoot.md's fault term of the change for a rule of
// limits l in a region of n nodes: 2B + S_f + 2⌈r·G⌉ for a join or restart
// (two owners with fresh or duplicated state while views converge), B + S_f
// + ⌈r·(G + call timeout)⌉ for a graceful leave (the leaver keeps deciding
// for lagging nodes on state the new owner does not see). G is the measured
// convergence; S_f the slack total while views disagree, (n − 1)·s(2).
func (c ringChange) term(l limits, n int) int64 {
	g := float64(c.settled - c.from)
	var sf int64
	if n >= 2 {
		sf = int64(n-1) * l.slackOne(2)
	}
	if c.join {
		return 2*l.burst + sf + 2*int64(math.Ceil(l.rate()*g))
	}
	return l.burst + sf + int64(math.Ceil(l.rate()*(g+float64(demoCallTimeout))))
}

// check is one envelope check of a phase: over every interval that
// overlaps no ring change, the excess over r·Δ against B + S + timing + F;
// over every interval, against that plus J, the terms of the ring changes
// in the phase.
type check struct {
	phase  phase
	excess float64
	from   int64 // the worst interval's first and last send times
	to     int64
	bound  int64
	// Across ring changes: every interval, bound + J. changes is how many
	// ring changes fall in the phase (0: the quiet check covers it all).
	changes   int
	jterm     int64
	excessAll float64
	fromAll   int64
	toAll     int64
}

// quietHeld: every interval that overlaps no ring change is within bound.
func (c check) quietHeld() bool { return c.excess <= float64(c.bound) }

// allHeld: every interval is within bound plus the ring changes' terms.
func (c check) allHeld() bool { return c.excessAll <= float64(c.bound+c.jterm) }

func (c check) held() bool { return c.quietHeld() && c.allHeld() }

// checkPhases checks recs against every phase, with the ring changes that
// touch the client's regions (n nodes a region).
func checkPhases(recs []record, phases []phase, changes []ringChange, n int) []check {
	var out []check
	for _, p := range phases {
		k := check{phase: p, bound: p.lim.burst + p.slack + p.lim.timing() + p.fault}
		// The quiet segments: the phase less every change's window.
		var wins [][2]int64
		for _, c := range changes {
			from, to := c.window()
			if to <= p.from || from >= p.to {
				continue
			}
			wins = append(wins, [2]int64{max(from, p.from), min(to, p.to)})
			k.changes++
			k.jterm += c.term(p.lim, n)
		}
		slices.SortFunc(wins, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
		at := p.from
		quiet := func(from, to int64) {
			if from >= to {
				return
			}
			if ex, lo, hi := worstExcess(recs, p.lim.rate(), from, to); ex > k.excess {
				k.excess, k.from, k.to = ex, lo, hi
			}
		}
		for _, w := range wins {
			quiet(at, w[0])
			at = max(at, w[1])
		}
		quiet(at, p.to)
		k.excessAll, k.fromAll, k.toAll = k.excess, k.from, k.to
		if k.changes > 0 {
			k.excessAll, k.fromAll, k.toAll = worstExcess(recs, p.lim.rate(), p.from, p.to)
		}
		out = append(out, k)
	}
	return out
}

func sortRecords(rs []record) {
	slices.SortStableFunc(rs, func(a, b record) int { return cmp.Compare(a.at, b.at) })
}

// shortDuration prints 1m0s as 1m and 1s as 1s.
func shortDuration(d time.Duration) string {
	switch {
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
