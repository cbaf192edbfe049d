package ops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

func node(t testing.TB) *weir.Node {
	t.Helper()
	n, err := weir.New(weir.Config{Rules: []quota.Rule{{ID: "per-key", Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}},
		Limit: 2, Window: 60e9, Burst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestViewsOfOneNode: every view reads the node it is given: counts and the
// top throttled list after a decision, the status JSON, the admin report's
// refusal of a write, the identity lookup's refusal of a bad method, and
// the cluster views' empty answers on a node without a cluster.
func TestViewsOfOneNode(t *testing.T) {
	n := node(t)
	for range 3 {
		n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {"k1"}}})
	}
	cs := ops.Counts(n)
	if len(cs) != 1 || cs[0].Rule != "per-key" || cs[0].Allowed != 2 || cs[0].Rejected != 1 {
		t.Fatalf("Counts = %+v, want per-key 2 allowed 1 rejected", cs)
	}
	if top := ops.TopThrottled(n); len(top) != 1 || top[0].Identity != "k1" {
		t.Fatalf("TopThrottled = %+v, want k1", top)
	}
	if ops.Members(n) != nil || ops.Peers(n) != nil || ops.GossipAddr(n) != "" || ops.GlobalStatus(n).Leasing {
		t.Fatal("a node without a cluster reports members, peers, a gossip address or leases")
	}
	if ops.Canary(n).Enabled || ops.AdminUnauthorized(n) != 0 || len(ops.Events(n)) != 0 {
		t.Fatal("a node without a canary or admin tokens reports one")
	}

	srv := httptest.NewServer(ops.UIHandler(n))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var ov weir.Overview
	err = json.NewDecoder(res.Body).Decode(&ov)
	res.Body.Close()
	if err != nil || ov.Node != "node" || len(ov.Rules) != 1 || len(ov.Counts) != 1 {
		t.Fatalf("GET /v1/status = %+v, %v; want the node's one rule and its counts", ov, err)
	}

	admin := httptest.NewServer(ops.AdminHandler(n))
	defer admin.Close()
	res, err = http.Post(admin.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("POST to the admin report: %d %s, want 405 problem+json", res.StatusCode, res.Header.Get("Content-Type"))
	}

	id := httptest.NewServer(ops.IdentityHandler(n))
	defer id.Close()
	res, err = http.Get(id.URL + "/v1/identities/k1?method=G%20T")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("lookup with a bad method: %d, want 400", res.StatusCode)
	}
	rep, err := ops.LookupIdentity(context.Background(), n, "k1", weir.IdentityQuery{Key: "header:X-Api-Key"})
	if err != nil || len(rep.Rules) != 1 || rep.Rules[0].Bucket.Remaining != 0 {
		t.Fatalf("LookupIdentity(k1) = %+v, %v; want per-key with nothing left", rep, err)
	}
}

// The status page on an operator-only listener, beside the gateway's
// handler on the public one.
func ExampleUIHandler() {
	n, err := weir.New(weir.Config{Rules: []quota.Rule{{ID: "per-ip", Key: []quota.KeySource{{Kind: quota.KeyIP}},
		Limit: 100, Window: 60e9}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close()
	public := http.NewServeMux()
	public.Handle("/", n.Middleware(http.NotFoundHandler()))
	operators := http.NewServeMux()
	operators.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(n)))
	for _, c := range ops.Counts(n) {
		fmt.Println(c.Rule, "allowed", c.Allowed, "rejected", c.Rejected)
	}
	// Output: per-ip allowed 0 rejected 0
}

// TestOverviewNamesANodeWithoutCluster: Config.Name and Config.Region name
// a node on its own in its Overview, as `weir serve` names it in its ready
// line.
func TestOverviewNamesANodeWithoutCluster(t *testing.T) {
	n, err := weir.New(weir.Config{Name: "edge-1", Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ov := ops.Overview(n)
	if ov.Node != "edge-1" || ov.Region != "eu" || ov.Cluster || len(ov.Members) != 1 || ov.Members[0].Region != "eu" {
		t.Fatalf("Overview: node %q region %q cluster %v members %+v", ov.Node, ov.Region, ov.Cluster, ov.Members)
	}
}
