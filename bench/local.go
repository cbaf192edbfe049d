package main

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// The local section: one keyed decision in process, for weir and the
// in-process alternatives, over the same pre-generated 32-byte identities
// visited in a shuffled order. Every rule is 1 000 per second with a burst
// of 100 (go-limiter has no separate burst: 1 000 tokens per second), and
// each key is visited at most once per 1 k operations, so nearly every
// decision is an admission for every system.
//
// Each timed loop is written out per system, with a direct call, as in
// bucket/bench_test.go: a shared loop over an interface would add an
// indirect call to every figure.

// Sizes of the keyed runs: powers of two, so the key index is a mask.
const (
	keys1k = 1 << 10
	keys1M = 1 << 20
)

// t0 is the first timestamp given to the systems whose API takes the time.
const t0 = int64(1_700_000_000_000_000_000)

var (
	idsOnce sync.Once
	idsAll  []string
)

// benchIDs returns n distinct 32-byte identities (deterministic), shuffled so
// consecutive operations touch unrelated keys.
func benchIDs(n int) []string {
	idsOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
		idsAll = make([]string, keys1M)
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

// localSystem is one in-process limiter: how to build an instance over a
// set of identities (every one already seen) and benchmark it serially and
// in parallel, and how to fill a fresh instance for the memory figure. The
// serial and parallel runs share the instance, and the runs of every round
// reuse it, so that an instance is built once per key count.
type localSystem struct {
	name string
	note string
	// keyed is false for the unkeyed x/time/rate limiter: its figures are
	// the same at every key count.
	keyed bool
	build func(ids []string) benchPair
	// fill builds a fresh instance holding every id (each a freshly
	// allocated string, as keys taken from requests are) and returns it;
	// nil when the figure does not apply.
	fill func(ids []string) any
}

// benchPair is one built instance's two benchmarks.
type benchPair struct {
	serial, parallel func(b *testing.B)
}

// rule parameters shared by every system.
const (
	ruleLimit = 1000 // per second
	ruleBurst = 100
)

func weirRule() bucket.GCRA {
	g, err := bucket.NewGCRA(ruleLimit, time.Second, ruleBurst)
	if err != nil {
		panic(err)
	}
	return g
}

// localSystems lists the local section's systems, weir's store first (the
// reference of every ratio).
func localSystems() []localSystem {
	return []localSystem{
		{name: "weir GCRAStore", note: "hash + lock-free keyed GCRA (Allow: allowed and retry-after, as AllowN's bool), time passed in", keyed: true, build: weirStore, fill: weirStoreFill},
		{name: "weir Node.Allow", note: "end to end: rule match, clock read, metrics, Decision", keyed: true, build: weirNode},
		{name: "x/time/rate AllowN(now,1)", note: "one limiter, no key, time passed in", keyed: false, build: xrateUnkeyed},
		{name: "x/time/rate keyed", note: "map[string]*rate.Limiter under a mutex, time passed in", keyed: true, build: keyedXRateBench, fill: keyedXRateFill},
		{name: "sethvargo/go-limiter", note: "memorystore.Take; reads the clock itself (its API takes no time)", keyed: true, build: goLimiterBench, fill: goLimiterFill},
		{name: "throttled GCRA memstore", note: "v2 GCRARateLimiterCtx on memstore (unbounded map); reads the clock itself", keyed: true, build: throttledBench, fill: throttledFill},
		{name: "map floor", note: "m[maphash(id)]++ on a map[uint64]int64 (one map per goroutine in parallel)", keyed: true, build: floorBench, fill: floorFill},
	}
}

// fakeClock is the time given to the systems whose API takes it: every run
// starts where the previous one on the instance stopped, 1 µs per decision,
// so a key is never asked about at a time before its last decision.
type fakeClock struct{ now atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.now.Store(t0)
	return c
}

// advanceTo records that some goroutine reached t.
func (c *fakeClock) advanceTo(t int64) {
	for {
		cur := c.now.Load()
		if t <= cur || c.now.CompareAndSwap(cur, t) {
			return
		}
	}
}

// afterRun holds what builds left running (go-limiter's sweeper goroutine,
// weir nodes); measureLocal runs and empties it when it is done.
var afterRun []func()

// ---- weir store

func weirStore(ids []string) benchPair {
	st, err := bucket.NewGCRAStore(bucket.StoreConfig{})
	if err != nil {
		panic(err)
	}
	g := weirRule()
	h := bucket.NewHasher()
	for _, id := range ids {
		st.Allow(h.Sum(id), t0, &g, 1)
	}
	mask := len(ids) - 1
	clk := newFakeClock()
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			now := clk.now.Load()
			for i := 0; b.Loop(); i++ {
				now += 1000
				st.Allow(h.Sum(ids[i&mask]), now, &g, 1)
			}
			clk.advanceTo(now)
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			start := clk.now.Load()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				now := start
				for pb.Next() {
					now += 1000
					st.Allow(h.Sum(ids[i&mask]), now, &g, 1)
					i++
				}
				clk.advanceTo(now)
			})
		},
	}
}

