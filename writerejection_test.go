package weir_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// WriteRejection answers with the bytes the middleware answers with: same
// status, same header fields, same problem body, for a rejection and for an
// identity too long to evaluate.
func TestWriteRejectionMatchesMiddleware(t *testing.T) {
	rules, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 60
    window: 1m
    burst: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return start }
	// Two nodes on one frozen clock see the same sequence of decisions.
	mw, err := weir.New(weir.Config{Rules: rules, Clock: clock, MaxIdentityBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	direct, err := weir.New(weir.Config{Rules: rules, Clock: clock, MaxIdentityBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	h := mw.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, key := range []string{"alice", "alice", "alice", strings.Repeat("k", 40)} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", key)
		want := httptest.NewRecorder()
		h.ServeHTTP(want, r)
		d := direct.Allow(context.Background(), direct.RequestFromHTTP(r))
		got := httptest.NewRecorder()
		if d.Allowed {
			d.WriteHeaders(got.Header())
		} else {
			weir.WriteRejection(got, &d)
		}
		d.Done()
		if got.Code != want.Code || !reflect.DeepEqual(got.Header(), want.Header()) || got.Body.String() != want.Body.String() {
			t.Errorf("request %d: WriteRejection answered %d %v %q; the middleware %d %v %q", i,
				got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
		}
	}
}
