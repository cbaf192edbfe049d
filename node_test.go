package weir_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manually advanced clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func parseRules(t *testing.T, y string) []quota.Rule {
	t.Helper()
	rules, err := quota.Parse("test.yaml", []byte(y))
	if err != nil {
		t.Fatalf("parse rules: %v", err)
	}
	return rules
}

func newNode(t *testing.T, cfg weir.Config) *weir.Node {
	t.Helper()
	n, err := weir.New(cfg)
	if err != nil {
		t.Fatalf("weir.New: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

const searchRule = `
rules:
  - id: search
    match: {prefix: /search}
    key: [header:X-API-Key, ip]
    limit: 100
    window: 1m
    burst: 20
`

// TestBurstExample is the burst example of the requirements through the node: a client at
// 100/min with burst 20 may send 20 at once, the 21st is rejected with a
// retry-after of 600 ms, then exactly one passes every 600 ms.
func TestBurstExample(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/search", Header: http.Header{"X-Api-Key": {"k1"}}}
	ctx := context.Background()
	for i := range 20 {
		if d := n.Allow(ctx, req); !d.Allowed {
			t.Fatalf("request %d of the burst rejected", i+1)
		}
	}
	d := n.Allow(ctx, req)
	if d.Allowed {
		t.Fatal("21st request admitted")
	}
	if got := d.RetryAfter(); got != 600*time.Millisecond {
		t.Fatalf("retry-after = %v, want 600ms", got)
	}
	for step := range 50 {
		clk.Advance(599 * time.Millisecond)
		if n.Allow(ctx, req).Allowed {
			t.Fatalf("step %d: admitted before 600ms elapsed", step)
		}
		clk.Advance(time.Millisecond)
		if !n.Allow(ctx, req).Allowed {
			t.Fatalf("step %d: rejected at 600ms", step)
		}
		if n.Allow(ctx, req).Allowed {
			t.Fatalf("step %d: two admitted in one 600ms slot", step)
		}
	}
	// Another key has its own bucket.
	other := req
	other.Header = http.Header{"X-Api-Key": {"k2"}}
	if !n.Allow(ctx, other).Allowed {
		t.Fatal("an unrelated key was rejected")
	}
}

func TestMiddlewareHeadersAndRejection(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: per-key
    match: {prefix: /api}
    key: [header:X-API-Key, ip]
    limit: 10
    window: 1s
    burst: 3
  - id: global
    match: {prefix: /api}
    limit: 1000
    window: 1s
`), Clock: clk.Now})
	var upstream atomic.Int64
	h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	do := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/api/x", nil)
		r.Header.Set("X-API-Key", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := range 3 {
		w := do()
		if w.Code != 200 {
			t.Fatalf("request %d: status %d", i, w.Code)
		}
		if got, want := w.Header().Get("X-RateLimit-Remaining"), string(rune('0'+2-i)); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q", i, got, want)
		}
	}
	w := do()
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", w.Code)
	}
	if upstream.Load() != 3 {
		t.Fatalf("upstream called %d times, want 3 (never for a rejected request)", upstream.Load())
	}
	hdr := w.Header()
	if got := hdr.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1 (100ms rounded up)", got)
	}
	if got := hdr.Get("X-RateLimit-Limit"); got != "10" {
		t.Errorf("X-RateLimit-Limit = %q, want 10", got)
	}
	if got := hdr.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("X-RateLimit-Remaining = %q, want 0", got)
	}
	wantReset := clk.Now().Add(300 * time.Millisecond)
	if got, want := hdr.Get("X-RateLimit-Reset"), itoa(ceilUnix(wantReset)); got != want {
		t.Errorf("X-RateLimit-Reset = %q, want %q", got, want)
	}
	if got, want := hdr.Get("RateLimit-Policy"), `"per-key";q=10;w=1, "global";q=1000;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := hdr.Get("RateLimit"), `"per-key";r=0;t=1, "global";r=997;t=1`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	if got := hdr.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q", got)
	}
	var body struct {
		Status   int    `json:"status"`
		Title    string `json:"title"`
		Detail   string `json:"detail"`
		Violated []struct {
			Rule string `json:"rule"`
		} `json:"violated_rules"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("problem body: %v: %s", err, w.Body.String())
	}
	if body.Status != 429 || len(body.Violated) != 1 || body.Violated[0].Rule != "per-key" {
		t.Errorf("problem body = %+v", body)
	}
	// The rejected request charged no other rule: the global bucket still
	// shows 997 left (3 admitted), not 996, and counts 3 admissions.
	counts := map[string]weir.RuleCounts{}
	for _, c := range ops.Counts(n) {
		counts[c.Rule] = c
	}
	if c := counts["per-key"]; c.Allowed != 3 || c.Rejected != 1 {
		t.Errorf("per-key counts = %+v", c)
	}
	if c := counts["global"]; c.Allowed != 3 || c.Rejected != 0 {
		t.Errorf("global counts = %+v", c)
	}
	clk.Advance(100 * time.Millisecond)
	if w := do(); w.Code != 200 {
		t.Fatalf("after the retry-after: status %d", w.Code)
	}
}

func itoa(v int64) string { return strings.TrimSpace(jsonNum(v)) }

func jsonNum(v int64) string { b, _ := json.Marshal(v); return string(b) }

func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

func TestTrustedProxies(t *testing.T) {
	clk := newFakeClock()
	rules := parseRules(t, `
rules:
  - id: per-ip
    key: [ip]
    limit: 1
    window: 1h
`)
	cases := []struct {
		name    string
		trusted []string
		header  string
		remote  string
		xff     string
		fwd     string
		wantIP  string
	}{
		{"untrusted peer cannot pick its IP", nil, "", "203.0.113.9:5000", "198.51.100.1", "", "203.0.113.9"},
		{"trusted proxy is believed", []string{"10.0.0.0/8"}, "", "10.1.2.3:5000", "198.51.100.1", "", "198.51.100.1"},
		{"spoofed left entries are skipped", []string{"10.0.0.0/8"}, "", "10.1.2.3:5000", "1.1.1.1, 198.51.100.1", "", "198.51.100.1"},
		{"a client's Forwarded is ignored by default", []string{"10.0.0.0/8"}, "", "10.1.2.3:5000", "198.51.100.1", "for=1.1.1.1", "198.51.100.1"},
		{"Forwarded when configured", []string{"10.0.0.0/8"}, "Forwarded", "10.1.2.3:5000", "1.1.1.1", "for=198.51.100.2", "198.51.100.2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, weir.Config{Rules: rules, Clock: clk.Now, TrustedProxies: tc.trusted, ForwardedHeader: tc.header})
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.remote
			r.Header.Set("X-Forwarded-For", tc.xff)
			if tc.fwd != "" {
				r.Header.Set("Forwarded", tc.fwd)
			}
			if got := n.RequestFromHTTP(r).ClientIP; got != tc.wantIP {
				t.Fatalf("client IP = %q, want %q", got, tc.wantIP)
			}
		})
	}
	if _, err := weir.New(weir.Config{TrustedProxies: []string{"not-an-ip"}}); err == nil || !strings.Contains(err.Error(), "TrustedProxies") {
		t.Fatalf("bad trusted proxy: err = %v, want one naming Config.TrustedProxies", err)
	}
}

func TestShadowNeverRejects(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: trial
    key: [header:X-API-Key]
    limit: 2
    window: 1m
    shadow: true
`), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {"bob"}}}
	shadowRejected := 0
	for range 10 {
		d := n.Allow(context.Background(), req)
		if !d.Allowed {
			t.Fatal("a shadow rule rejected a request")
		}
		if r, _ := d.Limiting(); r.ShadowRejected {
			shadowRejected++
		}
	}
	if shadowRejected != 8 {
		t.Fatalf("shadow would-be rejections = %d, want 8", shadowRejected)
	}
	c := ops.Counts(n)
	if len(c) != 1 || c[0].ShadowRejected != 8 || c[0].Allowed != 2 || c[0].Rejected != 0 {
		t.Fatalf("counts = %+v", c)
	}
	top := ops.TopShadowRejected(n)
	if len(top) == 0 || top[0].Identity != "bob" || top[0].Rule != "trial" {
		t.Fatalf("top shadow-rejected = %+v", top)
	}
	if len(ops.TopThrottled(n)) != 0 {
		t.Fatalf("shadow rejections leaked into the throttled list: %+v", ops.TopThrottled(n))
	}
}