func weirStoreFill(ids []string) any {
	st, err := bucket.NewGCRAStore(bucket.StoreConfig{})
	if err != nil {
		panic(err)
	}
	g := weirRule()
	h := bucket.NewHasher()
	for _, id := range ids {
		st.Apply(h.Sum(strings.Clone(id)), t0, &g, 1)
	}
	if st.Stats().Live != len(ids) {
		panic("weir store: not every key is live")
	}
	return st
}

// ---- weir Node.Allow

const nodeRules = `
rules:
  - id: per-ip
    key: [ip]
    limit: 1000
    window: 1s
    burst: 100
    mode: local
`

func newLocalNode() *weir.Node {
	rules, err := quota.Parse("bench.yaml", []byte(nodeRules))
	if err != nil {
		panic(err)
	}
	n, err := weir.New(weir.Config{Rules: rules})
	if err != nil {
		panic(err)
	}
	afterRun = append(afterRun, func() { n.Close() })
	return n
}

func weirNode(ids []string) benchPair {
	n := newLocalNode()
	reqs := make([]weir.Request, len(ids))
	for i, id := range ids {
		reqs[i] = weir.Request{Method: "GET", Path: "/", ClientIP: id}
	}
	ctx := context.Background()
	for i := range reqs {
		n.Allow(ctx, reqs[i])
	}
	mask := len(ids) - 1
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				n.Allow(ctx, reqs[i&mask])
			}
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					n.Allow(ctx, reqs[i&mask])
					i++
				}
			})
		},
	}
}

// ---- x/time/rate, unkeyed

func xrateUnkeyed([]string) benchPair {
	lim := rate.NewLimiter(rate.Limit(1e9), ruleBurst)
	clk := newFakeClock()
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			now := time.Unix(0, clk.now.Load())
			for b.Loop() {
				now = now.Add(1000)
				lim.AllowN(now, 1)
			}
			clk.advanceTo(now.UnixNano())
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			start := clk.now.Load()
			b.RunParallel(func(pb *testing.PB) {
				now := time.Unix(0, start)
				for pb.Next() {
					now = now.Add(1000)
					lim.AllowN(now, 1)
				}
				clk.advanceTo(now.UnixNano())
			})
		},
	}
}

// ---- x/time/rate, keyed through a map under one mutex

type keyedXRate struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newKeyedXRate(n int) *keyedXRate {
	return &keyedXRate{m: make(map[string]*rate.Limiter, n)}
}

func (k *keyedXRate) allowAt(id string, now time.Time) bool {
	k.mu.Lock()
	lim, ok := k.m[id]
	if !ok {
		lim = rate.NewLimiter(ruleLimit, ruleBurst)
		k.m[id] = lim
	}
	a := lim.AllowN(now, 1)
	k.mu.Unlock()
	return a
}

