package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole command in miniature: every local system at
// small key counts with a tiny benchtime, and every distributed system
// (real 3-node weir and gubernator clusters on loopback, redis-server when
// it is installed) for a fraction of a second per phase. It checks that
// each system was measured, made its decisions without errors, and that the
// report and its JSON carry every figure. It asserts no timing: figures are
// for the command, ratios in one run.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three clusters and a redis-server")
	}
	_, redisErr := exec.LookPath("redis-server")
	requireRedis := os.Getenv("CI") == "true"
	if redisErr != nil && !requireRedis {
		t.Log("redis-server is not installed: the Redis system is skipped (CI=true makes that a failure)")
	}
	cfg := runConfig{Mode: "smoke", Benchtime: 2 * time.Millisecond, Rounds: 1, Small: 1 << 8, Large: 1 << 12,
		sections: "local,dist,user", requireRedis: requireRedis, user: smokeUserConfig(),
		dist: distConfig{satDur: 200 * time.Millisecond, latDur: 200 * time.Millisecond, hotDur: 200 * time.Millisecond,
			satWorkers: 8, hotWorkers: 8, offered: 500, callers: 16, identities: 1 << 12,
			pairTurns: 2, pairTurn: 200 * time.Millisecond}}
	rep, err := run(cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}

	if got, want := len(rep.Local), len(localSystems()); got != want {
		t.Fatalf("local: %d systems measured, want %d", got, want)
	}
	for _, f := range rep.Local {
		if f.Serial1k <= 0 || f.Parallel1k <= 0 || f.Serial1M <= 0 || f.Parallel1M <= 0 {
			t.Errorf("local %s: a figure is missing: %+v", f.Name, f)
		}
		if f.HasBytesPerKey && f.BytesPerKey <= 0 {
			t.Errorf("local %s: heap per key %.1f, want > 0", f.Name, f.BytesPerKey)
		}
	}
	if w := rep.local("weir GCRAStore"); w == nil || w.AllocsPerOp != 0 || w.BytesPerKey <= 0 {
		t.Errorf("weir store: %+v, want 0 allocations and a heap figure", w)
	}

	wantDist := []string{"weir shared", "weir exact", "weir shared + sketch", "x/time/rate keyed (1 process)",
		"gubernator batching", "gubernator no-batching", "gubernator GLOBAL", "redis Lua token bucket"}
	if len(rep.Dist) != len(wantDist) {
		t.Fatalf("distributed: %d systems, want %d", len(rep.Dist), len(wantDist))
	}
	for i, f := range rep.Dist {
		if f.Name != wantDist[i] {
			t.Errorf("distributed system %d is %q, want %q", i, f.Name, wantDist[i])
		}
		if f.Skipped != "" {
			if f.Name != "redis Lua token bucket" || redisErr == nil || requireRedis {
				t.Errorf("%s skipped: %s", f.Name, f.Skipped)
			}
			continue
		}
		if f.PerSec <= 0 || f.LatSamples == 0 || f.HotCalls == 0 || f.HotAdmitted == 0 {
			t.Errorf("%s: a phase made no decisions: %+v", f.Name, f)
		}
		if errs := f.SatErrors + f.LatErrors + f.HotErrors; errs != 0 {
			t.Errorf("%s: %d errors", f.Name, errs)
		}
		// The reference bucket bounds what any exact limiter admits; weir
		// shared may exceed it by S at most (docs/overshoot.md, the envelope).
		if f.HotEnvelope >= 0 && float64(f.HotAdmitted) > f.HotReference+f.HotEnvelope+1 {
			t.Errorf("%s: hot identity admitted %d, above B + r·Δ + S = %.0f", f.Name, f.HotAdmitted, f.HotReference+f.HotEnvelope)
		}
		if f.HasDegraded && f.Degraded != 0 {
			t.Errorf("%s: %d fail-open decisions in a run with no fault", f.Name, f.Degraded)
		}
	}

	if redis := rep.dist("redis Lua token bucket"); redis != nil && redis.Skipped == "" {
		q := rep.Pair
		if q == nil {
			t.Fatal("weir exact and Redis were both measured, but not alternated")
		}
		if q.SamplesA == 0 || q.SamplesB == 0 || q.ErrorsA+q.ErrorsB != 0 || len(q.TurnP99sA) != 2 || len(q.TurnP99sB) != 2 || q.P99A <= 0 || q.P99B <= 0 {
			t.Errorf("paired latency: %+v", q)
		}
		if !strings.Contains(rep.Markdown(), "alternated") {
			t.Error("markdown lacks the alternated latencies")
		}
	}

	checkUserSmoke(t, rep, redisErr == nil || requireRedis)

	md := rep.Markdown()
	for _, s := range []string{"## Local decisions", "## Distributed decisions", "## The user's way", "## Targets", "| weir GCRAStore |", "| redis Lua token bucket |", "| weir shared, Check |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	for _, tg := range rep.Targets {
		switch tg.Result {
		case "met", "**missed**", "reported", "n/a":
		default:
			t.Errorf("target %q has result %q", tg.Name, tg.Result)
		}
	}
	path := filepath.Join(t.TempDir(), "results", "latest.json")
	if err := writeJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Local) != len(rep.Local) || len(back.Dist) != len(rep.Dist) || len(back.Targets) != len(rep.Targets) ||
		back.User == nil || len(back.User.Systems) != len(rep.User.Systems) {
		t.Errorf("JSON round trip lost sections: %d/%d/%d, user %v", len(back.Local), len(back.Dist), len(back.Targets), back.User != nil)
	}
}

