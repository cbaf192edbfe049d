package weir_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// BenchmarkHotPath is one local rule's decision through weir's public API
// (Node.Check and Node.Allow) against the plain keyed limiter a Go gateway
// writes by hand (a map of x/time/rate Limiters behind one mutex, Allow
// reading the clock), over the same identities in the same random order, in
// one run:
//
//	go test -run '^$' -bench HotPath -benchmem .
//
// Every identity is decided once before the timer starts, so both measure
// a large live key set, not inserts. Each decision's identity is a string
// made for it (one allocation of 32 bytes, in every system's figure), as a
// request's header is: in cache, like a freshly parsed request's, while the
// limiter's state for a million identities is not. The rule is the default
// a user writes: 100/s with a burst of 100, every other setting at its
// default (weir's store drops a key once its bucket is full again, so most
// decisions here insert; the map of x/time/rate keeps every Limiter).
func BenchmarkHotPath(b *testing.B) {
	for _, n := range []int{1_000_000} {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = hotKey(uint32(i))
		}
		order := hotOrder(n)
		b.Run(fmt.Sprintf("ids=%d/xrate-keyed", n), func(b *testing.B) {
			k := newKeyedXRate()
			for _, id := range ids {
				k.allow(id)
			}
			hotRun(b, order, func(i uint32) { k.allow(hotKey(i)) })
		})
		node, err := weir.New(weir.Config{Rules: []quota.Rule{{
			ID:     "per-key",
			Key:    []quota.KeySource{{Kind: quota.KeyUser}},
			Limit:  100,
			Window: time.Second,
			Burst:  100,
		}}})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for _, id := range ids {
			node.Allow(ctx, weir.Request{Method: "GET", Path: "/api/items", User: id})
		}
		b.Run(fmt.Sprintf("ids=%d/weir-check", n), func(b *testing.B) {
			hotRun(b, order, func(i uint32) {
				if _, err := node.Check(ctx, hotKey(i), "per-key", 1); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(fmt.Sprintf("ids=%d/weir-allow", n), func(b *testing.B) {
			hotRun(b, order, func(i uint32) {
				node.Allow(ctx, weir.Request{Method: "GET", Path: "/api/items", User: hotKey(i)})
			})
		})
		node.Close()
	}
}

// hotRun runs one decision per iteration, serially and from every
// GOMAXPROCS goroutine, walking order from a different place in each.
func hotRun(b *testing.B, order []uint32, decide func(uint32)) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			decide(order[i%len(order)])
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var start sync.Mutex
		next := 0
		b.RunParallel(func(pb *testing.PB) {
			start.Lock()
			i := next
			next += len(order) / 7
			start.Unlock()
			for pb.Next() {
				decide(order[i%len(order)])
				i++
			}
		})
	})
}

// hotKey returns identity i of benchIdentities as a new string.
func hotKey(i uint32) string {
	var b [32]byte
	copy(b[:], "key-0000000000000000000000000000")
	for j := 31; i > 0; j-- {
		b[j] = byte('0' + i%10)
		i /= 10
	}
	return string(b[:])
}

// hotOrder is a fixed pseudo-random walk over n identities.
func hotOrder(n int) []uint32 {
	order := make([]uint32, 4*n)
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

// keyedXRate is the limiter most Go gateways write first: one x/time/rate
// Limiter per key in a map behind a mutex.
type keyedXRate struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newKeyedXRate() *keyedXRate { return &keyedXRate{m: make(map[string]*rate.Limiter)} }

func (k *keyedXRate) allow(key string) bool {
	k.mu.Lock()
	l, ok := k.m[key]
	if !ok {
		l = rate.NewLimiter(100, 100)
		k.m[key] = l
	}
	k.mu.Unlock()
	return l.Allow()
}
