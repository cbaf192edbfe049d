package bucket

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// TestVerdictDecision checks GCRA.Decision(verdict) and GCRA.Allow against
// Step over random states, times and costs, edge cases included (cost 0, negative, above the
// burst; a TAT in debt; a clock behind the TAT), and that Allowed agrees.
func TestVerdictDecision(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for n := 0; n < 20000; n++ {
		g := mustGCRA(t, 1+r.Int64N(1000), time.Duration(1+r.Int64N(int64(time.Minute))), 1+r.Int64N(200))
		now := int64(time.Hour) + r.Int64N(int64(time.Hour))
		var tat int64
		switch r.IntN(4) {
		case 0: // full bucket
		case 1:
			tat = now - r.Int64N(g.tau+1)
		case 2:
			tat = now + r.Int64N(g.tau+1)
		default: // in debt, far ahead
			tat = now + g.tau + r.Int64N(100*g.tau+1)
		}
		cost := r.Int64N(g.burst+3) - 1 // -1 .. burst+1
		s := TAT(tat)
		want := g.Step(&s, now, cost)
		v, next := g.verdict(tat, now, cost)
		if got := g.Decision(v); got != want {
			t.Fatalf("tat %d now %d cost %d (T %d, burst %d): Decision(verdict) %+v, Step %+v", tat, now, cost, g.t, g.burst, got, want)
		}
		if v.Allowed() != want.Allowed {
			t.Fatalf("Allowed %v, Step %v", v.Allowed(), want.Allowed)
		}
		if cost > 0 && int64(s) != next {
			t.Fatalf("tat after: verdict %d, Step %d", next, int64(s))
		}
		// Allow: the same verdict, the same state after as Step.
		a := TAT(tat)
		if av := g.Allow(&a, now, cost); av != v || a != s {
			t.Fatalf("tat %d now %d cost %d: Allow %+v leaves %d, Step %+v leaves %d", tat, now, cost, av, a, want, s)
		}
	}
	if (Verdict{}) != (Verdict{Reset: 0, RetryAfter: 0}) || !(Verdict{}).Allowed() {
		t.Fatal("the zero Verdict is an admission")
	}
}

// TestGCRAAllowSequences: Allow admits and charges exactly as Step does
// along sequences of requests, over random rules, costs (within the burst,
// beyond it, zero and negative), times (forward, repeated, backward) and
// TATs near saturation.
func TestGCRAAllowSequences(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	for rule := range 200 {
		limit := 1 + r.Int64N(1000)
		window := time.Duration(limit + r.Int64N(int64(10*time.Second)))
		burst := 1 + r.Int64N(200)
		g, err := NewGCRA(limit, window, burst)
		if err != nil {
			t.Fatal(err)
		}
		var a, b TAT
		now := int64(1 << 40)
		if rule%10 == 0 {
			a = TAT(int64(^uint64(0)>>1) - r.Int64N(int64(window)))
			b = a
		}
		allowed := 0
		for i := range 2000 {
			switch r.IntN(4) {
			case 0: // the same instant
			case 1:
				now -= r.Int64N(int64(window) / 4) // a step back
			default:
				now += r.Int64N(int64(window) / 50)
			}
			cost := 1 + r.Int64N(burst)
			switch r.IntN(20) {
			case 0:
				cost = burst + 1 + r.Int64N(5)
			case 1:
				cost = -r.Int64N(2)
			}
			want := g.Step(&a, now, cost).Allowed
			if got := g.Allow(&b, now, cost).Allowed(); got != want || a != b {
				t.Fatalf("rule %d (limit %d, window %v, burst %d), step %d, cost %d: Allow %v tat %d, Step %v tat %d",
					rule, limit, window, burst, i, cost, got, b, want, a)
			}
			if want {
				allowed++
			}
		}
		if allowed == 0 && rule%10 != 0 {
			t.Fatalf("rule %d admitted nothing", rule)
		}
	}
}

