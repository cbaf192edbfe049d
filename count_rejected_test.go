package weir

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// countRejectedRule is a fixed window of 10 an hour that counts rejected
// requests (quota.Rule.CountRejected), as envoyproxy/ratelimit's counter.
func countRejectedRule(mode quota.Mode) []quota.Rule {
	return []quota.Rule{{ID: "cr", Limit: 10, Window: time.Hour, Algorithm: quota.AlgorithmFixedWindow,
		Mode: mode, CountRejected: true}}
}

// checkThenCharge runs Envoy's apply_on_stream_done pattern n times through
// CheckKeys on the nodes in turn (a cost-0 look, then a charge of 1) and
// returns how many looks were rejected and the remaining of the last look.
func checkThenCharge(t *testing.T, nodes []*Node, n int) (rejected int, last int64) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		node := nodes[i%len(nodes)]
		d, err := node.CheckKeys(ctx, []KeyCheck{{Rule: "cr", Key: "k", Cost: 0}})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			rejected++
		}
		last = d.Results()[0].Remaining
		if _, err := nodes[(i+1)%len(nodes)].CheckKeys(ctx, []KeyCheck{{Rule: "cr", Key: "k", Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	return rejected, last
}

// On one node a count_rejected fixed window limits the check-then-charge
// pattern (the default fixed window never does: each look passes at the
// limit and each charge past it is dropped), and a rejection reports
// remaining 0.
func TestCountRejectedOneNode(t *testing.T) {
	var now atomic.Int64
	now.Store(int64(1000 * time.Hour))
	node, err := New(Config{Rules: countRejectedRule(quota.ModeLocal), Clock: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	rejected, last := checkThenCharge(t, []*Node{node}, 12)
	if rejected != 1 || last != 0 {
		t.Fatalf("check-then-charge ×12 on a limit of 10: %d looks rejected (want 1), last remaining %d (want 0)", rejected, last)
	}
	d, err := node.CheckKeys(context.Background(), []KeyCheck{{Rule: "cr", Key: "k2", Cost: 15}})
	if err != nil {
		t.Fatal(err)
	}
	small, _ := node.CheckKeys(context.Background(), []KeyCheck{{Rule: "cr", Key: "k2", Cost: 1}})
	if d.Allowed || d.Results()[0].Remaining != 0 || small.Allowed {
		t.Fatalf("15 then 1 on a limit of 10: %+v then %+v; want both rejected, remaining 0", d.Results()[0], small.Results()[0])
	}
	now.Add(int64(time.Hour))
	if d, _ := node.CheckKeys(context.Background(), []KeyCheck{{Rule: "cr", Key: "k2", Cost: 10}}); !d.Allowed {
		t.Fatalf("next window: %+v, want admitted", d.Results()[0])
	}
}

// On a real 3-node cluster the identity's owner counts rejected requests
// too, whichever node is asked.
func TestCountRejectedCluster(t *testing.T) {
	c := startFWCluster(t, "count-rejected", `
rules:
  - id: cr
    key: [header:X-API-Key]
    algorithm: fixed_window
    limit: 10
    window: 1h
    mode: exact
    count_rejected: true
`, 3)
	rejected := 0
	ctx := context.Background()
	for i := range 12 {
		if d, err := c.nodes[i%3].CheckKeys(ctx, []KeyCheck{{Rule: "cr", Key: "k1", Cost: 1}}); err != nil {
			t.Fatal(err)
		} else if !d.Allowed {
			rejected++
		}
	}
	big, err := c.nodes[0].CheckKeys(ctx, []KeyCheck{{Rule: "cr", Key: "k3", Cost: 11}})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := c.nodes[1].CheckKeys(ctx, []KeyCheck{{Rule: "cr", Key: "k3", Cost: 1}})
	// Check-then-charge on every node in turn: the look after the 11th
	// charge is over the limit, and so is every one after it.
	looks, last := checkThenCharge(t, c.nodes, 12)
	if looks != 1 || last != 0 {
		t.Errorf("check-then-charge ×12 over 3 nodes on a limit of 10: %d looks rejected (want 1), last remaining %d (want 0)", looks, last)
	}
	if rejected != 2 || big.Allowed || big.Results()[0].Remaining != 0 || after.Allowed || after.Results()[0].Degraded {
		t.Fatalf("12 of 1 on a limit of 10: %d rejected (want 2); 11 then 1: %+v then %+v (want both rejected, remaining 0, not degraded)",
			rejected, big.Results()[0], after.Results()[0])
	}
}
