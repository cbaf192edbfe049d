package bucket

import (
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Benchmarks: weir's keyed GCRA against plain references over the same
// pre-generated 32-byte identities. Read them as ratios within one run:
//
//	go test -run '^$' -bench . -benchmem ./bucket/
//
// XRate/AllowN: one x/time/rate Limiter, AllowN(now, 1), no clock read.
// KeyedXRate: map[string]*rate.Limiter under one mutex (the usual keyed
// limiter). Floor: m[maphash.String(seed, id)]++ on a plain map, per
// goroutine in parallel runs: the ideal cost of "hash + one map access".

var benchSizes = []struct {
	name string
	n    int
}{{"1k", 1 << 10}, {"1M", 1 << 20}}

var (
	idsOnce sync.Once
	idsAll  []string
)

// benchIDs returns n distinct 32-byte identities (deterministic), in a
// shuffled order so consecutive ops touch unrelated keys.
func benchIDs(n int) []string {
	idsOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
		idsAll = make([]string, 1<<20)
		seen := make(map[string]bool, len(idsAll))
		for i := range idsAll {
			for {
				var b [32]byte
				for j := range b {
					b[j] = alphabet[r.IntN(len(alphabet))]
				}
				if s := string(b[:]); !seen[s] {
					seen[s] = true
					idsAll[i] = s
					break
				}
			}
		}
	})
	return idsAll[:n]
}

