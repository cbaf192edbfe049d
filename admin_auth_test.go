package weir_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
)

// syncBuffer is a log sink safe for the handlers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAdminDoors: on a node with Config.Lease.AdminTokens, the three
// operator APIs (RulesAdminHandler, AdminHandler, IdentityHandler, and the
// status page's identity lookup in UIHandler) answer a
// request with no token or a wrong one with 401 and a WWW-Authenticate
// challenge; nothing changes (the rule version stays); every attempt is
// counted and logged at warn through Config.Logger with the remote address
// and path, never the token presented.
func TestAdminDoors(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	n, err := weir.New(weir.Config{Logger: log, Registerer: reg, Lease: &weir.LeaseConfig{
		Voter: &raftgroup.Config{Name: "v1", Dir: t.TempDir(), Voters: []raftgroup.Voter{{Name: "v1"}},
			RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0", Machine: lease.Config{Regions: []string{"eu"}},
			HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
			LeaderLeaseTimeout: 75 * time.Millisecond},
		Rules: true, AdminTokens: map[string]string{adminToken: "alice"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	mux := http.NewServeMux()
	mux.Handle("/v1/rules", ops.RulesAdminHandler(n))
	mux.Handle("/v1/rules/", ops.RulesAdminHandler(n))
	mux.Handle("/admin/report", ops.AdminHandler(n))
	mux.Handle("/v1/identities/", ops.IdentityHandler(n))
	mux.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(n)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	do := func(method, path, token, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if c := do("PUT", "/v1/rules/login", adminToken, `{"limit": 5, "window": "1m", "key": ["ip"]}`).StatusCode; c != 200 {
		t.Fatalf("PUT with the token: %d", c)
	}
	waitFor(t, func() bool { return n.Status().RulesVersion == 1 })

	const wrong = "wrong-token-but-long-enough-0123"
	type attempt struct{ method, path, token string }
	var attempts []attempt
	for _, tok := range []string{"", wrong} {
		attempts = append(attempts,
			attempt{"PUT", "/v1/rules/login", tok},
			attempt{"DELETE", "/v1/rules/login", tok},
			attempt{"GET", "/v1/rules", tok},
			attempt{"GET", "/admin/report", tok},
			attempt{"GET", "/v1/identities/10.0.0.1", tok},
			attempt{"GET", "/ops/v1/identities/10.0.0.1", tok}) // the status page's lookup
	}
	for _, a := range attempts {
		resp := do(a.method, a.path, a.token, `{"limit": 1, "window": "1m", "key": ["ip"]}`)
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("%s %s token=%q: %d, WWW-Authenticate %q; want 401 with a Bearer challenge",
				a.method, a.path, a.token, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	if got := ops.AdminUnauthorized(n); got != uint64(len(attempts)) {
		t.Errorf("AdminUnauthorized = %d, want %d", got, len(attempts))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exported float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "weir_admin_unauthorized_total" {
			exported = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if exported != float64(len(attempts)) {
		t.Errorf("weir_admin_unauthorized_total = %v, want %d", exported, len(attempts))
	}
	// The token opens the read-only doors as well.
	for _, p := range []string{"/admin/report", "/v1/identities/10.0.0.1", "/ops/v1/identities/10.0.0.1"} {
		if c := do("GET", p, adminToken, "").StatusCode; c != 200 {
			t.Errorf("GET %s with the token: %d", p, c)
		}
	}
	// Nothing changed.
	if v := n.Status().RulesVersion; v != 1 {
		t.Errorf("rule version %d after refused changes, want 1", v)
	}
	got := logs.String()
	if strings.Contains(got, wrong) || strings.Contains(got, adminToken) {
		t.Error("a token reached the log")
	}
	// The log is rate limited to a burst of 5 lines; each names the path
	// and the remote address.
	lines := 0
	for _, l := range strings.Split(got, "\n") {
		if !strings.Contains(l, "unauthenticated admin request refused") {
			continue
		}
		lines++
		if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "remote=127.0.0.1:") || !strings.Contains(l, "path=/") {
			t.Errorf("refusal log line lacks level, remote or path: %s", l)
		}
	}
	if lines == 0 {
		t.Fatalf("no refusal logged:\n%s", got)
	}
	for _, c := range ops.Counts(n) {
		if c.FailOpen != 0 {
			t.Errorf("rule %s: %d fail-open decisions", c.Rule, c.FailOpen)
		}
	}
}

// TestGuardStandalone: a node without a lease group puts its operator
// handlers behind a raftgroup.Guard of its own.
func TestGuardStandalone(t *testing.T) {
	n, err := weir.New(weir.Config{Rules: parseRules(t, clusterRules)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	g, err := raftgroup.NewGuard(raftgroup.GuardConfig{Tokens: map[string]string{adminToken: "ops"}})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(ops.AdminHandler(n))
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope-nope-nope-nope-nope", 401}, {"Basic " + adminToken, 401}, {"Bearer " + adminToken, 200}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/admin/report", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, rec.Code, tc.want)
		}
	}
	if g.Unauthorized() != 3 {
		t.Errorf("Unauthorized = %d, want 3", g.Unauthorized())
	}
	if _, err := raftgroup.NewGuard(raftgroup.GuardConfig{Tokens: map[string]string{"short": "ops"}}); err == nil {
		t.Error("a short token was accepted")
	}
}
