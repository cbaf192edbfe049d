package weir

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// TestRecentCountsNeverUndercount: the count-min estimate of every key is at
// least its true count within the current and previous period, and exact
// when few keys share the sketch.
func TestRecentCountsNeverUndercount(t *testing.T) {
	var rc recentCounts
	rnd := rand.New(rand.NewPCG(1, 2))
	now := int64(100 * recentPeriod)
	type tally struct{ a, r uint64 }
	truth := map[uint64]*tally{}
	keys := make([]uint64, 5000)
	for i := range keys {
		keys[i] = rnd.Uint64()
		truth[keys[i]] = &tally{}
	}
	for range 200_000 {
		k := keys[rnd.IntN(len(keys))]
		rej := rnd.IntN(3) == 0
		rc.add(k, now, rej)
		if rej {
			truth[k].r++
		} else {
			truth[k].a++
		}
	}
	exact := 0
	for k, tr := range truth {
		a, r, _ := rc.estimate(k, now)
		if a < tr.a || r < tr.r {
			t.Fatalf("key %x: estimate %d/%d below the truth %d/%d", k, a, r, tr.a, tr.r)
		}
		if a == tr.a && r == tr.r {
			exact++
		}
	}
	// 5000 keys in 16384 cells per row: most keys share no cell in one of
	// the two rows.
	if exact < len(keys)*9/10 {
		t.Fatalf("only %d of %d estimates exact", exact, len(keys))
	}
}

// TestRecentCountsPeriods: counts survive into the next period, are gone two
// periods later, and a clock that steps back does not clear a newer period.
func TestRecentCountsPeriods(t *testing.T) {
	var rc recentCounts
	p := int64(recentPeriod)
	t0 := 10 * p
	for range 7 {
		rc.add(42, t0, true)
	}
	rc.add(42, t0, false)
	if a, r, since := rc.estimate(42, t0); a != 1 || r != 7 || since != recentPeriod {
		t.Fatalf("same period: %d/%d since %v, want 1/7 since %v", a, r, since, recentPeriod)
	}
	if a, r, _ := rc.estimate(42, t0+p); a != 1 || r != 7 {
		t.Fatalf("next period: %d/%d, want 1/7", a, r)
	}
	rc.add(42, t0+p+1, true)
	if a, r, since := rc.estimate(42, t0+p+1); a != 1 || r != 8 || since != recentPeriod+1 {
		t.Fatalf("two periods summed: %d/%d since %v, want 1/8", a, r, since)
	}
	rc.add(42, t0+2*p, true) // reuses and clears the slot of t0
	if a, r, _ := rc.estimate(42, t0+2*p); a != 0 || r != 2 {
		t.Fatalf("two periods later: %d/%d, want 0/2", a, r)
	}
	rc.add(42, t0, true) // the clock stepped back: ignored
	if a, r, _ := rc.estimate(42, t0+2*p); a != 0 || r != 2 {
		t.Fatalf("after a step back: %d/%d, want 0/2", a, r)
	}
	if a, r, _ := rc.estimate(42, t0+5*p); a != 0 || r != 0 {
		t.Fatalf("long after: %d/%d, want 0/0", a, r)
	}
}

// BenchmarkRecentCounts is the decision path's cost of the per-identity
// recent counts (two atomic adds in a count-min sketch) beside the
// reference, one GCRA decision in the keyed store, measured in the same
// run: read the ratio.
func BenchmarkRecentCounts(b *testing.B) {
	keys := make([]uint64, 1000)
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := range keys {
		keys[i] = rnd.Uint64()
	}
	now := int64(time.Hour)
	b.Run("add", func(b *testing.B) {
		var rc recentCounts
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			rc.add(keys[i%len(keys)], now+int64(i), i&7 == 0)
		}
	})
	b.Run("reference=gcra-store", func(b *testing.B) {
		g, err := bucket.NewGCRA(100, time.Second, 1_000_000_000)
		if err != nil {
			b.Fatal(err)
		}
		st, err := bucket.NewGCRAStore(bucket.StoreConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			st.Apply(keys[i%len(keys)], now+int64(i), &g, 1)
		}
	})
}

// TestRecentCountsPrefetch: prefetching a key's cells changes no count, in
// any period and across turnovers, and follows the slot the latest period
// claimed.
func TestRecentCountsPrefetch(t *testing.T) {
	var with, without recentCounts
	rnd := rand.New(rand.NewPCG(3, 4))
	now := int64(7 * recentPeriod)
	for i := range 20000 {
		key := rnd.Uint64() % 300
		rejected := rnd.IntN(3) == 0
		with.prefetch(key)
		with.add(key, now, rejected)
		without.add(key, now, rejected)
		if i%5000 == 4999 {
			now += int64(recentPeriod) // a turnover every 5 000 adds
			if got, want := with.cur.Load(), int32((now/int64(recentPeriod)-1)&1); got != want {
				t.Fatalf("after %d adds: prefetching from slot %d, the latest period's is %d", i+1, got, want)
			}
		}
		now += int64(time.Microsecond)
	}
	for key := range uint64(300) {
		a1, r1, s1 := with.estimate(key, now)
		a2, r2, s2 := without.estimate(key, now)
		if a1 != a2 || r1 != r2 || s1 != s2 {
			t.Fatalf("key %d: %d/%d over %v with prefetching, %d/%d over %v without", key, a1, r1, s1, a2, r2, s2)
		}
	}
}

// TestRecentSinceNodeAge: the recent counts of a node younger than a period
// reach back to its start, not to the start of the period before.
func TestRecentSinceNodeAge(t *testing.T) {
	var now atomic.Int64
	now.Store(int64(100*recentPeriod) + int64(time.Second))
	rules := []quota.Rule{{ID: "per-key", Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}}, Limit: 10, Window: time.Minute, Burst: 5}}
	n, err := New(Config{Clock: func() time.Time { return time.Unix(0, now.Load()) }, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	now.Add(int64(1500 * time.Millisecond))
	rep, err := n.lookupIdentity(t.Context(), "k", IdentityQuery{})
	if err != nil || rep.RecentSince != "1.5s" {
		t.Fatalf("RecentSince = %q (%v), want 1.5s: the node's age", rep.RecentSince, err)
	}
	var rc recentCounts
	if _, _, since := rc.estimate(1, int64(100*recentPeriod)+int64(time.Second)); since != recentPeriod+time.Second {
		t.Fatalf("since = %v on an old node, want one period and a second", since)
	}
}
