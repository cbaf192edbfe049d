package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// refundRules: a per-key rule on every request, and a per-tenant rule on
// /both only, much tighter. The windows are long enough that nothing
// refills during the test. The per-key rule is exact: a non-owner's every
// admission of it is its owner's decision, so a refund of it must reach
// the owner.
const refundRules = `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 120
    window: 1h
    burst: 120
    mode: exact
  - id: per-tenant
    match: {prefix: /both}
    key: [header:X-Tenant]
    limit: 10
    window: 1h
    burst: 10
    accuracy: 0.1
    mode: shared
`

// TestClusterRefundReachesOwner: three nodes on loopback, every request of
// /both carrying a per-key rule and a per-tenant rule that rejects most of
// them (docs/overshoot.md, "Several rules on a request"). The per-key
// rule's tokens of the rejected requests are given back on its owner's
// bucket, also for the requests a non-owner decided through the owner, so
// its spend equals the requests admitted within the region's slack (none:
// the rule is exact): what is left of its burst afterwards is admitted on
// /key, which carries the per-key rule alone.
func TestClusterRefundReachesOwner(t *testing.T) {
	var nodes []*weir.Node
	rules := parseRules(t, refundRules)
	for i := range 3 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "cluster-refund",
			DecideTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		node, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
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
	time.Sleep(cluster.DefaultHandoffTimeout + 100*time.Millisecond) // the rings' warm-up is over
	var perKey quota.Rule
	for _, r := range rules {
		if r.ID == "per-key" {
			perKey = r
		}
	}
	p, err := cluster.NewRuleParams(&perKey, 1)
	if err != nil {
		t.Fatal(err)
	}
	slack := p.RegionSlack(3)
	allow := func(i int, path string) bool {
		h := http.Header{"X-Api-Key": {"refund-key"}, "X-Tenant": {"refund-tenant"}}
		d := nodes[i%3].Allow(context.Background(), weir.Request{Method: "GET", Path: path, Header: h})
		if d.Degraded {
			t.Fatalf("a degraded decision in a run with no fault: %+v", d)
		}
		return d.Allowed
	}
	both := 0
	for i := range 90 {
		if allow(i, "/both") {
			both++
		}
	}
	if both == 0 || both > 30 {
		t.Fatalf("%d of 90 requests on /both admitted: the per-tenant rule (10, slack %d) did not decide", both, slack)
	}
	// The refunds travel in the next batches to the owners: let them land.
	time.Sleep(300 * time.Millisecond)
	alone := 0
	for i := range 3 * int(perKey.Burst) {
		if allow(i, "/key") {
			alone++
		}
	}
	spent := perKey.Burst - int64(alone)
	if d := spent - int64(both); d > slack || d < -slack {
		t.Fatalf("the per-key rule spent %d of its burst %d for %d requests admitted on /both (then admitted %d alone): "+
			"off by %d, more than the region's slack %d", spent, perKey.Burst, both, alone, d, slack)
	}
	t.Logf("admitted on /both %d, per-key spend %d, slack %d", both, spent, slack)
}
