package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

const clusterRules = `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 300
    window: 1s
    burst: 30
    mode: shared
  - id: per-key-exact
    match: {prefix: /exact}
    key: [header:X-API-Key]
    limit: 300
    window: 1s
    burst: 30
    mode: exact
`

// startNodes starts n nodes of one region on loopback and waits until each
// sees all of them.
func startNodes(t *testing.T, n int, label string) []*weir.Node {
	t.Helper()
	rules := parseRules(t, clusterRules)
	var nodes []*weir.Node
	for i := range n {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: label,
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second}
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
			if len(ops.Members(node)) != n {
				return false
			}
		}
		return true
	})
	return nodes
}

// TestClusterOfNodes: three weir nodes joined by memberlist and peer gRPC
// limit one API key as one limiter, in shared and exact mode, with no
// degraded decision; a node that leaves is removed from the others' rings
// and they go on deciding without errors.
func TestClusterOfNodes(t *testing.T) {
	nodes := startNodes(t, 3, "cluster-of-nodes")
	for _, path := range []string{"/api", "/exact"} {
		rule := "per-key"
		if path == "/exact" {
			rule = "per-key-exact"
		}
		var mu sync.Mutex
		admitted := 0
		var wg sync.WaitGroup
		const run = 1500 * time.Millisecond
		start := time.Now()
		// Four clients per node, each at ~83/s: ~3× the rate in all, and a
		// client never waits on another's round trip to its owner.
		for k := range 4 * len(nodes) {
			node := nodes[k%len(nodes)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(12 * time.Millisecond)
				defer tick.Stop()
				req := weir.Request{Method: "GET", Path: path, Header: http.Header{"X-Api-Key": {"k-" + path}}}
				for time.Since(start) < run {
					<-tick.C
					if d := node.Allow(context.Background(), req); d.Allowed {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start).Seconds()
		// S = 2 non-owner nodes × ⌊0.05·300/3⌋ = 10 for shared, 0 for exact.
		upper := 30 + 10 + 300*elapsed
		if float64(admitted) > upper+1 {
			t.Errorf("%s: admitted %d in %.2fs, above B + r·Δ + S = %.0f", rule, admitted, elapsed, upper)
		}
		if float64(admitted) < 0.7*300*elapsed {
			t.Errorf("%s: admitted %d in %.2fs, far below r·Δ = %.0f", rule, admitted, elapsed, 300*elapsed)
		}
		t.Logf("%s: admitted %d in %.2fs (r·Δ %.0f, upper bound %.0f)", rule, admitted, elapsed, 300*elapsed, upper)
	}
	for _, node := range nodes {
		for _, c := range ops.Counts(node) {
			if c.FailOpen != 0 {
				t.Errorf("rule %s: %d fail-open decisions in a run with no fault", c.Rule, c.FailOpen)
			}
		}
	}
	// A rule change on one node is gossiped: every member sees its version.
	if err := nodes[1].SetRules(parseRules(t, clusterRules+`
  - id: extra
    key: [ip]
    limit: 5
    window: 1s
`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, p := range ops.Peers(nodes[0]) {
			if p.Name == "gw-1" {
				return p.RulesVersion == 2
			}
		}
		return false
	})
	// One node leaves: the others' rings shrink and decisions go on.
	nodes[2].Close()
	waitFor(t, func() bool { return len(ops.Members(nodes[0])) == 2 && len(ops.Members(nodes[1])) == 2 })
	if !slices.Equal(ops.Members(nodes[0]), []string{"gw-0", "gw-1"}) {
		t.Fatalf("members after a leave: %v", ops.Members(nodes[0]))
	}
	for i := range 50 {
		req := weir.Request{Method: "GET", Path: "/api", Header: http.Header{"X-Api-Key": {fmt.Sprintf("after-%d", i)}}}
		if d := nodes[i%2].Allow(context.Background(), req); !d.Allowed || d.Degraded {
			t.Fatalf("request %d after the leave: allowed=%v degraded=%v", i, d.Allowed, d.Degraded)
		}
	}
}

// TestEnforceRegions: a rule with shadow: true is enforced in the regions
// its enforce_regions names and shadowed elsewhere (shadow first,
// then enforce region by region).
func TestEnforceRegions(t *testing.T) {
	rules := parseRules(t, `
rules:
  - id: rollout
    key: [header:X-Api-Key]
    limit: 2
    window: 1h
    shadow: true
    enforce_regions: [eu]
    mode: local
`)
	for _, c := range []struct {
		region   string
		enforced bool
	}{{"eu", true}, {"us", false}, {"", false}} {
		t.Run("region="+c.region, func(t *testing.T) {
			cfg := weir.Config{Rules: rules}
			if c.region != "" {
				cfg.Cluster = &weir.ClusterConfig{Name: "gw-" + c.region, Region: c.region, LocalTiming: true, Label: "enforce-" + c.region}
			}
			node, err := weir.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer node.Close()
			req := weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {"k"}}}
			allowed, shadowRejected := 0, 0
			for range 5 {
				d := node.Allow(context.Background(), req)
				if d.Allowed {
					allowed++
				}
				for _, r := range d.Results() {
					if r.ShadowRejected {
						shadowRejected++
					}
				}
			}
			if c.enforced && (allowed != 2 || shadowRejected != 0) {
				t.Errorf("enforced: %d allowed, %d shadow rejections of 5; want 2 and 0", allowed, shadowRejected)
			}
			if !c.enforced && (allowed != 5 || shadowRejected != 3) {
				t.Errorf("shadowed: %d allowed, %d shadow rejections of 5; want 5 and 3", allowed, shadowRejected)
			}
		})
	}
}

// TestJoinWaitsForRing: New of a node that joins returns once its ring holds
// the members the join found, so its first decisions are not made as the
// owner of every identity with fresh buckets.
func TestJoinWaitsForRing(t *testing.T) {
	rules := parseRules(t, clusterRules)
	var nodes []*weir.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i := range 3 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "join-waits"}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		if got := len(ops.Members(n)); got != i+1 {
			t.Fatalf("gw-%d: New returned with %d members in its ring, want %d", i, got, i+1)
		}
	}
}
