package bucket

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/internal/atomictable"
	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func newGCRAStore(t fataler, cfg StoreConfig) *GCRAStore {
	st, err := NewGCRAStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkGTable verifies the invariants of gcrastore.go on a quiescent store:
// no sealed slot but tombstones in a current table, one live slot per key,
// each reachable from its home in its own shard, the counters, the load.
func checkGTable(t fataler, st *GCRAStore) {
	for si := range st.shards {
		sh := &st.shards[si]
		sh.mu.Lock()
		tb := sh.table.Load()
		live, tombs := 0, 0
		if tb != nil {
			seen := map[uint64]bool{}
			for i := range tb.Size() {
				k, v := tb.At(i).Key(), tb.At(i).Val()
				switch {
				case k == 0:
					if v != 0 {
						t.Fatal("empty slot with a tat", si, i, v)
					}
				case v == tombTAT:
					tombs++
				case v < 0:
					t.Fatal("sealed slot in a current table", si, i, v)
				default:
					live++
					if seen[k] {
						t.Fatal("duplicate live key", si, k)
					}
					seen[k] = true
					if j, ok := st.find(tb, k); !ok || j != i {
						t.Fatal("unreachable slot", si, i)
					}
					if st.shardShift < 64 && int(k>>st.shardShift) != si {
						t.Fatal("key in the wrong shard", si, k)
					}
				}
			}
			if (live+tombs)*4 > tb.Size()*3 {
				t.Fatal("load above 3/4", si, live, tombs, tb.Size())
			}
		}
		if live != sh.live || tombs != sh.tombs {
			t.Fatal("counters", si, live, sh.live, tombs, sh.tombs)
		}
		sh.mu.Unlock()
	}
}

func TestGCRAStoreLayout(t *testing.T) {
	if n := unsafe.Sizeof(atomictable.Slot{}); n != 16 {
		t.Fatalf("slot is %d bytes, want 16", n)
	}
	if n := unsafe.Sizeof(gshard{}); n != 128 {
		t.Fatalf("shard is %d bytes, want 128", n)
	}
	if n := unsafe.Offsetof(gshard{}.mu); n != 64 {
		t.Fatalf("mu at %d, want 64", n)
	}
}

func TestGCRAStoreConfigErrors(t *testing.T) {
	for _, cfg := range []StoreConfig{{Shards: 3}, {Shards: -1}, {MaxKeys: -1}, {Shards: 1 << 17}} {
		if _, err := NewGCRAStore(cfg); err == nil || !contains(err.Error(), "StoreConfig.") {
			t.Errorf("%+v: err %v", cfg, err)
		}
	}
}

func TestGCRAStoreBasics(t *testing.T) {
	g := mustGCRA(t, 10, time.Second, 5)
	st := newGCRAStore(t, StoreConfig{Shards: 4})
	now := int64(time.Hour)
	if _, ok := st.Peek(0, now); ok {
		t.Fatal("peek on an empty store")
	}
	// Key 0 is valid (stored under an alias).
	if d := st.Apply(0, now, &g, 2); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("key 0: %+v", d)
	}
	if s, ok := st.Peek(0, now); !ok || s != TAT(now+200*ms) {
		t.Fatalf("peek key 0: %v %v", s, ok)
	}
	if s, ok := st.Peek(zeroAlias, now); !ok || s != TAT(now+200*ms) {
		t.Fatalf("key 0 is not aliased: %v %v", s, ok)
	}
	if _, ok := st.Peek(1, now); ok {
		t.Fatal("peek absent key")
	}
	if _, ok := st.Peek(0, now+200*ms); ok {
		t.Fatal("peek of an idle entry must report absent")
	}
	// A rejected cost > burst on a fresh key leaves nothing behind.
	if d := st.Apply(7, now, &g, 6); d.Allowed || d.RetryAfter != Never || st.Stats().Live != 1 {
		t.Fatalf("cost>burst: %+v live %d", d, st.Stats().Live)
	}
	// Update inserts, Delete removes.
	st.Update(9, now, func(s *TAT) { *s = TAT(now + 5*ms) })
	if s, ok := st.Peek(9, now); !ok || s != TAT(now+5*ms) {
		t.Fatalf("update: %v %v", s, ok)
	}
	st.Update(9, now, func(s *TAT) {
		if *s != TAT(now+5*ms) {
			t.Errorf("update saw %v", *s)
		}
		*s = 0
	}) // idle afterwards: dropped
	if st.Stats().Live != 1 {
		t.Fatalf("idle update kept: %+v", st.Stats())
	}
	st.Delete(0)
	st.Delete(12345)
	if st.Stats().Live != 0 {
		t.Fatalf("delete: %+v", st.Stats())
	}
	// An Apply that leaves the state idle on the slow path drops the entry.
	// (On the fast path it stays until swept, invisible to Peek.)
	st.Apply(3, now, &g, 1)
	st.Apply(3, now+100*ms, &g, 0)
	if _, ok := st.Peek(3, now+100*ms); ok {
		t.Fatal("idle entry visible")
	}
	// Reinsertion after a delete in the same table goes past the tombstone.
	st.Apply(3, now+100*ms, &g, 5)
	st.Delete(3)
	st.Apply(3, now+100*ms, &g, 1)
	if s, ok := st.Peek(3, now+100*ms); !ok || s != TAT(now+200*ms) {
		t.Fatalf("reinsert: %v %v", s, ok)
	}
	if d := st.Apply(3, now+100*ms, &g, 4); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("reinsert fast path: %+v", d)
	}
	checkGTable(t, st)
}