func keyedXRateBench(ids []string) benchPair {
	k := newKeyedXRate(len(ids))
	for _, id := range ids {
		k.allowAt(id, time.Unix(0, t0))
	}
	mask := len(ids) - 1
	clk := newFakeClock()
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			now := time.Unix(0, clk.now.Load())
			for i := 0; b.Loop(); i++ {
				now = now.Add(1000)
				k.allowAt(ids[i&mask], now)
			}
			clk.advanceTo(now.UnixNano())
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			start := clk.now.Load()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				now := time.Unix(0, start)
				for pb.Next() {
					now = now.Add(1000)
					k.allowAt(ids[i&mask], now)
					i++
				}
				clk.advanceTo(now.UnixNano())
			})
		},
	}
}

func keyedXRateFill(ids []string) any {
	k := newKeyedXRate(0)
	now := time.Unix(0, t0)
	for _, id := range ids {
		k.allowAt(strings.Clone(id), now)
	}
	return k
}

// ---- sethvargo/go-limiter memorystore

type goLimiterStore interface {
	Take(context.Context, string) (uint64, uint64, uint64, bool, error)
	Close(context.Context) error
}

func newGoLimiter() goLimiterStore {
	st, err := memorystore.New(&memorystore.Config{
		Tokens:        ruleLimit,
		Interval:      time.Second,
		SweepInterval: time.Hour, // no sweep during a run
		SweepMinTTL:   time.Hour,
	})
	if err != nil {
		panic(err)
	}
	afterRun = append(afterRun, func() { st.Close(context.Background()) })
	return st
}

func goLimiterBench(ids []string) benchPair {
	st := newGoLimiter()
	ctx := context.Background()
	for _, id := range ids {
		st.Take(ctx, id)
	}
	mask := len(ids) - 1
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				st.Take(ctx, ids[i&mask])
			}
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					st.Take(ctx, ids[i&mask])
					i++
				}
			})
		},
	}
}

func goLimiterFill(ids []string) any {
	st := newGoLimiter()
	ctx := context.Background()
	for _, id := range ids {
		st.Take(ctx, strings.Clone(id))
	}
	return st
}

// ---- throttled GCRA on its memory store

func newThrottled() *throttled.GCRARateLimiterCtx {
	st, err := memstore.NewCtx(0) // 0: an unbounded map, its cheapest store
	if err != nil {
		panic(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(ruleLimit), MaxBurst: ruleBurst})
	if err != nil {
		panic(err)
	}
	return l
}

func throttledBench(ids []string) benchPair {
	l := newThrottled()
	ctx := context.Background()
	for _, id := range ids {
		l.RateLimitCtx(ctx, id, 1)
	}
	mask := len(ids) - 1
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				l.RateLimitCtx(ctx, ids[i&mask], 1)
			}
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					l.RateLimitCtx(ctx, ids[i&mask], 1)
					i++
				}
			})
		},
	}
}

func throttledFill(ids []string) any {
	l := newThrottled()
	ctx := context.Background()
	for _, id := range ids {
		l.RateLimitCtx(ctx, strings.Clone(id), 1)
	}
	return l
}

// ---- the floor: a bare map increment

func floorBuild(ids []string, seed maphash.Seed) map[uint64]int64 {
	m := make(map[uint64]int64, len(ids))
	for _, id := range ids {
		m[maphash.String(seed, id)] = 0
	}
	return m
}

func floorBench(ids []string) benchPair {
	seed := maphash.MakeSeed()
	m := floorBuild(ids, seed)
	// One private map per parallel goroutine: the floor has no sharing.
	maps := make(chan map[uint64]int64, runtime.GOMAXPROCS(0))
	maps <- m
	for range cap(maps) - 1 {
		maps <- floorBuild(ids, seed)
	}
	mask := len(ids) - 1
	var seq atomic.Int64
	return benchPair{
		serial: func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m[maphash.String(seed, ids[i&mask])]++
			}
		},
		parallel: func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				pm := <-maps
				defer func() { maps <- pm }()
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					pm[maphash.String(seed, ids[i&mask])]++
					i++
				}
			})
		},
	}
}

func floorFill(ids []string) any {
	seed := maphash.MakeSeed()
	m := make(map[uint64]int64)
	for _, id := range ids {
		m[maphash.String(seed, strings.Clone(id))]++
	}
	return m
}

