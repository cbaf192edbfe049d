package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

// TestIdentitySourcesDoNotShare checks that identity sources are namespaces
// (docs/security.md): a header whose value equals
// a client's IP never spends that IP's bucket, and the reverse, whichever
// source comes first in the chain.
func TestIdentitySourcesDoNotShare(t *testing.T) {
	const ip = "198.51.100.7"
	for _, tc := range []struct {
		name, key string
		// attacker is a request carrying the header with the victim's
		// value; victim is the request identified by the other source.
		attacker, victim weir.Request
	}{
		{
			name: "header first", key: "[header:X-User, ip]",
			attacker: weir.Request{Method: "GET", Path: "/api", ClientIP: "203.0.113.9", Header: http.Header{"X-User": {ip}}},
			victim:   weir.Request{Method: "GET", Path: "/api", ClientIP: ip},
		},
		{
			name: "ip first", key: "[ip, header:X-User]",
			attacker: weir.Request{Method: "GET", Path: "/api", Header: http.Header{"X-User": {ip}}},
			victim:   weir.Request{Method: "GET", Path: "/api", ClientIP: ip},
		},
		{
			name: "user second", key: "[header:X-User, user]",
			attacker: weir.Request{Method: "GET", Path: "/api", Header: http.Header{"X-User": {"alice"}}},
			victim:   weir.Request{Method: "GET", Path: "/api", User: "alice"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			n := newNode(t, weir.Config{Clock: clk.Now, Rules: parseRules(t, `
rules:
  - id: api
    key: `+tc.key+`
    limit: 5
    window: 1m
    burst: 5
`)})
			ctx := context.Background()
			admitted := 0
			for range 25 {
				if n.Allow(ctx, tc.attacker).Allowed {
					admitted++
				}
			}
			if admitted != 5 {
				t.Fatalf("the attacker's own bucket admitted %d of 25, want 5", admitted)
			}
			victim := 0
			for range 5 {
				if n.Allow(ctx, tc.victim).Allowed {
					victim++
				}
			}
			if victim != 5 {
				t.Fatalf("after 25 requests of the other source with the same value, the victim's burst of 5 admitted %d", victim)
			}
			// And the reverse: the victim's spend leaves the attacker's
			// bucket as it was (empty, still).
			if n.Allow(ctx, tc.attacker).Allowed {
				t.Fatalf("the attacker was admitted after its burst was spent")
			}
		})
	}
}

