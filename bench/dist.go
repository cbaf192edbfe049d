package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The distributed section: every system behind one small interface, driven
// by one load generator that spreads calls over the three nodes.

// nodes is the size of every cluster.
const nodes = 3

// system is a distributed limiter as a gateway node sees it: may this
// identity pass now, asked on node node (0..nodes-1)?
type system interface {
	// Allow charges one token to key on the given node.
	Allow(ctx context.Context, node int, key string) (bool, error)
}

// distSystem is a named system with what the report says about it.
type distSystem struct {
	name string
	note string
	// envelope is the excess over the reference bucket the system promises
	// for a hot identity (weir shared: S); -1 when it states none.
	envelope float64
	// start brings up a fresh instance (every phase gets its own, so that
	// what one phase leaves behind does not weigh on the next).
	start func() (*instance, error)
}

// instance is one running system.
type instance struct {
	sys system
	// degraded reports decisions made without the owner (fail-open); nil
	// when the system does not count them.
	degraded func() uint64
	// cpu is the CPU time the system's processes have used so far: nil
	// for this process alone (processCPU); Redis adds its server's.
	cpu  func() time.Duration
	stop func()
}

// cpuTime is the CPU time the instance's processes have used so far.
func (in *instance) cpuTime() time.Duration {
	if in.cpu != nil {
		return in.cpu()
	}
	return processCPU()
}

// distFigures are one system's distributed results.
type distFigures struct {
	Name string `json:"name"`
	Note string `json:"note"`

	// Saturation: closed loop, many random identities.
	PerSec     float64 `json:"decisions_per_sec"`
	SatErrors  int64   `json:"saturation_errors"`
	SatWorkers int     `json:"saturation_workers"`
	// PerCPUSec is decisions per CPU-second of the bench process (the
	// generator included, a server process such as redis-server not).
	PerCPUSec float64 `json:"decisions_per_cpu_sec"`

	// Fixed offered load, open loop.
	Offered      float64 `json:"offered_per_sec"`
	Achieved     float64 `json:"achieved_per_sec"`
	P50          float64 `json:"p50_us"`
	P99          float64 `json:"p99_us"`
	P999         float64 `json:"p999_us"`
	LatErrors    int64   `json:"latency_errors"`
	LatSamples   int     `json:"latency_samples"`
	LatDelayed   int64   `json:"latency_dispatch_late"`
	HotAdmitted  int64   `json:"hot_admitted"`
	HotCalls     int64   `json:"hot_calls"`
	HotErrors    int64   `json:"hot_errors"`
	HotElapsed   float64 `json:"hot_elapsed_s"`
	HotReference float64 `json:"hot_reference"`
	HotEnvelope  float64 `json:"hot_envelope_excess"` // -1: none stated
	Degraded     uint64  `json:"degraded"`
	HasDegraded  bool    `json:"has_degraded"`
	Skipped      string  `json:"skipped,omitempty"`
}

// satResult is a saturation run's outcome.
type satResult struct {
	perSec float64
	errors int64
	// perCPUSec is decisions per CPU-second of this process (generator
	// included; a server in another process, like redis-server, is not
	// counted); 0 when unknown.
	perCPUSec float64
}

// idSpace is the set of n distinct identities the distributed section
// draws from: identity i is distID(i). Computing an identity costs about
// what one allocation does, where reading it from a slice of a million
// strings cost two cache misses (the string header, then its bytes: about
// 0.2 µs here, which every system paid and which was a third of weir's
// time per decision at saturation).
type idSpace int

// draw returns an identity picked uniformly at random.
func (n idSpace) draw(r *rand.Rand) string { return distID(uint64(r.IntN(int(n)))) }

// idAlphabet is 64 characters: an identity character carries 6 bits.
const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

// idPairs spells every 12-bit value as two characters of idAlphabet, so
// that an identity takes 16 look-ups (8 KB: it stays in the L1 cache).
var idPairs = func() (t [4096][2]byte) {
	for v := range t {
		t[v] = [2]byte{idAlphabet[v&63], idAlphabet[v>>6]}
	}
	return t
}()

