package raftgroup_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
)

// The rules admin API over a one-voter lease group on loopback: a PUT with
// a bearer token creates a rule (through Raft), a request without one is
// refused, and the history records who changed what. A real deployment
// serves the handler over TLS on an admin port (docs/rules-api.md).
func ExampleAdminHandler() {
	dir, err := os.MkdirTemp("", "lease-admin-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	g, err := raftgroup.Start(raftgroup.Config{
		Name: "n1", Dir: dir, RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		Voters:           []raftgroup.Voter{{Name: "n1"}},
		Machine:          lease.Config{Regions: []string{"eu", "us"}},
		HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
		LeaderLeaseTimeout: 25 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	admin, err := raftgroup.AdminHandler(raftgroup.AdminConfig{
		Store:  g,
		Tokens: map[string]string{"s3cr3t-token-for-alice": "alice"},
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(admin)
	defer srv.Close()

	do := func(method, path, token, body string) {
		req, _ := http.NewRequestWithContext(context.Background(), method, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Print(resp.StatusCode, " ", string(b))
	}
	do("PUT", "/v1/rules/search", "s3cr3t-token-for-alice", `{"limit": 100, "window": "1m", "burst": 20, "key": ["header:X-Api-Key"]}`)
	do("PUT", "/v1/rules/search", "", `{"limit": 1000000, "window": "1s"}`)
	for _, e := range g.History(0) {
		fmt.Printf("version %d: %s %s %s\n", e.Version, e.Principal, e.Op, e.RuleID)
	}
	// Output:
	// 200 {"version":1,"rule":{"id":"search","key":["header:X-Api-Key"],"limit":100,"window":"1m0s","burst":20,"cost":1,"algorithm":"gcra","mode":"shared","scope":"region","on_failure":"local","accuracy":0.05}}
	// 401 {"type":"about:blank","title":"Unauthorized","status":401,"detail":"a valid bearer token or client certificate is required"}
	// version 1: alice put search
}
