package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gubernator-io/gubernator/v2"
)

// run measures the sections cfg names and returns the report.
func run(cfg runConfig, logf func(string, ...any)) (*report, error) {
	cfg.fill()
	rep := &report{Date: time.Now().UTC().Format(time.RFC3339), Config: cfg, Machine: describeMachine()}
	if strings.Contains(cfg.sections, "local") {
		if f := flag.Lookup("test.benchtime"); f != nil {
			if err := f.Value.Set(cfg.Benchtime.String()); err != nil {
				return nil, err
			}
		}
		rep.Load = append(rep.Load, loadNote("local: start"))
		rep.Local = measureLocal(cfg.Rounds, cfg.Small, cfg.Large, logf)
		rep.Load = append(rep.Load, loadNote("local: end"))
	}
	if strings.Contains(cfg.sections, "dist") {
		rep.Load = append(rep.Load, loadNote("distributed: start"))
		d, pair, err := runDist(cfg, logf)
		if err != nil {
			return nil, err
		}
		rep.Dist, rep.Pair = d, pair
		if n := gubernatorAbandoned.Load(); n > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("gubernator: %d of its 3-daemon clusters did not finish Daemon.Close within %v (after GLOBAL traffic its broadcast loop's Interval.Stop waits forever); they were left running idle until the process ended.", n, closeWait))
		}
		rep.Load = append(rep.Load, loadNote("distributed: end"))
	}
	if strings.Contains(cfg.sections, "user") {
		rep.Load = append(rep.Load, loadNote("user's way: start"))
		u, err := runUser(cfg, logf)
		if err != nil {
			return nil, err
		}
		rep.User = u
		rep.Load = append(rep.Load, loadNote("user's way: end"))
	}
	rep.Targets = checkTargets(rep)
	return rep, nil
}

// runDist measures each system in turn; every phase starts its own
// instance and stops it. Then, when both are selected and the pair phase
// runs, weir exact and Redis take alternated turns at the fixed load
// (measurePair).
func runDist(cfg runConfig, logf func(string, ...any)) ([]distFigures, *pairFigures, error) {
	var out []distFigures
	systems, cleanup, err := distSystems(cfg, logf)
	defer cleanup()
	if err != nil {
		return nil, nil, err
	}
	var exact, redis *distSystem
	for i, ds := range systems {
		if !selected(cfg.only, ds.name) {
			continue
		}
		if ds.start == nil {
			out = append(out, distFigures{Name: ds.name, Note: ds.note, Skipped: ds.note})
			continue
		}
		switch ds.name {
		case "weir exact":
			exact = &systems[i]
		case redisName:
			redis = &systems[i]
		}
		if cfg.dist.onlyPair() {
			continue
		}
		logf("distributed: %s", ds.name)
		f, err := measureDist(ds, cfg.dist, strings.ReplaceAll(ds.name, " ", "-"), logf)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, f)
	}
	if exact == nil || redis == nil || !cfg.dist.runs("pair") {
		return out, nil, nil
	}
	logf("distributed: %s and %s, alternated", exact.name, redis.name)
	p, err := measurePair(*exact, *redis, cfg.dist, logf)
	if err != nil {
		return nil, nil, err
	}
	return out, &p, nil
}

// distSystems lists the distributed section's systems, weir first. The
// Redis server is started once (each phase empties it); cleanup stops it.
func distSystems(cfg runConfig, logf func(string, ...any)) ([]distSystem, func(), error) {
	weirMode := func(rule string) func() (*instance, error) {
		return func() (*instance, error) {
			wc, err := startWeirCluster(30 * time.Second)
			if err != nil {
				return nil, err
			}
			return &instance{sys: weirRuleSystem{wc, rule}, degraded: wc.degraded, stop: wc.Close}, nil
		}
	}
	gub := func(b gubernator.Behavior) func() (*instance, error) {
		return func() (*instance, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			gc, err := startGubernator(ctx, keys1M) // no eviction of live limits in a run
			if err != nil {
				return nil, err
			}
			return &instance{sys: gubernatorSystem{gc, b, ruleLimit, ruleBurst}, stop: gc.Close}, nil
		}
	}
	systems := []distSystem{
		{name: "weir shared", note: "3 nodes; admits within slack locally, syncs batched", envelope: sharedSlack(), start: weirMode("shared")},
		{name: "weir exact", note: "3 nodes; the owner decides (one batched hop from a non-owner)", envelope: 0, start: weirMode("exact")},
		{name: "weir shared + sketch", note: "3 nodes; shared, identities tracked in a count-min sketch (2²⁰ × 2, sized to the stream as docs/rules.md says) until one passes θ = 8 on a node (the configuration for many one-shot identities)", envelope: sketchedSlack(), start: weirMode("sketched")},
		{name: "x/time/rate keyed (1 process)", note: "reference: unshared map + mutex, not distributed", envelope: 0,
			start: func() (*instance, error) { return &instance{sys: newXRateSystem(), stop: func() {}}, nil }},
		{name: "gubernator batching", note: "LEAKY_BUCKET; forwarded to the owner in batches", envelope: -1, start: gub(gubernator.Behavior_BATCHING)},
		{name: "gubernator no-batching", note: "LEAKY_BUCKET; one forward per request", envelope: -1, start: gub(gubernator.Behavior_NO_BATCHING)},
		{name: "gubernator GLOBAL", note: "LEAKY_BUCKET; answered from the local copy, hits synced async", envelope: -1, start: gub(gubernator.Behavior_GLOBAL)},
	}
	if !selected(cfg.only, redisName) {
		return systems, func() {}, nil
	}
	bin, err := ensureRedis(logf, os.Geteuid() == 0)
	if err != nil {
		if cfg.requireRedis || !errors.Is(err, errNoRedis) {
			return nil, func() {}, err
		}
		logf("skipping Redis: %v", err)
		return append(systems, distSystem{name: redisName, note: "skipped: " + err.Error()}), func() {}, nil
	}
	rs, err := startRedis(bin, 10*time.Second)
	if err != nil {
		return nil, func() {}, err
	}
	systems = append(systems, distSystem{name: redisName, note: "1 redis-server, EVALSHA per decision, one client per node", envelope: 0,
		start: func() (*instance, error) {
			sys, err := newRedisSystem(rs.addr, cfg.dist.satWorkers)
			if err != nil {
				return nil, err
			}
			if err := sys.clients[0].FlushAll(context.Background()).Err(); err != nil {
				sys.Close()
				return nil, err
			}
			return &instance{sys: sys, stop: sys.Close}, nil
		}})
	return systems, rs.Stop, nil
}

// loadNote is the 1, 5 and 15 minute load averages at a point of the run:
// the machine is shared, and figures taken under load say so.
type loadAvg struct {
	At   string `json:"at"`
	Load string `json:"loadavg"`
}

func loadNote(at string) loadAvg {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return loadAvg{At: at, Load: "unknown"}
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return loadAvg{At: at, Load: "unknown"}
	}
	return loadAvg{At: at, Load: strings.Join(f[:3], " ")}
}

// cpuModel is the processor's model name, when the system says it.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// selected reports whether the system name is among those -only names: all
// when only is empty, else those whose name contains one of its
// comma-separated parts.
func selected(only, name string) bool {
	if only == "" {
		return true
	}
	for part := range strings.SplitSeq(only, ",") {
		if part != "" && strings.Contains(name, part) {
			return true
		}
	}
	return false
}
