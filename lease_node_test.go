package weir_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
)

const adminToken = "token-of-the-test-operator"

// startLeaseNodes starts n gateways that are also the n voters of the lease
// group, and one more that is a client of the group; all take their rules
// from it.
func startLeaseNodes(t *testing.T, n int) []*weir.Node {
	t.Helper()
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var voters []raftgroup.Voter
	raftLis, rpcLis := map[string]net.Listener{}, map[string]net.Listener{}
	peers := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("gw-%d", i)
		raftLis[name], rpcLis[name] = listen(), listen()
		peers[name] = rpcLis[name].Addr().String()
		voters = append(voters, raftgroup.Voter{Name: name, Addr: raftLis[name].Addr().String()})
	}
	var nodes []*weir.Node
	t.Cleanup(func() {
		for _, node := range nodes {
			node.Close()
		}
	})
	for i := range n {
		name := fmt.Sprintf("gw-%d", i)
		cc := &weir.ClusterConfig{Name: name, Region: "eu", LocalTiming: true, Label: "lease-rules",
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		node, err := weir.New(weir.Config{Cluster: cc, Lease: &weir.LeaseConfig{
			Voter: &raftgroup.Config{Name: name, Dir: t.TempDir(), Voters: voters, RPCPeers: peers,
				RaftListener: raftLis[name], RPCListener: rpcLis[name],
				Machine:          lease.Config{Regions: []string{"eu"}},
				HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
				LeaderLeaseTimeout: 75 * time.Millisecond},
			Rules: true, AdminTokens: map[string]string{adminToken: "alice"}}})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	// A gateway that is not a voter: a client of the group, told of new
	// versions by gossip.
	var rpcs []string
	for _, a := range peers {
		rpcs = append(rpcs, a)
	}
	client, err := weir.New(weir.Config{Cluster: &weir.ClusterConfig{Name: "gw-client", Region: "eu", LocalTiming: true,
		Label: "lease-rules", Join: []string{ops.GossipAddr(nodes[0])}, DecideTimeout: time.Second, CallTimeout: 2 * time.Second},
		Lease: &weir.LeaseConfig{Voters: rpcs, Rules: true, CheckInterval: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	nodes = append(nodes, client)
	waitFor(t, func() bool {
		for _, node := range nodes {
			if len(ops.Members(node)) != n+1 {
				return false
			}
		}
		return true
	})
	return nodes
}

func put(t *testing.T, url, token, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRulesFromLeaseGroup: a rule PUT through one node's admin API is
// committed by the lease group and reaches every node, which enforces it;
// an unauthenticated or invalid PUT changes nothing anywhere.
func TestRulesFromLeaseGroup(t *testing.T) {
	nodes := startLeaseNodes(t, 3)
	for _, node := range nodes {
		if st := node.Status(); !st.UsingDefaultRules || st.RulesVersion != 0 {
			t.Fatalf("before any rule: %+v", st)
		}
	}
	srv := httptest.NewServer(ops.RulesAdminHandler(nodes[1]))
	defer srv.Close()

	if code := put(t, srv.URL+"/v1/rules/per-key", "", `{"limit": 5, "window": "1m", "key": ["header:X-Api-Key"]}`); code != http.StatusUnauthorized {
		t.Fatalf("PUT without a token: %d, want 401", code)
	}
	if code := put(t, srv.URL+"/v1/rules/per-key", "wrong-token-wrong-token", `{"limit": 5, "window": "1m"}`); code != http.StatusUnauthorized {
		t.Fatalf("PUT with a wrong token: %d, want 401", code)
	}
	var code int
	waitFor(t, func() bool { // the group may still be electing its first leader
		code = put(t, srv.URL+"/v1/rules/per-key", adminToken, `{"limit": -5, "window": "1m"}`)
		return code != http.StatusServiceUnavailable
	})
	if code/100 != 4 {
		t.Fatalf("PUT of an invalid rule: %d, want a 4xx", code)
	}
	time.Sleep(200 * time.Millisecond)
	for i, node := range nodes {
		if v := node.Rules().Version(); v != 0 {
			t.Fatalf("gw-%d runs version %d after refused PUTs", i, v)
		}
	}

	start := time.Now()
	waitFor(t, func() bool { // 503: leadership moved (a loaded machine); a client retries
		code = put(t, srv.URL+"/v1/rules/per-key", adminToken, `{"limit": 5, "window": "1m", "burst": 5, "key": ["header:X-Api-Key"], "mode": "local"}`)
		return code != http.StatusServiceUnavailable
	})
	if code != http.StatusOK {
		t.Fatalf("PUT: %d", code)
	}
	// Version 1, or 2 if a PUT answered 503 had committed after all.
	var version uint64
	waitFor(t, func() bool {
		version = nodes[0].Rules().Version()
		for _, node := range nodes {
			if v := node.Rules().Version(); v == 0 || v != version {
				return false
			}
		}
		return true
	})
	t.Logf("rule version %d on all 4 nodes (3 voters, 1 client told by gossip) %v after the PUT", version, time.Since(start))
	for i, node := range nodes {
		if node.Status().UsingDefaultRules {
			t.Errorf("gw-%d still says it uses its default rules", i)
		}
		admitted := 0
		for range 8 {
			req := weir.Request{Method: "GET", Path: "/x", Header: http.Header{"X-Api-Key": {"k"}}}
			if d := node.Allow(context.Background(), req); d.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Errorf("gw-%d admitted %d of 8 under the new rule (limit 5, per node)", i, admitted)
		}
	}

	// Propagation over repeated changes (docs/performance.md, "Lease
	// group"): the time from a PUT's answer to every node running it.
	var took []time.Duration
	for k := range 8 {
		body := fmt.Sprintf(`{"limit": %d, "window": "1m", "burst": 5, "key": ["header:X-Api-Key"], "mode": "local"}`, 10+k)
		start := time.Now()
		waitFor(t, func() bool {
			code = put(t, srv.URL+"/v1/rules/per-key", adminToken, body)
			return code != http.StatusServiceUnavailable
		})
		if code != http.StatusOK {
			t.Fatalf("PUT %d: %d", k, code)
		}
		waitFor(t, func() bool {
			for _, node := range nodes {
				set := node.Rules()
				i, ok := set.Lookup("per-key")
				if !ok || set.Rule(i).Limit != int64(10+k) {
					return false
				}
			}
			return true
		})
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("propagation to all 4 nodes over %d changes: median %v, max %v", len(took), took[len(took)/2], took[len(took)-1])
}
