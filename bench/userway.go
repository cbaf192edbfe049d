package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"golang.org/x/time/rate"

	"github.com/weir-dev/weir"
)

// The user's way: weir deployed as a user deploys it, beside the same peers
// deployed the same way, under one workload. Three nodes of each system in
// this process on 127.0.0.1; 32 goroutines, each walking the three nodes
// round robin (its i-th call on node (w+i) mod 3), each call a random
// identity out of 100 000 or out of 1 000 000; one GCRA rule of 100/s with
// a burst of 100 and every other setting at its default. weir is asked
// through Node.Check and, in a row of its own, through Node.Allow.
//
// Sustained throughput: a system may answer fast and leave work queued
// (weir's syncs to the owners, gubernator GLOBAL's hits). After the window
// the section waits until the system's processes are back to their idle
// CPU use, and counts the decisions over the window plus that drain: what
// the system keeps up with, not what it accepts for a while. weir exposes
// no count of its queued syncs (neither weir.Node nor package ops), so the
// drain is read from the CPU: the process holds nothing else.

// The rule of the section.
const (
	userLimit  = 100 // per second
	userBurst  = 100
	userRuleID = "user"
)

// userRules is a weir cluster's rule set in the section: one rule as a user
// writes it, keyed by client IP, with mode left out (shared, the default
// for gcra) when mode is "".
func userRules(mode string) string {
	y := fmt.Sprintf("rules:\n  - id: %s\n    key: [ip]\n    limit: %d\n    window: 1s\n    burst: %d\n", userRuleID, userLimit, userBurst)
	if mode != "" {
		y += "    mode: " + mode + "\n"
	}
	return y
}

// userClusters numbers the section's weir clusters, so that each has a
// memberlist label of its own and never hears a cluster closed before it.
var userClusters atomic.Int64

// userClusterConfig returns node i's cluster configuration as a user writes
// it: a name, the region, loopback addresses on free ports and a label;
// every timing (LAN memberlist profile, sync interval, decide and call
// timeouts, linger), batch size, shard count and key cap at its default.
func userClusterConfig(label string) func(i int) *weir.ClusterConfig {
	return func(i int) *weir.ClusterConfig {
		return &weir.ClusterConfig{Name: fmt.Sprintf("user-%d", i), Region: "bench", Label: label,
			GossipAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0"}
	}
}

// weirUserSystem decides through a cluster whose only rule is the
// section's, with Node.Check or (allow) Node.Allow.
type weirUserSystem struct {
	c     *weirCluster
	allow bool
}

// Allow implements system.
func (w weirUserSystem) Allow(ctx context.Context, node int, key string) (bool, error) {
	n := w.c.nodes[node]
	if w.allow {
		d := n.Allow(ctx, weir.Request{Method: http.MethodGet, Path: "/", ClientIP: key})
		d.Done()
		return d.Allowed, d.Err
	}
	r, err := n.Check(ctx, key, userRuleID, 1)
	return r.Allowed, err
}

// xratePerNode is keyed x/time/rate as each gateway node would run it on
// its own: per node a map of limiters under the node's mutex, nothing
// shared between nodes (a hot identity gets a bucket on every node).
type xratePerNode struct {
	nodes [nodes]xrateNode
}

// xrateNode is one node's map; the padding keeps the nodes' mutexes on
// cache lines of their own, as in separate processes.
type xrateNode struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
	_  [64]byte
}

func newXRatePerNode() *xratePerNode {
	x := &xratePerNode{}
	for i := range x.nodes {
		x.nodes[i].m = make(map[string]*rate.Limiter)
	}
	return x
}

// Allow implements system with the limiter's own clock read.
func (x *xratePerNode) Allow(_ context.Context, node int, key string) (bool, error) {
	now := time.Now()
	n := &x.nodes[node]
	n.mu.Lock()
	lim, ok := n.m[key]
	if !ok {
		lim = rate.NewLimiter(userLimit, userBurst)
		n.m[key] = lim
	}
	a := lim.AllowN(now, 1)
	n.mu.Unlock()
	return a, nil
}

// nullSystem admits everything without looking: the harness alone (the
// generator, the identity, the interface call), the floor under every
// figure of CPU per decision.
type nullSystem struct{}

// Allow implements system.
func (nullSystem) Allow(context.Context, int, string) (bool, error) { return true, nil }

// userRef is the section's reference, every ratio's denominator.
const userRef = "x/time/rate keyed, per node"