// smokeUserConfig is the user's-way section in miniature.
func smokeUserConfig() userConfig {
	return userConfig{Rounds: 1, Workers: 8, HotWorkers: 4, Identities: []int{1 << 10, 1 << 12},
		Window: 200 * time.Millisecond, Warm: 50 * time.Millisecond,
		Offered: 500, Latency: 200 * time.Millisecond, Callers: 16, LatIdentities: 1 << 10,
		Hot: 300 * time.Millisecond, Baseline: 100 * time.Millisecond, Quiet: 100 * time.Millisecond, QuietCores: 0.05,
		DrainMax: 10 * time.Second}
}

// checkUserSmoke checks the user's-way section of a smoke run: every
// system measured in every phase without errors, its drain seen end, the
// hot identity within what each system promises (one bucket over the
// cluster for weir shared and exact, slack aside; a bucket per node for
// the unshared reference, so more than one bucket's worth), and the
// section's targets set. Degraded decisions are logged, not failed: with
// the default 200 ms call timeout a loaded machine may time an exchange
// out, and the run's report counts them.
func checkUserSmoke(t *testing.T, rep *report, withRedis bool) {
	t.Helper()
	u := rep.User
	if u == nil {
		t.Fatal("the user's-way section did not run")
	}
	want := []string{userRef, "harness alone (no limiter)", "weir shared, Check", "weir shared, Allow", "weir local, Check", "weir local, Allow",
		"weir exact, Check", "weir exact, Allow", "gubernator batching", "gubernator no-batching", "gubernator GLOBAL", redisName}
	if len(u.Systems) != len(want) {
		t.Fatalf("user's way: %d systems, want %d", len(u.Systems), len(want))
	}
	for i, f := range u.Systems {
		if f.Name != want[i] {
			t.Errorf("user's way system %d is %q, want %q", i, f.Name, want[i])
		}
		if f.Skipped != "" {
			if f.Name != redisName || withRedis {
				t.Errorf("user's way: %s skipped: %s", f.Name, f.Skipped)
			}
			continue
		}
		if len(f.Rounds) != 1 || len(f.Rounds[0].Sat) != 2 {
			t.Errorf("user's way: %s: %d rounds, want 1 with 2 windows", f.Name, len(f.Rounds))
			continue
		}
		rd := f.Rounds[0]
		for _, s := range rd.Sat {
			if s.Decisions == 0 || s.CPU <= 0 || !s.Drained {
				t.Errorf("user's way: %s at %d identities: %+v", f.Name, s.Identities, s)
			}
		}
		if n := f.errors(); n != 0 {
			t.Errorf("user's way: %s: %d errors", f.Name, n)
		}
		if f.Floor {
			if rd.Lat != nil || rd.Hot != nil {
				t.Errorf("user's way: the harness alone ran the latency or hot phase")
			}
			continue
		}
		if rd.Lat == nil || rd.Lat.Samples == 0 || rd.Hot == nil || rd.Hot.Admitted < userBurst/2 {
			t.Errorf("user's way: %s: latency %+v, hot %+v", f.Name, rd.Lat, rd.Hot)
			continue
		}
		if f.HasDegraded && f.Degraded != 0 {
			t.Logf("user's way: %s: %d degraded decisions", f.Name, f.Degraded)
		}
		switch {
		case f.Name == userRef:
			if float64(rd.Hot.Admitted) <= 1.5*rd.Hot.Ideal {
				t.Errorf("user's way: the unshared reference admitted %d of a hot identity, ideal %.0f: its nodes share a bucket", rd.Hot.Admitted, rd.Hot.Ideal)
			}
		case strings.HasPrefix(f.Name, "weir shared") || strings.HasPrefix(f.Name, "weir exact"):
			// S = 2 × ⌊0.05 · 100 ÷ 3⌋ = 2 for shared (docs/overshoot.md).
			if f.Degraded == 0 && float64(rd.Hot.Admitted) > rd.Hot.Ideal+2+1 {
				t.Errorf("user's way: %s admitted %d of a hot identity, above the ideal %.0f + S", f.Name, rd.Hot.Admitted, rd.Hot.Ideal)
			}
		}
	}
	n := 0
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "user's way") {
			n++
		}
	}
	if n == 0 {
		t.Error("no target of the user's way")
	}
}

