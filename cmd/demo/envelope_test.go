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

// TestSlack checks the envelope's slack terms against DESIGN.md's and
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