// userSystem is one system of the section.
type userSystem struct {
	name string
	// settings says what it runs with (docs/performance.md quotes it).
	settings string
	// floor marks the harness alone: saturation only, no ratio goal.
	floor bool
	// start brings up an instance; a round measures every phase on one.
	start func() (*instance, error)
}

// userConfig sizes the section.
type userConfig struct {
	Rounds     int   `json:"rounds"`
	Workers    int   `json:"workers"`
	HotWorkers int   `json:"hot_workers"`
	Identities []int `json:"identities"`
	// Window is a saturation window, after a warm-up of Warm.
	Window time.Duration `json:"window_ns"`
	Warm   time.Duration `json:"warm_ns"`
	// Offered per second for Latency (after a warm-up of a quarter of it),
	// from Callers open-loop callers, over LatIdentities identities.
	Offered       float64       `json:"offered_per_sec"`
	Latency       time.Duration `json:"latency_ns"`
	Callers       int           `json:"callers"`
	LatIdentities int           `json:"latency_identities"`
	Hot           time.Duration `json:"hot_ns"`
	// Baseline is how long the idle CPU use is measured on a fresh
	// instance; Quiet how long the CPU use must stay within QuietCores of
	// it for the system to count as drained; DrainMax how long a drain is
	// waited for at most.
	Baseline   time.Duration `json:"baseline_ns"`
	Quiet      time.Duration `json:"quiet_ns"`
	QuietCores float64       `json:"quiet_cores"`
	DrainMax   time.Duration `json:"drain_max_ns"`
	// satProfile, when set, is the prefix of a CPU profile of each
	// saturation window and its drain (prefix-system-identities.pprof).
	satProfile string
}

// userSat is one saturation window's outcome.
type userSat struct {
	Identities int   `json:"identities"`
	Decisions  int64 `json:"decisions"`
	Admitted   int64 `json:"admitted"`
	Errors     int64 `json:"errors"`
	// Window is the generator's run, Drain the time from its end until
	// the system was quiet again (DrainMax when it was not: Drained is
	// then false), both in seconds.
	Window  float64 `json:"window_s"`
	Drain   float64 `json:"drain_s"`
	Drained bool    `json:"drained"`
	// CPU is the system's CPU time over the window and the drain, in
	// seconds; Baseline its idle CPU use before, in cores.
	CPU      float64 `json:"cpu_s"`
	Baseline float64 `json:"baseline_cores"`
}

// sustained is decisions per second over the window and the drain.
func (s userSat) sustained() float64 { return ratio(float64(s.Decisions), s.Window+s.Drain) }

// windowed is decisions per second over the window alone.
func (s userSat) windowed() float64 { return ratio(float64(s.Decisions), s.Window) }

// cpuPerDecision is the CPU per decision in microseconds, the drain's
// included.
func (s userSat) cpuPerDecision() float64 { return ratio(s.CPU*1e6, float64(s.Decisions)) }

// userLat is the fixed-load phase's outcome; latencies in microseconds.
type userLat struct {
	Achieved float64 `json:"achieved_per_sec"`
	P50      float64 `json:"p50_us"`
	P99      float64 `json:"p99_us"`
	P999     float64 `json:"p999_us"`
	Samples  int     `json:"samples"`
	Errors   int64   `json:"errors"`
	Late     int64   `json:"dispatch_late"`
}

// userHot is the hot-identity phase's outcome.
type userHot struct {
	Admitted int64   `json:"admitted"`
	Calls    int64   `json:"calls"`
	Errors   int64   `json:"errors"`
	Elapsed  float64 `json:"elapsed_s"`
	// Ideal is B + r·Δ: what one exact bucket fed every call admits.
	Ideal float64 `json:"ideal"`
}

// userRound is one system's figures in one round.
type userRound struct {
	Sat []userSat `json:"saturation"`
	Lat *userLat  `json:"latency,omitempty"`
	Hot *userHot  `json:"hot,omitempty"`
}

// userFigures is one system's results over the rounds.
type userFigures struct {
	Name     string      `json:"name"`
	Settings string      `json:"settings"`
	Floor    bool        `json:"floor,omitempty"`
	Skipped  string      `json:"skipped,omitempty"`
	Rounds   []userRound `json:"rounds"`
	// Degraded sums the fail-open decisions of every phase and round
	// (weir only: HasDegraded).
	Degraded    uint64 `json:"degraded"`
	HasDegraded bool   `json:"has_degraded"`
}

