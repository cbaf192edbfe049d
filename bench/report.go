package main

import (
	"fmt"
	"math"
	"strings"
)

// report is one run's results: what the markdown shows and the JSON holds.
type report struct {
	Date    string         `json:"date"`
	Seconds float64        `json:"seconds"`
	Config  runConfig      `json:"config"`
	Machine machine        `json:"machine"`
	Load    []loadAvg      `json:"load"`
	Local   []localFigures `json:"local"`
	Dist    []distFigures  `json:"distributed"`
	// Pair is weir exact and Redis at the fixed load in alternated turns
	// (measurePair); nil when not run.
	Pair *pairFigures `json:"paired_latency,omitempty"`
	// User is the user's-way section (userway.go); nil when not run.
	User    *userReport `json:"user_way,omitempty"`
	Targets []target    `json:"targets"`
	// Notes are things that happened in the run that the figures do not
	// show (a system that would not shut down, a skipped part).
	Notes []string `json:"notes,omitempty"`
}

// target is one of issue 7's targets checked against this run.
type target struct {
	Name     string `json:"name"`
	Measured string `json:"measured"`
	Goal     string `json:"goal"`
	// Result is "met", "missed", "reported" (no goal, a figure to show) or
	// "n/a" (not measured in this run).
	Result string `json:"result"`
}

func (r *report) local(name string) *localFigures {
	for i := range r.Local {
		if r.Local[i].Name == name {
			return &r.Local[i]
		}
	}
	return nil
}

func (r *report) dist(name string) *distFigures {
	for i := range r.Dist {
		if r.Dist[i].Name == name && r.Dist[i].Skipped == "" {
			return &r.Dist[i]
		}
	}
	return nil
}

// ratio is a ÷ b, NaN when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func fmtX(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	case x >= 0.1:
		return fmt.Sprintf("%.2f×", x)
	default:
		return fmt.Sprintf("%.4f×", x)
	}
}

