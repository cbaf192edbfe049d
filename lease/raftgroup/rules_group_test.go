package raftgroup

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/quota"
)

// These tests run the rule store end to end: real Raft on raft-boltdb in
// t.TempDir(), the forwarding service and the admin API over HTTP, all on
// 127.0.0.1 with ephemeral ports. No fault is injected unless a test says
// so, and none uses a timed assertion.

const (
	aliceToken = "alice-token-0123456789abcdef"
	bobToken   = "bob-token-0123456789abcdefgh"
)

// adminServer serves the admin API over store on loopback.
func adminServer(t *testing.T, store RuleService) (*httptest.Server, *Admin) {
	t.Helper()
	a, err := AdminHandler(AdminConfig{Store: store, Tokens: map[string]string{aliceToken: "alice", bobToken: "bob"},
		Timeout: waitBound, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return srv, a
}

// reply is an HTTP answer with its JSON body decoded.
type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func call(t *testing.T, hc *http.Client, method, url, token, body string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, url, raw, err)
		}
	}
	return r
}

// expect checks an answer's status, and for errors its problem+json form.
func (r reply) expect(t *testing.T, what string, status int) reply {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, r.status, status, r.raw)
	}
	if status >= 400 {
		if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("%s: Content-Type %q", what, ct)
		}
		if r.body["status"] != float64(status) || r.body["title"] == "" {
			t.Fatalf("%s: problem %v", what, r.body)
		}
	}
	return r
}

// problemFields lists the fields a problem names.
func (r reply) problemFields() []string {
	var out []string
	errs, _ := r.body["errors"].([]any)
	for _, e := range errs {
		m, _ := e.(map[string]any)
		f, _ := m["field"].(string)
		out = append(out, f)
	}
	return out
}

// storeState is what must not move when a change is refused: every
// replica's version, rules and history.
func storeState(c *cluster) string {
	var b strings.Builder
	for _, g := range c.live() {
		v := g.FSM().ReadRules(true, true, 0, 0)
		js, _ := json.Marshal(v)
		b.Write(js)
	}
	return b.String()
}

// waitVersion waits until every running replica's rule store reaches v.
func waitVersion(t *testing.T, c *cluster, v uint64) {
	t.Helper()
	waitFor(t, "every replica at the rule version", func() bool {
		for _, g := range c.live() {
			if got, _ := g.Rules(); got != v {
				return false
			}
		}
		return true
	})
}