func TestGCRAStoreUpdatePanic(t *testing.T) {
	g := mustGCRA(t, 10, time.Second, 5)
	st := newGCRAStore(t, StoreConfig{Shards: 1})
	now := int64(time.Hour)
	st.Apply(1, now, &g, 2)
	func() {
		defer func() { _ = recover() }()
		st.Update(1, now, func(s *TAT) { *s = 1; panic("boom") })
	}()
	checkGTable(t, st)
	if s, ok := st.Peek(1, now); !ok || s != TAT(now+200*ms) {
		t.Fatalf("after panic: %v %v", s, ok)
	}
	if d := st.Apply(1, now, &g, 3); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after panic: %+v", d)
	}
}

// TestGCRAStoreSealedFallback holds the shard mutex with the key's slot
// sealed (as Update does) while an Apply runs: the Apply must wait and then
// see the value the holder stores, not the one it first loaded.
func TestGCRAStoreSealedFallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := mustGCRA(t, 10, time.Second, 5)
	st := newGCRAStore(t, StoreConfig{Shards: 1})
	now := int64(time.Hour)
	st.Apply(1, now, &g, 1)
	sh := &st.shards[0]
	sh.mu.Lock()
	tb := sh.table.Load()
	i, ok := st.find(tb, mix(1))
	if !ok {
		t.Fatal("not found")
	}
	e := tb.At(i)
	e.Seal()
	done := make(chan Decision)
	go func() { done <- st.Apply(1, now, &g, 1) }()
	select {
	case d := <-done:
		t.Fatalf("Apply went through a sealed slot: %+v", d)
	case <-time.After(20 * time.Millisecond):
	}
	e.Set(now + int64(400*time.Millisecond)) // 4 tokens spent
	st.rebuild(sh, tb, tb.Size(), now)       // and move it, for good measure
	sh.mu.Unlock()
	if d := <-done; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the seal: %+v", d)
	}
	if s, _ := st.Peek(1, now); s != TAT(now+500*ms) {
		t.Fatalf("tat %v", s)
	}
	checkGTable(t, st)
	// The retired table is sealed for good.
	if tb.At(i).Val() >= 0 {
		t.Fatal("old table not sealed")
	}
}

func TestGCRAStoreGrowShrinkSweep(t *testing.T) {
	st := newGCRAStore(t, StoreConfig{Shards: 1})
	testGrowShrinkSweep(t, st, func() { checkGTable(t, st) }, func(key uint64) bool {
		_, ok := st.find(st.shards[0].table.Load(), mix(key))
		return ok
	})
	later := int64(time.Hour) + int64(2*time.Second)
	// Churn at a steady live count: tombstones are purged by same-size
	// rebuilds, the table does not grow without bound.
	g2 := mustGCRA(t, 1000, time.Second, 1)
	for k := uint64(1); k <= 100_000; k++ {
		st.Apply(1<<41+k, later, &g2, 1)
		st.Delete(1<<41 + k)
	}
	checkGTable(t, st)
	if s := st.Stats(); s.Live != 1000 || s.Slots > 4096 {
		t.Fatalf("churn: %+v", s)
	}
}

func TestGCRAStoreEvictionAtCap(t *testing.T) {
	st := newGCRAStore(t, StoreConfig{Shards: 1, MaxKeys: 100})
	testEvictionAtCap(t, st)
	checkGTable(t, st)
}

func TestGCRAStoreDeterministic(t *testing.T) {
	testDeterministic(t, func() (tatStore, func() []uint64) {
		st := newGCRAStore(t, StoreConfig{Shards: 4, MaxKeys: 64})
		return st, func() []uint64 {
			var live []uint64
			for i := range st.shards {
				tb := st.shards[i].table.Load()
				for j := range tb.Size() {
					sl := tb.At(j)
					live = append(live, sl.Key(), uint64(sl.Val()))
				}
			}
			return live
		}
	})
}

