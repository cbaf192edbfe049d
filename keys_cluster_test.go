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
			cc.Join = []string{ops.GossipAddr(nodes[0])}
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
			if len(ops.Members(n)) != 3 {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if f := n.Status().KeyFormat; f != 1 {
			t.Fatalf("a ring with a format-1 member has format %d in force on %v", f, ops.Members(n))
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
			if n.Status().KeyFormat != 2 || len(ops.Members(n)) != 2 {
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

// TestDurableTrialAcrossKeyFormats: "one free trial" keyed on an account
// header, then the IP, decided by a lease group whose three voters are the
// ring's gateways, one of which first speaks only key format 1. A client
// with no account takes its trial under format 1 (its counter is keyed by
// the bare IP); the old voter restarts speaking format 2, the fleet
// switches, and the IP's counter, now keyed by its tagged identity, is
// inherited: no second trial on any gateway. After the switch an account
// equal to another IP does not spend that IP's trial.
func TestDurableTrialAcrossKeyFormats(t *testing.T) {
	rules := parseRules(t, `
rules:
  - id: trial
    match: {methods: [POST], path: /trial}
    key: [header:X-Account, ip]
    limit: 1
    window: 720h
    burst: 1
    durable: true
    on_failure: closed
`)
	g := startDurableGroupWith(t, 3, rules, map[string]uint32{"gw-2": 1})
	formats := func(want uint32) func() bool {
		return func() bool {
			gws := g.gateways()
			for _, n := range gws {
				if n.Status().KeyFormat != want || len(ops.Members(n)) != len(g.names) {
					return false
				}
			}
			return len(gws) == len(g.names)
		}
	}
	waitFor(t, formats(1))
	anon := func(ip string) weir.Request { return weir.Request{Method: "POST", Path: "/trial", ClientIP: ip} }
	account := func(a string) weir.Request {
		return weir.Request{Method: "POST", Path: "/trial", ClientIP: "203.0.113.1", Header: http.Header{"X-Account": {a}}}
	}
	// tries sends req once to every gateway, one after the other, and
	// counts the admissions; a degraded decision fails the test.
	tries := func(req weir.Request) int {
		got := 0
		for _, gw := range g.gateways() {
			d := gw.Allow(context.Background(), req)
			if d.Degraded {
				t.Fatalf("a degraded decision in a run with no fault: %+v", d.Results())
			}
			if d.Allowed {
				got++
			}
		}
		return got
	}
	const old, fresh, other = "198.51.100.7", "198.51.100.8", "198.51.100.9"
	if got := tries(anon(old)); got != 1 {
		t.Fatalf("format 1: the anonymous client %s got %d trials over three gateways, want 1", old, got)
	}

	g.stop("gw-2")
	g.formats = nil
	g.start("gw-2", nil)
	waitFor(t, formats(2))
	g.leader()

	if got := tries(anon(old)); got != 0 {
		t.Errorf("format 2: the client %s, whose trial was taken under format 1, got %d more", old, got)
	}
	if got := tries(anon(fresh)); got != 1 {
		t.Errorf("format 2: a new anonymous client got %d trials, want 1", got)
	}
	if got := tries(account(other)); got != 1 {
		t.Errorf("format 2: the account %q got %d trials, want 1", other, got)
	}
	if got := tries(anon(other)); got != 1 {
		t.Errorf("format 2: the client at %s got %d trials after an account of that value took its own, want 1", other, got)
	}
	if n := failOpen(g.gateways(), "trial"); n != 0 {
		t.Errorf("%d fail-open decisions in a run with no fault", n)
	}
}