// TestWaitQuiet checks the drain detector: quiet at once when nothing
// runs, the drain seen end when work goes on after the window, and a
// drain that never ends reported as such.
func TestWaitQuiet(t *testing.T) {
	const span = 50 * time.Millisecond
	clk := &stepClock{now: time.Unix(1_800_000_000, 0)}
	fixed := func() time.Duration { return time.Second }
	if d, ok := waitQuietOn(clk, fixed, clk.Now(), 0.05, span, time.Second); !ok || d != 0 {
		t.Errorf("no CPU used: drain %v, %v; want 0, true", d, ok)
	}
	t0 := clk.Now()
	busy := func() time.Duration { return clk.Now().Sub(t0) } // one core, for ever
	if d, ok := waitQuietOn(clk, busy, clk.Now(), 0.05, span, 200*time.Millisecond); ok || d != 200*time.Millisecond {
		t.Errorf("always busy: drain %v, %v; want the maximum, false", d, ok)
	}
	// Busy for 300 ms, then idle: the drain is the busy time, to a sample.
	const burn = 300 * time.Millisecond
	from := clk.Now()
	busyUntil := func() time.Duration { return min(clk.Now().Sub(from), burn) }
	d, ok := waitQuietOn(clk, busyUntil, from, 0.05, span, 5*time.Second)
	if !ok || d < burn-quietSample || d > burn+quietSample {
		t.Errorf("busy for %v: drain %v, %v; want %v to a sample, true", burn, d, ok, burn)
	}
	// The real clock: a goroutine spinning on this process's CPU.
	stop := make(chan struct{})
	from = time.Now()
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	time.AfterFunc(burn, func() { close(stop) })
	if d, ok := waitQuiet(processCPU, from, 0.05, span, 5*time.Second); processCPU() > 0 && (!ok || d < burn/2) {
		t.Errorf("a goroutine spinning for %v: drain %v, %v", burn, d, ok)
	}
}

// stepClock is a quietClock whose Sleep advances it exactly.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time        { return c.now }
func (c *stepClock) Sleep(d time.Duration) { c.now = c.now.Add(d) }

// TestRedisScript checks the token-bucket script against the reference on a
// real redis-server: one key hammered from every node admits its burst, and
// never more than B + r·Δ over the run (a script that lost timestamp
// precision would mint tokens on every call and break the bound).
func TestRedisScript(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed (scripts/install-redis.sh)")
		}
		t.Skip("redis-server is not installed")
	}
	rs, err := startRedis(bin, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	sys, err := newRedisSystem(rs.addr, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	hot := hammer(sys, "script-test", 6, 300*time.Millisecond)
	if hot.errors != 0 {
		t.Fatalf("%d errors", hot.errors)
	}
	if hot.admitted < ruleBurst || float64(hot.admitted) > hot.reference {
		t.Errorf("admitted %d of %d calls in %.3fs, want between the burst %d and B + r·Δ = %.0f",
			hot.admitted, hot.calls, hot.elapsed, ruleBurst, hot.reference)
	}
	if hot.calls <= hot.admitted {
		t.Errorf("all %d calls admitted: the bucket never ran dry", hot.calls)
	}
}

// TestEnsureRedisMessage: without redis-server and without root the error
// says how to install it, and is errNoRedis (so the run skips Redis).
func TestEnsureRedisMessage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := ensureRedis(t.Logf, false)
	if !errors.Is(err, errNoRedis) || !strings.Contains(err.Error(), "install-redis.sh") {
		t.Errorf("ensureRedis without redis-server: %v", err)
	}
}

// TestQuantiles checks the nearest-rank quantile and the median.
func TestQuantiles(t *testing.T) {
	xs := make([]float64, 1000)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0, 1}} {
		if got := quantile(xs, c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
	if quantile(nil, 0.5) != 0 || median(nil) != 0 {
		t.Error("empty inputs should give 0")
	}
}

// TestChildCPU reads this process's CPU time from /proc, as it reads
// redis-server's, and sets it against getrusage's.
func TestChildCPU(t *testing.T) {
	for x := 0; processCPU() < 50*time.Millisecond; x++ {
		_ = x * x
	}
	p, c := processCPU(), childCPU(os.Getpid())
	if c == 0 {
		t.Skip("no /proc on this system")
	}
	if d := p - c; d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Errorf("/proc says %v of CPU, getrusage %v", c, p)
	}
}
