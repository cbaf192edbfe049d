package weir_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// FuzzMiddleware drives the whole HTTP path with hostile request parts: the
// path, method, API key, forwarding headers and peer address. It must never
// panic, must answer 200, 400 or 429 and nothing else, must never call the
// upstream for a rejection, and must always send well-formed rate-limit
// fields when a rule applied.
func FuzzMiddleware(f *testing.F) {
	f.Add("GET", "/api/x", "alice", "198.51.100.1", "", "10.0.0.1:1234")
	f.Add("POST", "/api/../api//x", strings.Repeat("k", 2000), "1.1.1.1, 2.2.2.2", `for="[2001:db8::1]:80"`, "10.0.0.1:1")
	f.Add("get", "", "", "garbage,,,", "for=_hidden;proto=http", "not-an-addr")
	f.Add("DELETE", "/api/\x00/x", "\xff\xfe", "::ffff:1.2.3.4", "for=unknown", "[::1]:80")
	rules, err := quota.Parse("fuzz.yaml", []byte(`
rules:
  - id: per-key
    match: {prefix: /api}
    key: [header:X-API-Key, ip]
    limit: 5
    window: 1s
    burst: 2
    cost_by_method: {POST: 2}
  - id: per-ip
    key: [ip]
    limit: 1000
    window: 1s
  - id: trial
    match: {pattern: "/api/{id}/*"}
    key: [ip]
    limit: 1
    window: 1m
    shadow: true
`))
	if err != nil {
		f.Fatal(err)
	}
	clk := time.Unix(1_800_000_000, 0)
	n, err := weir.New(weir.Config{Rules: rules, Clock: func() time.Time { return clk }, TrustedProxies: []string{"10.0.0.0/8", "::1"}, MaxIdentityBytes: 1024})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.Close() })
	f.Fuzz(func(t *testing.T, method, path, key, xff, fwd, remote string) {
		called := false
		h := n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true }))
		r := httptest.NewRequest("GET", "/", nil)
		r.Method = method
		r.URL.Path = path
		r.RemoteAddr = remote
		r.Header.Set("X-API-Key", key)
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("Forwarded", fwd)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusOK:
			if !called {
				t.Fatal("200 without calling the upstream")
			}
		case http.StatusTooManyRequests:
			if called {
				t.Fatal("upstream called for a rejected request")
			}
			if ra := w.Header().Get("Retry-After"); ra != "" {
				if v, err := strconv.Atoi(ra); err != nil || v < 1 {
					t.Fatalf("Retry-After %q", ra)
				}
			}
		case http.StatusBadRequest:
			if called || len(key) <= 1024 {
				t.Fatalf("400 for a key of %d bytes (called=%v): %s", len(key), called, w.Body.String())
			}
		default:
			t.Fatalf("status %d", w.Code)
		}
		if p := w.Header().Get("RateLimit-Policy"); p != "" && !strings.HasPrefix(p, `"`) {
			t.Fatalf("RateLimit-Policy %q", p)
		}
		if rem := w.Header().Get("X-RateLimit-Remaining"); rem != "" {
			if v, err := strconv.ParseInt(rem, 10, 64); err != nil || v < 0 {
				t.Fatalf("X-RateLimit-Remaining %q", rem)
			}
		}
	})
}
