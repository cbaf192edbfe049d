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
		sections: "local,dist", requireRedis: requireRedis,
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

	md := rep.Markdown()
	for _, s := range []string{"## Local decisions", "## Distributed decisions", "## Targets", "| weir GCRAStore |", "| redis Lua token bucket |"} {
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
	if len(back.Local) != len(rep.Local) || len(back.Dist) != len(rep.Dist) || len(back.Targets) != len(rep.Targets) {
		t.Errorf("JSON round trip lost sections: %d/%d/%d", len(back.Local), len(back.Dist), len(back.Targets))
	}
}

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