// distID returns identity i: 32 characters of idAlphabet that look random.
// The first 11 characters spell mix64(i), a bijection, so distinct i give
// distinct identities.
func distID(i uint64) string {
	var b [32]byte
	x := mix64(i ^ 0x6a09e667f3bcc908)
	y := mix64(x + 0x9e3779b97f4a7c15)
	z := mix64(y + 0x9e3779b97f4a7c15)
	// x: characters 0-10 (bits 0-59 in pairs, then bits 60-63); y:
	// characters 11-20; z: characters 21-31 (its top bits unused).
	spell10(b[0:10], x)
	b[10] = idAlphabet[x>>60]
	spell10(b[11:21], y)
	spell10(b[21:31], z)
	b[31] = idAlphabet[(z>>60)&63]
	return string(b[:])
}

// spell10 writes the low 60 bits of v into dst as 10 characters, two per
// 12 bits.
func spell10(dst []byte, v uint64) {
	for j := range 5 {
		p := idPairs[(v>>(12*j))&4095]
		dst[2*j], dst[2*j+1] = p[0], p[1]
	}
}

// mix64 is splitmix64's finaliser: a bijection of uint64 that spreads
// every input bit over the output.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// saturate runs workers closed-loop callers (worker w on node w%nodes), each
// drawing identities at random from ids, for d, and returns decisions per
// second over the run.
func saturate(s system, ids idSpace, workers int, d time.Duration) satResult {
	var stop atomic.Bool
	var total, errs atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	start, cpu0 := time.Now(), processCPU()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			node := w % nodes
			var n, e int64
			for !stop.Load() {
				if _, err := s.Allow(ctx, node, ids.draw(r)); err != nil {
					e++
				}
				n++
			}
			total.Add(n)
			errs.Add(e)
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el, cpu := time.Since(start).Seconds(), (processCPU() - cpu0).Seconds()
	res := satResult{perSec: float64(total.Load()) / el, errors: errs.Load()}
	if cpu > 0 {
		res.perCPUSec = float64(total.Load()) / cpu
	}
	return res
}

// latResult is a fixed-load run's outcome; latencies in microseconds.
type latResult struct {
	achieved       float64
	p50, p99, p999 float64
	errors         int64
	samples        int
	late           int64
}

// fixedLoad offers rate calls per second, open loop, for d: a dispatcher
// releases each call at its scheduled time to a pool of callers (call i on
// node i%nodes, identity drawn at random from ids), and a call's latency is
// measured from its scheduled time, so a system that falls behind shows
// its queueing in the figures instead of slowing the offer down
// (no coordinated omission). late counts calls that found no free caller.
func fixedLoad(s system, ids idSpace, rate float64, d time.Duration, callers int) latResult {
	rs, lats := fixedLoadSamples([]system{s}, ids, rate, d, callers)
	res := rs[0]
	res.p50, res.p99, res.p999 = quantile(lats[0], 0.50), quantile(lats[0], 0.99), quantile(lats[0], 0.999)
	return res
}

// fixedLoadSamples is fixedLoad of several systems at once, each offered
// rate calls per second: call i goes to system i mod len(ss), so that they
// take turns call by call, under one generator and one pool of callers, and
// whatever slows the process slows them alike. It returns each system's
// result and its calls' latencies in microseconds, sorted, instead of their
// quantiles.
func fixedLoadSamples(ss []system, ids idSpace, rate float64, d time.Duration, callers int) ([]latResult, [][]float64) {
	type job struct {
		at  time.Time
		key string
		n   int
	}
	k := len(ss)
	jobs := make(chan job, callers*4)
	var mu sync.Mutex
	lats := make([][]float64, k)
	for i := range lats {
		lats[i] = make([]float64, 0, int(rate*d.Seconds())+16)
	}
	errs := make([]atomic.Int64, k)
	var late atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([][]float64, k)
			for j := range jobs {
				sys := j.n % k
				if _, err := ss[sys].Allow(ctx, (j.n/k)%nodes, j.key); err != nil {
					errs[sys].Add(1)
				}
				local[sys] = append(local[sys], float64(time.Since(j.at).Nanoseconds())/1e3)
			}
			mu.Lock()
			for i := range local {
				lats[i] = append(lats[i], local[i]...)
			}
			mu.Unlock()
		}()
	}
	r := rand.New(rand.NewPCG(11, 13))
	start := time.Now()
	interval := time.Duration(float64(time.Second) / (rate * float64(k)))
	total := int(rate * d.Seconds() * float64(k))
	for i := 0; i < total; {
		due := int(time.Since(start)/interval) + 1
		for ; i < total && i < due; i++ {
			j := job{at: start.Add(time.Duration(i) * interval), key: ids.draw(r), n: i}
			select {
			case jobs <- j:
			default:
				late.Add(1)
				jobs <- j
			}
		}
		if i < total {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
	}
	close(jobs)
	wg.Wait()
	el := time.Since(start).Seconds()
	out := make([]latResult, k)
	for i := range lats {
		slices.Sort(lats[i])
		out[i] = latResult{
			achieved: float64(len(lats[i])) / el,
			errors:   errs[i].Load(),
			samples:  len(lats[i]),
			late:     late.Load(),
		}
	}
	return out, lats
}