// fmtNum prints a figure with a thin grouping of thousands.
func fmtNum(x float64, prec int) string {
	s := fmt.Sprintf("%.*f", prec, x)
	intPart, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(intPart, "-")
	intPart = strings.TrimPrefix(intPart, "-")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(c)
	}
	out := b.String()
	if neg {
		out = "-" + out
	}
	if frac != "" {
		out += "." + frac
	}
	return out
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// checkTargets sets each target of issue 7 against the run's figures.
func checkTargets(r *report) []target {
	var ts []target
	add := func(name, measured, goal, result string) {
		ts = append(ts, target{name, measured, goal, result})
	}
	w := r.local("weir GCRAStore")
	if w != nil {
		if x := r.local("x/time/rate AllowN(now,1)"); x != nil {
			v := ratio(w.Serial1k, x.Serial1k)
			add("local, 1 k keys: weir store ÷ x/time/rate AllowN(now,1), serial", fmt.Sprintf("%.2f", v), "≤ 0.5", verdict(v <= 0.5))
		}
		if f := r.local("map floor"); f != nil {
			v := ratio(w.Serial1M, f.Serial1M)
			add("local, 1 M keys: weir store ÷ bare map increment, serial", fmt.Sprintf("%.2f", v), "≤ 1.5", verdict(v <= 1.5))
		}
		for _, mode := range []string{"serial", "parallel"} {
			worst, worstName := math.Inf(1), ""
			for _, a := range r.Local {
				if !a.Keyed || strings.HasPrefix(a.Name, "weir") || a.Name == "map floor" {
					continue
				}
				wv, av := w.Serial1M, a.Serial1M
				if mode == "parallel" {
					wv, av = w.Parallel1M, a.Parallel1M
				}
				if v := ratio(av, wv); v < worst {
					worst, worstName = v, a.Name
				}
			}
			add("local, 1 M keys, "+mode+": every keyed alternative ÷ weir store (slowest ratio)",
				fmt.Sprintf("%.2f (%s)", worst, worstName), "≥ 3", verdict(worst >= 3))
		}
		add("local: weir store allocations per decision", fmt.Sprintf("%.2f", w.AllocsPerOp), "0", verdict(w.AllocsPerOp == 0))
		least, leastName := math.Inf(1), ""
		for _, a := range r.Local {
			if a.HasBytesPerKey && a.Name != "weir GCRAStore" && a.Name != "map floor" && a.BytesPerKey < least {
				least, leastName = a.BytesPerKey, a.Name
			}
		}
		add("local: heap bytes per key at 1 M keys, weir store vs the fewest of the alternatives",
			fmt.Sprintf("%.1f vs %.1f (%s)", w.BytesPerKey, least, leastName), "fewest", verdict(w.BytesPerKey < least))
	}
	sh, ex := r.dist("weir shared"), r.dist("weir exact")
	redis := r.dist("redis Lua token bucket")
	if sh != nil {
		for _, name := range []string{"redis Lua token bucket", "gubernator batching", "gubernator no-batching", "gubernator GLOBAL"} {
			o := r.dist(name)
			if o == nil {
				add("shared decisions/s ÷ "+name, "not measured", "≥ 100", "n/a")
				continue
			}
			v := ratio(sh.PerSec, o.PerSec)
			add("shared decisions/s ÷ "+name, fmt.Sprintf("%.0f", v), "≥ 100", verdict(v >= 100))
		}
		for _, name := range []string{"redis Lua token bucket", "gubernator batching", "gubernator no-batching", "gubernator GLOBAL"} {
			if o := r.dist(name); o != nil && o.HotElapsed > 0 && sh.HotElapsed > 0 {
				v := ratio(float64(sh.HotCalls)/sh.HotElapsed, float64(o.HotCalls)/o.HotElapsed)
				add("hot identity (one key over its limit) decisions/s: shared ÷ "+name, fmt.Sprintf("%.0f", v), "(no goal: beside the 100× target)", "reported")
			}
		}
		if x := r.dist("x/time/rate keyed (1 process)"); x != nil {
			v := ratio(sh.PerSec, x.PerSec)
			add("shared decisions/s ÷ unshared keyed x/time/rate (same load generator)", fmt.Sprintf("%.2f", v), "≥ 1", verdict(v >= 1))
		}
		upper := sh.HotReference + sh.HotEnvelope
		add("shared hot identity: admitted vs B + r·Δ + S", fmt.Sprintf("%d vs %.0f (S = %.0f)", sh.HotAdmitted, upper, sh.HotEnvelope),
			"≤ B + r·Δ + S", verdict(float64(sh.HotAdmitted) <= upper))
		add("shared: fail-open (degraded) decisions in a run with no fault", fmt.Sprintf("%d", sh.Degraded), "0", verdict(sh.Degraded == 0))
	}
	// The same targets for the configuration meant for many one-shot
	// identities: shared with sketch gating (docs/overshoot.md).
	if sk := r.dist("weir shared + sketch"); sk != nil {
		for _, name := range []string{"redis Lua token bucket", "gubernator batching", "gubernator no-batching", "gubernator GLOBAL"} {
			if o := r.dist(name); o != nil {
				v := ratio(sk.PerSec, o.PerSec)
				add("shared + sketch decisions/s ÷ "+name, fmt.Sprintf("%.0f", v), "≥ 100", verdict(v >= 100))
			}
		}
		if x := r.dist("x/time/rate keyed (1 process)"); x != nil {
			v := ratio(sk.PerSec, x.PerSec)
			add("shared + sketch decisions/s ÷ unshared keyed x/time/rate (same load generator)", fmt.Sprintf("%.2f", v), "≥ 1", verdict(v >= 1))
		}
		upper := sk.HotReference + sk.HotEnvelope
		add("shared + sketch hot identity: admitted vs B + r·Δ + S + N·θ·(⌈Δ/P⌉+1)", fmt.Sprintf("%d vs %.0f", sk.HotAdmitted, upper),
			"≤ the envelope", verdict(float64(sk.HotAdmitted) <= upper))
		add("shared + sketch: fail-open (degraded) decisions in a run with no fault", fmt.Sprintf("%d", sk.Degraded), "0", verdict(sk.Degraded == 0))
	}
	if ex != nil {
		if redis == nil {
			add("exact decisions/s ÷ Redis Lua", "Redis not measured", "≥ 1", "n/a")
			if r.Pair == nil {
				add("exact p99 vs Redis Lua p99", "Redis not measured", "lower", "n/a")
			}
		} else {
			v := ratio(ex.PerSec, redis.PerSec)
			add("exact decisions/s ÷ Redis Lua", fmt.Sprintf("%.2f", v), "≥ 1", verdict(v >= 1))
			name, goal, result := fmt.Sprintf("exact p99 vs Redis Lua p99 at %s/s", fmtNum(ex.Offered, 0)), "lower", verdict(ex.P99 < redis.P99)
			if r.Pair != nil {
				name, goal, result = name+", each in its own phase", "(beside the alternated figure)", "reported"
			}
			add(name, fmt.Sprintf("%.0f µs vs %.0f µs", ex.P99, redis.P99), goal, result)
		}
	}
	if p := r.Pair; p != nil {
		add(fmt.Sprintf("exact p99 vs Redis Lua p99 at %s/s each, calls alternated, %d turns of %.1f s pooled", fmtNum(p.Offered, 0), p.Turns, p.TurnSecs),
			fmt.Sprintf("%.0f µs vs %.0f µs (exact lower in %d of %d turns)", p.P99A, p.P99B, p.P99Wins, p.Turns), "lower", verdict(p.P99A < p.P99B))
	}
	if r.User != nil {
		userTargets(r.User, add)
	}
	if g := r.dist("gubernator GLOBAL"); g != nil && sh != nil {
		add("hot identity, admitted ÷ reference: gubernator GLOBAL beside weir shared",
			fmt.Sprintf("%.3f vs %.3f", ratio(float64(g.HotAdmitted), g.HotReference), ratio(float64(sh.HotAdmitted), sh.HotReference)),
			"reported", "reported")
	}
	return ts
}

