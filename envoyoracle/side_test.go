package envoyoracle

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSideBySide measures weir and envoyproxy/ratelimit on this machine in
// one run (docs/envoy.md, "Side by side with envoyproxy/ratelimit"): three
// `weir serve` processes as one cluster (no Redis), in three clusters: with
// the default token buckets, with envoy.fidelity and with
// envoy.fixed_window, against three processes of envoyproxy/ratelimit's own
// service binary sharing one redis-server, all serving sideDescriptors and
// all fed the same request stream. Each round measures the four in turn
// (weir default, envoyproxy/ratelimit, weir fidelity, weir fixed_window);
// then each weir mode and envoyproxy/ratelimit are
// offered half the fixed load each at the same time, call by call in turn,
// so that their latencies see the same machine. The ratios are taken round
// by round.
//
// It runs only with WEIR_SIDE=1. WEIR_SIDE_ROUNDS (4), WEIR_SIDE_SECONDS
// (8, per measured phase) and WEIR_SIDE_OFFERED (2000 calls/s) size it;
// WEIR_SIDE_ENVOY_SETTINGS adds envoyproxy/ratelimit settings
// ("REDIS_PIPELINE_WINDOW=150us"), space-separated, over pinnedSettings;
// WEIR_SIDE_OUT names a JSON file for the figures; WEIR_SIDE_PROFILE=1
// takes a CPU profile of a weir serve node at saturation even when the
// target is met (it is taken for a mode that misses it anyway), kept in
// WEIR_SIDE_PROFILE_DIR when that is set.
func TestSideBySide(t *testing.T) {
	if os.Getenv("WEIR_SIDE") == "" {
		t.Skip("the side-by-side measurement runs with WEIR_SIDE=1 (docs/envoy.md)")
	}
	cfg := sideConfig{
		rounds:     envInt(t, "WEIR_SIDE_ROUNDS", 4),
		phase:      time.Duration(envInt(t, "WEIR_SIDE_SECONDS", 8)) * time.Second,
		offered:    float64(envInt(t, "WEIR_SIDE_OFFERED", 2000)),
		satWorkers: 64,
		callers:    256,
	}
	needRedis(t)
	dir := t.TempDir()
	desc := filepath.Join(dir, "bench.yaml")
	if err := os.WriteFile(desc, []byte(sideDescriptors), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("building envoyproxy/ratelimit's service and weir")
	envoyBin := buildEnvoyService(t, dir)
	weirBin := weirBinary(t)

	redis := startRedis(t)
	envoyExtra := strings.Fields(os.Getenv("WEIR_SIDE_ENVOY_SETTINGS"))
	for _, kv := range envoyExtra {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			t.Fatalf("WEIR_SIDE_ENVOY_SETTINGS: %q is not KEY=value", kv)
		}
	}
	ec, ep := startEnvoyProcs(t, envoyBin, redis.addr, desc, 3, envoyExtra)
	envoy := sideSystem{name: sideEnvoy, clients: ec, pids: append(ep, redis.cmd.Process.Pid)}
	weirs := map[string]sideSystem{}
	for _, m := range sideWeirModes {
		c, p := startSideWeir(t, weirBin, desc, m.mode, nil)
		weirs[m.name] = sideSystem{name: m.name, clients: c, pids: p}
	}
	order := []sideSystem{weirs[sideWeirDefault], envoy, weirs[sideWeirFidelity], weirs[sideWeirFixed]}
	rep := sideReport{
		Go: runtime.Version(), CPUs: runtime.NumCPU(), Rounds: cfg.rounds, PhaseSeconds: cfg.phase.Seconds(),
		Offered: cfg.offered, SatWorkers: cfg.satWorkers, LoadBefore: machineLoad(), EnvoySettings: envoyExtra,
		Runs: map[string][]sideRun{}, Pairs: map[string][]sidePair{},
	}
	for r := range cfg.rounds {
		for _, s := range order {
			run := measureSide(t, s, cfg, uint64(r+1))
			rep.Runs[s.name] = append(rep.Runs[s.name], run)
			t.Logf("round %d, %s: saturation %.0f/s, %.0f per CPU-second of the system (generator %.2f CPU-s, machine %.2f CPU-s in %.1f s); at %.0f/s p50 %.0f µs, p99 %.0f µs",
				r+1, s.name, run.Sat.PerSec(), run.Sat.PerSysCPU(), run.Sat.GenCPU, run.Sat.MachineCPU, run.Sat.Seconds,
				cfg.offered, run.Lat.P50, run.Lat.P99)
		}
		for _, m := range sideWeirModes {
			w := weirs[m.name]
			pr := measurePair(t, w, envoy, cfg, uint64(r+1))
			rep.Pairs[w.name] = append(rep.Pairs[w.name], pr)
			t.Logf("round %d, paired at %.0f/s each: %s p50 %.0f µs, p99 %.0f µs; %s p50 %.0f µs, p99 %.0f µs",
				r+1, cfg.offered/2, w.name, pr.Weir.P50, pr.Weir.P99, sideEnvoy, pr.Envoy.P50, pr.Envoy.P99)
		}
	}
	rep.LoadAfter = machineLoad()
	missed := false
	for _, m := range sideWeirModes {
		v := rep.verdict(m.name)
		rep.Verdicts = append(rep.Verdicts, v)
		missed = missed || !v.MetMedian
	}
	t.Log("\n" + rep.markdown())
	if missed || os.Getenv("WEIR_SIDE_PROFILE") == "1" {
		for i, v := range rep.Verdicts {
			if !v.MetMedian || os.Getenv("WEIR_SIDE_PROFILE") == "1" {
				t.Logf("CPU profile of weir serve node n1 (%s) at saturation:\n%s", v.Mode, profileWeir(t, dir, desc, sideWeirModes[i], cfg))
			}
		}
	}
	if out := os.Getenv("WEIR_SIDE_OUT"); out != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range order {
		for _, run := range rep.Runs[s.name] {
			if run.Sat.Errors > 0 || run.Lat.Errors > 0 {
				t.Errorf("%s: %d calls failed at saturation, %d at the fixed load", s.name, run.Sat.Errors, run.Lat.Errors)
			}
		}
	}
}

