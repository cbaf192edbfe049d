package weir_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

// soakIdentities is how many distinct identities a memory soak drives: 1 M
// in `go test`, 10 M with WEIR_SOAK=1 (memory flat under 10 M
// rotating identities).
func soakIdentities(t *testing.T) int {
	if raceDetector {
		t.Skip("memory soak: skipped under -race (too slow; the detector's shadow memory distorts the heap)")
	}
	if testing.Short() {
		t.Skip("memory soak: skipped with -short")
	}
	if os.Getenv("WEIR_SOAK") == "1" {
		return 10_000_000
	}
	return 1_000_000
}

// heapAfterGC is the live heap, in bytes, after a full collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC() // the second one frees what the first one's finalizers released
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// soakSlack is how far the last checkpoint may exceed the first after the
// cap filled: 25 % plus 4 MiB (garbage-collector and map-growth noise).
func soakFlat(first, last uint64) bool { return last <= first+first/4+4<<20 }

// TestMemoryFlatRotatingIdentities: an attacker rotating identities (a new
// client IP on every request, each spending a token) through a node with a
// key cap cannot grow its memory: past the cap the heap stays flat and
// evictions are counted. Run the 10 M version with WEIR_SOAK=1.
func TestMemoryFlatRotatingIdentities(t *testing.T) {
	total := soakIdentities(t)
	const maxKeys = 1 << 17 // a multiple of the store's shard count: each shard holds maxKeys/shards
	now := time.Unix(1_700_000_000, 0)
	n, err := weir.New(weir.Config{Rules: parseRules(t, `
rules:
  - id: per-ip
    key: [ip]
    limit: 10
    window: 1s
    burst: 10
`), MaxKeys: maxKeys, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	buf := make([]byte, 0, 32)
	var checkpoints []uint64
	every := total / 10
	for i := range total {
		buf = strconv.AppendUint(append(buf[:0], "10."...), uint64(i), 10)
		if d := n.Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: string(buf)}); !d.Allowed {
			t.Fatalf("identity %d: rejected on its first request", i)
		}
		if i%1000 == 999 {
			now = now.Add(time.Millisecond) // a fake clock: 1000 requests a millisecond
		}
		if (i+1)%every == 0 && i+1 > maxKeys {
			checkpoints = append(checkpoints, heapAfterGC())
		}
	}
	var live int64
	var evicted uint64
	for _, s := range ops.Overview(n).Stores {
		live += s.Live
		evicted += s.EvictedIdle + s.EvictedForgiven
	}
	first, last := checkpoints[0], checkpoints[len(checkpoints)-1]
	t.Logf("%d identities, MaxKeys %d: live %d, evicted %d; heap after GC at each tenth: %s",
		total, maxKeys, live, evicted, mib(checkpoints))
	if live > maxKeys {
		t.Errorf("%d live keys over the cap of %d", live, maxKeys)
	}
	// Past the cap every new identity evicts one, or the store's sweep
	// hand removes an idle one first (not counted here): most are counted.
	if evicted < uint64(total-maxKeys)/2 {
		t.Errorf("evictions counted %d, want at least %d", evicted, (total-maxKeys)/2)
	}
	if !soakFlat(first, last) {
		t.Errorf("heap grew from %.1f MiB to %.1f MiB past the cap", float64(first)/(1<<20), float64(last)/(1<<20))
	}
	for _, c := range ops.Counts(n) {
		if c.FailOpen != 0 {
			t.Errorf("rule %s: %d fail-open decisions", c.Rule, c.FailOpen)
		}
	}
}

func mib(xs []uint64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.1f", float64(x)/(1<<20))
	}
	return s + " MiB"
}