// TestGCRAStoreDifferential applies the same random single-threaded
// sequence to Store[TAT] and GCRAStore and requires identical Decisions and
// Peeks. Keys come from a small set (with 0 and its alias), time moves
// forward with small and large gaps (so entries go idle, get swept, tables
// grow and shrink), costs span 0..burst+1 over three rules, and Delete and
// Update are mixed in. In tiny mode MaxKeys is at most 16 per shard so
// tables stay within capScan and the cap is hit constantly: both stores
// must forgive an entry at the same step (exactly when the shard's spent
// entries fill the cap). Which spent entry is forgiven depends on the slot
// layout, which differs by design (tombstones vs backward shift), so after
// a forgiven eviction the test deletes each store's victim from the other
// and carries on comparing.
func TestGCRAStoreDifferential(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		shards := 1 << rapid.IntRange(0, 2).Draw(rt, "shardBits")
		tiny := rapid.Bool().Draw(rt, "tiny")
		maxKeys := 1 << 20
		if tiny {
			maxKeys = shards * rapid.IntRange(1, 16).Draw(rt, "perShard")
		}
		nkeys := rapid.IntRange(1, 400).Draw(rt, "nkeys")
		seed := rapid.Uint64().Draw(rt, "seed")
		var rules [3]GCRA
		for i := range rules {
			rules[i] = mustGCRA(rt, rapid.Int64Range(1, 50).Draw(rt, "limit"), time.Second,
				rapid.Int64Range(1, 10).Draw(rt, "burst"))
		}
		cfg := StoreConfig{Shards: shards, MaxKeys: maxKeys}
		ref, err := NewStore[TAT](cfg)
		if err != nil {
			rt.Fatal(err)
		}
		lf := newGCRAStore(rt, cfg)

		r := rand.New(rand.NewPCG(seed, 99))
		keys := make([]uint64, nkeys)
		for i := range keys {
			keys[i] = r.Uint64()
		}
		keys[0] = 0
		if nkeys > 1 {
			keys[1] = zeroAlias
		}
		now := int64(time.Hour) + r.Int64N(int64(time.Hour))
		comparePeeks := func(where string) {
			for _, k := range keys {
				a, aok := ref.Peek(k, now)
				b, bok := lf.Peek(k, now)
				if a != b || aok != bok {
					rt.Fatalf("%s: peek %#x at %d: store %v %v, gcrastore %v %v", where, k, now, a, aok, b, bok)
				}
			}
		}
		forgiven := uint64(0)
		resync := func(op int) {
			fa, fb := ref.Stats().EvictedForgiven, lf.Stats().EvictedForgiven
			if fa != fb {
				rt.Fatalf("op %d: forgiven store %d, gcrastore %d", op, fa, fb)
			}
			if fa == forgiven {
				return
			}
			forgiven = fa
			for _, k := range keys {
				_, aok := ref.Peek(k, now)
				_, bok := lf.Peek(k, now)
				if aok && !bok {
					ref.Delete(k)
				} else if bok && !aok {
					lf.Delete(k)
				}
			}
		}
		const nops = 2000
		for op := 0; op < nops; op++ {
			g := &rules[r.IntN(len(rules))]
			k := keys[r.IntN(nkeys)]
			switch x := r.IntN(100); {
			case x < 75:
				now += r.Int64N(int64(g.t)/2 + 1)
				c := r.Int64N(g.burst + 2)
				a, b := ref.Apply(k, now, g, c), lf.Apply(k, now, g, c)
				if a != b {
					rt.Fatalf("op %d: Apply(%#x, %d, cost %d): store %+v, gcrastore %+v", op, k, now, c, a, b)
				}
				resync(op)
			case x < 85:
				a, aok := ref.Peek(k, now)
				b, bok := lf.Peek(k, now)
				if a != b || aok != bok {
					rt.Fatalf("op %d: Peek(%#x): store %v %v, gcrastore %v %v", op, k, a, aok, b, bok)
				}
			case x < 90:
				ref.Delete(k)
				lf.Delete(k)
			case x < 97:
				// fns that give the same result on any idle input, since an
				// idle entry may be kept by one store and not the other.
				d := r.Int64N(3 * g.t)
				var fn func(s *TAT)
				switch r.IntN(3) {
				case 0:
					fn = func(s *TAT) { *s = TAT(max(int64(*s), now) + d) }
				case 1:
					fn = func(s *TAT) { *s = 0 }
				default:
					fn = func(s *TAT) {}
				}
				ref.Update(k, now, fn)
				lf.Update(k, now, fn)
				resync(op)
			case x < 99:
				now += r.Int64N(int64(5 * time.Second)) // most entries go idle
			default:
				comparePeeks("periodic")
				checkGTable(rt, lf)
			}
		}
		comparePeeks("end")
		checkGTable(rt, lf)
	})
}