// Markdown renders the report as the tables the docs quote.
func (r *report) Markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# weir against the alternatives (%s run, %s)\n\n", r.Config.Mode, r.Date)
	p("Machine: %s, %d CPUs (GOMAXPROCS %d), %s %s/%s.", r.Machine.CPU, r.Machine.NumCPU, r.Machine.GOMAXPROCS, r.Machine.GoVersion, r.Machine.GOOS, r.Machine.GOARCH)
	if len(r.Load) > 0 {
		var ls []string
		for _, l := range r.Load {
			ls = append(ls, fmt.Sprintf("%s %s", l.At, l.Load))
		}
		p(" Load average (1/5/15 min): %s.", strings.Join(ls, "; "))
	}
	p("\n\n")

	r.markdownLocal(&b)

	if len(r.Dist) > 0 {
		sh, ex := r.dist("weir shared"), r.dist("weir exact")
		var shv, exv, exp50, exp99, exp999 float64
		if sh != nil {
			shv = sh.PerSec
		}
		if ex != nil {
			exv, exp50, exp99, exp999 = ex.PerSec, ex.P50, ex.P99, ex.P999
		}
		c := r.Config.Dist
		p("## Distributed decisions\n\n")
		p("3 nodes of each system in this process on 127.0.0.1; calls spread over the nodes. Saturation: %d closed-loop callers for %.0f s over %s random identities. Latency: %s decisions/s offered open loop for %.0f s (latency from each call's scheduled time). Hot identity: one key, %d callers over the 3 nodes for %.1f s, rule 1 000/s burst 100; reference = B + r·Δ.\n\n",
			c.Workers, c.SaturationSeconds, fmtNum(float64(c.Identities), 0), fmtNum(c.Offered, 0), c.LatencySeconds, c.Workers, c.HotSeconds)
		p("| system | decisions/s | ÷ weir shared | ÷ weir exact | p50 µs | p99 µs | p99.9 µs | achieved/s | errors |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, f := range r.Dist {
			if f.Skipped != "" {
				p("| %s | skipped: %s | | | | | | | |\n", f.Name, f.Skipped)
				continue
			}
			flag := ""
			if f.PerSec > 0 && f.Achieved > 0 && f.PerSec < 2*f.Offered { // both phases ran (-phases)
				flag = " ⚠ saturates under 2× the offer"
			}
			p("| %s | %s%s | %s | %s | %.0f (%s) | %.0f (%s) | %.0f (%s) | %s | %d |\n", f.Name, fmtNum(f.PerSec, 0), flag,
				fmtX(ratio(f.PerSec, shv)), fmtX(ratio(f.PerSec, exv)),
				f.P50, fmtX(ratio(f.P50, exp50)), f.P99, fmtX(ratio(f.P99, exp99)), f.P999, fmtX(ratio(f.P999, exp999)),
				fmtNum(f.Achieved, 0), f.SatErrors+f.LatErrors+f.HotErrors)
		}
		p("\nLatency ratios are ÷ weir exact (the one-hop design, like Redis).\n\n")
		var shHot float64
		if sh != nil {
			shHot = float64(sh.HotCalls) / sh.HotElapsed
		}
		p("| hot identity | admitted | reference B + r·Δ | admitted ÷ reference | excess over reference | promised excess | decisions/s (÷ weir shared) | degraded |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, f := range r.Dist {
			if f.Skipped != "" {
				continue
			}
			env, deg := "none stated", "not counted"
			if f.HotEnvelope >= 0 {
				env = fmt.Sprintf("≤ %.0f", f.HotEnvelope)
			}
			if f.HasDegraded {
				deg = fmt.Sprintf("%d", f.Degraded)
			}
			hot := float64(f.HotCalls) / f.HotElapsed
			p("| %s | %d | %.0f | %.3f | %+.0f | %s | %s (%s) | %s |\n", f.Name, f.HotAdmitted, f.HotReference,
				ratio(float64(f.HotAdmitted), f.HotReference), float64(f.HotAdmitted)-f.HotReference, env, fmtNum(hot, 0), fmtX(ratio(hot, shHot)), deg)
		}
		p("\n")
		for _, f := range r.Dist {
			if f.Note != "" {
				p("- %s: %s\n", f.Name, f.Note)
			}
		}
		p("\n")
	}

	if q := r.Pair; q != nil {
		p("## %s and %s, alternated\n\n", q.A, q.B)
		p("Both running side by side and offered %s decisions/s each at the same time, call by call in turn from one generator and one pool of callers, for %d turns of %.1f s; latencies pooled per system (from each call's scheduled time), and each turn's p99s compared.\n\n",
			fmtNum(q.Offered, 0), q.Turns, q.TurnSecs)
		p("| system | p50 µs | p99 µs | p99.9 µs | samples | errors | turns with the lower p99 |\n|---|---:|---:|---:|---:|---:|---:|\n")
		p("| %s | %.0f | %.0f | %.0f | %d | %d | %d of %d |\n", q.A, q.P50A, q.P99A, q.P999A, q.SamplesA, q.ErrorsA, q.P99Wins, q.Turns)
		p("| %s | %.0f (%s) | %.0f (%s) | %.0f (%s) | %d | %d | %d of %d |\n\n", q.B, q.P50B, fmtX(ratio(q.P50B, q.P50A)), q.P99B, fmtX(ratio(q.P99B, q.P99A)),
			q.P999B, fmtX(ratio(q.P999B, q.P999A)), q.SamplesB, q.ErrorsB, q.Turns-q.P99Wins, q.Turns)
	}
	if r.User != nil {
		r.User.markdown(&b)
	}
	for _, n := range r.Notes {
		p("Note: %s\n\n", n)
	}
	if len(r.Targets) > 0 {
		p("## Targets\n\n| target | measured | goal | result |\n|---|---|---|---|\n")
		for _, t := range r.Targets {
			p("| %s | %s | %s | %s |\n", t.Name, t.Measured, t.Goal, t.Result)
		}
		p("\n")
	}
	return b.String()
}