// TestRulesAdminThroughFollower: the admin API served by a follower puts,
// reads, deletes and lists the history of rules (writes forwarded to the
// leader); a global rule reaches every replica's lease Machine; invalid,
// malformed, oversized, unauthenticated and wrong-token requests are
// refused with problem+json naming the field and change nothing.
func TestRulesAdminThroughFollower(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader()
	f := c.follower(l)
	srv, admin := adminServer(t, f)
	hc := srv.Client()
	url := srv.URL + "/v1/rules"

	put := call(t, hc, "PUT", url+"/search", aliceToken,
		`{"limit": 100, "window": "1m", "burst": 20, "key": ["header:X-Api-Key"], "match": {"prefix": "/search"}, "description": "caf\u00e9 \/ search"}`).
		expect(t, "put search", 200)
	if put.body["version"] != 1.0 {
		t.Fatalf("put: %v", put.body)
	}
	call(t, hc, "PUT", url+"/cust-global", bobToken,
		`{"id": "cust-global", "limit": 10000, "window": "1m", "burst": 600, "cost": 2, "cost_by_method": {"post": 5}, "scope": "global"}`).
		expect(t, "put global", 200)
	waitVersion(t, c, 2)

	// The global rule reached every replica's lease Machine.
	want := []lease.Rule{{ID: "cust-global", Limit: 10000, Window: time.Minute, Burst: 600, MaxCost: 5}}
	for _, g := range c.live() {
		if got := g.FSM().LeaseRules(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: machine rules %+v, want %+v", g.Name(), got, want)
		}
	}
	// And a region's report on it is served.
	res := propose(t, f, lease.Command{Report: &lease.Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "cust-global", Identity: "cust", Demand: 3000}}}})
	if len(res.Grants) != 1 || res.Grants[0].Share != 3000 {
		t.Fatalf("grants on the stored global rule: %+v", res.Grants)
	}

	// Reads: local and linearizable, the rule in normalised form, which
	// PUTs back unchanged.
	for _, q := range []string{"", "?consistent=true"} {
		got := call(t, hc, "GET", url+"/search"+q, aliceToken, "").expect(t, "get "+q, 200)
		rule := got.body["rule"].(map[string]any)
		if rule["id"] != "search" || rule["burst"] != 20.0 || rule["window"] != "1m0s" || rule["mode"] != "shared" ||
			rule["description"] != "café / search" {
			t.Fatalf("get%s: %v", q, got.body)
		}
		list := call(t, hc, "GET", url+q, bobToken, "").expect(t, "list", 200)
		if rules := list.body["rules"].([]any); len(rules) != 2 || list.body["version"] != 2.0 {
			t.Fatalf("list%s: %v", q, list.body)
		}
	}
	got := call(t, hc, "GET", url+"/search", aliceToken, "").expect(t, "get", 200)
	back, _ := json.Marshal(got.body["rule"])
	if r := call(t, hc, "PUT", url+"/search", aliceToken, string(back)).expect(t, "put back", 200); r.body["version"] != 2.0 {
		t.Fatalf("putting back a rule read with GET changed the version: %v", r.body)
	}

	// Refusals change nothing.
	before := storeState(c)
	for _, tc := range []struct {
		what, method, path, token, body string
		status                          int
		fields                          []string
	}{
		{"invalid rule", "PUT", "/search", aliceToken, `{"limit": 10, "window": "1m", "burst": 5, "cost_by_method": {"POST": 500}, "accuracy": 0.9}`, 422, []string{"cost_by_method.POST", "accuracy"}},
		{"unleasable global", "PUT", "/cust-global", aliceToken, `{"limit": 10000, "window": "1m", "burst": 12, "cost": 5, "scope": "global"}`, 422, []string{"burst"}},
		{"unknown field", "PUT", "/search", aliceToken, `{"limit": 1, "window": "1m", "colour": "red"}`, 400, []string{"colour"}},
		{"duration without unit", "PUT", "/search", aliceToken, `{"limit": 1, "window": 60}`, 400, []string{"window"}},
		{"malformed JSON", "PUT", "/search", aliceToken, `{"limit": 1,`, 400, []string{""}},
		{"not an object", "PUT", "/search", aliceToken, `[1]`, 400, []string{""}},
		{"other id", "PUT", "/search", aliceToken, `{"id": "other", "limit": 1, "window": "1m"}`, 400, []string{"id"}},
		{"bad id", "PUT", "/bad%20id", aliceToken, `{"limit": 1, "window": "1m"}`, 422, []string{"id"}},
		{"too large", "PUT", "/search", aliceToken, `{"description": "` + strings.Repeat("x", DefaultAdminMaxBody) + `"}`, 413, nil},
		{"no credentials", "PUT", "/search", "", `{"limit": 1, "window": "1m"}`, 401, nil},
		{"wrong token", "PUT", "/search", "alice-token-0123456789abcdeX", `{"limit": 1, "window": "1m"}`, 401, nil},
		{"no credentials, delete", "DELETE", "/search", "", "", 401, nil},
		{"unknown id", "DELETE", "/nope", aliceToken, "", 404, nil},
		{"get unknown", "GET", "/nope", aliceToken, "", 404, nil},
		{"wrong method", "POST", "/search", aliceToken, `{}`, 405, nil},
		{"wrong method on the list", "DELETE", "", aliceToken, "", 405, nil},
		{"bad since", "GET", "/history?since=x", aliceToken, "", 400, []string{"since"}},
		{"nothing there", "GET", "/search/x", aliceToken, "", 404, nil},
	} {
		r := call(t, hc, tc.method, url+tc.path, tc.token, tc.body).expect(t, tc.what, tc.status)
		if tc.fields != nil && strings.Join(r.problemFields(), ",") != strings.Join(tc.fields, ",") {
			t.Errorf("%s: fields %q, want %q: %s", tc.what, r.problemFields(), tc.fields, r.raw)
		}
		if tc.status == 401 && r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: no WWW-Authenticate", tc.what)
		}
		if tc.status == 405 && r.header.Get("Allow") == "" {
			t.Errorf("%s: no Allow", tc.what)
		}
	}
	if admin.Unauthorized() != 3 {
		t.Fatalf("%d refused authentications counted, want 3", admin.Unauthorized())
	}
	// The leader applied the unleasable global rule's entry and refused
	// it; wait until every replica applied as much before comparing.
	idx := l.AppliedIndex()
	waitFor(t, "replicas to apply the refused entry", func() bool {
		for _, g := range c.live() {
			if g.AppliedIndex() < idx {
				return false
			}
		}
		return true
	})
	if after := storeState(c); after != before {
		t.Fatalf("a refused request changed the rule store:\n%s\n%s", before, after)
	}

	// Delete, then the history: who, what, in order.
	call(t, hc, "DELETE", url+"/search", bobToken, "").expect(t, "delete", 200)
	call(t, hc, "GET", url+"/search?consistent=true", aliceToken, "").expect(t, "get deleted", 404)
	hist := call(t, hc, "GET", url+"/history?consistent=true", aliceToken, "").expect(t, "history", 200)
	entries := hist.body["entries"].([]any)
	if len(entries) != 3 || hist.body["version"] != 3.0 || hist.body["oldest"] != 1.0 {
		t.Fatalf("history: %v", hist.body)
	}
	for i, w := range []struct{ who, op, id string }{{"alice", "put", "search"}, {"bob", "put", "cust-global"}, {"bob", "delete", "search"}} {
		e := entries[i].(map[string]any)
		if e["principal"] != w.who || e["op"] != w.op || e["rule_id"] != w.id || e["version"] != float64(i+1) {
			t.Errorf("entry %d: %v, want %+v", i, e, w)
		}
		if at, err := time.Parse(time.RFC3339Nano, e["at"].(string)); err != nil || time.Since(at) > time.Hour {
			t.Errorf("entry %d: at %v (%v)", i, e["at"], err)
		}
	}
	if e := entries[2].(map[string]any); e["after"] != nil || e["before"].(map[string]any)["id"] != "search" {
		t.Fatalf("the delete's before and after: %v", e)
	}
	page := call(t, hc, "GET", url+"/history?since=1&limit=1", aliceToken, "").expect(t, "history page", 200)
	if es := page.body["entries"].([]any); len(es) != 1 || es[0].(map[string]any)["version"] != 2.0 {
		t.Fatalf("history page: %v", page.body)
	}
	noDegradation(t, c)
}