// userReport is the section's results.
type userReport struct {
	Config  userConfig    `json:"config"`
	Systems []userFigures `json:"systems"`
}

func fullUserConfig() userConfig {
	return userConfig{Rounds: 3, Workers: 32, HotWorkers: 16, Identities: []int{100_000, 1_000_000},
		Window: 3 * time.Second, Warm: 500 * time.Millisecond,
		Offered: offeredLoad, Latency: 3 * time.Second, Callers: 256, LatIdentities: 100_000,
		Hot: 3 * time.Second, Baseline: 300 * time.Millisecond, Quiet: 200 * time.Millisecond, QuietCores: 0.05,
		DrainMax: time.Minute}
}

func quickUserConfig() userConfig {
	return userConfig{Rounds: 1, Workers: 32, HotWorkers: 16, Identities: []int{100_000, 1_000_000},
		Window: time.Second, Warm: 200 * time.Millisecond,
		Offered: offeredLoad, Latency: time.Second, Callers: 256, LatIdentities: 100_000,
		Hot: 1500 * time.Millisecond, Baseline: 200 * time.Millisecond, Quiet: 200 * time.Millisecond, QuietCores: 0.05,
		DrainMax: 20 * time.Second}
}

// userGubernatorCache is each gubernator daemon's CacheSize in the
// section: the identity space fits (its default, 50 000, would evict live
// limits at 1 000 000 identities and forget what they spent).
const userGubernatorCache = 1 << 20

// userSystems lists the section's systems, the reference first. rs is the
// Redis server (nil: Redis is listed with no start, and skipped).
func userSystems(rs *redisServer) []userSystem {
	weirMode := func(mode string, allow bool) func() (*instance, error) {
		return func() (*instance, error) {
			label := fmt.Sprintf("weir-bench-user-%d", userClusters.Add(1))
			wc, err := startCluster(userRules(mode), userClusterConfig(label), 30*time.Second)
			if err != nil {
				return nil, err
			}
			return &instance{sys: weirUserSystem{wc, allow}, degraded: wc.degraded, stop: wc.Close}, nil
		}
	}
	gub := func(b gubernator.Behavior) func() (*instance, error) {
		return func() (*instance, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			gc, err := startGubernator(ctx, userGubernatorCache)
			if err != nil {
				return nil, err
			}
			return &instance{sys: gubernatorSystem{gc, b, userLimit, userBurst}, stop: gc.Close}, nil
		}
	}
	const weirSettings = "3 weir.New nodes, Config.Cluster with only Name, Region, Label and 127.0.0.1:0 gossip and RPC addresses (LAN memberlist profile; sync interval, decide timeout, call timeout 200 ms, linger 200 µs, batch 1 024, shards, key cap: defaults); the rule `key: [ip], limit: 100, window: 1s, burst: 100`"
	const gubSettings = "3 daemons in process (SpawnDaemon), static peers, GRPC and HTTP on 127.0.0.1:0; CacheSize 1 048 576 per daemon (the identity space fits), Workers default (NumCPU), Behaviors at their defaults (BatchWait 500 µs, BatchLimit 1 000, BatchTimeout 500 ms, GlobalSyncWait 100 ms, GlobalBatchLimit 1 000, GlobalTimeout 500 ms, GlobalPeerRequestsConcurrency 100); each call one GetRateLimits of the node's V1Instance (embedded, no client hop), LEAKY_BUCKET limit 100 per 1 000 ms, burst 100"
	systems := []userSystem{
		{name: userRef, settings: "per node a map[string]*rate.Limiter under the node's mutex, rate.NewLimiter(100, 100), AllowN(time.Now(), 1); nothing shared between nodes",
			start: func() (*instance, error) { return &instance{sys: newXRatePerNode(), stop: func() {}}, nil }},
		{name: "harness alone (no limiter)", floor: true, settings: "Allow returns true: the generator's own cost",
			start: func() (*instance, error) { return &instance{sys: nullSystem{}, stop: func() {}}, nil }},
		{name: "weir shared, Check", settings: weirSettings + ", mode left out (shared); Node.Check(ctx, id, rule, 1)", start: weirMode("", false)},
		{name: "weir shared, Allow", settings: weirSettings + ", mode left out (shared); Node.Allow(ctx, Request{GET /, ClientIP: id}) and Decision.Done", start: weirMode("", true)},
		{name: "weir local, Check", settings: weirSettings + ", mode: local; Node.Check", start: weirMode("local", false)},
		{name: "weir local, Allow", settings: weirSettings + ", mode: local; Node.Allow", start: weirMode("local", true)},
		{name: "weir exact, Check", settings: weirSettings + ", mode: exact; Node.Check", start: weirMode("exact", false)},
		{name: "weir exact, Allow", settings: weirSettings + ", mode: exact; Node.Allow", start: weirMode("exact", true)},
		{name: "gubernator batching", settings: gubSettings + "; Behavior BATCHING (gubernator's default)", start: gub(gubernator.Behavior_BATCHING)},
		{name: "gubernator no-batching", settings: gubSettings + "; Behavior NO_BATCHING", start: gub(gubernator.Behavior_NO_BATCHING)},
		{name: "gubernator GLOBAL", settings: gubSettings + "; Behavior GLOBAL", start: gub(gubernator.Behavior_GLOBAL)},
	}
	redisSettings := "1 redis-server (no persistence, 127.0.0.1, free port); per node a go-redis client with its defaults (pool 10 × GOMAXPROCS connections), one EVALSHA of a token-bucket Lua script per decision (the server's TIME, state in a hash with a TTL), no pipelining; its CPU counts the server's"
	if rs == nil {
		return append(systems, userSystem{name: redisName, settings: redisSettings, start: nil})
	}
	return append(systems, userSystem{name: redisName, settings: redisSettings,
		start: func() (*instance, error) {
			sys, err := newRedisBucket(rs.addr, 0, userLimit, userBurst)
			if err != nil {
				return nil, err
			}
			if err := sys.clients[0].FlushAll(context.Background()).Err(); err != nil {
				sys.Close()
				return nil, err
			}
			return &instance{sys: sys, stop: sys.Close, cpu: func() time.Duration { return processCPU() + rs.CPU() }}, nil
		}})
}

