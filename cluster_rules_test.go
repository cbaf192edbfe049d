package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

const sharedRaiseRules = `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: %d
    window: 1m
    burst: 5
    mode: shared
`

// TestClusterRaiseCarriesTokens: three nodes on loopback, a shared rule of
// 5/min burst 5, one token spent, raised to 50/min burst 5 on every node:
// the owner's bucket and the nodes' views carry the 4 tokens held, so the
// next 4 requests are admitted.
func TestClusterRaiseCarriesTokens(t *testing.T) {
	var nodes []*weir.Node
	for i := range 3 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "cluster-raise",
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		node, err := weir.New(weir.Config{Rules: parseRules(t, fmt.Sprintf(sharedRaiseRules, 5)), Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	t.Cleanup(func() {
		for _, node := range nodes {
			node.Close()
		}
	})
	waitFor(t, func() bool {
		for _, node := range nodes {
			if len(ops.Members(node)) != 3 {
				return false
			}
		}
		return true
	})
	req := weir.Request{Method: "GET", Path: "/api", Header: http.Header{"X-Api-Key": {"raised"}}}
	// The first admission spends the one token (a ring still warming up
	// may turn a request away without spending: it is asked again).
	waitFor(t, func() bool { return nodes[0].Allow(context.Background(), req).Allowed })
	raised := parseRules(t, fmt.Sprintf(sharedRaiseRules, 50))
	for _, node := range nodes {
		if err := node.SetRules(raised); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for range 4 {
		if d := nodes[0].Allow(context.Background(), req); d.Allowed {
			got++
		} else if d.Degraded {
			t.Fatalf("a degraded decision in a run with no fault: %+v", d)
		}
	}
	if got != 4 {
		t.Fatalf("%d of the next 4 admitted after raising 5/min to 50/min with 1 token spent, want 4", got)
	}
}