// TestGCRAStoreConcurrent hammers a store from several goroutines under
// -race. Cold keys churn (inserts, sweeps, deletes, updates, grow, purge and
// shrink rebuilds) at times below F; meanwhile:
//   - frozen keys are spent at the single time F with cost 1: exactly burst
//     admissions per key across all goroutines, whatever the interleaving;
//     one lost CAS or a spend lost in a rebuild would show as an extra one;
//   - moving keys, pre-inserted and never idle at any time a sweeper uses,
//     are spent at times from F on with costs 1..burst: per key, the tokens
//     admitted stay within burst + Δ/T, Δ the span of times used.
func TestGCRAStoreConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	const (
		workers  = 4
		ops      = 6000
		nFrozen  = 6
		nMoving  = 6
		coldKeys = 3000
	)
	C0 := int64(time.Hour)
	F := C0 + int64(time.Hour)                   // cold times stay in [C0, F)
	frozen := mustGCRA(t, 1000, time.Second, 40) // T = 1 ms
	moving := mustGCRA(t, 100, time.Second, 5)   // T = 10 ms
	cold := mustGCRA(t, 1_000_000, time.Second, 2)
	st := newGCRAStore(t, StoreConfig{Shards: 2})
	frozenKey := func(i int) uint64 { return 1<<62 + uint64(i) }
	movingKey := func(i int) uint64 { return 1<<61 + uint64(i) }
	for i := 0; i < nMoving; i++ {
		st.Update(movingKey(i), F, func(s *TAT) { *s = TAT(F + 1) })
	}
	var (
		mu          sync.Mutex
		admFrozen   [nFrozen]int64
		admMoving   [nMoving]int64
		maxMovingAt = F
		wg          sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var af [nFrozen]int64
			var am [nMoving]int64
			coldNow := C0
			movNow := F
			for i := 0; i < ops; i++ {
				switch x := r.IntN(16); {
				case x < 3:
					k := r.IntN(nFrozen)
					if st.Apply(frozenKey(k), F, &frozen, 1).Allowed {
						af[k]++
					}
				case x < 6:
					k := r.IntN(nMoving)
					movNow += r.Int64N(int64(2 * time.Millisecond))
					c := 1 + r.Int64N(moving.burst)
					if st.Apply(movingKey(k), movNow, &moving, c).Allowed {
						am[k] += c
					}
					st.Peek(movingKey(k), movNow) // other goroutines' times differ: no bound here
				case x < 7:
					k := r.IntN(nFrozen)
					if s, ok := st.Peek(frozenKey(k), F); ok && (int64(s)-F)%frozen.t != 0 || s > TAT(F+frozen.tau) {
						t.Errorf("frozen key %d tat %d", k, s)
					}
				default:
					coldNow += r.Int64N(int64(3 * time.Microsecond))
					// Phases: a goroutine fills a private range (growth),
					// then works a shared one, then deletes its range
					// (shrink).
					var k uint64
					phase := (i / 500) % 3
					switch phase {
					case 0:
						k = uint64(w*coldKeys + r.IntN(coldKeys))
					case 1:
						k = uint64(workers*coldKeys + r.IntN(coldKeys))
					default:
						k = uint64(w*coldKeys + r.IntN(coldKeys))
					}
					switch y := r.IntN(10); {
					case phase == 2 && y < 7:
						st.Delete(k)
					case y == 8:
						st.Update(k, coldNow, func(s *TAT) { *s = TAT(coldNow + int64(time.Microsecond)) })
					case y == 9:
						st.Peek(k, coldNow)
					default:
						st.Apply(k, coldNow, &cold, 1)
					}
				}
				if i%1000 == 0 {
					st.Stats()
				}
			}
			mu.Lock()
			for k := range af {
				admFrozen[k] += af[k]
			}
			for k := range am {
				admMoving[k] += am[k]
			}
			maxMovingAt = max(maxMovingAt, movNow)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	checkGTable(t, st)
	for k, a := range admFrozen {
		if a != frozen.burst {
			t.Errorf("frozen key %d: %d admissions, want exactly %d", k, a, frozen.burst)
		}
		if s, ok := st.Peek(frozenKey(k), F); a > 0 && (!ok || int64(s) != F+a*frozen.t) {
			t.Errorf("frozen key %d: tat %v %v, want %d", k, s, ok, F+a*frozen.t)
		}
	}
	span := maxMovingAt - F
	for k, a := range admMoving {
		if a*moving.t > moving.tau+span {
			t.Errorf("moving key %d: %d tokens over %v: above burst %d + Δ/T %d", k, a, time.Duration(span), moving.burst, span/moving.t)
		}
		if a == 0 {
			t.Errorf("moving key %d never admitted", k)
		}
	}
	s := st.Stats()
	t.Logf("stats %+v", s)
	if s.Swept == 0 {
		t.Error("no sweep happened")
	}
}
