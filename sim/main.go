// Command sim is weir's deterministic overshoot simulator: it runs the real
// cluster coordinator of every node of a region under a virtual clock and a
// simulated network, feeds the same requests to one exact GCRA bucket per
// identity (the reference), and checks the accuracy envelope of docs/overshoot.md over
// every interval. The same flags and seed print the same bytes.
//
//	go run ./sim -nodes 5 -traffic uneven -faults 'crash:n1@10s,restart:n1@20s' -duration 1m -seed 7
//	go run ./sim -sweep default
//	go run ./sim -nodes 3 -mode exact -ids 4 -rules 'limit=150,tenants=2' -seed 5
//	go run ./sim -global -regions 3 -demand move -faults 'partition:r1@15s-35s' -seed 7
//	go run ./sim -global -doorman
//
// With -rules every request carries several rules, which each node decides
// with weir's request policy (internal/policy), and each rule's envelope is
// checked on its own. With -global it simulates a global limit leased across regions instead
// (package sim/global).
//
// See docs/overshoot.md for the contract it checks and the tables it made.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/global"
	"github.com/weir-dev/weir/sim/region"
)

func main() {
	// The simulator's live heap is small and nearly all its garbage is
	// short-lived messages: collecting less often saves a fifth of a run.
	// A GOGC in the environment wins (GOGC=off for instruction counts
	// that a collection does not disturb).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it returns the exit code (0 ok, 1 a bound broken, 2
// bad flags or an error).
func run(args []string, stdout, stderr io.Writer) int {
	for i, a := range args {
		if a == "-global" || a == "--global" {
			return global.Main(append(slices.Clone(args[:i]), args[i+1:]...), stdout, stderr)
		}
	}
	cfg, opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return 2
	}
	if opts.cpuprofile != "" {
		f, err := os.Create(opts.cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "sim: -cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "sim: -cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	if !opts.quiet {
		cfg.Progress = func(done, total time.Duration) {
			fmt.Fprintf(stderr, "\rsimulated %v of %v (%.1fs wall)", done.Round(time.Millisecond), total, time.Since(start).Seconds())
			if done >= total {
				fmt.Fprintln(stderr)
			}
		}
	}
	if opts.log {
		cfg.Log = stderr
	}
	if opts.sweep != "" {
		g, err := region.ParseGrid(opts.sweep)
		if err != nil {
			fmt.Fprintf(stderr, "sim: -sweep: %v\n", err)
			return 2
		}
		base := cfg
		base.Progress, base.Log = nil, nil
		var prog func(done, total int)
		if !opts.quiet {
			prog = func(done, total int) {
				fmt.Fprintf(stderr, "\rrun %d of %d (%.1fs wall)", done, total, time.Since(start).Seconds())
				if done == total {
					fmt.Fprintln(stderr)
				}
			}
		}
		results, err := region.Sweep(base, g, stdout, prog)
		if err != nil {
			fmt.Fprintf(stderr, "sim: %v\n", err)
			return 2
		}
		if err := savePlot(opts, "excess.svg", sweepChart(results)); err != nil {
			fmt.Fprintf(stderr, "sim: plots: %v\n", err)
			return 2
		}
		for _, r := range results {
			if !r.OK() {
				return 1
			}
		}
		return 0
	}
	res, err := region.Run(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return 2
	}
	res.Summary(stdout)
	if err := savePlot(opts, "rate.svg", rateChart(res)); err != nil {
		fmt.Fprintf(stderr, "sim: plots: %v\n", err)
		return 2
	}
	if !res.OK() {
		fmt.Fprintf(stdout, "reproduce: go run ./sim %s\n", res.Config.Flags())
		return 1
	}
	return 0
}

type options struct {
	sweep, out, plot, cpuprofile string
	quiet, log                   bool
}

// savePlot writes the run's or the sweep's plot as name into -out and to
// -plot, where given.
func savePlot(o options, name string, ch *chart) error {
	if o.out == "" && o.plot == "" {
		return nil
	}
	svg := ch.svg()
	if o.out != "" {
		if err := writePlot(filepath.Join(o.out, name), svg); err != nil {
			return err
		}
	}
	if o.plot != "" {
		return writePlot(o.plot, svg)
	}
	return nil
}

func parseFlags(args []string, stderr io.Writer) (region.Config, options, error) {
	var (
		c               region.Config
		o               options
		mode, onFailure string
		algorithm       string
		latency, faults string
		rules           string
		slack           int64
		seed            uint64
	)
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Nodes, "nodes", 3, "gateways in the region at the start (n0, n1, ...)")
	fs.Int64Var(&c.Limit, "limit", 100, "the rule's limit: tokens per window")
	fs.DurationVar(&c.Window, "window", time.Second, "the rule's window")
	fs.Int64Var(&c.Burst, "burst", 0, "the rule's burst (0: the limit)")
	fs.StringVar(&mode, "mode", "shared", "shared or exact (exact for an -algorithm other than gcra)")
	fs.StringVar(&algorithm, "algorithm", "gcra", "the rule's algorithm: gcra, or in mode exact fixed_window, sliding_window, sliding_log, leaky_bucket (held to equality with one instance of it) or concurrency (-limit slots, held -hold each)")
	fs.DurationVar(&c.Hold, "hold", 0, "concurrency: how long an admitted request is held before its release (0: 20ms); traffic offers -load × -limit in flight")
	fs.Float64Var(&c.Accuracy, "accuracy", quota.DefaultAccuracy, "the rule's accuracy a: S = Σ sᵢ ≤ a·limit")
	fs.Int64Var(&slack, "slack", -1, "per-node slack in tokens at the initial size (sets -accuracy; -1: use -accuracy)")
	fs.StringVar(&c.Scheme, "scheme", cluster.DefaultSlackScheme.String(), "slack scheme: fixed (⌊a·L ÷ N⌋ per node) or demand (a base per node, the rest granted by demand)")
	fs.StringVar(&onFailure, "on-failure", "local", "local, open or closed")
	fs.Int64Var(&c.Cost, "cost", 1, "tokens per request")
	fs.DurationVar(&c.Sync, "sync", 100*time.Millisecond, "the coordinator's sync interval")
	fs.DurationVar(&c.DecideTimeout, "decide-timeout", 250*time.Millisecond, "how long a forwarded request waits for its owner")
	fs.DurationVar(&c.Linger, "linger", 200*time.Microsecond, "how long a batch waits before it is sent")
	fs.DurationVar(&c.CallTimeout, "call-timeout", 200*time.Millisecond, "bound on one exchange")
	fs.IntVar(&c.BreakerFailures, "breaker-failures", 3, "failed exchanges in a row that open a peer's breaker")
	fs.DurationVar(&c.BreakerCooldown, "breaker-cooldown", time.Second, "how long a breaker stays open")
	fs.DurationVar(&c.Tick, "tick", 10*time.Millisecond, "how often each node ticks (the production shell: 10ms)")
	fs.DurationVar(&c.Detect, "detect", 500*time.Millisecond, "membership: time to declare a crashed or unreachable node dead")
	fs.DurationVar(&c.Gossip, "gossip", 50*time.Millisecond, "membership: time for a join, leave or heal to reach a node")
	fs.StringVar(&latency, "latency", "lognormal:200us:0.5", "one-way latency: const:D, uniform:D1:D2 or lognormal:MEDIAN:SIGMA")
	fs.StringVar(&c.Traffic, "traffic", "constant", "traffic: "+strings.Join(region.TrafficKinds, ", "))
	fs.Float64Var(&c.Load, "load", 3, "offered rate per identity as a multiple of the rule's rate")
	fs.IntVar(&c.IDs, "ids", 0, "identities (0: 1, or 1000 for zipf)")
	fs.Float64Var(&c.Rate, "rate", 0, "zipf: decisions per simulated second in all (0: load × rate × ids ÷ 10)")
	fs.Float64Var(&c.ZipfS, "zipf", 1.1, "zipf: exponent (> 1)")
	fs.BoolVar(&c.TrackAll, "track-all", false, "shared rules keep an entry of every identity on every node: no blind spend")
	fs.IntVar(&c.KeyCap, "keycap", 0, "the coordinators' key cap: entries per rule per node (0: the default, 1 000 000)")
	fs.Int64Var(&c.Sketch, "sketch", 0, "sketch gating threshold θ of the rule (0: off; shared mode; docs/overshoot.md \"Sketch gating\")")
	fs.DurationVar(&c.SketchPeriod, "sketch-period", 0, "sketch gating period P (0: the window)")
	fs.StringVar(&rules, "rules", "none", "rules every request carries after the main one, decided with it by the request policy (see below)")
	fs.StringVar(&faults, "faults", "none", "faults to inject (see below)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "simulated time of traffic")
	fs.Uint64Var(&seed, "seed", 1, "the run's random seed")
	fs.StringVar(&o.out, "out", "", "directory for SVG plots: rate.svg of a run, excess.svg of a sweep (none if empty)")
	fs.StringVar(&o.plot, "plot", "", "file to write the run's (or the sweep's) SVG plot to (none if empty)")
	fs.StringVar(&o.sweep, "sweep", "", `run a grid instead of one run ("default" or a spec, see below)`)
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	fs.BoolVar(&o.log, "log", false, "log faults and ring changes on stderr")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: go run ./sim [flags]\n\nSimulates one region of weir gateways running the real cluster coordinator, and checks\nthe accuracy envelope of docs/overshoot.md. Exit status 1 when a bound is broken.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\n%s\n\n%s\n\n%s\n", region.RulesSyntax, region.FaultSyntax, region.GridSyntax)
	}
	if err := fs.Parse(args); err != nil {
		return c, o, err
	}
	if fs.NArg() > 0 {
		return c, o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case c.Nodes < 1:
		return c, o, fmt.Errorf("-nodes %d: want at least 1", c.Nodes)
	case c.Limit < 1:
		return c, o, fmt.Errorf("-limit %d: want at least 1", c.Limit)
	case c.Burst < 0:
		return c, o, fmt.Errorf("-burst %d: want at least 1 (0: the limit)", c.Burst)
	}
	c.Mode = quota.Mode(mode)
	c.Algorithm = quota.Algorithm(algorithm)
	if explicit := false; c.Algorithm != quota.AlgorithmGCRA {
		fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "mode" })
		if !explicit {
			c.Mode = quota.ModeExact
		}
	}
	c.OnFailure = quota.OnFailure(onFailure)
	c.Seed = seed
	l, err := region.ParseLatency(latency)
	if err != nil {
		return c, o, fmt.Errorf("-latency: %w", err)
	}
	c.Latency = l
	if c.Faults, err = region.ParseFaults(faults); err != nil {
		return c, o, fmt.Errorf("-faults: %w", err)
	}
	if c.Rules, err = region.ParseRules(rules); err != nil {
		return c, o, fmt.Errorf("-rules: %w", err)
	}
	if slack >= 0 {
		if c.Nodes < 1 || c.Limit < 1 {
			return c, o, fmt.Errorf("-slack needs -nodes and -limit of at least 1")
		}
		// Slack(n) = ⌊a·L ÷ n⌋: the half token keeps the floor exact.
		c.Accuracy = (float64(slack) + 0.5) * float64(c.Nodes) / float64(c.Limit)
		if c.Accuracy > 0.5 {
			return c, o, fmt.Errorf("-slack %d: %d nodes × %d tokens is more than half the limit %d (accuracy is at most 0.5)", slack, c.Nodes, slack, c.Limit)
		}
	}
	if o.sweep == "" {
		if err := c.Validate(); err != nil {
			return c, o, err
		}
	}
	return c, o, nil
}