// hotResult is a hot-identity run's outcome.
type hotResult struct {
	admitted, calls, errors int64
	elapsed                 float64
	reference               float64
}

// hammer calls one identity from workers closed-loop callers spread over the
// nodes for d and compares what was admitted with the reference bucket:
// one exact bucket fed every request, which over Δ admits at most
// burst + limit·Δ (Δ from the first call's start to the last call's end).
func hammer(s system, key string, workers int, d time.Duration) hotResult {
	var stop atomic.Bool
	var admitted, calls, errs atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := w % nodes
			var a, c, e int64
			for !stop.Load() {
				ok, err := s.Allow(ctx, node, key)
				switch {
				case err != nil:
					e++
				case ok:
					a++
				}
				c++
			}
			admitted.Add(a)
			calls.Add(c)
			errs.Add(e)
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start).Seconds()
	return hotResult{
		admitted:  admitted.Load(),
		calls:     calls.Load(),
		errors:    errs.Load(),
		elapsed:   el,
		reference: ruleBurst + ruleLimit*el,
	}
}

// distConfig sizes the distributed section.
type distConfig struct {
	satDur, latDur, hotDur time.Duration
	satWorkers             int
	hotWorkers             int
	offered                float64
	callers                int
	identities             int
	// pairTurns and pairTurn shape the paired latency phase (measurePair).
	pairTurns int
	pairTurn  time.Duration
	// phases names the phases to run (lat, sat, hot, pair); empty means all.
	phases string
}

// redisName is the Redis system's name in the distributed section.
const redisName = "redis Lua token bucket"

// onlyPair reports whether the pair phase is the only one to run: the
// systems' own phases are then skipped.
func (c distConfig) onlyPair() bool { return c.phases == "pair" }

// runs reports whether the phase named p is to run.
func (c distConfig) runs(p string) bool {
	return c.phases == "" || slices.Contains(strings.Split(c.phases, ","), p)
}

// measureDist runs the three phases on one system, each on a fresh
// instance: the fixed load (after a warm-up at the same load), saturation
// (after a short warm-up), then the hot identity.
func measureDist(ds distSystem, cfg distConfig, label string, logf func(string, ...any)) (distFigures, error) {
	ids := idSpace(cfg.identities)
	f := distFigures{Name: ds.name, Note: ds.note, SatWorkers: cfg.satWorkers, Offered: cfg.offered, HotEnvelope: ds.envelope}
	phase := func(fn func(s system)) error {
		t := time.Now()
		in, err := ds.start()
		logf("  %s: started in %v", ds.name, time.Since(t).Round(time.Millisecond))
		if err != nil {
			return fmt.Errorf("%s: %w", ds.name, err)
		}
		fn(in.sys)
		if in.degraded != nil {
			f.Degraded += in.degraded()
			f.HasDegraded = true
		}
		in.stop()
		return nil
	}
	var err error
	if cfg.runs("lat") {
		err = phase(func(s system) {
			fixedLoad(s, ids, cfg.offered, cfg.latDur/4, cfg.callers) // warm-up: connections, caches
			lat := fixedLoad(s, ids, cfg.offered, cfg.latDur, cfg.callers)
			f.Achieved, f.P50, f.P99, f.P999 = lat.achieved, lat.p50, lat.p99, lat.p999
			f.LatErrors, f.LatSamples, f.LatDelayed = lat.errors, lat.samples, lat.late
		})
	}
	if err != nil {
		return f, err
	}
	if cfg.runs("sat") {
		err = phase(func(s system) {
			saturate(s, ids, cfg.satWorkers, cfg.satDur/10)
			sat := saturate(s, ids, cfg.satWorkers, cfg.satDur)
			f.PerSec, f.SatErrors, f.PerCPUSec = sat.perSec, sat.errors, sat.perCPUSec
			logf("  %s: saturation: %.0f decisions/s, %.0f per CPU-second of this process", ds.name, sat.perSec, sat.perCPUSec)
		})
	}
	if err != nil {
		return f, err
	}
	if cfg.runs("hot") {
		err = phase(func(s system) {
			hot := hammer(s, fmt.Sprintf("hot-%s-%d", label, time.Now().UnixNano()), cfg.hotWorkers, cfg.hotDur)
			f.HotAdmitted, f.HotCalls, f.HotErrors = hot.admitted, hot.calls, hot.errors
			f.HotElapsed, f.HotReference = hot.elapsed, hot.reference
		})
	}
	return f, err
}

