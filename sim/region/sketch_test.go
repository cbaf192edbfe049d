package region

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"
)

// TestGatedPassAgainstBruteForce compares the exact pass of gated runs
// (bestByK with the sketch term) with a direct scan over every pair of
// admissions.
func TestGatedPassAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		n := 1 + rng.IntN(40)
		rate := rng.Float64()
		per := 1 + rng.Int64N(20)
		term := 3 * rng.Float64()
		var pts []gPoint
		at := int64(0)
		for range n {
			at += rng.Int64N(6)
			pts = append(pts, gPoint{at: at, cost: float64(1 + rng.IntN(3)), gated: rng.IntN(2) == 0})
		}
		keep := func(p *gPoint) bool { return p.gated }
		got := worstWithTerm(bestByK(pts, keep, rate, per), term)
		want := math.Inf(-1)
		for i := range pts {
			if !keep(&pts[i]) {
				continue
			}
			sum := 0.0
			for j := i; j < len(pts); j++ {
				if !keep(&pts[j]) {
					continue
				}
				sum += pts[j].cost
				d := pts[j].at - pts[i].at
				k := (d + per - 1) / per
				want = max(want, sum-rate*float64(d)-term*float64(k+1))
			}
		}
		if got != want && math.Abs(got-want) > 1e-9 {
			t.Fatalf("trial %d: exact pass %.4f, brute force %.4f", trial, got, want)
		}
	}
}

// TestGatedZipf: gated runs with many identities of Zipf traffic on 3 and
// 5 nodes keep the envelope with the sketch term, admit through the
// sketch, make no on_failure decision, and are deterministic.
func TestGatedZipf(t *testing.T) {
	for _, nodes := range []int{3, 5} {
		cfg := Config{Nodes: nodes, Accuracy: 0.2, Sketch: 4, Traffic: TrafficZipf, IDs: 2000, Rate: 5000,
			Duration: 3 * time.Second, Seed: 7}
		var out [2]bytes.Buffer
		var r *Result
		for i := range out {
			var err error
			if r, err = Run(cfg); err != nil {
				t.Fatal(err)
			}
			r.Summary(&out[i])
		}
		if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
			t.Fatalf("%d nodes: two runs of one seed differ:\n%s\n---\n%s", nodes, out[0].String(), out[1].String())
		}
		if !r.OK() {
			t.Errorf("%d nodes: %s\n  go run ./sim %s", nodes, strings.Join(r.Violations, "; "), r.Config.Flags())
		}
		if r.Degraded != 0 {
			t.Errorf("%d nodes: %d on_failure decisions with no fault", nodes, r.Degraded)
		}
		if r.BySource[cluster.SourceSketch] == 0 || r.Coord.SketchAdmits == 0 {
			t.Errorf("%d nodes: nothing admitted through the sketch:\n%s", nodes, out[0].String())
		}
		if r.SketchN != nodes || r.SketchTheta != 4 {
			t.Errorf("%d nodes: N %d θ_eff %d, want %d and 4", nodes, r.SketchN, r.SketchTheta, nodes)
		}
		if math.IsInf(r.SketchPerPeriod, -1) || r.SketchPerPeriod > r.SketchBound()+eps {
			t.Errorf("%d nodes: sketch term %.2f per period, bound %.0f", nodes, r.SketchPerPeriod, r.SketchBound())
		}
	}
}

// TestGatedPulse: the sketch's adversary (pulse traffic: each period it
// meets every node as a stranger, spends θ there through the sketch, then
// saturates) gets N·θ_eff through the sketch every period, and the
// measured term comes near N·θ_eff per aligned period without passing it;
// the envelope with the term holds.
func TestGatedPulse(t *testing.T) {
	for _, nodes := range []int{3, 5} {
		cfg := Config{Nodes: nodes, Limit: 100, Burst: 20, Accuracy: 0.2, Sketch: 4, Traffic: TrafficPulse,
			Duration: 20 * time.Second, Seed: 1}
		r, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		r.Summary(&out)
		t.Logf("%d nodes: sketch term %.2f per aligned period (bound N·θ_eff %.0f); excess over B + r·Δ + term %.2f (bound %.2f); over B + r·Δ alone %.2f",
			nodes, r.SketchPerPeriod, r.SketchBound(), r.ExcessAccounted, r.BoundAccounted, r.ExcessPlain)
		if !r.OK() {
			t.Errorf("%d nodes: %s\n%s", nodes, strings.Join(r.Violations, "; "), out.String())
		}
		if r.Degraded != 0 {
			t.Errorf("%d nodes: %d on_failure decisions with no fault", nodes, r.Degraded)
		}
		periods := int64(cfg.Duration / time.Second)
		if want := int64(nodes) * 4 * periods; r.BySource[cluster.SourceSketch] != want {
			t.Errorf("%d nodes: %d tokens through the sketch, want N·θ per period = %d:\n%s", nodes, r.BySource[cluster.SourceSketch], want, out.String())
		}
		if r.SketchPerPeriod < 0.9*r.SketchBound() || r.SketchPerPeriod > r.SketchBound()+eps {
			t.Errorf("%d nodes: sketch term %.2f per period, want near N·θ_eff = %.0f and not above", nodes, r.SketchPerPeriod, r.SketchBound())
		}
		// The term is real: without it the run passes B + r·Δ + S.
		if r.ExcessPlain <= float64(r.S) {
			t.Errorf("%d nodes: excess over B + r·Δ %.2f is within S = %d: the sketch added nothing", nodes, r.ExcessPlain, r.S)
		}
	}
}

// TestGatedSweep: the sketch dimension expands, leaves exact runs
// ungated, and a small gated sweep with faults keeps every bound.
func TestGatedSweep(t *testing.T) {
	g, err := ParseGrid("nodes=3,5;mode=shared,exact;traffic=zipf,uneven;sketch=0,4;faults=[none][crash:n1@1s,restart:n1@2s][skew:n0:+200ms@1s]")
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Accuracy: 0.2, Duration: 3 * time.Second, Seed: 1}
	var buf bytes.Buffer
	rs, err := Sweep(base, g, &buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	gated := 0
	for _, r := range rs {
		if r.Config.Sketch > 0 {
			gated++
		}
		if !r.OK() {
			t.Errorf("seed %d: %s\n  go run ./sim %s", r.Config.Seed, strings.Join(r.Violations, "; "), r.Config.Flags())
		}
		if len(r.Config.Faults) == 0 && r.Degraded != 0 {
			t.Errorf("seed %d: %d on_failure decisions with no fault", r.Config.Seed, r.Degraded)
		}
	}
	if gated != 12 {
		t.Errorf("%d gated runs of %d, want 12 (shared, sketch=4)", gated, len(rs))
	}
	if !strings.Contains(buf.String(), "sketch") {
		t.Errorf("the gated sweep has no sketch column:\n%s", buf.String())
	}
	if t.Failed() {
		t.Log(buf.String())
	}
}
