package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// Wrap a handler: 429s with Retry-After and rate-limit headers come for free.
func ExampleNode_Middleware() {
	rules, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: per-key
    key: [header:X-API-Key, ip]
    limit: 60
    window: 1m
    burst: 2
`))
	if err != nil {
		panic(err)
	}
	start := time.Unix(1_800_000_000, 0)
	node, err := weir.New(weir.Config{Rules: rules, Clock: func() time.Time { return start }})
	if err != nil {
		panic(err)
	}
	defer node.Close()
	h := node.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 1  "per-key";r=1;t=1
	// 200 0  "per-key";r=0;t=2
	// 429 0 1 "per-key";r=0;t=2
}

// Allow decides a request without HTTP: every applicable rule must pass.
func ExampleNode_Allow() {
	node, err := weir.New(weir.Config{Rules: []quota.Rule{{
		ID:     "search",
		Match:  quota.Match{Prefix: "/search"},
		Key:    []quota.KeySource{{Kind: quota.KeyUser}},
		Limit:  100,
		Window: time.Minute,
		Burst:  20,
	}}})
	if err != nil {
		panic(err)
	}
	defer node.Close()
	admitted := 0
	for range 25 {
		d := node.Allow(context.Background(), weir.Request{Method: "GET", Path: "/search", User: "u1"})
		if d.Allowed {
			admitted++
		}
	}
	fmt.Println("admitted", admitted, "of 25")
	// Output: admitted 20 of 25
}