// quantile of sorted xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// median of xs; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pairFigures is the paired latency phase's outcome: two systems offered
// the same fixed load at the same time, call by call in turn (see
// fixedLoadSamples), their latencies pooled per system over all turns.
type pairFigures struct {
	A         string    `json:"a"`
	B         string    `json:"b"`
	Offered   float64   `json:"offered_per_s"` // to each system
	Turns     int       `json:"turns"`
	TurnSecs  float64   `json:"turn_seconds"`
	P50A      float64   `json:"p50_us_a"`
	P99A      float64   `json:"p99_us_a"`
	P999A     float64   `json:"p999_us_a"`
	P50B      float64   `json:"p50_us_b"`
	P99B      float64   `json:"p99_us_b"`
	P999B     float64   `json:"p999_us_b"`
	SamplesA  int       `json:"samples_a"`
	SamplesB  int       `json:"samples_b"`
	ErrorsA   int64     `json:"errors_a"`
	ErrorsB   int64     `json:"errors_b"`
	P99Wins   int       `json:"turns_a_p99_lower"` // turns in which A's p99 was below B's
	TurnP99sA []float64 `json:"turn_p99_us_a"`
	TurnP99sB []float64 `json:"turn_p99_us_b"`
}

// measurePair runs a and b side by side (both started, both warmed up) and
// offers both the fixed load at once, call by call in turn, for
// cfg.pairTurns turns of cfg.pairTurn (each turn's p99s are kept too). On
// this shared machine the CPU left to the process moves within a fraction
// of a second, so two systems measured one after the other, even in turns
// of half a second, compare two loads as much as two systems; calls
// interleaved one by one see the same load.
func measurePair(a, b distSystem, cfg distConfig, logf func(string, ...any)) (pairFigures, error) {
	f := pairFigures{A: a.name, B: b.name, Offered: cfg.offered, Turns: cfg.pairTurns, TurnSecs: cfg.pairTurn.Seconds()}
	if cfg.pairTurns <= 0 || cfg.pairTurn <= 0 {
		return f, fmt.Errorf("paired latency: %d turns of %v: nothing to measure", cfg.pairTurns, cfg.pairTurn)
	}
	ia, err := a.start()
	if err != nil {
		return f, fmt.Errorf("%s: %w", a.name, err)
	}
	defer ia.stop()
	ib, err := b.start()
	if err != nil {
		return f, fmt.Errorf("%s: %w", b.name, err)
	}
	defer ib.stop()
	ids := idSpace(cfg.identities)
	both := []system{ia.sys, ib.sys}
	fixedLoadSamples(both, ids, cfg.offered, cfg.pairTurn, cfg.callers) // warm-up
	var la, lb []float64
	for range cfg.pairTurns {
		rs, lats := fixedLoadSamples(both, ids, cfg.offered, cfg.pairTurn, cfg.callers)
		la, lb = append(la, lats[0]...), append(lb, lats[1]...)
		f.ErrorsA += rs[0].errors
		f.ErrorsB += rs[1].errors
		pa, pb := quantile(lats[0], 0.99), quantile(lats[1], 0.99)
		f.TurnP99sA, f.TurnP99sB = append(f.TurnP99sA, pa), append(f.TurnP99sB, pb)
		if pa < pb {
			f.P99Wins++
		}
	}
	slices.Sort(la)
	slices.Sort(lb)
	f.P50A, f.P99A, f.P999A, f.SamplesA = quantile(la, 0.50), quantile(la, 0.99), quantile(la, 0.999), len(la)
	f.P50B, f.P99B, f.P999B, f.SamplesB = quantile(lb, 0.50), quantile(lb, 0.99), quantile(lb, 0.999), len(lb)
	logf("  paired latency: %s p50 %.0f µs, p99 %.0f µs; %s p50 %.0f µs, p99 %.0f µs; %s's p99 lower in %d of %d turns",
		a.name, f.P50A, f.P99A, b.name, f.P50B, f.P99B, a.name, f.P99Wins, f.Turns)
	return f, nil
}
