package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// BenchmarkMiddleware is one request through each library's own HTTP
// middleware around a handler that does nothing, keyed by the X-Api-Key
// header, with one rule of 100 per second and a burst of 100 at each
// library's defaults, over 1 M identities visited in a shuffled order (every
// identity seen once before the timer starts), in one run:
//
//	go test -run '^$' -bench Middleware -benchmem
//
// bare is the handler and the benchmark's own loop alone. The peers:
// sethvargo/go-limiter's httplimit on its memorystore (100 tokens per
// second) and throttled's HTTPRateLimiterCtx with VaryBy on the header, on
// its GCRA and unbounded memory store. weir is Node.Middleware with the rule
// in the default mode of a node without a cluster (local).
func BenchmarkMiddleware(b *testing.B) {
	const n = 1 << 20
	ids := make([]string, n)
	for i := range ids {
		ids[i] = identity(uint32(i))
	}
	order := shuffledOrder(n)
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

	node, err := weir.New(weir.Config{Rules: []quota.Rule{{
		ID:     "per-key",
		Key:    []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}, {Kind: quota.KeyIP}},
		Limit:  100,
		Window: time.Second,
		Burst:  100,
	}}})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()

	gl, err := memorystore.New(&memorystore.Config{Tokens: 100, Interval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer gl.Close(context.Background())
	glm, err := httplimit.NewMiddleware(gl, func(r *http.Request) (string, error) { return r.Header.Get("X-Api-Key"), nil })
	if err != nil {
		b.Fatal(err)
	}

	ts, err := memstore.NewCtx(0)
	if err != nil {
		b.Fatal(err)
	}
	tl, err := throttled.NewGCRARateLimiterCtx(ts, throttled.RateQuota{MaxRate: throttled.PerSec(100), MaxBurst: 100})
	if err != nil {
		b.Fatal(err)
	}
	tm := &throttled.HTTPRateLimiterCtx{RateLimiter: tl, VaryBy: &throttled.VaryBy{Headers: []string{"X-Api-Key"}}}

	for _, s := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", nop},
		{"weir", node.Middleware(nop)},
		{"go-limiter-httplimit", glm.Handle(nop)},
		{"throttled", tm.RateLimit(nop)},
	} {
		b.Run(s.name+"/serial", func(b *testing.B) {
			w := &nopWriter{h: http.Header{}}
			r := httptest.NewRequest("GET", "/api/items", nil)
			key := []string{""}
			r.Header["X-Api-Key"] = key
			for _, id := range ids {
				key[0] = id
				clear(w.h)
				s.h.ServeHTTP(w, r)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				key[0] = identity(order[i&(n-1)])
				clear(w.h)
				s.h.ServeHTTP(w, r)
				if w.code == http.StatusTooManyRequests {
					b.Fatal("a rejection: the rule should admit every request of this walk")
				}
			}
		})
		b.Run(s.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Uint32
			b.RunParallel(func(pb *testing.PB) {
				w := &nopWriter{h: http.Header{}}
				r := httptest.NewRequest("GET", "/api/items", nil)
				key := []string{""}
				r.Header["X-Api-Key"] = key
				i := next.Add(n / 7)
				for pb.Next() {
					key[0] = identity(order[i&(n-1)])
					clear(w.h)
					s.h.ServeHTTP(w, r)
					i++
				}
			})
		})
	}
}

// identity returns identity i as a new string, in cache as a freshly parsed
// request's header is (one allocation of 32 bytes in every figure,
// bare's included).
func identity(i uint32) string {
	var b [32]byte
	copy(b[:], "key-0000000000000000000000000000")
	for j := 31; i > 0; j-- {
		b[j] = byte('0' + i%10)
		i /= 10
	}
	return string(b[:])
}

// shuffledOrder is a fixed pseudo-random walk over n identities.
func shuffledOrder(n int) []uint32 {
	order := make([]uint32, n)
	x := uint64(1)
	for i := range order {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		order[i] = uint32((z ^ (z >> 31)) % uint64(n))
	}
	return order
}

// nopWriter is a ResponseWriter that keeps the status and drops the body.
type nopWriter struct {
	h    http.Header
	code int
}

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(code int)        { w.code = code }