const (
	sideWeirDefault  = "weir (default: token buckets)"
	sideWeirFidelity = "weir (envoy.fidelity)"
	sideWeirFixed    = "weir (envoy.fixed_window)"
	sideEnvoy        = "envoyproxy/ratelimit + Redis"
)

// sideWeirMode is one weir system of the measurement.
type sideWeirMode struct {
	name string
	mode sideMode
	file string // the profile's file name part
}

// sideWeirModes are the weir systems measured, each a 3-node cluster, in
// the order of the report's tables.
var sideWeirModes = []sideWeirMode{
	{sideWeirDefault, sideModeDefault, "default"},
	{sideWeirFidelity, sideModeFidelity, "fidelity"},
	{sideWeirFixed, sideModeFixed, "fixed_window"},
}

// sideConfig sizes the measurement.
type sideConfig struct {
	rounds     int
	phase      time.Duration // each measured phase
	offered    float64       // the fixed load, calls per second
	satWorkers int           // closed-loop callers at saturation
	callers    int           // open-loop callers at the fixed load
}

// sideRun is one system's measurement in one round.
type sideRun struct {
	Sat phaseOut `json:"saturation"`
	Lat phaseOut `json:"fixed_load"`
}

// measureSide measures one system: saturation (after a one-second warm-up),
// then the fixed load (after a one-second warm-up at that load).
func measureSide(t *testing.T, s sideSystem, cfg sideConfig, seed uint64) sideRun {
	saturate(t, s, cfg.satWorkers, time.Second, seed+100)
	sat := saturate(t, s, cfg.satWorkers, cfg.phase, seed)
	fixedLoad(t, s, cfg.offered, time.Second, cfg.callers, seed+100)
	lat := fixedLoad(t, s, cfg.offered, cfg.phase, cfg.callers, seed)
	return sideRun{Sat: sat, Lat: lat}
}

// sidePair is a weir mode and envoyproxy/ratelimit offered half the fixed
// load each at the same time, call by call in turn (fixedLoadPaired).
type sidePair struct {
	Weir  phaseOut `json:"weir"`
	Envoy phaseOut `json:"envoy"`
}

// measurePair runs the paired fixed load (after a one-second warm-up).
func measurePair(t *testing.T, w, e sideSystem, cfg sideConfig, seed uint64) sidePair {
	both := []sideSystem{w, e}
	fixedLoadPaired(t, both, cfg.offered/2, time.Second, cfg.callers, seed+200)
	out := fixedLoadPaired(t, both, cfg.offered/2, cfg.phase, cfg.callers, seed+300)
	return sidePair{Weir: out[0], Envoy: out[1]}
}