// TestOverrideSourceNamespace checks that an override matches its own
// source's identities only: the IP 198.51.100.7's override does not raise the
// limit of an API key with that value, and an override without a source is
// the first source's.
func TestOverrideSourceNamespace(t *testing.T) {
	const ip = "198.51.100.7"
	clk := newFakeClock()
	n := newNode(t, weir.Config{Clock: clk.Now, Rules: parseRules(t, `
rules:
  - id: api
    key: [header:X-Api-Key, ip]
    limit: 2
    window: 1m
    overrides:
      - {identity: 198.51.100.7, source: ip, limit: 10, burst: 10}
      - {identity: gold, limit: 6, burst: 6}
`)})
	ctx := context.Background()
	count := func(req weir.Request) (admitted int, limit int64) {
		for range 20 {
			d := n.Allow(ctx, req)
			if d.Allowed {
				admitted++
			}
			limit = d.Results()[0].Limit
		}
		return admitted, limit
	}
	for _, c := range []struct {
		name  string
		req   weir.Request
		want  int
		limit int64
	}{
		{"the ip's override", weir.Request{Method: "GET", Path: "/", ClientIP: ip}, 10, 10},
		{"an API key equal to the ip", weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.1", Header: http.Header{"X-Api-Key": {ip}}}, 2, 2},
		{"the first source's override", weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.2", Header: http.Header{"X-Api-Key": {"gold"}}}, 6, 6},
		{"an ip equal to the key", weir.Request{Method: "GET", Path: "/", ClientIP: "gold"}, 2, 2},
	} {
		if got, limit := count(c.req); got != c.want || limit != c.limit {
			t.Errorf("%s: admitted %d of 20 with limit %d, want %d with limit %d", c.name, got, limit, c.want, c.limit)
		}
	}
}

// TestNamespacesShowPlainIdentities checks what stays as it was for users:
// decisions, the top-throttled list and the identity lookup show the value
// the source yielded (never a tag), the lookup finds a later source's bucket
// with its key query, and Raw lookups and CheckKeys use the bare key.
func TestNamespacesShowPlainIdentities(t *testing.T) {
	const ip = "198.51.100.7"
	clk := newFakeClock()
	n := newNode(t, weir.Config{Clock: clk.Now, Rules: parseRules(t, `
rules:
  - id: api
    key: [header:X-Api-Key, ip]
    limit: 3
    window: 1m
`)})
	ctx := context.Background()
	anon := weir.Request{Method: "GET", Path: "/", ClientIP: ip}
	var d weir.Decision
	for range 5 {
		d = n.Allow(ctx, anon)
	}
	if d.Allowed {
		t.Fatal("the anonymous client's 5th request of 3 per minute was admitted")
	}
	if got := d.Results()[0].Identity; got != ip {
		t.Errorf("the decision names identity %q, want %q", got, ip)
	}
	top := ops.TopThrottled(n)
	if len(top) != 1 || top[0].Identity != ip || top[0].Rule != "api" || top[0].Source != "ip" {
		t.Errorf("top throttled = %+v, want one entry for the ip %s under api", top, ip)
	}

	// The ip namespace holds the spent bucket; the API key namespace (the
	// default of a lookup) does not.
	rep, err := ops.LookupIdentity(ctx, n, ip, weir.IdentityQuery{Key: "ip"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rules) != 1 || rep.Identity != ip || rep.Rules[0].Bucket.Remaining != 0 || rep.Rules[0].Rejected == 0 ||
		len(rep.Throttled) != 1 {
		t.Errorf("lookup of the ip %s: %+v, want its spent bucket and its rejections", ip, rep)
	}
	for _, q := range []weir.IdentityQuery{{}, {Key: "header:X-Api-Key"}, {Raw: true}} {
		rep, err := ops.LookupIdentity(ctx, n, ip, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Rules) != 1 || rep.Rules[0].Bucket.Remaining != 3 || len(rep.Throttled) != 0 {
			t.Errorf("lookup %+v of an API key equal to a spent ip: %+v, want a full bucket of 3", q, rep)
		}
	}
	// An API key of the same value, throttled too, is its own entry.
	for range 5 {
		n.Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.7", Header: http.Header{"X-Api-Key": {ip}}})
	}
	top = ops.TopThrottled(n)
	if len(top) != 2 || top[0].Identity != ip || top[1].Identity != ip || top[0].Source == top[1].Source {
		t.Errorf("top throttled = %+v, want the ip %s and the API key %s apart", top, ip, ip)
	}

	// CheckKeys and Check count under the bare key: the first source's
	// namespace, so a descriptor key is the API key of that value.
	if _, err := n.Check(ctx, "k1", "api", 3); err != nil {
		t.Fatal(err)
	}
	rep, err = ops.LookupIdentity(ctx, n, "k1", weir.IdentityQuery{Raw: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rules[0].Bucket.Remaining != 0 {
		t.Errorf("raw lookup after Check spent k1: %+v", rep.Rules[0].Bucket)
	}
	if d := n.Allow(ctx, weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {"k1"}}}); d.Allowed {
		t.Errorf("the API key k1 was admitted after Check spent the bare key k1")
	}
	// A key that begins with NUL cannot pose as another source's tag.
	forged := "\x00src\x00ip\x00" + "203.0.113.50"
	if _, err := n.Check(ctx, forged, "api", 3); err != nil {
		t.Fatal(err)
	}
	if d := n.Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.50"}); !d.Allowed {
		t.Errorf("a Check key forged as the ip namespace spent the ip 203.0.113.50's bucket")
	}
}

// TestLongNamespacedIdentity: a later source's value as long as an identity
// may be (Config.MaxIdentityBytes's default) still fits where it leaves the
// node once tagged, and keeps a bucket of its own.
func TestLongNamespacedIdentity(t *testing.T) {
	long := strings.Repeat("a", weir.DefaultMaxIdentityBytes)
	rules := parseRules(t, keyFormatRules)
	var nodes []*weir.Node
	for i := range 2 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "long-identity",
			DecideTimeout: 2 * time.Second, CallTimeout: 2 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	waitFor(t, func() bool { return len(ops.Members(nodes[0])) == 2 && len(ops.Members(nodes[1])) == 2 })
	ctx := context.Background()
	for _, id := range []string{long, long[:len(long)-1] + "b"} {
		admitted := 0
		for i := range 8 {
			d := nodes[i%2].Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: id})
			if d.Degraded || d.Err != nil {
				t.Fatalf("a %d-byte ip was decided degraded (%v): %+v", len(id), d.Err, d.Results())
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Errorf("a %d-byte ip was admitted %d times over two nodes, want 5", len(id), admitted)
		}
	}
}