func TestIdentityPolicy(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 1
    window: 1h
`), Clock: clk.Now, MaxIdentityBytes: 64})
	h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-API-Key", strings.Repeat("k", 65))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "identity too long") {
		t.Fatalf("oversized identity: %d %s", w.Code, w.Body.String())
	}
	d := n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", Header: r.Header})
	if !errors.Is(d.Err, weir.ErrIdentityTooLong) || d.Allowed {
		t.Fatalf("Allow: %+v", d.Err)
	}
	// No identity at all: every such request shares the rule's "" bucket.
	anon := weir.Request{Method: "GET", Path: "/"}
	if !n.Allow(context.Background(), anon).Allowed {
		t.Fatal("first anonymous request rejected")
	}
	if n.Allow(context.Background(), anon).Allowed {
		t.Fatal("anonymous requests do not share a bucket")
	}
}

func TestPenaltyBox(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: login
    key: [ip]
    limit: 1
    window: 1s
    penalty: {after: 3, within: 1m, base: 10s, max: 40s}
`), Clock: clk.Now})
	req := weir.Request{Method: "POST", Path: "/login", ClientIP: "198.51.100.7"}
	ctx := context.Background()
	if !n.Allow(ctx, req).Allowed {
		t.Fatal("first request rejected")
	}
	for range 3 {
		if n.Allow(ctx, req).Allowed {
			t.Fatal("over-limit request admitted")
		}
	}
	// Three rejections within a minute: locked out for 10s even though the
	// bucket itself has refilled after 1s.
	clk.Advance(2 * time.Second)
	d := n.Allow(ctx, req)
	if d.Allowed {
		t.Fatal("admitted during the lockout")
	}
	if r, _ := d.Limiting(); !r.Locked || r.RetryAfter <= 0 || r.RetryAfter > 10*time.Second {
		t.Fatalf("lockout result = %+v", r)
	}
	clk.Advance(10 * time.Second)
	if !n.Allow(ctx, req).Allowed {
		t.Fatal("still rejected after the lockout ended")
	}
}