// runUser measures the section: cfg.Rounds rounds, each measuring every
// system in turn (the order rotated by one system per round), each system
// on a fresh instance per round.
func runUser(cfg runConfig, logf func(string, ...any)) (*userReport, error) {
	uc := cfg.user
	rep := &userReport{Config: uc}
	if uc.Rounds <= 0 || uc.Workers <= 0 || len(uc.Identities) == 0 {
		return nil, fmt.Errorf("user's way: %d rounds, %d workers, %d identity spaces: nothing to measure", uc.Rounds, uc.Workers, len(uc.Identities))
	}
	var rs *redisServer
	skip := ""
	if selected(cfg.only, redisName) {
		bin, err := ensureRedis(logf, os.Geteuid() == 0)
		switch {
		case err == nil:
			if rs, err = startRedis(bin, 10*time.Second); err != nil {
				return nil, err
			}
			defer rs.Stop()
		case cfg.requireRedis || !errors.Is(err, errNoRedis):
			return nil, err
		default:
			logf("user's way: skipping Redis: %v", err)
			skip = err.Error()
		}
	}
	var systems []userSystem
	for _, s := range userSystems(rs) {
		if s.name == userRef || selected(cfg.only, s.name) {
			systems = append(systems, s)
		}
	}
	rep.Systems = make([]userFigures, len(systems))
	for i, s := range systems {
		rep.Systems[i] = userFigures{Name: s.name, Settings: s.settings, Floor: s.floor}
		if s.start == nil {
			rep.Systems[i].Skipped = "skipped: " + skip
		}
	}
	for r := range uc.Rounds {
		for k := range systems {
			i := (k + r) % len(systems)
			s, f := systems[i], &rep.Systems[i]
			if s.start == nil {
				continue
			}
			logf("user's way, round %d/%d: %s", r+1, uc.Rounds, s.name)
			rd, deg, err := measureUser(s, uc, r, logf)
			if err != nil {
				return nil, fmt.Errorf("user's way: %s: %w", s.name, err)
			}
			f.Rounds = append(f.Rounds, rd)
			if deg != nil {
				f.Degraded += *deg
				f.HasDegraded = true
			}
		}
	}
	return rep, nil
}

