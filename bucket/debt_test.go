package bucket

import (
	"sync"
	"testing"
	"time"
)

// capKeys is a key cap whose whole table lies within one eviction sample
// (capScan slots) in both stores, so every forgiven eviction there chooses
// among all live entries.
const capKeys = 24

// testLeastIndebtedEvicted: at the key cap, with nothing idle, the entry
// owing least is the one forgiven, the most indebted is kept, and what each
// victim owed is counted (docs/overshoot.md, the local key cap term). Key k
// of 1..capKeys spends k+1 tokens of a 1/s rule (it owes k+1 s); each new
// key spends more than any of them, so the old keys go in the order of
// their debt and the most indebted, key capKeys, outlives all the others.
func testLeastIndebtedEvicted(t *testing.T, st tatStore) {
	t.Helper()
	g := mustGCRA(t, 1, time.Second, 100)
	now := int64(time.Hour)
	for k := uint64(1); k <= capKeys; k++ {
		if d := st.Apply(k, now, &g, int64(k)+1); !d.Allowed {
			t.Fatalf("key %d rejected", k)
		}
	}
	var want uint64
	for j := uint64(1); j < capKeys; j++ {
		st.Apply(1000+j, now, &g, 50)
		want += uint64(j+1) * uint64(time.Second)
		for k := uint64(1); k <= capKeys; k++ {
			if _, ok := st.Peek(k, now); ok != (k > j) {
				t.Fatalf("after %d inserts: key %d present %v (the least indebted must go first)", j, k, ok)
			}
		}
	}
	s := st.Stats()
	if s.Live != capKeys || s.EvictedForgiven != capKeys-1 || s.EvictedIdle != 0 || s.ForgivenNanos != want || s.ForgivenTokens != 0 {
		t.Fatalf("stats %+v, want %d forgiven owing %d ns", s, capKeys-1, want)
	}
}

func TestStoreEvictsLeastIndebted(t *testing.T) {
	st := newTATStore(t, StoreConfig{Shards: 1, MaxKeys: capKeys})
	testLeastIndebtedEvicted(t, genericTAT{st})
	checkTable(t, st)
}

func TestGCRAStoreEvictsLeastIndebted(t *testing.T) {
	st := newGCRAStore(t, StoreConfig{Shards: 1, MaxKeys: capKeys})
	testLeastIndebtedEvicted(t, st)
	checkGTable(t, st)
}

