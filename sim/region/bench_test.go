package region

import (
	"runtime/debug"
	"testing"
	"time"
)

// benchConfig is the benchmark of issue 4's "How it is measured": 100
// simulated nodes, 1 000 identities (Zipf), 100 000 decisions per
// simulated second, for dur of simulated time (10 minutes in the issue).
func benchConfig(dur time.Duration, limit int64) Config {
	return Config{Nodes: 100, Limit: limit, Window: time.Second, Traffic: TrafficZipf, IDs: 1000, Rate: 100_000,
		Duration: dur, Seed: 1, Tick: 50 * time.Millisecond}
}

// BenchmarkRegion reports simulated decisions per wall-clock second, over
// 10 simulated seconds; the full 10 minutes is the command
//
//	go run ./sim -nodes 100 -limit 100 -traffic zipf -ids 1000 -rate 100000 -duration 10m -tick 50ms
//
// limit=100 gives a slack of 0 on 100 nodes (every non-owner admission is
// a round trip to the owner); limit=10000 a slack of 5 per node.
// The command sets the same GC target: the simulator's live heap is small
// and its garbage is all short-lived.
func BenchmarkRegion(b *testing.B) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	for _, bc := range []struct {
		name  string
		limit int64
	}{{"limit=100", 100}, {"limit=10000", 10000}} {
		b.Run(bc.name, func(b *testing.B) {
			var decisions int64
			for b.Loop() {
				r, err := Run(benchConfig(10*time.Second, bc.limit))
				if err != nil {
					b.Fatal(err)
				}
				decisions += r.Requests
			}
			b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
