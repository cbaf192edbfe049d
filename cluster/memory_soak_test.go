package cluster

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// TestCoordinatorMemoryFlatRotatingIdentities: identities rotated through
// the pure core, as an attacker choosing a fresh key per request would:
// the owner's buckets and a gateway's node entries stay under
// CoordinatorConfig.MaxKeys, the heap stays flat past the cap, and the
// evictions are counted. 1 M identities in `go test`, 10 M with
// WEIR_SOAK=1; skipped under -race.
func TestCoordinatorMemoryFlatRotatingIdentities(t *testing.T) {
	if raceDetector || testing.Short() {
		t.Skip("memory soak: skipped under -race and -short")
	}
	total := 1_000_000
	if os.Getenv("WEIR_SOAK") == "1" {
		total = 10_000_000
	}
	if n, err := strconv.Atoi(os.Getenv("WEIR_SOAK_IDENTITIES")); err == nil && n >= 1_000_000 {
		total = n // to look at one size (a heap profile at the end: -memprofile)
	}
	const maxKeys = 100_000
	ring, err := NewRing(1, []Member{{Name: "gw", Addr: "gw"}, {Name: "own", Addr: "own"}})
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{gw: NewCoordinator(CoordinatorConfig{Self: "gw", MaxKeys: maxKeys}),
		owner: NewCoordinator(CoordinatorConfig{Self: "own", MaxKeys: maxKeys})}
	for _, c := range []*Coordinator{p.gw, p.owner} {
		c.SetRules(0, []RuleParams{capRule(t, quota.ModeShared)})
		c.SetTable(t0, ring)
	}
	// An owner alone in its ring, deciding every identity itself and
	// leaving each in debt: its cap evicts by forgiving.
	own := ownerOnly(t, maxKeys)
	start := time.Now()
	now := t0
	buf := make([]byte, 0, 32)
	var heaps []uint64
	every := total / 10
	for i := range total {
		buf = strconv.AppendUint(append(buf[:0], "k-"...), uint64(i), 10)
		id := string(buf)
		// The gateway sees every identity; half of them the ring gives
		// to the owner, which charges them when the gateway syncs.
		if _, err := p.gw.Decide(now, "r", id, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := own.Decide(now, "r", id, 1+int64(i%10)); err != nil {
			t.Fatal(err)
		}
		if i%64 == 63 {
			p.pump(now)
		}
		if i%1000 == 999 {
			now += int64(time.Millisecond)
			p.gw.Tick(now)
			p.owner.Tick(now)
			own.Tick(now)
			p.pump(now)
		}
		if (i+1)%every == 0 && i+1 > 2*maxKeys {
			runtime.GC()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			heaps = append(heaps, ms.HeapAlloc)
		}
	}
	if path := os.Getenv("WEIR_SOAK_HEAPPROFILE"); path != "" {
		// The heap while the coordinators are alive, to see what grows.
		if fh, err := os.Create(path); err == nil {
			runtime.GC()
			_ = pprof.WriteHeapProfile(fh)
			fh.Close()
		}
	}
	sg, so, sa := p.gw.Stats(), p.owner.Stats(), own.Stats()
	t.Logf("%d identities in %v, MaxKeys %d: gateway %d entries + %d buckets, evicted idle %d views %d forgiven %d; "+
		"its owner %d buckets; lone owner %d buckets, evicted idle %d forgiven %d (%d tokens); heap after GC: %s",
		total, time.Since(start).Round(time.Millisecond), maxKeys, sg.Entries, sg.Owned, sg.EvictedIdle, sg.EvictedViews, sg.EvictedForgiven,
		so.Owned, sa.Owned, sa.EvictedIdle, sa.EvictedForgiven, sa.ForgivenTokens, mibs(heaps))
	if so.Owned > maxKeys || so.OverCap != 0 || so.Degraded != 0 {
		t.Errorf("the gateway's owner: %+v", so)
	}
	for name, st := range map[string]Stats{"gateway": sg, "lone owner": sa} {
		if st.Entries+st.Owned > maxKeys || st.OverCap != 0 {
			t.Errorf("%s: %d entries + %d buckets (over the cap %d times), cap %d", name, st.Entries, st.Owned, st.OverCap, maxKeys)
		}
		if st.EvictedIdle+st.EvictedViews+st.EvictedForgiven == 0 {
			t.Errorf("%s: no evictions counted", name)
		}
		if st.Degraded != 0 {
			t.Errorf("%s: %d degraded decisions", name, st.Degraded)
		}
	}
	first, last := heaps[0], heaps[len(heaps)-1]
	if last > first+first/4+4<<20 { // 25 % plus 4 MiB of collector and map noise
		t.Errorf("heap grew from %.1f MiB to %.1f MiB past the cap", float64(first)/(1<<20), float64(last)/(1<<20))
	}
}

func mibs(xs []uint64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += strconv.FormatFloat(float64(x)/(1<<20), 'f', 1, 64)
	}
	return s + " MiB"
}