// markdownLocal renders the local section into b.
func (r *report) markdownLocal(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if w := r.local("weir GCRAStore"); w != nil {
		p("## Local decisions\n\n")
		p("ns per decision (median of %d round(s), benchtime %v), and each figure ÷ weir's store in the same run. Keys: %s and %s distinct 32-byte identities; rule 1 000/s, burst 100. Parallel: GOMAXPROCS goroutines on one shared instance (the floor: one map per goroutine). Heap: runtime.MemStats HeapAlloc growth after runtime.GC() for %s keys, each key a fresh string as from a request.\n\n",
			r.Config.Rounds, r.Config.Benchtime, fmtNum(float64(r.Config.Small), 0), fmtNum(float64(r.Config.Large), 0), fmtNum(float64(r.Config.Large), 0))
		p("| system | serial, 1 k keys | serial, 1 M keys | parallel, 1 k keys | parallel, 1 M keys | allocs/op | heap bytes/key |\n")
		p("|---|---:|---:|---:|---:|---:|---:|\n")
		cell := func(v, ref float64) string { return fmt.Sprintf("%.1f (%s)", v, fmtX(ratio(v, ref))) }
		for _, f := range r.Local {
			heap := "–"
			if f.HasBytesPerKey {
				heap = fmt.Sprintf("%.1f (%s)", f.BytesPerKey, fmtX(ratio(f.BytesPerKey, w.BytesPerKey)))
			}
			s1M, p1M := cell(f.Serial1M, w.Serial1M), cell(f.Parallel1M, w.Parallel1M)
			if !f.Keyed {
				s1M, p1M = "(no key)", "(no key)"
			}
			p("| %s | %s | %s | %s | %s | %.0f | %s |\n", f.Name, cell(f.Serial1k, w.Serial1k), s1M, cell(f.Parallel1k, w.Parallel1k), p1M, math.Round(f.AllocsPerOp), heap)
		}
		p("\n")
		for _, f := range r.Local {
			p("- %s: %s\n", f.Name, f.Note)
		}
		p("\n")
	}
}