// TestRulesClient: a node that is not a voter changes and reads the rule
// store through a Client dialing the voters (one of them not running):
// writes are forwarded to the leader, reads come from the voter reached or
// linearizably from the leader, and refusals come back with the same
// sentinels and field names as on a voter.
func TestRulesClient(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.leader()
	addrs := []string{closedAddr(t)} // a voter that is down: the client moves on
	for _, g := range c.live() {
		addrs = append(addrs, g.RPCAddr())
	}
	cl, err := NewClient(ClientConfig{Voters: addrs, Name: "gateway-1", Timeout: waitBound})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()

	if v, err := cl.PutRule(ctx, "ops", searchRule); err != nil || v != 1 {
		t.Fatalf("put: %d, %v", v, err)
	}
	if v, err := cl.PutRule(ctx, "ops", globalRule); err != nil || v != 2 {
		t.Fatalf("put: %d, %v", v, err)
	}
	v, rules, err := cl.ReadRules(ctx, true)
	if err != nil || v != 2 || len(rules) != 2 || rules[0].ID != "cust-global" || rules[1].Burst != 20 {
		t.Fatalf("linearizable read: %d %+v %v", v, rules, err)
	}
	bad := searchRule
	bad.Limit = 0
	if _, err := cl.PutRule(ctx, "ops", bad); !errors.Is(err, quota.ErrInvalidRule) || strings.Join(fields(err), ",") != "limit" {
		t.Fatalf("invalid put through the client: %v", err)
	}
	// Refused by the leader's machine, not by the client's checks: the
	// problem travels back over two hops with its field.
	unleasable := globalRule
	unleasable.Burst, unleasable.CostByMethod = 5, nil
	if _, err := cl.PutRule(ctx, "ops", unleasable); !errors.Is(err, quota.ErrInvalidRule) || strings.Join(fields(err), ",") != "burst" {
		t.Fatalf("unleasable put through the client: %v", err)
	}
	if _, err := cl.DeleteRule(ctx, "ops", "nope"); !errors.Is(err, lease.ErrRuleNotFound) {
		t.Fatalf("delete unknown: %v", err)
	}
	if v, err := cl.DeleteRule(ctx, "ops", "search"); err != nil || v != 3 {
		t.Fatalf("delete: %d, %v", v, err)
	}
	page, err := cl.ReadHistory(ctx, HistoryQuery{Since: 1, Linearizable: true})
	if err != nil || page.Version != 3 || len(page.Entries) != 2 || page.Entries[1].Op != lease.OpDelete || page.Entries[1].Principal != "ops" {
		t.Fatalf("history: %+v %v", page, err)
	}
	// A local read from a voter converges to the same.
	waitFor(t, "the voter the client reads to catch up", func() bool {
		v, _, err := cl.ReadRules(ctx, false)
		return err == nil && v == 3
	})
	// The admin API works over the client too.
	srv, _ := adminServer(t, cl)
	r := call(t, srv.Client(), "GET", srv.URL+"/v1/rules/cust-global?consistent=true", aliceToken, "").expect(t, "get via client", 200)
	if r.body["version"] != 3.0 {
		t.Fatalf("get via the client: %v", r.body)
	}
	noDegradation(t, c)
}

