package weir_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

const uiRules = `
rules:
  - id: per-key
    match: {prefix: /api}
    key: [header:X-API-Key]
    limit: 5
    window: 1m
    burst: 5
  - id: everyone
    match: {prefix: /api}
    key: [global]
    limit: 100000
    window: 1s
  - id: login
    match: {path: /login}
    key: [ip]
    limit: 3
    window: 1m
  - id: global-customer
    key: [header:X-Customer]
    limit: 1000
    window: 1m
    burst: 100
    scope: global
`

func getJSON(t *testing.T, h http.Handler, path string, into any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if into != nil && rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), into); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, rec.Body)
		}
	}
	return rec.Code
}

// TestUIHandlerOneNode: the page and its assets are served from the
// binary; the status JSON reports the rules, counts, top throttled and the
// global rule with no lease data; the identity lookup says which rule
// throttles an identity and why, filters by path and key source, and the
// rules API answers 503 on a node without a lease group.
func TestUIHandlerOneNode(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, uiRules)})
	ctx := context.Background()
	for range 8 {
		n.Allow(ctx, weir.Request{Method: "GET", Path: "/api/x", Header: http.Header{"X-Api-Key": {"key-abuse"}}})
	}
	n.Allow(ctx, weir.Request{Method: "GET", Path: "/api/x", Header: http.Header{"X-Api-Key": {"key-calm"}}})
	h := ops.UIHandler(n)

	for path, want := range map[string]string{"/": "<title>weir", "/ui/app.js": "v1/status", "/ui/style.css": "font"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), want) {
			t.Fatalf("GET %s: %d, body lacks %q", path, rec.Code, want)
		}
	}

	var ov weir.Overview
	if c := getJSON(t, h, "/v1/status", &ov); c != 200 {
		t.Fatalf("status: %d", c)
	}
	if len(ov.Rules) != 4 || len(ov.Members) != 1 || ov.Members[0].Health != "self" || ov.RulesAPI {
		t.Fatalf("overview: %+v", ov)
	}
	if len(ov.TopThrottled) == 0 || ov.TopThrottled[0].Identity != "key-abuse" || ov.TopThrottled[0].Rule != "per-key" {
		t.Fatalf("top throttled: %+v", ov.TopThrottled)
	}
	if len(ov.Leases) != 1 || ov.Leases[0].Rule != "global-customer" || len(ov.Leases[0].Shares) != 0 || !strings.Contains(ov.Leases[0].Note, "no lease data") {
		t.Fatalf("leases: %+v", ov.Leases)
	}

	var rep weir.IdentityReport
	if c := getJSON(t, h, "/v1/identities/key-abuse?path=/api/x", &rep); c != 200 {
		t.Fatalf("identity: %d", c)
	}
	if !slices.Equal(rep.Throttled, []string{"per-key"}) || len(rep.Rules) != 3 {
		t.Fatalf("key-abuse: throttled %v, rules %d", rep.Throttled, len(rep.Rules))
	}
	pk := rep.Rules[0]
	if pk.Rule != "per-key" || !pk.Bucket.Known || pk.Bucket.Where != "local" || pk.Bucket.Remaining != 0 ||
		pk.Bucket.RetryAfterMS <= 0 || pk.Allowed != 5 || pk.Rejected != 3 || !strings.Contains(pk.Verdict, "throttled now") {
		t.Fatalf("per-key of key-abuse: %+v", pk)
	}
	if g := rep.Rules[1]; g.Rule != "everyone" || !g.Global || g.Bucket.RetryAfterMS != 0 {
		t.Fatalf("the global rule: %+v", g)
	}
	if getJSON(t, h, "/v1/identities/key-calm?key=header:X-Api-Key", &rep); len(rep.Throttled) != 0 || len(rep.Rules) != 1 ||
		rep.Rules[0].Bucket.Remaining != 4 || rep.Rules[0].Allowed != 1 {
		t.Fatalf("key-calm: %+v", rep)
	}
	if getJSON(t, h, "/v1/identities/"+url.PathEscape("10.0.0.1")+"?path=/login&method=POST&key=ip", &rep); len(rep.Rules) != 1 ||
		rep.Rules[0].Rule != "login" || !rep.Rules[0].Bucket.Full {
		t.Fatalf("an unseen IP on /login: %+v", rep)
	}
	if c := getJSON(t, h, "/v1/identities/"+strings.Repeat("x", 2000), nil); c != http.StatusBadRequest {
		t.Fatalf("an oversized identity: %d, want 400", c)
	}
	if c := getJSON(t, h, "/v1/identities/a?method=G%20T", nil); c != http.StatusBadRequest {
		t.Fatalf("a bad method: %d, want 400", c)
	}
	if c := getJSON(t, h, "/v1/rules", nil); c != http.StatusServiceUnavailable {
		t.Fatalf("rules API without a lease group: %d, want 503", c)
	}
	for _, c := range ops.Counts(n) {
		if c.FailOpen != 0 {
			t.Fatalf("fail-open decisions: %+v", c)
		}
	}
	if ev := ops.Events(n); len(ev) != 0 {
		t.Fatalf("events with no fault: %+v", ev)
	}
}

