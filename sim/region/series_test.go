package region

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// TestPlotBin: the rate series' default bin is a second, coarser for long
// runs or slow rules, finer for short runs, and always a round step.
func TestPlotBin(t *testing.T) {
	for _, tc := range []struct {
		duration time.Duration
		rate     float64
		want     time.Duration
	}{
		{10 * time.Second, 100, time.Second},
		{2 * time.Minute, 100, time.Second},
		{2 * time.Second, 100, 200 * time.Millisecond},
		{3 * time.Second, 100, 500 * time.Millisecond},
		{2 * time.Minute, 10, 2 * time.Second}, // 600 per minute: 20 tokens take 2 s
		{10 * time.Minute, 100, 2 * time.Second},
		{time.Hour, 100, 15 * time.Second},
		{24 * time.Hour, 100, 5 * time.Minute},
		{10 * time.Second, 0.01, time.Hour}, // 20 tokens take 2 000 s
	} {
		if got := plotBin(tc.duration, tc.rate); got != tc.want {
			t.Errorf("plotBin(%v, %g) = %v, want %v", tc.duration, tc.rate, got, tc.want)
		}
	}
}

// TestSeriesBound: in every bin, what the owners accounted for (the
// cluster's admissions less on_failure's) stays within the series' bound,
// the envelope of the bin capped by what each identity offered; so does the
// reference (one exact bucket admits at most B + r·Δ); the faults' ring
// changes are listed in time order.
func TestSeriesBound(t *testing.T) {
	for _, tc := range []struct {
		name, faults string
		cfg          Config
	}{
		{"crash", "crash:n1@1s,restart:n1@2s", Config{Nodes: 3, Traffic: TrafficSaturate, IDs: 6}},
		{"partition", "partition:n0@1s-2s", Config{Nodes: 3, Traffic: TrafficUneven}},
		{"zipf", "leave:n1@1s,join:n1@2s", Config{Nodes: 3, Mode: quota.ModeExact, Traffic: TrafficZipf, IDs: 200, Rate: 3000, Bin: 100 * time.Millisecond}},
		// Many identities, each sending a request every few bins, and
		// decided a round trip after it arrived: a decision often falls
		// in the bin after its request's.
		{"sparse", "none", Config{Nodes: 3, Mode: quota.ModeExact, IDs: 300, Load: 0.05, Latency: engine.Const{D: 20 * time.Millisecond}, Bin: 100 * time.Millisecond}},
		{"keycap", "none", Config{Nodes: 3, Traffic: TrafficZipf, IDs: 300, Rate: 3000, KeyCap: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Duration, c.Seed = 3*time.Second, 1
			var err error
			if c.Faults, err = ParseFaults(tc.faults); err != nil {
				t.Fatal(err)
			}
			r, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Bound) != len(r.Cluster) || len(r.Fallback) != len(r.Cluster) {
				t.Fatalf("series lengths: bound %d, fallback %d, cluster %d", len(r.Bound), len(r.Fallback), len(r.Cluster))
			}
			for b := range r.Cluster {
				if acc := float64(r.Cluster[b] - r.Fallback[b]); acc > r.Bound[b]+1e-6 {
					t.Errorf("bin %d (%v): accounted %v over the bound %.2f", b, time.Duration(b)*r.Bin, acc, r.Bound[b])
				}
				if ref := float64(r.Reference[b]); ref > r.Bound[b]+1e-6 {
					t.Errorf("bin %d (%v): reference %v over the bound %.2f", b, time.Duration(b)*r.Bin, ref, r.Bound[b])
				}
			}
			if c.Faults != nil && len(r.Rings) == 0 {
				t.Errorf("faults %s: no ring change recorded", tc.faults)
			}
			for i := 1; i < len(r.Rings); i++ {
				if r.Rings[i].At < r.Rings[i-1].At {
					t.Fatalf("ring changes out of order: %v after %v", r.Rings[i].At, r.Rings[i-1].At)
				}
			}
		})
	}
}