// noDegradation checks, at the end of a test that injects no fault, that
// no replica counted a malformed message and every replica's invariant
// holds (the lease group's counterpart of the fail-open count).
func noDegradation(t *testing.T, c *cluster) {
	t.Helper()
	c.checkAll("end")
	for _, g := range c.live() {
		if g.Malformed() != 0 {
			t.Errorf("%s counted %d malformed commands", g.Name(), g.Malformed())
		}
	}
}

// TestRulesAdminMutualTLS: a client certificate verified by the admin
// server authenticates; its subject's common name is the principal in the
// audit entry; without a certificate or token the request is refused.
func TestRulesAdminMutualTLS(t *testing.T) {
	c := newCluster(t, 1, nil)
	g := c.leader()
	pool, cert := testCerts(t)
	a, err := AdminHandler(AdminConfig{Store: g, Tokens: map[string]string{aliceToken: "alice"}, Timeout: waitBound})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(a)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	defer srv.Close()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}}
	defer tr.CloseIdleConnections()
	withCert := &http.Client{Transport: tr}
	noTr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}
	defer noTr.CloseIdleConnections()
	noCert := &http.Client{Transport: noTr}

	call(t, noCert, "PUT", srv.URL+"/v1/rules/login", "", `{"limit": 5, "window": "1m"}`).expect(t, "no cert", 401)
	call(t, withCert, "PUT", srv.URL+"/v1/rules/login", "", `{"limit": 5, "window": "1m", "on_failure": "closed"}`).expect(t, "cert", 200)
	// A token, when given, is what authenticates.
	call(t, withCert, "PUT", srv.URL+"/v1/rules/login", "wrong-token-0123456789", `{"limit": 6, "window": "1m"}`).expect(t, "cert, wrong token", 401)
	call(t, noCert, "PUT", srv.URL+"/v1/rules/login", aliceToken, `{"limit": 6, "window": "1m"}`).expect(t, "token", 200)
	h := g.History(0)
	if len(h) != 2 || h[0].Principal != "lease voter" || h[1].Principal != "alice" {
		t.Fatalf("history principals: %+v", h)
	}
	if a.Unauthorized() != 2 {
		t.Fatalf("%d refused", a.Unauthorized())
	}
	noDegradation(t, c)
}

// TestRulesRestartAll: every voter stops and starts again on its data
// directory (one of them from a snapshot with the log behind it
// compacted); the rules, their history and the lease machine's rules are
// intact on every replica.
func TestRulesRestartAll(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.TickInterval = -1; cfg.TrailingLogs = 1 })
	l := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	for _, step := range []func() (uint64, error){
		func() (uint64, error) { return l.PutRule(ctx, "alice", searchRule) },
		func() (uint64, error) { return c.follower(l).PutRule(ctx, "bob", globalRule) },
		func() (uint64, error) { return l.DeleteRule(ctx, "carol", "search") },
		func() (uint64, error) { return l.PutRule(ctx, "dave", searchRule) },
	} {
		if _, err := step(); err != nil {
			t.Fatal(err)
		}
	}
	waitVersion(t, c, 4)
	want := c.converge()
	wantView := l.FSM().ReadRules(true, true, 0, 0)
	if err := c.follower(l).Snapshot(); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names {
		c.stop(n)
	}
	for _, n := range c.names {
		c.restart(n)
	}
	c.leader()
	waitVersion(t, c, 4)
	restored := 0
	for _, g := range c.live() {
		restored += g.FSM().Restores()
		got := g.FSM().ReadRules(true, true, 0, 0)
		if !reflect.DeepEqual(got, wantView) {
			t.Fatalf("%s: rule store after the restart differs:\n%+v\n%+v", g.Name(), got, wantView)
		}
		if lr := g.FSM().LeaseRules(); len(lr) != 1 || lr[0].ID != "cust-global" {
			t.Fatalf("%s: machine rules %+v", g.Name(), lr)
		}
	}
	if restored == 0 {
		t.Fatal("no replica restored from the snapshot")
	}
	// Only the Takeover moved: time and guard, no rule.
	s, err := lease.ReadState(c.converge())
	if err != nil {
		t.Fatal(err)
	}
	w, _ := lease.ReadState(want)
	if !bytes.Equal(s.RuleStore, w.RuleStore) ||
		!reflect.DeepEqual(s.Rules, w.Rules) {
		t.Fatal("the rule store or the machine's rules moved across the restart")
	}
	noDegradation(t, c)
}