// profileWeir starts a fresh 3-node cluster of weir serve built with a
// profile endpoint (buildWeirProfiled), saturates it as the measurement
// does, takes a CPU profile of node n1 over the phase and returns the top
// of `go tool pprof -top`.
func profileWeir(t *testing.T, dir, desc string, m sideWeirMode, cfg sideConfig) string {
	bin := filepath.Join(dir, "weir-pprof")
	if _, err := os.Stat(bin); err != nil {
		bin = buildWeirProfiled(t, dir)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c, p := startSideWeir(t, bin, desc, m.mode, func(i int) []string {
		if i == 0 {
			return []string{"WEIR_PPROF_LISTEN=" + addr}
		}
		return nil
	})
	s := sideSystem{name: "weir profiled", clients: c, pids: p}
	saturate(t, s, cfg.satWorkers, time.Second, 99)
	profDir := os.Getenv("WEIR_SIDE_PROFILE_DIR")
	if profDir == "" {
		profDir = dir
	}
	prof := filepath.Join(profDir, fmt.Sprintf("weir-n1-%s.pprof", m.file))
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(cfg.phase.Seconds())))
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(prof)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	saturate(t, s, cfg.satWorkers, cfg.phase+time.Second, 98)
	if err := <-done; err != nil {
		t.Fatalf("CPU profile: %v", err)
	}
	var all strings.Builder
	for _, args := range [][]string{{"-top", "-nodecount=20"}, {"-top", "-cum", "-nodecount=40"}} {
		out, err := exec.Command("go", append(append([]string{"tool", "pprof"}, args...), bin, prof)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go tool pprof: %v\n%s", err, out)
		}
		all.WriteString("go tool pprof " + strings.Join(args, " ") + ":\n")
		all.Write(out)
	}
	all.WriteString("where the samples fall:\n" + profileBreakdown(t, bin, prof))
	return all.String()
}

// envInt reads a positive integer from the environment, def when unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// sideReport is the whole measurement.
type sideReport struct {
	Go           string  `json:"go"`
	CPUs         int     `json:"cpus"`
	Rounds       int     `json:"rounds"`
	PhaseSeconds float64 `json:"phase_seconds"`
	Offered      float64 `json:"offered_per_s"`
	SatWorkers   int     `json:"saturation_workers"`
	LoadBefore   string  `json:"loadavg_before"`
	LoadAfter    string  `json:"loadavg_after"`
	// EnvoySettings are envoyproxy/ratelimit's settings beyond
	// pinnedSettings (WEIR_SIDE_ENVOY_SETTINGS).
	EnvoySettings []string             `json:"envoy_settings"`
	Runs          map[string][]sideRun `json:"runs"`
	// Pairs are the paired fixed loads, by weir mode.
	Pairs    map[string][]sidePair `json:"paired"`
	Verdicts []sideVerdict         `json:"verdicts"`
}

// sideVerdict is the target for one weir mode: at least twice the
// decisions per CPU-second of envoyproxy/ratelimit with its Redis, at a
// lower p99, in every round.
type sideVerdict struct {
	Mode string `json:"mode"`
	// Round by round, weir ÷ envoyproxy/ratelimit.
	PerCPU    []float64 `json:"per_cpu_ratios"`
	PerSec    []float64 `json:"saturation_ratios"`
	P99       []float64 `json:"p99_ratios"`        // measured in turn
	PairedP99 []float64 `json:"paired_p99_ratios"` // measured at once
	// Met: in every round, at least 2× the decisions per CPU-second and a
	// lower p99, in turn and paired. MetMedian: the same of the medians.
	Met       bool `json:"met"`
	MetMedian bool `json:"met_median"`
}

// verdict compares mode with envoyproxy/ratelimit round by round.
func (r sideReport) verdict(mode string) sideVerdict {
	v := sideVerdict{Mode: mode, Met: true}
	e := r.Runs[sideEnvoy]
	for i, w := range r.Runs[mode] {
		p := r.Pairs[mode][i]
		v.PerCPU = append(v.PerCPU, w.Sat.PerSysCPU()/e[i].Sat.PerSysCPU())
		v.PerSec = append(v.PerSec, w.Sat.PerSec()/e[i].Sat.PerSec())
		v.P99 = append(v.P99, w.Lat.P99/e[i].Lat.P99)
		v.PairedP99 = append(v.PairedP99, p.Weir.P99/p.Envoy.P99)
		v.Met = v.Met && v.PerCPU[i] >= 2 && v.P99[i] < 1 && v.PairedP99[i] < 1
	}
	v.MetMedian = median(v.PerCPU) >= 2 && median(v.P99) < 1 && median(v.PairedP99) < 1
	return v
}

