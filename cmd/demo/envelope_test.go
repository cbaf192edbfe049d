package main

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestWorstExcess checks the one-pass worst excess against the direct
// definition, max over i ≤ j of Σ cost[i..j] − r·(t_j − t_i), on random
// records.
func TestWorstExcess(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 200 {
		var recs []record
		at := int64(0)
		for range n % 40 {
			at += rng.Int64N(int64(300 * time.Millisecond))
			recs = append(recs, record{at: at, cost: 1 + rng.Int64N(5)*rng.Int64N(2), ok: rng.IntN(4) > 0})
		}
		rate := 10.0 / float64(time.Second)
		got, _, _ := worstExcess(recs, rate, math.MinInt64, math.MaxInt64)
		want := 0.0
		for i := range recs {
			if !recs[i].ok {
				continue
			}
			sum := 0.0
			for j := i; j < len(recs); j++ {
				if !recs[j].ok {
					continue
				}
				sum += float64(recs[j].cost)
				want = max(want, sum-rate*float64(recs[j].at-recs[i].at))
			}
		}
		if math.Abs(got-want) > 1e-6 {
			t.Fatalf("case %d: worstExcess = %v, want %v", n, got, want)
		}
	}
}

// TestReference: the reference admits a burst of B at once, then one per
// interval, and switching to a tighter version keeps the bucket's state.
func TestReference(t *testing.T) {
	old := limits{limit: 600, window: time.Minute, burst: 20}
	var recs []record
	for i := range 40 { // 40 requests at once
		recs = append(recs, record{at: int64(i), cost: 1})
	}
	if got := reference(recs, []phase{{from: math.MinInt64, lim: old}}); got != 20 {
		t.Fatalf("a burst of 40 at once: reference admitted %d, want the burst, 20", got)
	}
	// One request every 50ms for 10 s against 10/s burst 20: 20 + 10 per
	// second.
	recs = recs[:0]
	for i := range 200 {
		recs = append(recs, record{at: int64(i) * int64(50*time.Millisecond), cost: 1})
	}
	if got := reference(recs, []phase{{from: math.MinInt64, lim: old}}); got < 118 || got > 121 {
		t.Fatalf("20/s for 10 s against 10/s burst 20: reference admitted %d, want about 120", got)
	}
	// Tightened to 5/s at 5 s: about 20 + 50 + 25.
	tight := limits{limit: 300, window: time.Minute, burst: 10}
	if got := reference(recs, []phase{{from: math.MinInt64, lim: old}, {from: int64(5 * time.Second), lim: tight}}); got < 92 || got > 97 {
		t.Fatalf("tightened at 5 s: reference admitted %d, want about 95", got)
	}
}

// TestSlack checks the envelope's slack terms against docs/overshoot.md's and
// docs/global.md's formulas.
func TestSlack(t *testing.T) {
	l := limits{limit: 600, window: time.Minute, burst: 20, accuracy: 0.05}
	// 3 nodes: 2 non-owners × ⌊30/3⌋ = 20 (2 nodes: 1 × 15).
	if got := l.regionSlack(3); got != 20 {
		t.Fatalf("regionSlack(3) = %d, want 20", got)
	}
	g := limits{limit: 1200, window: time.Minute, burst: 40, accuracy: 0.025}
	// Per region at most a·L = 30 (3 × 10, 2 × 15, 1 × 30); two regions 60.
	if got := g.globalSlack(2, 3); got != 60 {
		t.Fatalf("globalSlack(2, 3) = %d, want 60", got)
	}
}

// TestCheckAcrossRingChanges: an extra burst inside a ring change's window
// is held to the bound plus the change's term, not to the quiet bound; the
// same burst where no change happened breaks the quiet bound; and
// intervals that only touch quiet time are checked as tightly as before.
func TestCheckAcrossRingChanges(t *testing.T) {
	sec := int64(time.Second)
	lim := limits{limit: 10, window: time.Second, burst: 5, accuracy: 0.1}
	ph := []phase{{from: math.MinInt64, to: math.MaxInt64, lim: lim, slack: lim.regionSlack(3)}}
	// One admitted request every 100 ms for 20 s (r·Δ exactly), and 12
	// extra at t = 10 s.
	var recs []record
	for i := range int64(200) {
		recs = append(recs, record{at: i * sec / 10, cost: 1, ok: true})
	}
	for range 12 {
		recs = append(recs, record{at: 10*sec + 1, cost: 1, ok: true})
	}
	sortRecords(recs)
	join := ringChange{region: "eu", node: "n1", join: true, from: 9 * sec, settled: 9*sec + sec/2}

	k := checkPhases(recs, ph, nil, 3)[0]
	if k.held() || k.changes != 0 {
		t.Fatalf("no ring change: excess %.1f against bound %d held (changes %d), want broken", k.excess, k.bound, k.changes)
	}
	k = checkPhases(recs, ph, []ringChange{join}, 3)[0]
	// G = 0.5 s: J = 2B + 2·s(2) + 2⌈r·G⌉ = 10 + 2·0 + 10 (s(2) = ⌊1 ÷ 2⌋).
	if want := int64(2*5 + 2*lim.slackOne(2) + 2*5); k.jterm != want || k.changes != 1 {
		t.Fatalf("J = %d over %d changes, want %d over 1", k.jterm, k.changes, want)
	}
	if !k.held() {
		t.Fatalf("burst in the join's window: quiet %.1f ≤ %d, across %.1f ≤ %d should hold", k.excess, k.bound, k.excessAll, k.bound+k.jterm)
	}
	if k.excess > 1.5 || k.excessAll < 12 {
		t.Fatalf("quiet excess %.1f (want about 1: the steady stream), across %.1f (want ≥ 12: the burst)", k.excess, k.excessAll)
	}
	// The window ends a handoff timeout after the views agreed: a burst
	// after that is quiet time again.
	late := ringChange{region: "eu", node: "n1", join: true, from: 9*sec - 3*sec, settled: 9*sec - 2*sec}
	if k = checkPhases(recs, ph, []ringChange{late}, 3)[0]; k.held() {
		t.Fatalf("a burst %v after the join settled was excused: quiet %.1f ≤ %d", 3*time.Second, k.excess, k.bound)
	}
	// A leave's term counts the call timeout.
	leave := ringChange{join: false, from: 0, settled: sec}
	if got, want := leave.term(lim, 3), int64(5+lim.slackOne(2)*2+int64(math.Ceil(10*(1+demoCallTimeout.Seconds())))); got != want {
		t.Fatalf("leave term %d, want %d", got, want)
	}
}