// benchRule admits 1000/s per key with burst 100, while each key is visited
// at most once per 1k ops at 1 µs per op: nearly everything is allowed.
func benchRule(b *testing.B) GCRA {
	g, err := NewGCRA(1000, time.Second, 100)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

const benchT0 = int64(1_700_000_000_000_000_000)

func BenchmarkGCRAStore(b *testing.B) {
	for _, sz := range benchSizes {
		ids := benchIDs(sz.n)
		mask := sz.n - 1
		g := benchRule(b)
		h := NewHasher()
		b.Run("keys="+sz.name+"/serial", func(b *testing.B) {
			st, _ := NewStore[TAT](StoreConfig{})
			now := benchT0
			for i := range ids { // warm: every key present
				st.Apply(h.Sum(ids[i]), now, &g, 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			denied := 0
			for i := 0; b.Loop(); i++ {
				now += 1000
				if !st.Apply(h.Sum(ids[i&mask]), now, &g, 1).Allowed {
					denied++
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
		b.Run("keys="+sz.name+"/parallel", func(b *testing.B) {
			st, _ := NewStore[TAT](StoreConfig{})
			for i := range ids {
				st.Apply(h.Sum(ids[i]), benchT0, &g, 1)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := int(seq.Add(1))
				i := w * 7919
				now := benchT0
				for pb.Next() {
					now += 1000
					st.Apply(h.Sum(ids[i&mask]), now, &g, 1)
					i++
				}
			})
		})
	}
}

// BenchmarkGCRAStoreLF is BenchmarkGCRAStore on the lock-free GCRAStore.
// The two are written out rather than shared through an interface or a
// func value on purpose: each timed loop must be a direct call, or the
// benchmark would measure an indirect call on top of the store.
func BenchmarkGCRAStoreLF(b *testing.B) {
	for _, sz := range benchSizes {
		ids := benchIDs(sz.n)
		mask := sz.n - 1
		g := benchRule(b)
		h := NewHasher()
		b.Run("keys="+sz.name+"/serial", func(b *testing.B) {
			st, _ := NewGCRAStore(StoreConfig{})
			now := benchT0
			for i := range ids { // warm: every key present
				st.Apply(h.Sum(ids[i]), now, &g, 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			denied := 0
			for i := 0; b.Loop(); i++ {
				now += 1000
				if !st.Apply(h.Sum(ids[i&mask]), now, &g, 1).Allowed {
					denied++
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
		b.Run("keys="+sz.name+"/parallel", func(b *testing.B) {
			st, _ := NewGCRAStore(StoreConfig{})
			for i := range ids {
				st.Apply(h.Sum(ids[i]), benchT0, &g, 1)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := int(seq.Add(1))
				i := w * 7919
				now := benchT0
				for pb.Next() {
					now += 1000
					st.Apply(h.Sum(ids[i&mask]), now, &g, 1)
					i++
				}
			})
		})
	}
}

func BenchmarkXRate(b *testing.B) {
	b.Run("AllowN", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 100)
		now := time.Unix(0, benchT0)
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(1000)
			lim.AllowN(now, 1)
		}
	})
	b.Run("Allow", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 100)
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
}

func BenchmarkKeyedXRate(b *testing.B) {
	for _, sz := range benchSizes {
		ids := benchIDs(sz.n)
		mask := sz.n - 1
		build := func() (map[string]*rate.Limiter, *sync.Mutex) {
			m := make(map[string]*rate.Limiter, sz.n)
			for _, id := range ids {
				m[id] = rate.NewLimiter(1000, 100)
			}
			return m, new(sync.Mutex)
		}
		allow := func(m map[string]*rate.Limiter, mu *sync.Mutex, id string, now time.Time) bool {
			mu.Lock()
			lim, ok := m[id]
			if !ok {
				lim = rate.NewLimiter(1000, 100)
				m[id] = lim
			}
			a := lim.AllowN(now, 1)
			mu.Unlock()
			return a
		}
		b.Run("keys="+sz.name+"/serial", func(b *testing.B) {
			m, mu := build()
			now := time.Unix(0, benchT0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				now = now.Add(1000)
				allow(m, mu, ids[i&mask], now)
			}
		})
		b.Run("keys="+sz.name+"/parallel", func(b *testing.B) {
			m, mu := build()
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				now := time.Unix(0, benchT0)
				for pb.Next() {
					now = now.Add(1000)
					allow(m, mu, ids[i&mask], now)
					i++
				}
			})
		})
	}
}

func BenchmarkFloor(b *testing.B) {
	for _, sz := range benchSizes {
		ids := benchIDs(sz.n)
		mask := sz.n - 1
		seed := maphash.MakeSeed()
		build := func() map[uint64]int64 {
			m := make(map[uint64]int64, sz.n)
			for _, id := range ids {
				m[maphash.String(seed, id)] = 0
			}
			return m
		}
		b.Run("keys="+sz.name+"/serial", func(b *testing.B) {
			m := build()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				m[maphash.String(seed, ids[i&mask])]++
			}
		})
		b.Run("keys="+sz.name+"/parallel", func(b *testing.B) {
			maps := make(chan map[uint64]int64, runtime.GOMAXPROCS(0)*4)
			for range cap(maps) {
				maps <- build()
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				m := <-maps
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					m[maphash.String(seed, ids[i&mask])]++
					i++
				}
			})
		})
	}
}

// BenchmarkStoreMemory fills a store with 1M distinct identities under
// GCRA and reports the heap it holds per key (target <= 48 bytes/key):
// Store[TAT] and the lock-free GCRAStore. (Sub-benchmarks, since a
// benchmark that calls b.Run reports nothing itself.)
func BenchmarkStoreMemory(b *testing.B) {
	ids := benchIDs(1 << 20)
	g := benchRule(b)
	h := NewHasher()
	b.Run("Store", func(b *testing.B) {
		benchStoreMemory(b, len(ids), func() (int, any) {
			st, _ := NewStore[TAT](StoreConfig{})
			for _, id := range ids {
				st.Apply(h.Sum(id), benchT0, &g, 1)
			}
			return st.Stats().Live, st
		})
	})
	b.Run("GCRAStore", func(b *testing.B) {
		benchStoreMemory(b, len(ids), func() (int, any) {
			st, _ := NewGCRAStore(StoreConfig{})
			for _, id := range ids {
				st.Apply(h.Sum(id), benchT0, &g, 1)
			}
			return st.Stats().Live, st
		})
	})
}

// benchStoreMemory measures the heap held by what fill builds, per key.
func benchStoreMemory(b *testing.B, n int, fill func() (live int, st any)) {
	var perKey float64
	for b.Loop() {
		b.StopTimer()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		live, st := fill()
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		if live != n {
			b.Fatalf("live %d, want %d", live, n)
		}
		perKey = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		runtime.KeepAlive(st)
		b.StartTimer()
	}
	b.ReportMetric(perKey, "bytes/key")
}

// BenchmarkStoreAtCap is the insert path at the key cap: every op is a new
// key, so every op evicts one. "forgiven": a 1/h rule, so no entry is ever
// idle and each eviction chooses the least indebted of the capScan slots
// examined; "idle": a 1000/s rule, so the entries examined are mostly idle
// and the first idle one goes.
func BenchmarkStoreAtCap(b *testing.B) {
	slow, err := NewGCRA(1, time.Hour, 10)
	if err != nil {
		b.Fatal(err)
	}
	fast := benchRule(b)
	cfg := StoreConfig{MaxKeys: 1 << 16}
	for _, c := range []struct {
		name string
		g    *GCRA
	}{{"forgiven", &slow}, {"idle", &fast}} {
		b.Run("Store/"+c.name, func(b *testing.B) {
			st, _ := NewStore[TAT](cfg)
			now := benchT0
			b.ReportAllocs()
			for i := uint64(1); b.Loop(); i++ {
				now += 1000
				st.Apply(i, now, c.g, 1)
			}
		})
		b.Run("GCRAStore/"+c.name, func(b *testing.B) {
			st, _ := NewGCRAStore(cfg)
			now := benchT0
			b.ReportAllocs()
			for i := uint64(1); b.Loop(); i++ {
				now += 1000
				st.Apply(i, now, c.g, 1)
			}
		})
	}
}
