package hitters

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

const hl = int64(time.Minute)

// exact is the reference: every event kept, decayed counts computed directly.
type exact struct {
	halfLife float64
	events   map[string][]event
}

type event struct {
	t int64
	n uint64
}

func newExact(halfLife time.Duration) *exact {
	return &exact{halfLife: float64(halfLife), events: map[string][]event{}}
}

func (e *exact) Add(now int64, key string, n uint64) {
	if len(key) > MaxKeyLen {
		key = key[:MaxKeyLen]
	}
	e.events[key] = append(e.events[key], event{now, n})
}

func (e *exact) Count(now int64, key string) float64 {
	var c float64
	for _, ev := range e.events[key] {
		c += float64(ev.n) * math.Exp2(-float64(now-ev.t)/e.halfLife)
	}
	return c
}

// atLeast reports whether est >= want up to float64 rounding.
func atLeast(est, want float64) bool {
	return est >= want*(1-1e-9)
}

func TestHeavyHittersFound(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if testing.Short() || raceEnabled {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			s := New(Config{K: 20, Seed: seed})
			ref := newExact(DefaultHalfLife)
			heavy := map[string]bool{}
			for i := range 10 {
				heavy[fmt.Sprintf("heavy-%d", i)] = true
			}
			var keys []string
			for k := range heavy {
				for range 2000 {
					keys = append(keys, k)
				}
			}
			for range 100_000 {
				keys = append(keys, fmt.Sprintf("light-%d", rng.IntN(50_000)))
			}
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			for _, k := range keys {
				s.Add(0, k, 1)
				ref.Add(0, k, 1)
			}
			top := s.Top(0)
			if len(top) != 20 {
				t.Fatalf("len(Top) = %d, want 20", len(top))
			}
			for i, e := range top {
				if want := ref.Count(0, e.Key); e.Count < want {
					t.Errorf("%s: estimate %v below true count %v", e.Key, e.Count, want)
				}
				if i < len(heavy) && !heavy[e.Key] {
					t.Errorf("top[%d] = %v, want a heavy key; top = %v", i, e, top)
				}
			}
		})
	}
}

func TestDecayHalves(t *testing.T) {
	s := New(Config{})
	s.Add(0, "a", 100)
	s.Add(0, "b", 10)
	for i, want := range []float64{100, 50, 25, 12.5} {
		top := s.Top(int64(i) * hl)
		if len(top) != 2 || top[0].Key != "a" || math.Abs(top[0].Count-want) > 1e-9*want {
			t.Fatalf("after %d half-lives: %v, want a=%v", i, top, want)
		}
	}
	// Time going backwards is treated as the latest time seen.
	if top := s.Top(0); math.Abs(top[0].Count-12.5) > 1e-9 {
		t.Errorf("Top at an earlier time = %v, want a=12.5", top)
	}
	// New events count in full while old ones have decayed; order follows recency.
	s.Add(3*hl, "b", 20)
	top := s.Top(3 * hl)
	if top[0].Key != "b" || math.Abs(top[0].Count-21.25) > 1e-9 {
		t.Errorf("after re-adding b: %v, want b=21.25 first", top)
	}
}

// TestDecayRenormalize crosses many renormalization epochs and checks counts
// against the exact reference.
func TestDecayRenormalize(t *testing.T) {
	s := New(Config{HalfLife: time.Second})
	ref := newExact(time.Second)
	sec := int64(time.Second)
	now := int64(-1 << 40) // arbitrary origin, negative on purpose
	for i := range 500 {
		now += sec * int64(i%7)
		s.Add(now, "k", uint64(i+1))
		ref.Add(now, "k", uint64(i+1))
		if i%50 == 49 {
			top := s.Top(now)
			want := ref.Count(now, "k")
			if len(top) != 1 || !atLeast(top[0].Count, want) || top[0].Count > want*(1+1e-9) {
				t.Fatalf("step %d: %v, want k=%v", i, top, want)
			}
		}
	}
	// After very long silence the entry has decayed away.
	if top := s.Top(now + 100*renormHalfLives*sec); len(top) != 0 {
		t.Errorf("after long silence: %v, want empty", top)
	}
	s.Add(now+101*renormHalfLives*sec, "x", 3)
	if top := s.Top(now + 101*renormHalfLives*sec); len(top) != 1 || top[0] != (Entry{"x", 3}) {
		t.Errorf("after restart: %v, want [x=3]", top)
	}
}