func TestConcurrencyReleasedByMiddleware(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: inflight
    key: [header:X-API-Key]
    algorithm: concurrency
    limit: 2
    window: 1m
`)})
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func() int {
		r, _ := http.NewRequest("GET", srv.URL, nil)
		r.Header.Set("X-API-Key", "c")
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); codes <- get() }()
	}
	<-entered
	<-entered
	if c := get(); c != http.StatusTooManyRequests {
		t.Fatalf("third concurrent request: %d, want 429", c)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("held request finished with %d", c)
		}
	}
	if c := get(); c != 200 {
		t.Fatalf("after release: %d, want 200 (slots given back)", c)
	}
}

func TestCheck(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: clk.Now})
	ctx := context.Background()
	r, err := n.Check(ctx, "k", "search", 5)
	if err != nil || !r.Allowed || r.Remaining != 15 || r.Limit != 100 || r.Burst != 20 {
		t.Fatalf("Check = %+v, %v", r, err)
	}
	if !r.ResetAt.Equal(clk.Now().Add(3 * time.Second)) {
		t.Fatalf("ResetAt = %v, want now+3s", r.ResetAt)
	}
	r, _ = n.Check(ctx, "k", "search", 16)
	if r.Allowed || r.RetryAfter != 600*time.Millisecond {
		t.Fatalf("over-spend = %+v", r)
	}
	r, _ = n.Check(ctx, "k", "search", 21)
	if r.Allowed || r.RetryAfter != bucket.Never {
		t.Fatalf("cost above burst = %+v, want RetryAfter Never", r)
	}
	if _, err := n.Check(ctx, "k", "nope", 1); !errors.Is(err, weir.ErrUnknownRule) {
		t.Fatalf("unknown rule: %v", err)
	}
}

func TestRuleFileReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(searchRule)
	reg := prometheus.NewRegistry()
	n := newNode(t, weir.Config{RulesFile: path, ReloadPoll: 50 * time.Millisecond, Registerer: reg})
	if v := n.Status().RulesVersion; v != 1 {
		t.Fatalf("initial version %d", v)
	}
	write(strings.Replace(searchRule, "limit: 100", "limit: 200", 1))
	waitFor(t, func() bool { return n.Status().RulesVersion == 2 })
	if r, _ := n.Check(context.Background(), "k", "search", 1); r.Limit != 200 {
		t.Fatalf("reloaded limit = %d", r.Limit)
	}
	write(strings.Replace(searchRule, "window: 1m", "window: -1m", 1))
	waitFor(t, func() bool { return n.Status().LastReloadError != "" })
	st := n.Status()
	if st.RulesVersion != 2 || !strings.Contains(st.LastReloadError, "rules.yaml:") || !strings.Contains(st.LastReloadError, "window") {
		t.Fatalf("after a bad reload: %+v", st)
	}
	if r, _ := n.Check(context.Background(), "k", "search", 1); r.Limit != 200 {
		t.Fatalf("bad reload changed the rules: limit %d", r.Limit)
	}
	if got := gatherValue(t, reg, "weir_rules_reload_errors_total", nil); got < 1 {
		t.Fatalf("reload errors metric = %v", got)
	}
	if got := gatherValue(t, reg, "weir_rules_version", nil); got != 2 {
		t.Fatalf("version metric = %v", got)
	}
}

func TestDefaultRulesWhenFileUnreadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.yaml")
	defaults := parseRules(t, `
rules:
  - id: safe-default
    key: [ip]
    limit: 1
    window: 1h
`)
	n := newNode(t, weir.Config{RulesFile: path, DefaultRules: defaults, ReloadPoll: 50 * time.Millisecond})
	st := n.Status()
	if !st.UsingDefaultRules || st.LastReloadError == "" {
		t.Fatalf("status = %+v, want defaults in force and the error said", st)
	}
	req := weir.Request{Method: "GET", Path: "/", ClientIP: "192.0.2.1"}
	if !n.Allow(context.Background(), req).Allowed || n.Allow(context.Background(), req).Allowed {
		t.Fatal("the default rule is not enforced")
	}
	if err := os.WriteFile(path, []byte(searchRule), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !n.Status().UsingDefaultRules })
	if _, ok := n.Rules().Lookup("search"); !ok {
		t.Fatal("the file's rules did not replace the defaults")
	}
}

func TestSetRulesRejectsBadRulesAtomically(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule)})
	bad := parseRules(t, searchRule)
	bad = append(bad, quota.Rule{ID: "search", Limit: 1, Window: time.Second})
	if err := n.SetRules(bad); err == nil {
		t.Fatal("duplicate ids accepted")
	}
	if n.Rules().Len() != 1 || n.Status().RulesVersion != 1 {
		t.Fatal("a rejected rule set was half-applied")
	}
}

func TestMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: clk.Now, Registerer: reg})
	req := weir.Request{Method: "GET", Path: "/search", ClientIP: "192.0.2.1"}
	for range 25 {
		n.Allow(context.Background(), req)
	}
	if got := gatherValue(t, reg, "weir_decisions_total", map[string]string{"rule": "search", "outcome": "allowed"}); got != 20 {
		t.Fatalf("allowed = %v", got)
	}
	if got := gatherValue(t, reg, "weir_decisions_total", map[string]string{"rule": "search", "outcome": "rejected"}); got != 5 {
		t.Fatalf("rejected = %v", got)
	}
	if got := gatherValue(t, reg, "weir_keys_live", map[string]string{"store": "gcra"}); got != 1 {
		t.Fatalf("keys live = %v", got)
	}
	n.Close()
	if _, err := weir.New(weir.Config{Registerer: reg}); err != nil {
		t.Fatalf("a closed node's metrics were not unregistered: %v", err)
	}
}

func TestAdminHandler(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/search", ClientIP: "192.0.2.66"}
	for range 30 {
		n.Allow(context.Background(), req)
	}
	w := httptest.NewRecorder()
	ops.AdminHandler(n).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	var rep struct {
		TopThrottled []weir.Hitter `json:"top_throttled"`
		Status       weir.Status   `json:"status"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.TopThrottled) != 1 || rep.TopThrottled[0].Identity != "192.0.2.66" || rep.TopThrottled[0].Count < 10 {
		t.Fatalf("top throttled = %+v", rep.TopThrottled)
	}
	w = httptest.NewRecorder()
	ops.AdminHandler(n).ServeHTTP(w, httptest.NewRequest("POST", "/", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", w.Code)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := []struct {
		cfg  weir.Config
		want string
	}{
		{weir.Config{MaxKeys: -1}, "Config.MaxKeys"},
		{weir.Config{MaxIdentityBytes: -1}, "Config.MaxIdentityBytes"},
		{weir.Config{ForwardedHeader: "X-Real-IP"}, "Config.ForwardedHeader"},
		{weir.Config{Rules: []quota.Rule{{ID: "x"}}}, "Config.Rules"},
		{weir.Config{RulesFile: "a.yaml", Rules: []quota.Rule{{ID: "x", Limit: 1, Window: time.Second}}}, "exclusive"},
	}
	for _, tc := range cases {
		if _, err := weir.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func gatherValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func TestLeakyBucketDelays(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: smooth
    key: [ip]
    algorithm: leaky_bucket
    limit: 10
    window: 1s
    max_delay: 300ms
`), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/", ClientIP: "192.0.2.9"}
	var delays []time.Duration
	for range 5 {
		d := n.Allow(context.Background(), req)
		if !d.Allowed {
			delays = append(delays, -1)
			continue
		}
		delays = append(delays, d.Delay)
	}
	want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, -1}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("delays = %v, want %v (-1 = rejected)", delays, want)
		}
	}
}

func TestOverridesAndTiers(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, `
rules:
  - id: api
    key: [header:X-API-Key]
    limit: 2
    window: 1m
    overrides: [{identity: acme, limit: 5, burst: 5}]
    tiers: [{name: gold, limit: 4}]
`), Clock: clk.Now})
	count := func(key, tier string) int {
		admitted := 0
		for range 10 {
			if n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Api-Key": {key}}, Tier: tier}).Allowed {
				admitted++
			}
		}
		return admitted
	}
	if got := count("plain", ""); got != 2 {
		t.Errorf("rule limit: %d admitted, want 2", got)
	}
	if got := count("acme", "gold"); got != 5 {
		t.Errorf("override: %d admitted, want 5 (an override beats a tier)", got)
	}
	if got := count("other", "gold"); got != 2 {
		t.Errorf("tier: %d admitted, want 2 (the tier's burst defaults to the rule's)", got)
	}
}

// TestDecisionsAllocateNothing: admitting and rejecting a request for a key
// already present allocate nothing, even with a long identity (an abusive
// client makes the rejection path the hot one).
func TestDecisionsAllocateNothing(t *testing.T) {
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/search", Header: http.Header{"X-Api-Key": {strings.Repeat("k", 64)}}}
	ctx := context.Background()
	n.Allow(ctx, req)
	if a := testing.AllocsPerRun(10, func() { n.Allow(ctx, req) }); a != 0 {
		t.Errorf("admission: %v allocations per decision", a)
	}
	for range 30 {
		n.Allow(ctx, req) // spend the burst: what follows is rejected
	}
	if n.Allow(ctx, req).Allowed {
		t.Fatal("the burst was not spent")
	}
	if a := testing.AllocsPerRun(1000, func() { n.Allow(ctx, req) }); a != 0 {
		t.Errorf("rejection: %v allocations per decision", a)
	}
}

// TestMiddlewareAllocations: a request admitted through the middleware
// allocates twice, whatever its rules' key chain: the decision with the
// context that hands it to the upstream and the header values (one
// allocation), and the request with that context (net/http's WithContext).
// The client IP is resolved only when a rule counts by it.
func TestMiddlewareAllocations(t *testing.T) {
	clk := newFakeClock()
	rules := parseRules(t, `
rules:
  - id: by-key
    match: {prefix: /}
    key: [header:X-Api-Key, ip]
    limit: 1000000
    window: 1s
`)
	n := newNode(t, weir.Config{Rules: rules, Clock: clk.Now})
	h := n.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	w := httptest.NewRecorder()
	keyed := httptest.NewRequest("GET", "/items", nil)
	keyed.Header.Set("X-Api-Key", "k1")
	anon := httptest.NewRequest("GET", "/items", nil)
	for _, c := range []struct {
		name string
		r    *http.Request
		want float64
	}{
		{"keyed (the ip is never resolved)", keyed, 2},
		{"anonymous (counted by ip: its string)", anon, 3},
	} {
		h.ServeHTTP(w, c.r)
		if a := testing.AllocsPerRun(100, func() {
			clear(w.Header())
			h.ServeHTTP(w, c.r)
		}); a > c.want {
			t.Errorf("%s: %v allocations per request, want at most %v", c.name, a, c.want)
		}
	}
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: the rule should admit every request", w.Code)
	}
}

// TestFromContext: the upstream behind the middleware sees the decision the
// middleware made (to learn, for example, that it was Degraded).
func TestFromContext(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: newFakeClock().Now})
	var seen *weir.Decision
	h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := weir.FromContext(r.Context())
		if !ok {
			t.Error("no decision in the upstream's context")
			return
		}
		seen = d
	}))
	r := httptest.NewRequest("GET", "/search", nil)
	r.Header.Set("X-API-Key", "ctx")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if seen == nil || !seen.Allowed || seen.Degraded || len(seen.Results()) != 1 || seen.Results()[0].Rule != "search" || seen.Results()[0].Remaining != 19 {
		t.Fatalf("decision seen upstream: %+v", seen)
	}
	if _, ok := weir.FromContext(context.Background()); ok {
		t.Fatal("FromContext found a decision outside the middleware")
	}
}

// TestFromContextDerived: the context the upstream gets is its request's
// context with the decision: the decision is found through contexts the
// upstream derives from it, the request's own values stay visible, and a
// cancellation of the request (a client gone) reaches the derived contexts.
func TestFromContextDerived(t *testing.T) {
	n := newNode(t, weir.Config{Rules: parseRules(t, searchRule), Clock: newFakeClock().Now})
	type ownKey struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ownKey{}, "kept"))
	defer cancel()
	var found, own bool
	var canceled error
	h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, stop := context.WithTimeout(r.Context(), time.Minute)
		defer stop()
		_, found = weir.FromContext(ctx)
		own = ctx.Value(ownKey{}) == "kept"
		cancel() // the client goes away
		select {
		case <-ctx.Done():
			canceled = ctx.Err()
		case <-time.After(10 * time.Second):
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(parent, "GET", "/search", nil))
	if !found {
		t.Error("FromContext found no decision through a context derived from the request's")
	}
	if !own {
		t.Error("the request's own context value is not visible behind the middleware")
	}
	if !errors.Is(canceled, context.Canceled) {
		t.Errorf("a cancelled request reached the derived context as %v, want context.Canceled", canceled)
	}
}

// An unusable rules file at start is an error from New, naming the file,
// line and field, unless the caller opted in to starting on DefaultRules.
func TestInvalidRulesFileAtStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - id: search\n    key: [ip]\n    limit: -5\n    window: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := weir.New(weir.Config{RulesFile: bad})
	if err == nil {
		t.Fatal("New started on an invalid rules file with no DefaultRules")
	}
	for _, want := range []string{bad, "rules.yaml:4", "limit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := weir.New(weir.Config{RulesFile: filepath.Join(dir, "missing.yaml")}); err == nil {
		t.Error("New started on a missing rules file with no DefaultRules")
	}

	// Opted in: the node starts on its defaults and says why, in the log.
	var logs syncBuffer
	defaults := parseRules(t, "rules:\n  - id: safe\n    key: [ip]\n    limit: 1\n    window: 1h\n")
	n := newNode(t, weir.Config{RulesFile: bad, DefaultRules: defaults, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !n.Status().UsingDefaultRules {
		t.Fatal("the node is not on its default rules")
	}
	for _, want := range []string{bad, "rules.yaml:4", "limit"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log %q does not name %q", logs.String(), want)
		}
	}
}

// With no Config.Logger the node's warnings and errors reach slog.Default()
// (a refused reload, here), and its informational lines do not.
func TestNilLoggerLogsThroughDefault(t *testing.T) {
	var logs syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(searchRule), 0o644); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, weir.Config{RulesFile: path, ReloadPoll: 20 * time.Millisecond})
	if err := os.WriteFile(path, []byte("rules:\n  - id: search\n    key: [ip]\n    limit: 10\n    window: 1 fortnight\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "rule reload failed") })
	out := logs.String()
	for _, want := range []string{path, "rules.yaml:5", "window", "level=ERROR"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q does not name %q", out, want)
		}
	}
	if strings.Contains(out, "level=INFO") {
		t.Errorf("informational lines reached the default logger: %q", out)
	}
	_ = n
}