// TestGCRAStoreAllow runs the same random requests through Allow on a
// GCRAStore and Apply on the reference Store[TAT]: the same verdicts, the
// same states after (Peek), including negative costs and costs above the
// burst, and the same Decision once expanded.
func TestGCRAStoreAllow(t *testing.T) {
	g := mustGCRA(t, 10, time.Second, 5)
	ref, err := NewStore[TAT](StoreConfig{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	st := newGCRAStore(t, StoreConfig{Shards: 4})
	r := rand.New(rand.NewPCG(3, 5))
	keys := make([]uint64, 64)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	keys[0] = 0
	now := int64(time.Hour)
	allowed := 0
	for op := 0; op < 50000; op++ {
		k := keys[r.IntN(len(keys))]
		now += r.Int64N(int64(20 * time.Millisecond))
		cost := r.Int64N(g.burst+3) - 1
		want := ref.Apply(k, now, &g, cost)
		v := st.Allow(k, now, &g, cost)
		if got := g.Decision(v); got != want {
			t.Fatalf("op %d: Allow(%#x, %d, cost %d) = %+v → %+v, Store.Apply %+v", op, k, now, cost, v, got, want)
		}
		if v.Allowed() {
			allowed++
		}
		a, aok := ref.Peek(k, now)
		b, bok := st.Peek(k, now)
		if a != b || aok != bok {
			t.Fatalf("op %d: Peek(%#x): store %v %v, gcrastore %v %v", op, k, a, aok, b, bok)
		}
	}
	if allowed == 0 || allowed == 50000 {
		t.Fatalf("%d of 50000 allowed: the mix should both admit and reject", allowed)
	}
	checkGTable(t, st)
}

// ExampleGCRAStore_Allow decides requests with the two-word Verdict and
// expands one into the whole Decision.
func ExampleGCRAStore_Allow() {
	g, _ := NewGCRA(2, time.Second, 2) // 2 per second, burst 2
	st, _ := NewGCRAStore(StoreConfig{})
	key := NewSeededHasher(1).Sum("user-42")
	now := int64(time.Hour)
	for i := 0; i < 3; i++ {
		v := st.Allow(key, now, &g, 1)
		fmt.Println(v.Allowed(), v.RetryAfter)
	}
	fmt.Printf("%+v\n", g.Decision(st.Allow(key, now, &g, 0))) // a peek: spent, not in debt
	// Output:
	// true 0s
	// true 0s
	// false 500ms
	// {Allowed:true Limit:2 Remaining:0 Reset:1s RetryAfter:0s Delay:0s}
}

// BenchmarkGCRAStoreAllow is BenchmarkGCRAStoreLF through Allow, the method
// a caller that needs allowed and retry-after uses (as x/time/rate's AllowN
// returns a bool): the figure scripts/bench-single-node.sh sets against
// AllowN and the keyed alternatives.
func BenchmarkGCRAStoreAllow(b *testing.B) {
	for _, sz := range benchSizes {
		ids := benchIDs(sz.n)
		mask := sz.n - 1
		g := benchRule(b)
		h := NewHasher()
		b.Run("keys="+sz.name+"/serial", func(b *testing.B) {
			st, _ := NewGCRAStore(StoreConfig{})
			now := benchT0
			for i := range ids { // warm: every key present
				st.Allow(h.Sum(ids[i]), now, &g, 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			denied := 0
			for i := 0; b.Loop(); i++ {
				now += 1000
				if !st.Allow(h.Sum(ids[i&mask]), now, &g, 1).Allowed() {
					denied++
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
		b.Run("keys="+sz.name+"/parallel", func(b *testing.B) {
			st, _ := NewGCRAStore(StoreConfig{})
			for i := range ids {
				st.Allow(h.Sum(ids[i]), benchT0, &g, 1)
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
					st.Allow(h.Sum(ids[i&mask]), now, &g, 1)
					i++
				}
			})
		})
	}
}