// TestStoreEvictsLeastIndebtedCounts: the same for states that count
// tokens (a fixed window, concurrency slots): the fewest tokens go first,
// and the tokens forgiven are counted.
func TestStoreEvictsLeastIndebtedCounts(t *testing.T) {
	now := int64(time.Hour)
	t.Run("fixed_window", func(t *testing.T) {
		st, err := NewStore[FixedState](StoreConfig{Shards: 1, MaxKeys: capKeys})
		if err != nil {
			t.Fatal(err)
		}
		f, err := NewFixedWindow(100, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		testLeastCounted(t, now, func(k uint64, cost int64) { st.Apply(k, now, &f, cost) },
			func(k uint64) bool { _, ok := st.Peek(k, now); return ok }, st.Stats)
		checkTable(t, st)
	})
	t.Run("concurrency", func(t *testing.T) {
		st, err := NewStore[Inflight](StoreConfig{Shards: 1, MaxKeys: capKeys})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewConcurrency(100)
		if err != nil {
			t.Fatal(err)
		}
		testLeastCounted(t, now, func(k uint64, cost int64) { st.Apply(k, now, &c, cost) },
			func(k uint64) bool { _, ok := st.Peek(k, now); return ok }, st.Stats)
		// A release for a forgiven key finds no entry and leaves none.
		rel := c.Release()
		st.Apply(1, now, &rel, 2)
		if _, ok := st.Peek(1, now); ok || st.Stats().Live != capKeys {
			t.Fatalf("release of an evicted key: %+v", st.Stats())
		}
		checkTable(t, st)
	})
}

func testLeastCounted(t *testing.T, now int64, apply func(k uint64, cost int64), present func(k uint64) bool, stats func() StoreStats) {
	t.Helper()
	for k := uint64(1); k <= capKeys; k++ {
		apply(k, int64(k)+1)
	}
	var want uint64
	for j := uint64(1); j < capKeys; j++ {
		apply(1000+j, 50)
		want += j + 1
		for k := uint64(1); k <= capKeys; k++ {
			if present(k) != (k > j) {
				t.Fatalf("after %d inserts: key %d present %v", j, k, present(k))
			}
		}
	}
	if s := stats(); s.EvictedForgiven != capKeys-1 || s.ForgivenTokens != want || s.ForgivenNanos != 0 {
		t.Fatalf("stats %+v, want %d forgiven holding %d tokens", s, capKeys-1, want)
	}
}

// TestDebt: what each state type owes at now, in its unit.
func TestDebt(t *testing.T) {
	const s = int64(time.Second)
	now := 100 * s
	sw, err := NewSlidingWindow(10, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var sst SlidingState
	sw.Step(&sst, 95*s, 4) // window [90 s, 100 s): Cur 4
	sw.Step(&sst, 101*s, 3)
	lg, err := NewSlidingLog(10, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var lst SlidingLogState
	lg.Step(&lst, 89*s, 5) // out of view at 100 s
	lg.Step(&lst, 95*s, 2)
	lg.Step(&lst, 99*s, 1)
	for _, c := range []struct {
		name   string
		d      debtor
		at     int64
		owed   int64
		inTime bool
	}{
		{"tat ahead", ptr(TAT(now + 3*s)), now, 3 * s, true},
		{"tat idle", ptr(TAT(now - s)), now, 0, true},
		{"departure", ptr(Departure(now + 2*s)), now, 2 * s, true},
		{"fixed", &FixedState{End: now + s, Count: 7}, now, 7, false},
		{"fixed ended", &FixedState{End: now, Count: 7}, now, 0, false},
		{"inflight", ptr(Inflight(3)), now, 3, false},
		// At 101 s, window [100 s, 110 s): Prev 4 weighted by 9/10 → 4, Cur 3.
		{"sliding", &sst, 101 * s, 7, false},
		// At 105 s: ⌈4·5/10⌉ + 3.
		{"sliding later", &sst, 105 * s, 5, false},
		// At 112 s, rolled: Prev 3 weighted by 8/10 → 3.
		{"sliding rolled", &sst, 112 * s, 3, false},
		{"sliding out of view", &sst, 120 * s, 0, false},
		{"log", &lst, now, 3, false},
		{"log later", &lst, 106 * s, 1, false},
		{"penalty locked", &PenaltyState{Until: now + 4*s, Expire: now + 40*s}, now, 4 * s, true},
		{"penalty counting", &PenaltyState{Count: 2, Expire: now + 40*s}, now, 0, true},
	} {
		if owed, inTime := c.d.debt(c.at); owed != c.owed || inTime != c.inTime {
			t.Errorf("%s: debt (%d, %v), want (%d, %v)", c.name, owed, inTime, c.owed, c.inTime)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestGCRAStoreConcurrentAtCap: forgiven evictions race with lock-free
// decisions on the same keys: the table stays consistent, the cap holds,
// and every forgiven eviction is counted with a positive debt.
func TestGCRAStoreConcurrentAtCap(t *testing.T) {
	st := newGCRAStore(t, StoreConfig{Shards: 2, MaxKeys: 2 * capKeys})
	g := mustGCRA(t, 1, time.Hour, 10) // nothing refills during the test: every eviction forgives
	now := int64(time.Hour)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				// Hot keys 1..8 are spent over and over; the rest rotate.
				k := uint64(1 + i%8)
				if i%2 == 1 {
					k = uint64(1000 + w*100_000 + i)
				}
				st.Apply(k, now, &g, 1)
			}
		}()
	}
	wg.Wait()
	checkGTable(t, st)
	s := st.Stats()
	if s.Live > 2*capKeys || s.EvictedForgiven == 0 || s.ForgivenNanos < s.EvictedForgiven*uint64(time.Hour) {
		t.Fatalf("stats %+v: want at most %d live, forgiven evictions each owing at least an hour", s, 2*capKeys)
	}
}
