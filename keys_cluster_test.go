package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// keyFormatRules: a per-identity exact rule keyed on a header, then the IP.
const keyFormatRules = `
rules:
  - id: api
    key: [header:X-User, ip]
    limit: 5
    window: 1h
    burst: 5
    mode: exact
`

// TestKeyFormatMixedRing runs a ring of three nodes in which one speaks only
// key format 1 (as a node that predates key formats does). The pool keeps
// format 1, so that every node names an identity's bucket as the old one
// does: an identity of the chain's second source has one bucket in the ring,
// whichever node its requests reach. Once the old node has left, the others
// switch to format 2, and the sources are namespaces again, still with one
// bucket per identity in the ring.
func TestKeyFormatMixedRing(t *testing.T) {
	rules := parseRules(t, keyFormatRules)
	var nodes []*weir.Node
	for i := range 3 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "key-format-mixed",
			DecideTimeout: 2 * time.Second, CallTimeout: 2 * time.Second}
		if i > 0 {
			cc.Join = []string{nodes[0].GossipAddr()}
		}
		if i == 2 {
			weir.SpeakKeyFormat(cc, 1)
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	closed := make([]bool, len(nodes))
	t.Cleanup(func() {
		for i, n := range nodes {
			if !closed[i] {
				n.Close()
			}
		}
	})
	waitFor(t, func() bool {
		for _, n := range nodes {
			if len(n.Members()) != 3 {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if f := n.Status().KeyFormat; f != 1 {
			t.Fatalf("a ring with a format-1 member has format %d in force on %v", f, n.Members())
		}
	}
	ctx := context.Background()
	// admitted sends each node in turn a request, 12 in all, and counts
	// the admissions: one bucket of burst 5 in the ring admits 5.
	admitted := func(live []*weir.Node, req weir.Request) int {
		got := 0
		for i := range 12 {
			d := live[i%len(live)].Allow(ctx, req)
			if d.Degraded {
				t.Fatalf("a decision was degraded: %+v", d.Results())
			}
			if d.Allowed {
				got++
			}
		}
		return got
	}
	anon := func(ip string) weir.Request { return weir.Request{Method: "GET", Path: "/", ClientIP: ip} }
	user := func(v string) weir.Request {
		return weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.1", Header: http.Header{"X-User": {v}}}
	}
	for i := range 5 {
		ip := fmt.Sprintf("198.51.100.%d", i+1)
		if got := admitted(nodes, anon(ip)); got != 5 {
			t.Errorf("mixed ring: the ip %s was admitted %d times over three nodes, want 5 (one bucket)", ip, got)
		}
	}
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	closed[2] = true
	live := nodes[:2]
	waitFor(t, func() bool {
		for _, n := range live {
			if n.Status().KeyFormat != 2 || len(n.Members()) != 2 {
				return false
			}
		}
		return true
	})
	for i := range 5 {
		ip := fmt.Sprintf("198.51.100.%d", 100+i)
		if got := admitted(live, user(ip)); got != 5 {
			t.Errorf("format 2: the user %s was admitted %d times, want 5", ip, got)
		}
		if got := admitted(live, anon(ip)); got != 5 {
			t.Errorf("format 2: the ip %s, after an X-User of that value spent its own bucket, was admitted %d times, want 5 (one bucket of its own)", ip, got)
		}
	}
}