// ---- measuring

// localFigures are one system's local results; NaN-free: a figure that does
// not apply is 0 with its Has flag false.
type localFigures struct {
	Name           string  `json:"name"`
	Note           string  `json:"note"`
	Serial1k       float64 `json:"serial_1k_ns"`
	Serial1M       float64 `json:"serial_1M_ns"`
	Parallel1k     float64 `json:"parallel_1k_ns"`
	Parallel1M     float64 `json:"parallel_1M_ns"`
	AllocsPerOp    float64 `json:"allocs_per_op"` // the largest of the four runs
	BytesPerKey    float64 `json:"bytes_per_key_1M"`
	HasBytesPerKey bool    `json:"has_bytes_per_key"`
	Keyed          bool    `json:"keyed"`
}

// benchOnce runs one testing.Benchmark and returns ns/op and allocs/op
// (testing's whole allocations per op, as -benchmem prints them).
func benchOnce(f func(b *testing.B)) (ns, allocs float64) {
	r := testing.Benchmark(f)
	if r.N == 0 {
		return 0, 0
	}
	return float64(r.T.Nanoseconds()) / float64(r.N), float64(r.AllocsPerOp())
}

// measureLocal runs the local section: rounds rounds, each running every
// system's four benchmarks in turn (interleaved, so that a change of load
// on the shared machine hits all alike), keeping each figure's median; then
// the memory figure of each system, on fresh instances. An instance is
// built for one key count, benchmarked serially and in parallel, and
// dropped: testing.Benchmark collects garbage before each run, and a heap
// holding every system at 1 M keys at once would make that cost seconds.
func measureLocal(rounds, small, large int, logf func(string, ...any)) []localFigures {
	systems := localSystems()
	ids := [2][]string{benchIDs(small), benchIDs(large)}
	type runs struct{ serial, parallel [2][]float64 }
	all := make([]runs, len(systems))
	allocs := make([]float64, len(systems))
	for round := range rounds {
		for i, s := range systems {
			for size := range 2 {
				if !s.keyed && size == 1 {
					continue // unkeyed: one figure serves every key count
				}
				bp := s.build(ids[size])
				ns, a := benchOnce(bp.serial)
				all[i].serial[size] = append(all[i].serial[size], ns)
				allocs[i] = max(allocs[i], a)
				ns, a = benchOnce(bp.parallel)
				all[i].parallel[size] = append(all[i].parallel[size], ns)
				allocs[i] = max(allocs[i], a)
				for _, f := range afterRun {
					f()
				}
				afterRun = afterRun[:0]
			}
		}
		logf("local: round %d/%d done", round+1, rounds)
	}
	out := make([]localFigures, len(systems))
	for i, s := range systems {
		f := localFigures{Name: s.name, Note: s.note, Keyed: s.keyed, AllocsPerOp: allocs[i]}
		f.Serial1k, f.Parallel1k = median(all[i].serial[0]), median(all[i].parallel[0])
		if s.keyed {
			f.Serial1M, f.Parallel1M = median(all[i].serial[1]), median(all[i].parallel[1])
		} else {
			f.Serial1M, f.Parallel1M = f.Serial1k, f.Parallel1k
		}
		if s.fill != nil {
			f.BytesPerKey, f.HasBytesPerKey = heapPerKey(ids[1], s.fill), true
		}
		out[i] = f
	}
	return out
}

// heapPerKey is the live heap a fresh instance holds per key after a GC:
// HeapAlloc after the fill minus HeapAlloc before it, both read right after
// runtime.GC(), divided by the number of keys.
func heapPerKey(ids []string, fill func([]string) any) float64 {
	var before, after runtime.MemStats
	// Goroutines that held earlier instances (go-limiter's sweeper after
	// Close) end asynchronously: let them, so that what they held is not
	// in "before" and freed by "after".
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	st := fill(ids)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(st)
	for _, f := range afterRun {
		f()
	}
	afterRun = afterRun[:0]
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(len(ids))
}
