package weir_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// Benchmarks of the node's end-to-end decision against the bare keyed
// decision it is built on, over the same identities, in one run:
//
//	go test -run '^$' -bench 'NodeAllow|BareKeyed|Middleware' -benchmem .
//
// BareKeyed is what bucket/ costs alone: hash the identity, mix in the
// rule, apply GCRA in the store, with the time passed in. NodeAllow adds
// rule matching, the key chain, the clock read, metrics and the Decision.

func benchIdentities(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("key-%028d", i*7919%n) // 32 bytes
	}
	return ids
}

// benchRules admits 100/s per key with a burst so large that every key
// stays in the store (spent, never idle) and every decision is an admission:
// the benchmarks measure the steady state of a hot key set, not inserts.
var benchRules = []quota.Rule{{
	ID:     "per-key",
	Match:  quota.Match{Prefix: "/api"},
	Key:    []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}, {Kind: quota.KeyIP}},
	Limit:  100,
	Window: time.Second,
	Burst:  1_000_000_000,
}}

func BenchmarkBareKeyed(b *testing.B) {
	ids := benchIdentities(1000)
	g, err := bucket.NewGCRA(100, time.Second, 1_000_000_000)
	if err != nil {
		b.Fatal(err)
	}
	st, err := bucket.NewGCRAStore(bucket.StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	h := bucket.NewHasher()
	salt := h.Sum("rule\x00per-key")
	now := time.Now().UnixNano()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now += 100
		st.Apply(bucket.Mix(salt, h.Sum(ids[i%len(ids)])), now, &g, 1)
	}
}

func BenchmarkNodeAllow(b *testing.B) {
	ids := benchIdentities(1000)
	n, err := weir.New(weir.Config{Rules: benchRules})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	reqs := make([]weir.Request, len(ids))
	for i, id := range ids {
		reqs[i] = weir.Request{Method: "GET", Path: "/api/items", Header: http.Header{"X-Api-Key": {id}}, ClientIP: "192.0.2.1"}
	}
	ctx := context.Background()
	b.Run("keys=1k/serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			n.Allow(ctx, reqs[i%len(reqs)])
		}
	})
	b.Run("keys=1k/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				n.Allow(ctx, reqs[i%len(reqs)])
				i++
			}
		})
	})
	// The same identities from the chain's second source (ip): the
	// namespaced key of keys.go, against the first source's above.
	anon := make([]weir.Request, len(ids))
	for i, id := range ids {
		anon[i] = weir.Request{Method: "GET", Path: "/api/items", ClientIP: id}
	}
	b.Run("keys=1k/second-source/serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			n.Allow(ctx, anon[i%len(anon)])
		}
	})
}

// BenchmarkMiddleware is the whole HTTP wrapper (client IP, headers, the
// decision) around a handler that does nothing, against the bare handler.
func BenchmarkMiddleware(b *testing.B) {
	n, err := weir.New(weir.Config{Rules: benchRules})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	nop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	ids := benchIdentities(1000)
	run := func(b *testing.B, h http.Handler) {
		r := httptest.NewRequest("GET", "/api/items", nil)
		w := httptest.NewRecorder()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r.Header.Set("X-Api-Key", ids[i%len(ids)])
			for k := range w.Header() {
				delete(w.Header(), k)
			}
			h.ServeHTTP(w, r)
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, nop) })
	b.Run("weir", func(b *testing.B) { run(b, n.Middleware(nop)) })
}