// measureUser measures one round of one system on a fresh instance: its
// idle CPU use, a saturation window per identity space (after a warm-up;
// the system quiet before each window and waited for after it), the fixed
// load, and the hot identity. It returns the round's figures and, for a
// system that counts them, its degraded decisions.
func measureUser(s userSystem, cfg userConfig, round int, logf func(string, ...any)) (userRound, *uint64, error) {
	var rd userRound
	t := time.Now()
	in, err := s.start()
	if err != nil {
		return rd, nil, err
	}
	defer in.stop()
	logf("  started in %v", time.Since(t).Round(time.Millisecond))
	base := idleCores(in.cpuTime, cfg.Baseline)
	quiet := func() (time.Duration, bool) {
		return waitQuiet(in.cpuTime, time.Now(), base+cfg.QuietCores, cfg.Quiet, cfg.DrainMax)
	}
	for _, n := range cfg.Identities {
		ids := idSpace(n)
		draw := func(r *rand.Rand) string { return ids.draw(r) }
		walk(in.sys, cfg.Workers, cfg.Warm, draw)
		if _, ok := quiet(); !ok {
			logf("  warm-up at %d identities not drained within %v", n, cfg.DrainMax)
		}
		stopProfile, err := startSatProfile(cfg.satProfile, s.name, n)
		if err != nil {
			return rd, nil, err
		}
		c0 := in.cpuTime()
		w := walk(in.sys, cfg.Workers, cfg.Window, draw)
		drain, ok := quiet()
		stopProfile()
		sat := userSat{Identities: n, Decisions: w.calls, Admitted: w.admitted, Errors: w.errors,
			Window: w.elapsed, Drain: drain.Seconds(), Drained: ok, CPU: (in.cpuTime() - c0).Seconds(), Baseline: base}
		rd.Sat = append(rd.Sat, sat)
		logf("  %d identities: %.0f decisions/s in the window, drained in %.2f s (%v): %.0f/s sustained, %.2f µs CPU per decision",
			n, sat.windowed(), sat.Drain, ok, sat.sustained(), sat.cpuPerDecision())
	}
	if !s.floor {
		ids := idSpace(cfg.LatIdentities)
		fixedLoad(in.sys, ids, cfg.Offered, cfg.Latency/4, cfg.Callers) // warm-up
		quiet()
		l := fixedLoad(in.sys, ids, cfg.Offered, cfg.Latency, cfg.Callers)
		rd.Lat = &userLat{Achieved: l.achieved, P50: l.p50, P99: l.p99, P999: l.p999, Samples: l.samples, Errors: l.errors, Late: l.late}
		quiet()
		key := fmt.Sprintf("hot-%s-%d-%d", strings.ReplaceAll(s.name, " ", "-"), round, time.Now().UnixNano())
		h := walk(in.sys, cfg.HotWorkers, cfg.Hot, func(*rand.Rand) string { return key })
		rd.Hot = &userHot{Admitted: h.admitted, Calls: h.calls, Errors: h.errors, Elapsed: h.elapsed,
			Ideal: userBurst + userLimit*h.elapsed}
		logf("  p99 at %.0f/s: %.0f µs; hot identity: %d admitted, ideal %.0f", cfg.Offered, l.p99, h.admitted, rd.Hot.Ideal)
	}
	if in.degraded == nil {
		return rd, nil, nil
	}
	d := in.degraded()
	return rd, &d, nil
}

