package shell

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
)

// TestShellSketchNoAlloc: a gated decision through the Node, with its
// prefetch and the hint it publishes, allocates nothing (a hint stored on
// every decision had put one on the heap each time).
func TestShellSketchNoAlloc(t *testing.T) {
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 4})
	sh := startGRPCCluster(t, 1, rule)[0].shell
	hasher := sh.cfg.Hasher
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "one-shot-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	now := t0
	if o, err := sh.DecideAt(ctx, now, "r", "warm-up", 1); err != nil || o.Source != cluster.SourceSketch {
		t.Fatalf("warm-up: %+v, %v: want a sketch admission", o, err)
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		id := ids[i%len(ids)]
		h := hasher.Sum(id)
		sh.Prefetch(h, "r", id)
		o, err := sh.DecideHashedAt(ctx, now, h, "r", id, 1)
		if err != nil || o.Source != cluster.SourceSketch {
			t.Fatalf("request %d: %+v, %v: want a sketch admission", i, o, err)
		}
		i++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per gated decision through the Node, want 0", allocs)
	}
}