// median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// spread formats the median and range of xs.
func spread(xs []float64, format string) string {
	f := func(x float64) string { return fmt.Sprintf(format, x) }
	return fmt.Sprintf("%s (%s–%s)", f(median(xs)), f(slices.Min(xs)), f(slices.Max(xs)))
}

// pick maps runs to one figure each.
func pick(runs []sideRun, f func(sideRun) float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = f(r)
	}
	return out
}

// pickPair maps pairs to one figure each.
func pickPair(ps []sidePair, f func(sidePair) float64) []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = f(p)
	}
	return out
}

// markdown is the report as the tables docs/envoy.md shows: medians over
// the rounds with their ranges, then the ratios.
func (r sideReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d CPUs, %d rounds of %.0f s phases, load average %s before, %s after\n",
		r.Go, r.CPUs, r.Rounds, r.PhaseSeconds, r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(&b, "envoyproxy/ratelimit: pinned settings, and %q\n\n", r.EnvoySettings)
	fmt.Fprintf(&b, "| system | saturation, decisions/s | decisions per CPU-second (system) | generator CPU-s per 1000 decisions | p50 at %.0f/s | p99 at %.0f/s | over limit |\n", r.Offered, r.Offered)
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, name := range []string{sideWeirDefault, sideWeirFidelity, sideWeirFixed, sideEnvoy} {
		runs := r.Runs[name]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s µs | %s µs | %s |\n", name,
			spread(pick(runs, func(x sideRun) float64 { return x.Sat.PerSec() }), "%.0f"),
			spread(pick(runs, func(x sideRun) float64 { return x.Sat.PerSysCPU() }), "%.0f"),
			spread(pick(runs, func(x sideRun) float64 { return 1000 / x.Sat.PerGenCPU() }), "%.3f"),
			spread(pick(runs, func(x sideRun) float64 { return x.Lat.P50 }), "%.0f"),
			spread(pick(runs, func(x sideRun) float64 { return x.Lat.P99 }), "%.0f"),
			spread(pick(runs, func(x sideRun) float64 { return float64(x.Sat.Over) / float64(x.Sat.Calls) }), "%.2f"))
	}
	redis := pick(r.Runs[sideEnvoy], func(x sideRun) float64 { return x.Sat.ProcCPU[len(x.Sat.ProcCPU)-1] / x.Sat.SysCPU })
	fmt.Fprintf(&b, "\nredis-server's share of envoyproxy/ratelimit's CPU at saturation: %s\n", spread(redis, "%.2f"))
	fmt.Fprintf(&b, "\npaired, %.0f/s each at once, call by call in turn:\n\n", r.Offered/2)
	b.WriteString("| weir mode | weir p50 | weir p99 | envoyproxy/ratelimit p50 | envoyproxy/ratelimit p99 |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: |\n")
	for _, m := range sideWeirModes {
		mode := m.name
		ps := r.Pairs[mode]
		fmt.Fprintf(&b, "| %s | %s µs | %s µs | %s µs | %s µs |\n", mode,
			spread(pickPair(ps, func(p sidePair) float64 { return p.Weir.P50 }), "%.0f"),
			spread(pickPair(ps, func(p sidePair) float64 { return p.Weir.P99 }), "%.0f"),
			spread(pickPair(ps, func(p sidePair) float64 { return p.Envoy.P50 }), "%.0f"),
			spread(pickPair(ps, func(p sidePair) float64 { return p.Envoy.P99 }), "%.0f"))
	}
	b.WriteString("\n| weir ÷ envoyproxy/ratelimit | decisions per CPU-second | saturation | p99 in turn | p99 paired | target: every round | target: medians |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | --- | --- |\n")
	word := map[bool]string{true: "met", false: "missed"}
	for _, v := range r.Verdicts {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", v.Mode, spread(v.PerCPU, "%.2f"), spread(v.PerSec, "%.2f"),
			spread(v.P99, "%.2f"), spread(v.PairedP99, "%.2f"), word[v.Met], word[v.MetMedian])
	}
	b.WriteString("\nround by round:\n")
	for i := range r.Rounds {
		for _, name := range []string{sideWeirDefault, sideEnvoy, sideWeirFidelity, sideWeirFixed} {
			x := r.Runs[name][i]
			fmt.Fprintf(&b, "  %d %-32s sat %6.0f/s  sys %5.2f CPU-s  gen %5.2f CPU-s  machine %5.2f CPU-s in %4.1f s  per sys CPU-s %6.0f  degraded %d  |  fixed %6.0f/s p50 %5.0f µs p99 %6.0f µs p99.9 %6.0f µs late %d sys %5.2f CPU-s degraded %d\n",
				i+1, name, x.Sat.PerSec(), x.Sat.SysCPU, x.Sat.GenCPU, x.Sat.MachineCPU, x.Sat.Seconds, x.Sat.PerSysCPU(), x.Sat.Degraded,
				x.Lat.PerSec(), x.Lat.P50, x.Lat.P99, x.Lat.P999, x.Lat.Late, x.Lat.SysCPU, x.Lat.Degraded)
		}
		for _, m := range sideWeirModes {
			mode := m.name
			p := r.Pairs[mode][i]
			fmt.Fprintf(&b, "  %d paired: %-32s p50 %5.0f µs p99 %6.0f µs p99.9 %6.0f µs sys %5.2f CPU-s; envoyproxy/ratelimit p50 %5.0f µs p99 %6.0f µs p99.9 %6.0f µs sys %5.2f CPU-s; late %d\n",
				i+1, mode, p.Weir.P50, p.Weir.P99, p.Weir.P999, p.Weir.SysCPU, p.Envoy.P50, p.Envoy.P99, p.Envoy.P999, p.Envoy.SysCPU, p.Weir.Late)
		}
	}
	return b.String()
}