type fixedShares []weir.LeaseShare

func (f fixedShares) LeaseShares() []weir.LeaseShare { return f }

// TestLeaseShareSource: shares the lease work reports are shown per global
// rule, ordered by region; shares of rules not in the set are left out.
func TestLeaseShareSource(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, uiRules)})
	weir.SetLeaseShareSource(n, fixedShares{
		{Rule: "global-customer", Region: "us", Rate: 10, Burst: 60},
		{Rule: "global-customer", Region: "eu", Rate: 6.6, Burst: 40, Fallback: true},
		{Rule: "gone", Region: "eu", Rate: 1, Burst: 1},
	})
	ls := ops.LeaseShares(n)
	if len(ls) != 1 || len(ls[0].Shares) != 2 || ls[0].Shares[0].Region != "eu" || !ls[0].Shares[0].Fallback || ls[0].Note != "" {
		t.Fatalf("lease shares: %+v", ls)
	}
	weir.SetLeaseShareSource(n, nil)
	if ls := ops.LeaseShares(n); len(ls[0].Shares) != 0 || ls[0].Note == "" {
		t.Fatalf("after removing the source: %+v", ls)
	}
}

// TestIdentityLookupAsksTheOwner: in a 3-node cluster, a lookup on a node
// that does not own the identity reports the owner's bucket, read over the
// peer transport (Peer.Inspect): spent, in debt when the others' slack
// outran it, and the same state the owner reports of itself.
func TestIdentityLookupAsksTheOwner(t *testing.T) {
	rules := parseRules(t, `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 6
    window: 1m
    burst: 30
    mode: shared
`)
	var nodes []*weir.Node
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	for i := range 3 {
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: "identity-lookup",
			DecideTimeout: 2 * time.Second, CallTimeout: 2 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	waitFor(t, func() bool {
		for _, n := range nodes {
			if len(ops.Members(n)) != 3 {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	// An identity that gw-0 does not own.
	var id, owner string
	for i := range 100 {
		cand := fmt.Sprintf("key-%d", i)
		rep, err := ops.LookupIdentity(ctx, nodes[0], cand, weir.IdentityQuery{Key: "header:X-API-Key"})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Rules) != 1 || rep.Rules[0].Bucket.Error != "" {
			t.Fatalf("lookup of %s: %+v", cand, rep)
		}
		if b := rep.Rules[0].Bucket; b.Node != "gw-0" {
			id, owner = cand, b.Node
			if !b.Full || b.Remaining != 30 || b.Where != "owner" {
				t.Fatalf("an unseen identity's bucket: %+v", b)
			}
			break
		}
	}
	if id == "" {
		t.Fatal("gw-0 owns 100 identities out of 100")
	}
	req := weir.Request{Method: "GET", Path: "/api", Header: http.Header{"X-Api-Key": {id}}}
	rejected := 0
	for i := 0; rejected < 5 && i < 1000; i++ {
		if d := nodes[i%3].Allow(ctx, req); !d.Allowed {
			rejected++
		}
	}
	if rejected < 5 {
		t.Fatal("the identity was never rejected")
	}
	var fromOwner weir.IdentityReport
	for _, n := range nodes {
		var rep weir.IdentityReport
		// The others' unconfirmed spend reaches the owner within a sync
		// interval; the owner decided the forwarded requests already.
		waitFor(t, func() bool {
			var err error
			if rep, err = ops.LookupIdentity(ctx, n, id, weir.IdentityQuery{Path: "/api"}); err != nil {
				t.Fatal(err)
			}
			// A token comes back every 10 s.
			return len(rep.Rules) == 1 && rep.Rules[0].Bucket.Remaining <= 1
		})
		b := rep.Rules[0].Bucket
		if b.Where != "owner" || b.Node != owner || !b.Known || b.Error != "" || b.Full || b.ResetAfterMS < 280_000 ||
			!slices.Contains(rep.Throttled, "per-key") {
			t.Fatalf("%s sees the bucket as %+v, want %s's spent bucket", rep.Node, b, owner)
		}
		if rep.Node == owner {
			fromOwner = rep
		}
	}
	if fromOwner.Node == "" {
		t.Fatal("no lookup on the owner")
	}
	for _, n := range nodes {
		for _, c := range ops.Counts(n) {
			if c.FailOpen != 0 {
				t.Fatalf("fail-open decisions with no fault: %+v", c)
			}
		}
	}
}

// TestCanaryFlagsUnenforcedRule: the canary sees rejections while its rule
// is enforced, reports not ok (weir_canary_ok 0) once the rule is shadowed
// or removed, and ok again once it is enforced again.
func TestCanaryFlagsUnenforcedRule(t *testing.T) {
	const canaryRules = `
rules:
  - id: weir-canary
    key: [header:X-Weir-Canary]
    match: {path: /weir-canary}
    limit: 1
    window: 1s
    burst: 1
`
	rules := parseRules(t, canaryRules)
	reg := prometheus.NewRegistry()
	n := newNode(t, weir.Config{Rules: rules, Registerer: reg,
		Canary: &weir.CanaryConfig{Rule: "weir-canary", Interval: 20 * time.Millisecond, Window: 400 * time.Millisecond}})
	okGauge := func() float64 { return gatherValue(t, reg, "weir_canary_ok", nil) }
	waitFor(t, func() bool { c := ops.Canary(n); return c.Rejected >= 3 && c.OK && !c.LastRejection.IsZero() })
	if okGauge() != 1 {
		t.Fatal("weir_canary_ok is not 1 while the canary sees rejections")
	}
	shadowed := parseRules(t, canaryRules+"    shadow: true\n")
	if err := n.SetRules(shadowed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !ops.Canary(n).OK })
	if okGauge() != 0 {
		t.Fatal("weir_canary_ok is not 0 with the canary rule shadowed")
	}
	if err := n.SetRules(rules); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return ops.Canary(n).OK })
	if err := n.SetRules(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		c := ops.Canary(n)
		return !c.OK && c.Errors > 0 && strings.Contains(c.LastError, "unknown rule")
	})
	if v := gatherValue(t, reg, "weir_canary_probes_total", map[string]string{"outcome": "error"}); v == 0 {
		t.Fatal("no probe counted as error with the canary rule removed")
	}
	for _, c := range ops.Counts(n) {
		if c.FailOpen != 0 {
			t.Fatalf("fail-open decisions with no fault: %+v", c)
		}
	}
	_ = io.Discard
}

// TestCanaryConfigErrors: a canary without a rule, or with a window too
// short for its interval, is refused naming the field.
func TestCanaryConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		c    weir.CanaryConfig
		want string
	}{
		{weir.CanaryConfig{}, "Config.Canary.Rule"},
		{weir.CanaryConfig{Rule: "x", Interval: time.Second, Window: time.Second}, "Config.Canary.Window"},
		{weir.CanaryConfig{Rule: "x", Interval: -1}, "Config.Canary.Interval"},
	} {
		if _, err := weir.New(weir.Config{Canary: &tc.c}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %+v: %v, want an error naming %s", tc.c, err, tc.want)
		}
	}
}
