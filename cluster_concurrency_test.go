package weir

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A concurrency rule in mode exact on a real 3-node cluster (memberlist and
// gRPC on loopback): the identity's owner holds the region's slots, so the
// region has at most the limit in flight, not nodes × the limit, and a
// crashed gateway's slots are freed when the ring drops it.

const concurrencyRules = `
rules:
  - id: conc
    match: {prefix: /slow}
    key: [header:X-API-Key]
    algorithm: concurrency
    limit: 5
    window: 1m
    mode: exact
`

// TestClusterConcurrency: 30 callers (10 per node) of one identity, each
// request held 20 ms, for 2 s: the requests in flight across the three
// nodes, counted at every admission and every release, never pass 5; every
// slot is reused (hundreds admitted); no decision is degraded. Then a
// gateway holding slots crashes: its slots are free again once the others'
// rings drop it, long before the rule's window (1 min) would free them.
func TestClusterConcurrency(t *testing.T) {
	const limit = 5
	c := startClusterWith(t, fmt.Sprintf("weir-conc-%d", time.Now().UnixNano()), concurrencyRules, 3, 3)
	id := "tenant-conc"
	req := Request{Method: "GET", Path: "/slow", Header: http.Header{"X-Api-Key": {id}}}
	var inFlight, most, admitted, degraded atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for _, node := range c.nodes {
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					d := node.Allow(context.Background(), req)
					if d.Err != nil {
						t.Errorf("allow: %v", d.Err)
						return
					}
					if d.Degraded {
						degraded.Add(1)
					}
					if !d.Allowed {
						time.Sleep(2 * time.Millisecond)
						continue
					}
					// Counted after the admission and uncounted before the
					// release: never more than the owner holds.
					n := inFlight.Add(1)
					admitted.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(20 * time.Millisecond)
					inFlight.Add(-1)
					d.Done()
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("%d admitted over 2 s, at most %d in flight across 3 nodes, %d degraded", admitted.Load(), most.Load(), degraded.Load())
	if most.Load() > limit {
		t.Errorf("%d requests in flight across the region, limit %d (per node it would be up to %d)", most.Load(), limit, 3*limit)
	}
	if most.Load() < limit {
		t.Errorf("at most %d in flight, want the limit %d used", most.Load(), limit)
	}
	if admitted.Load() < 100 {
		t.Errorf("%d admitted, want the slots reused (>= 100 over 2 s of 20 ms requests)", admitted.Load())
	}
	if degraded.Load() != 0 {
		t.Errorf("%d degraded decisions with no fault", degraded.Load())
	}

	// A gateway that is not the owner takes 3 slots and crashes with them.
	owner := c.ring(0).OwnerName(id)
	victim, other := -1, -1
	for i := range 3 {
		switch name := fmt.Sprintf("gw-%d", i); {
		case name == owner:
		case victim < 0:
			victim = i
		default:
			other = i
		}
	}
	for range 3 {
		if d := c.nodes[victim].Allow(context.Background(), req); !d.Allowed {
			t.Fatalf("gw-%d: a free slot was refused: %+v", victim, d.Results())
		}
	}
	if d := c.nodes[other].Allow(context.Background(), req); d.Allowed {
		d.Done()
	} else {
		t.Fatal("2 free slots of 5 refused")
	}
	crashed := time.Now()
	c.crash(victim)
	free := func() int {
		n := 0
		var ds []Decision
		for range limit {
			d := c.nodes[other].Allow(context.Background(), req)
			if d.Allowed {
				n++
				ds = append(ds, d)
			}
		}
		for i := range ds {
			ds[i].Done()
		}
		return n
	}
	if n := free(); n != 2 {
		t.Fatalf("with the crashed gateway's 3 slots held, %d of 5 admitted, want 2", n)
	}
	accWait(t, 20*time.Second, func() bool { return free() == limit }, "the crashed gateway's slots to be freed")
	t.Logf("the crashed gateway's slots were free %v after the crash", time.Since(crashed).Round(time.Millisecond))

	// The middleware releases the owner's slot on every path: a handler
	// that fails, one that panics, and a client that gives up.
	var cancel context.CancelFunc = func() {}
	handler := c.nodes[other].Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("end") {
		case "error":
			http.Error(w, "upstream failed", http.StatusBadGateway)
		case "panic":
			panic("handler bug")
		case "cancel":
			cancel()
			<-r.Context().Done()
		}
	}))
	for _, end := range []string{"error", "panic", "cancel"} {
		for range 2 * limit {
			rctx := context.Background()
			if end == "cancel" {
				rctx, cancel = context.WithCancel(rctx)
			}
			r := httptest.NewRequestWithContext(rctx, "GET", "/slow?end="+end, nil)
			r.Header.Set("X-Api-Key", id)
			w := httptest.NewRecorder()
			func() {
				defer func() { _ = recover() }()
				handler.ServeHTTP(w, r)
			}()
			cancel()
			if w.Code == http.StatusTooManyRequests {
				t.Fatalf("end %s: a request was refused: the slots of earlier ones were not released", end)
			}
		}
	}
	if n := free(); n != limit {
		t.Errorf("after failed, panicking and cancelled requests %d of %d slots are free", n, limit)
	}
}