// profileParts sorts a CPU profile's samples (the text of `go tool pprof
// -traces`) into where weir serve spends its CPU, each sample into the
// first part whose pattern one of its frames matches.
var profileParts = []struct{ name, pattern string }{
	{"GC (mark workers, assists, sweeping)", `runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge)`},
	{"peer exchange (sending, serving, the shell's loop)", `shell\.\(\*Node\)\.(run|send|flush|flusher|flushWith|exchange|Handle|collect)|shell\.\(\*GRPCTransport\)|shell\.peerServer|shell\.\(\*peerStream\)|shell\.(encodeBatch|decodeBatch)|peerpb\.`},
	{"weir's answer (rls.ShouldRateLimit: matching, deciding, headers)", `rls\.\(\*Service\)\.ShouldRateLimit`},
	{"gossip, ticks, metrics", `memberlist|prometheus|shell\.\(\*Node\)\.ticker`},
	{"gRPC serving (HTTP/2 frames, protobuf, reads and writes)", `google\.golang\.org/grpc|golang\.org/x/net/http2|google\.golang\.org/protobuf`},
}

// profileBreakdown is the share of each of profileParts in the profile at
// prof of binary bin (the rest: the scheduler, stack growth, polling).
func profileBreakdown(t *testing.T, bin, prof string) string {
	out, err := exec.Command("go", "tool", "pprof", "-traces", bin, prof).Output()
	if err != nil {
		t.Fatalf("go tool pprof -traces: %v", err)
	}
	res := make([]*regexp.Regexp, len(profileParts))
	for i, p := range profileParts {
		res[i] = regexp.MustCompile(p.pattern)
	}
	sums := make([]time.Duration, len(profileParts)+1)
	var total time.Duration
	for _, sample := range strings.Split(string(out), "-----------+")[1:] {
		f := strings.Fields(sample)
		if len(f) < 2 {
			continue
		}
		v, err := time.ParseDuration(f[1])
		if err != nil {
			continue
		}
		total += v
		part := len(profileParts)
		for i, re := range res {
			if re.MatchString(sample) {
				part = i
				break
			}
		}
		sums[part] += v
	}
	var b strings.Builder
	for i, d := range sums {
		name := "other (scheduler, stack growth, polling)"
		if i < len(profileParts) {
			name = profileParts[i].name
		}
		fmt.Fprintf(&b, "%7v %5.1f%%  %s\n", d, 100*d.Seconds()/total.Seconds(), name)
	}
	fmt.Fprintf(&b, "%7v  in all\n", total)
	return b.String()
}