func TestMemoryBounded(t *testing.T) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	cfg := Config{K: 16, Width: 1024, Depth: 3, HalfLife: time.Second}
	s := New(cfg)
	var b strings.Builder
	for i := range n {
		b.Reset()
		fmt.Fprintf(&b, "key-%d", i)
		s.Add(int64(i)*1000, b.String(), uint64(1+i%5))
	}
	if len(s.counts) != cfg.Width*cfg.Depth {
		t.Errorf("len(counts) = %d, want %d", len(s.counts), cfg.Width*cfg.Depth)
	}
	if len(s.top) > cfg.K || len(s.index) != len(s.top) {
		t.Errorf("len(top) = %d, len(index) = %d, want <= %d and equal", len(s.top), len(s.index), cfg.K)
	}
	if cap(s.top) > cfg.K {
		t.Errorf("cap(top) = %d grew beyond K", cap(s.top))
	}
}

func TestLongKeysTruncated(t *testing.T) {
	s := New(Config{})
	long := strings.Repeat("x", 1000)
	s.Add(0, long, 1)
	s.Add(0, long[:MaxKeyLen]+"different tail", 1)
	top := s.Top(0)
	if len(top) != 1 || top[0].Key != long[:MaxKeyLen] || top[0].Count != 2 {
		t.Errorf("Top = %v, want one truncated key with count 2", top)
	}
}

func TestDeterministic(t *testing.T) {
	run := func(seed uint64) []Entry {
		rng := rand.New(rand.NewPCG(7, 7))
		s := New(Config{K: 10, Width: 64, Depth: 2, Seed: seed})
		for i := range 20_000 {
			s.Add(int64(i)*int64(time.Millisecond), fmt.Sprint("k", rng.IntN(300)), uint64(1+rng.IntN(3)))
		}
		return s.Top(20_000 * int64(time.Millisecond))
	}
	a, b := run(1), run(1)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different results:\n%v\n%v", a, b)
	}
	if c := run(2); slices.Equal(a, c) {
		t.Logf("seeds 1 and 2 happen to agree: %v", c)
	}
}

func TestZeroAndDefaults(t *testing.T) {
	s := New(Config{K: -1, Width: -1, Depth: 1000, HalfLife: -1})
	if s.k != DefaultK || s.width != DefaultWidth || s.depth != maxDepth || s.halfLife != float64(DefaultHalfLife) {
		t.Errorf("defaults not applied: %+v", s)
	}
	s.Add(0, "a", 0)
	if top := s.Top(0); len(top) != 0 {
		t.Errorf("Add of zero events: %v", top)
	}
	if top := New(Config{}).Top(123); len(top) != 0 {
		t.Errorf("empty sketch: %v", top)
	}
	huge := New(Config{HalfLife: math.MaxInt64})
	huge.Add(math.MinInt64, "a", 1)
	if top := huge.Top(math.MaxInt64); len(top) != 1 || math.Abs(top[0].Count-0.25) > 1e-9 {
		t.Errorf("extreme times: %v", top)
	}
}

// TestMatchesReference drives random operations with collisions and checks the
// Top invariants against the exact counts.
func TestMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			K:        rapid.IntRange(1, 8).Draw(t, "k"),
			Width:    rapid.IntRange(1, 64).Draw(t, "width"),
			Depth:    rapid.IntRange(1, 4).Draw(t, "depth"),
			HalfLife: time.Duration(rapid.Int64Range(1, 1000).Draw(t, "halfLife")),
			Seed:     rapid.Uint64().Draw(t, "seed"),
		}
		nkeys := rapid.IntRange(1, 20).Draw(t, "nkeys")
		s, ref := New(cfg), newExact(cfg.HalfLife)
		now := rapid.Int64Range(-1e12, 1e12).Draw(t, "start")
		for i := range rapid.IntRange(1, 200).Draw(t, "ops") {
			now += rapid.Int64Range(0, 3*int64(cfg.HalfLife)).Draw(t, "dt")
			key := fmt.Sprint("k", rapid.IntRange(0, nkeys-1).Draw(t, "key"))
			n := rapid.Uint64Range(0, 1000).Draw(t, "n")
			s.Add(now, key, n)
			ref.Add(now, key, n)
			if i%10 != 0 {
				continue
			}
			top := s.Top(now)
			if len(top) > cfg.K {
				t.Fatalf("len(Top) = %d > K", len(top))
			}
			seen := map[string]bool{}
			for j, e := range top {
				if want := ref.Count(now, e.Key); !atLeast(e.Count, want) {
					t.Fatalf("%s: estimate %v below true count %v", e.Key, e.Count, want)
				}
				if j > 0 && (top[j-1].Count < e.Count || top[j-1].Count == e.Count && top[j-1].Key >= e.Key) {
					t.Fatalf("not sorted: %v", top)
				}
				seen[e.Key] = true
			}
			if len(ref.events) <= cfg.K {
				// Nothing was ever evicted, so every key that still counts is listed.
				for k := range ref.events {
					if ref.Count(now, k) >= 2*minCount && !seen[k] {
						t.Fatalf("key %s (count %v) missing from %v", k, ref.Count(now, k), top)
					}
				}
			}
		}
	})
}

func TestConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := New(Config{K: 5, Width: 256, Depth: 2})
	var wg sync.WaitGroup
	const workers, per = 8, 2000
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				s.Add(int64(i), fmt.Sprint("k", (w*per+i)%37), 1)
				if i%100 == 0 {
					_ = s.Top(int64(i))
				}
			}
		})
	}
	wg.Wait()
	top := s.Top(per)
	if len(top) != 5 {
		t.Fatalf("Top = %v", top)
	}
	var total float64
	for _, e := range top {
		total += e.Count
	}
	if total <= 0 {
		t.Errorf("no counts: %v", top)
	}
}

func ExampleSketch() {
	s := New(Config{K: 2, HalfLife: time.Minute})
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 8 {
		s.Add(start.UnixNano(), "tenant-a", 1)
	}
	s.Add(start.UnixNano(), "tenant-b", 3)
	s.Add(start.UnixNano(), "tenant-c", 1)
	for _, e := range s.Top(start.Add(time.Minute).UnixNano()) {
		fmt.Printf("%s %.1f\n", e.Key, e.Count)
	}
	// Output:
	// tenant-a 4.0
	// tenant-b 1.5
}

// counter is what the benchmarks compare: the Sketch and the exact,
// unbounded reference (a map of lazily scaled counts, same decay model).
type counter interface {
	Add(now int64, key string, n uint64)
}

type exactMap struct {
	mu sync.Mutex
	m  map[string]float64
}

func (e *exactMap) Add(now int64, key string, n uint64) {
	e.mu.Lock()
	e.m[key] += float64(n) * math.Exp2(float64(now)/float64(hl))
	e.mu.Unlock()
}

func BenchmarkAdd(b *testing.B) {
	for _, nkeys := range []int{1_000, 1_000_000} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("tenant-%d/user-%d", i%97, i)
		}
		impls := []struct {
			name string
			new  func() counter
		}{
			{"sketch", func() counter { return New(Config{}) }},
			{"exactmap", func() counter { return &exactMap{m: map[string]float64{}} }},
		}
		for _, impl := range impls {
			b.Run(fmt.Sprintf("keys=%d/%s", nkeys, impl.name), func(b *testing.B) {
				c := impl.new()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					c.Add(int64(i)*1000, keys[i%nkeys], 1)
					i++
				}
			})
			b.Run(fmt.Sprintf("keys=%d/%s/parallel", nkeys, impl.name), func(b *testing.B) {
				c := impl.new()
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						c.Add(int64(i)*1000, keys[i%nkeys], 1)
						i++
					}
				})
			})
		}
	}
}

func BenchmarkTop(b *testing.B) {
	s := New(Config{})
	for i := range 100_000 {
		s.Add(int64(i), fmt.Sprint("k", i%5000), 1)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Top(100_000)
	}
}

// TestAddPair: AddPair(a, b) counts exactly what Add(a+" "+b) counts, and
// once a key is in the top list, counting it again allocates nothing.
func TestAddPair(t *testing.T) {
	one, two := New(Config{K: 4, Seed: 3}), New(Config{K: 4, Seed: 3})
	for i := range 200 {
		id := strings.Repeat("k", 40) + string(rune('a'+i%7))
		one.Add(int64(i), "rule "+id, 1)
		two.AddPair(int64(i), "rule", id, 1)
	}
	if a, b := one.Top(300), two.Top(300); !reflect.DeepEqual(a, b) {
		t.Fatalf("Add and AddPair differ:\n%v\n%v", a, b)
	}
	long := strings.Repeat("x", 64)
	two.AddPair(400, "rule", long, 50)
	if allocs := testing.AllocsPerRun(100, func() { two.AddPair(401, "rule", long, 1) }); allocs != 0 {
		t.Fatalf("AddPair of a key already in the top list allocates %v times", allocs)
	}
}
