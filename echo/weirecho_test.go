package weirecho_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/echo"
	"github.com/weir-dev/weir/quota"
)

const rulesYAML = `
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 60
    window: 1m
    burst: 2
  - id: per-user
    match: {prefix: /user}
    key: [user]
    limit: 10
    window: 1s
    burst: 1
`

// frozenNode is a node on a clock that never moves, so two of them see the
// same decisions for the same requests.
func frozenNode(t *testing.T) *weir.Node {
	t.Helper()
	rules, err := quota.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_800_000_000, 0)
	n, err := weir.New(weir.Config{Rules: rules, Clock: func() time.Time { return start }, MaxIdentityBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

type answer struct {
	code   int
	header http.Header
	body   string
}

func get(t *testing.T, url, key string) answer {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// The echo middleware, with ErrorHandler, sends the headers and bodies weir's net/http
// middleware sends for the same requests: admitted, rejected, and refused
// for an identity over the node's cap.
func TestHeadersEqualWeirMiddleware(t *testing.T) {
	plain := httptest.NewServer(frozenNode(t).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})))
	defer plain.Close()
	e := echo.New()
	e.HTTPErrorHandler = weirecho.ErrorHandler(e.DefaultHTTPErrorHandler)
	e.Use(weirecho.Middleware(frozenNode(t), weirecho.Config{}))
	// The handler answers with the plain handler's bytes, so only the
	// middleware can make the answers differ.
	e.GET("/", func(c echo.Context) error { return c.Blob(http.StatusOK, "text/plain; charset=utf-8", []byte("ok")) })
	srv := httptest.NewServer(e)
	defer srv.Close()

	codes := []int{}
	for _, key := range []string{"alice", "alice", "alice", "alice", "bob", strings.Repeat("k", 40), ""} {
		want := get(t, plain.URL+"/", key)
		got := get(t, srv.URL+"/", key)
		if got.code != want.code || !reflect.DeepEqual(got.header, want.header) || got.body != want.body {
			t.Errorf("key %q: echo answered %d %v %q; weir's middleware %d %v %q",
				key, got.code, got.header, got.body, want.code, want.header, want.body)
		}
		codes = append(codes, got.code)
	}
	if want := []int{200, 200, 429, 429, 200, 400, 200}; !reflect.DeepEqual(codes, want) {
		t.Errorf("statuses %v, want %v", codes, want)
	}
}

// The user comes from echo's context (set by an earlier middleware); with
// echo's own error handler a rejection is its JSON message with the
// rate-limit headers already set; handlers see the decision.
func TestUserFromContextAndDefaultErrorHandler(t *testing.T) {
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { c.Set("user", c.QueryParam("u")); return next(c) }
	})
	e.Use(weirecho.Middleware(frozenNode(t), weirecho.Config{
		User: func(c echo.Context) string { u, _ := c.Get("user").(string); return u },
	}))
	e.GET("/user", func(c echo.Context) error {
		d, ok := weirecho.Decision(c)
		if !ok || !d.Allowed {
			t.Errorf("handler: Decision = %v, %v", d, ok)
		}
		return c.String(http.StatusOK, "ok")
	})
	srv := httptest.NewServer(e)
	defer srv.Close()
	for i, tc := range []struct {
		user string
		code int
	}{{"ann", 200}, {"ann", 429}, {"ben", 200}, {"ann", 429}} {
		a := get(t, srv.URL+"/user?u="+tc.user, "k"+string(rune('0'+i)))
		if a.code != tc.code {
			t.Errorf("request %d (user %s): %d, want %d", i, tc.user, a.code, tc.code)
		}
		if a.code == 429 {
			if a.body != `{"message":"rate limit exceeded: per-user"}`+"\n" || a.header.Get("Retry-After") != "1" || a.header.Get("RateLimit-Policy") == "" {
				t.Errorf("request %d: rejection %v %q", i, a.header, a.body)
			}
		}
	}
}