// startSatProfile starts a CPU profile of one saturation window of system
// name at n identities, written to prefix-name-n.pprof (no profile when
// prefix is empty); the function it returns stops it.
func startSatProfile(prefix, name string, n int) (func(), error) {
	if prefix == "" {
		return func() {}, nil
	}
	slug := strings.NewReplacer(" ", "-", ",", "", "/", "-").Replace(name)
	f, err := os.Create(fmt.Sprintf("%s-%s-%d.pprof", prefix, slug, n))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("saturation profile (not with -cpuprofile): %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// walkResult is a closed-loop run's outcome.
type walkResult struct {
	calls, admitted, errors int64
	elapsed                 float64
}

// walk runs workers closed-loop callers for d: caller w's i-th call asks
// node (w+i) mod nodes about the identity key returns (each caller has a
// random source of its own). elapsed runs from the start to the last
// call's end.
func walk(s system, workers int, d time.Duration, key func(*rand.Rand) string) walkResult {
	var stop atomic.Bool
	var calls, admitted, errs atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			node := w % nodes
			var c, a, e int64
			for !stop.Load() {
				ok, err := s.Allow(ctx, node, key(r))
				switch {
				case err != nil:
					e++
				case ok:
					a++
				}
				c++
				if node++; node == nodes {
					node = 0
				}
			}
			calls.Add(c)
			admitted.Add(a)
			errs.Add(e)
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return walkResult{calls: calls.Load(), admitted: admitted.Load(), errors: errs.Load(), elapsed: time.Since(start).Seconds()}
}

// idleCores measures the CPU use of cpu's processes over d, in cores.
func idleCores(cpu func() time.Duration, d time.Duration) float64 {
	t0, c0 := time.Now(), cpu()
	time.Sleep(d)
	return (cpu() - c0).Seconds() / time.Since(t0).Seconds()
}

// quietSample is how often waitQuiet reads the CPU time.
const quietSample = 10 * time.Millisecond

// waitQuiet waits until the CPU use of cpu's processes stays at or under
// cores over a span of at least span, and returns the time from from to
// the start of the first such span (the drain) and true; or, when none
// starts before from + max, max and false. A system that left no work
// behind is quiet at once: its drain is 0.
func waitQuiet(cpu func() time.Duration, from time.Time, cores float64, span, max time.Duration) (time.Duration, bool) {
	return waitQuietOn(wallClock{}, cpu, from, cores, span, max)
}

// quietClock is the clock waitQuietOn samples by: the wall clock, or a
// test's.
type quietClock interface {
	Now() time.Time
	Sleep(time.Duration)
}

type wallClock struct{}

func (wallClock) Now() time.Time        { return time.Now() }
func (wallClock) Sleep(d time.Duration) { time.Sleep(d) }

// waitQuietOn is waitQuiet on clk.
func waitQuietOn(clk quietClock, cpu func() time.Duration, from time.Time, cores float64, span, max time.Duration) (time.Duration, bool) {
	type sample struct {
		at  time.Time
		cpu time.Duration
	}
	ss := []sample{{from, cpu()}}
	i := 0 // the latest sample at least span before the newest
	for {
		clk.Sleep(quietSample)
		now := sample{clk.Now(), cpu()}
		ss = append(ss, now)
		for i+1 < len(ss) && now.at.Sub(ss[i+1].at) >= span {
			i++
		}
		if el := now.at.Sub(ss[i].at); el >= span && (now.cpu-ss[i].cpu).Seconds() <= cores*el.Seconds() {
			return ss[i].at.Sub(from), true
		}
		if now.at.Sub(from) >= max+span {
			return max, false
		}
	}
}

// ---- figures

// sat returns round r's saturation figure at identity space k, and whether
// there is one.
func (f *userFigures) sat(r, k int) (userSat, bool) {
	if r >= len(f.Rounds) || k >= len(f.Rounds[r].Sat) {
		return userSat{}, false
	}
	return f.Rounds[r].Sat[k], true
}

// medianOf is the median over the rounds of v(round), skipping rounds where
// ok is false; NaN when there is none.
func (f *userFigures) medianOf(v func(r int) (float64, bool)) float64 {
	var xs []float64
	for r := range f.Rounds {
		if x, ok := v(r); ok && !math.IsNaN(x) {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return median(xs)
}

// satMedian is the median over the rounds of a saturation figure at
// identity space k.
func (f *userFigures) satMedian(k int, v func(userSat) float64) float64 {
	return f.medianOf(func(r int) (float64, bool) {
		s, ok := f.sat(r, k)
		return v(s), ok
	})
}

// satRatio is the median over the rounds of the round's ratio of a
// saturation figure at identity space k to g's in the same round.
func (f *userFigures) satRatio(g *userFigures, k int, v func(userSat) float64) float64 {
	return f.medianOf(func(r int) (float64, bool) {
		a, ok1 := f.sat(r, k)
		b, ok2 := g.sat(r, k)
		return ratio(v(a), v(b)), ok1 && ok2
	})
}

// latMedian is the median over the rounds of a fixed-load figure.
func (f *userFigures) latMedian(v func(*userLat) float64) float64 {
	return f.medianOf(func(r int) (float64, bool) {
		l := f.Rounds[r].Lat
		if l == nil {
			return 0, false
		}
		return v(l), true
	})
}

// latRatio is the median over the rounds of the round's ratio of a
// fixed-load figure to g's.
func (f *userFigures) latRatio(g *userFigures, v func(*userLat) float64) float64 {
	return f.medianOf(func(r int) (float64, bool) {
		if r >= len(g.Rounds) || f.Rounds[r].Lat == nil || g.Rounds[r].Lat == nil {
			return 0, false
		}
		return ratio(v(f.Rounds[r].Lat), v(g.Rounds[r].Lat)), true
	})
}

// hotRatio is the median over the rounds of the hot identity's admitted ÷
// ideal.
func (f *userFigures) hotRatio() float64 {
	return f.medianOf(func(r int) (float64, bool) {
		h := f.Rounds[r].Hot
		if h == nil {
			return 0, false
		}
		return ratio(float64(h.Admitted), h.Ideal), true
	})
}

// hotWorst is the largest admitted ÷ ideal over the rounds.
func (f *userFigures) hotWorst() float64 {
	w := math.NaN()
	for _, rd := range f.Rounds {
		if rd.Hot != nil {
			if v := ratio(float64(rd.Hot.Admitted), rd.Hot.Ideal); math.IsNaN(w) || v > w {
				w = v
			}
		}
	}
	return w
}

// errors sums every phase's errors over the rounds.
func (f *userFigures) errors() int64 {
	var n int64
	for _, rd := range f.Rounds {
		for _, s := range rd.Sat {
			n += s.Errors
		}
		if rd.Lat != nil {
			n += rd.Lat.Errors
		}
		if rd.Hot != nil {
			n += rd.Hot.Errors
		}
	}
	return n
}

// undrained counts the windows whose drain was not seen end.
func (f *userFigures) undrained() int {
	n := 0
	for _, rd := range f.Rounds {
		for _, s := range rd.Sat {
			if !s.Drained {
				n++
			}
		}
	}
	return n
}

func (u *userReport) system(name string) *userFigures {
	for i := range u.Systems {
		if u.Systems[i].Name == name && u.Systems[i].Skipped == "" && len(u.Systems[i].Rounds) > 0 {
			return &u.Systems[i]
		}
	}
	return nil
}

// markdown renders the section.
func (u *userReport) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	c := u.Config
	ref := u.system(userRef)
	if ref == nil {
		return
	}
	var spaces []string
	for _, n := range c.Identities {
		spaces = append(spaces, fmtNum(float64(n), 0))
	}
	p("## The user's way\n\n")
	p("3 nodes of each system in this process on 127.0.0.1, deployed with their defaults; %d goroutines, each walking the 3 nodes round robin, each call a random identity out of %s; one rule of %d/s, burst %d (GCRA; gubernator LEAKY_BUCKET; Redis a token bucket). Medians of %d round(s), each system measured in turn (the order rotated by one per round) on a fresh instance per round; ratios are the median of each round's ratio to %s in the same round. Saturation windows of %.1f s (after %.1f s of warm-up), sustained = decisions ÷ (window + drain), the drain being the time until the system's CPU use is back within %.2f cores of its idle use for %v (weir exposes no count of its queued syncs); CPU per decision over the window and the drain, the harness's own cost included (its row). p99 at %s decisions/s offered open loop for %.1f s over %s identities. Hot identity: %d goroutines on one identity over the 3 nodes for %.1f s; ideal = burst + rate × duration.\n\n",
		c.Workers, strings.Join(spaces, " and "), userLimit, userBurst, c.Rounds, userRef, c.Window.Seconds(), c.Warm.Seconds(), c.QuietCores, c.Quiet,
		fmtNum(c.Offered, 0), c.Latency.Seconds(), fmtNum(float64(c.LatIdentities), 0), c.HotWorkers, c.Hot.Seconds())
	p("| system |")
	for _, s := range spaces {
		p(" sustained decisions/s, %s ids (÷ ref) |", s)
	}
	for _, s := range spaces {
		p(" CPU µs/decision, %s ids (÷ ref) |", s)
	}
	p(" p99 µs at %s/s (÷ ref) | hot admitted ÷ ideal | degraded | errors |\n|---|", fmtNum(c.Offered, 0))
	for range 2 * len(spaces) {
		p("---:|")
	}
	p("---:|---:|---:|---:|\n")
	for i := range u.Systems {
		f := &u.Systems[i]
		if f.Skipped != "" {
			p("| %s | %s |\n", f.Name, f.Skipped)
			continue
		}
		p("| %s |", f.Name)
		for k := range spaces {
			flag := ""
			if n := f.undrainedAt(k); n > 0 {
				flag = fmt.Sprintf(" ⚠ %d window(s) not drained in %v", n, c.DrainMax)
			}
			p(" %s (%s)%s |", fmtNum(f.satMedian(k, userSat.sustained), 0), fmtX(f.satRatio(ref, k, userSat.sustained)), flag)
		}
		for k := range spaces {
			p(" %.2f (%s) |", f.satMedian(k, userSat.cpuPerDecision), fmtX(f.satRatio(ref, k, userSat.cpuPerDecision)))
		}
		if f.Floor {
			p(" – | – | – | %d |\n", f.errors())
			continue
		}
		deg := "not counted"
		if f.HasDegraded {
			deg = fmt.Sprintf("%d", f.Degraded)
		}
		p(" %.0f (%s) | %.3f | %s | %d |\n", f.latMedian(func(l *userLat) float64 { return l.P99 }),
			fmtX(f.latRatio(ref, func(l *userLat) float64 { return l.P99 })), f.hotRatio(), deg, f.errors())
	}
	p("\nIn the window and after it (medians):\n\n| system |")
	for _, s := range spaces {
		p(" %s ids: decisions/s in the window | drain s |", s)
	}
	p(" p50 µs | p99.9 µs |\n|---|")
	for range 2 * len(spaces) {
		p("---:|")
	}
	p("---:|---:|\n")
	for i := range u.Systems {
		f := &u.Systems[i]
		if f.Skipped != "" || len(f.Rounds) == 0 {
			continue
		}
		p("| %s |", f.Name)
		for k := range spaces {
			p(" %s | %.2f |", fmtNum(f.satMedian(k, userSat.windowed), 0), f.satMedian(k, func(s userSat) float64 { return s.Drain }))
		}
		if f.Floor {
			p(" – | – |\n")
			continue
		}
		p(" %.0f | %.0f |\n", f.latMedian(func(l *userLat) float64 { return l.P50 }), f.latMedian(func(l *userLat) float64 { return l.P999 }))
	}
	p("\n")
	for _, f := range u.Systems {
		p("- %s: %s\n", f.Name, f.Settings)
	}
	p("\n")
}

// undrainedAt counts the windows at identity space k whose drain was not
// seen end.
func (f *userFigures) undrainedAt(k int) int {
	n := 0
	for r := range f.Rounds {
		if s, ok := f.sat(r, k); ok && !s.Drained {
			n++
		}
	}
	return n
}

// userTargets sets the targets of the user's-way section against its
// figures: weir shared with default settings at least as many sustained
// decisions as unshared keyed x/time/rate and at least 100 × Redis and
// every gubernator mode, at each identity space; the hot identity within
// 1 % of the ideal; no degraded decision.
func userTargets(u *userReport, add func(name, measured, goal, result string)) {
	ref := u.system(userRef)
	if ref == nil {
		return
	}
	for _, name := range []string{"weir shared, Check", "weir shared, Allow"} {
		sh := u.system(name)
		if sh == nil {
			continue
		}
		for k, n := range u.Config.Identities {
			ids := fmtNum(float64(n), 0)
			v := sh.satRatio(ref, k, userSat.sustained)
			add(fmt.Sprintf("user's way, %s ids: %s sustained decisions/s ÷ %s", ids, name, userRef), fmt.Sprintf("%.2f", v), "≥ 1", verdict(v >= 1))
			for _, o := range []string{redisName, "gubernator batching", "gubernator no-batching", "gubernator GLOBAL"} {
				of := u.system(o)
				if of == nil {
					add(fmt.Sprintf("user's way, %s ids: %s sustained decisions/s ÷ %s", ids, name, o), "not measured", "≥ 100", "n/a")
					continue
				}
				v := sh.satRatio(of, k, userSat.sustained)
				add(fmt.Sprintf("user's way, %s ids: %s sustained decisions/s ÷ %s", ids, name, o), fmt.Sprintf("%.1f", v), "≥ 100", verdict(v >= 100))
			}
		}
		w := sh.hotWorst()
		add(fmt.Sprintf("user's way: %s hot identity admitted ÷ ideal (worst round)", name), fmt.Sprintf("%.3f", w), "≤ 1.01", verdict(w <= 1.01))
	}
	for _, f := range u.Systems {
		if f.HasDegraded {
			add(fmt.Sprintf("user's way: %s degraded decisions", f.Name), fmt.Sprintf("%d", f.Degraded), "0", verdict(f.Degraded == 0))
		}
	}
}
