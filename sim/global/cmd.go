package global

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Main is `go run ./sim -global [flags]`: args are the flags after
// -global. It returns the exit code: 0 ok, 1 a check broken, 2 bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	var (
		c                         Config
		latency, faults, schedule string
		sweep                     string
		doorman                   bool
	)
	fs := flag.NewFlagSet("sim -global", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Regions, "regions", 3, "regions r0, r1, ... (2 to 24)")
	fs.Int64Var(&c.Limit, "limit", 200, "the global limit L: tokens per window")
	fs.DurationVar(&c.Window, "window", time.Second, "the rule's window W")
	fs.Int64Var(&c.Burst, "burst", 0, "the global burst B (0: L ÷ 10, at least regions × cost)")
	fs.Int64Var(&c.Cost, "cost", 1, "tokens per request")
	fs.Float64Var(&c.Accuracy, "accuracy", 0.05, "in-region accuracy a: each region's slack is ⌊a·share⌋")
	fs.IntVar(&c.IDs, "ids", 1, "global identities")
	fs.DurationVar(&c.Refresh, "refresh", time.Second, "how often each region reports")
	fs.DurationVar(&c.Lease, "lease", 10*time.Second, "lease duration")
	fs.DurationVar(&c.MaxSkew, "max-skew", 500*time.Millisecond, "the machine's skew margin")
	fs.DurationVar(&c.Skew, "skew", 200*time.Millisecond, "spread of the clocks (each off by up to half of it; at most -max-skew)")
	fs.DurationVar(&c.Tick, "tick", time.Second, "how often the leader proposes Tick")
	fs.DurationVar(&c.Sync, "sync", 100*time.Millisecond, "in-region sync: slack spend is charged this often")
	fs.DurationVar(&c.Election, "election", 2*time.Second, "time from a leader crash to the new leader's takeover")
	fs.DurationVar(&c.Commit, "commit", 80*time.Millisecond, "time from a report's arrival to its reply (a Raft commit)")
	fs.StringVar(&latency, "latency", "lognormal:40ms:0.3", "one-way cross-region latency: const:D, uniform:D1:D2 or lognormal:MEDIAN:SIGMA")
	fs.StringVar(&c.Demand, "demand", DemandConstant, "demand: "+strings.Join(DemandKinds, ", "))
	fs.Float64Var(&c.Load, "load", 1.5, "offered demand per identity as a multiple of L")
	fs.DurationVar(&c.MoveEvery, "move-every", 20*time.Second, "demand move: how long demand stays in one region")
	fs.StringVar(&schedule, "schedule", "", "demand schedule: rates per region over time (see below)")
	fs.BoolVar(&c.Poisson, "poisson", false, "Poisson arrivals at the rates of demand constant, move or schedule (evenly spaced without)")
	fs.IntVar(&c.DoormanClients, "doorman-clients", 0, "demand doorman: clients per region (0: 45 ÷ regions)")
	fs.StringVar(&c.Fallback, "fallback", FallbackShare, "what a region enforces in fallback: share, open or closed")
	fs.StringVar(&faults, "faults", "none", "faults to inject (see below)")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "simulated time")
	fs.DurationVar(&c.Warmup, "warmup", 0, "start excluded from the averages (0: a lease)")
	fs.DurationVar(&c.Sample, "sample", time.Second, "how often Σ shares is sampled for its mean")
	fs.Uint64Var(&c.Seed, "seed", 1, "the run's random seed")
	fs.BoolVar(&c.Breakdown, "breakdown", false, "print where the capacity was over time: used, unused, granted but not delivered, awaiting acknowledgement, repayment or expiry, unallocated")
	fs.StringVar(&sweep, "sweep", "", `run a grid instead ("default" or a spec, see below)`)
	fs.Bool("quiet", false, "accepted for symmetry with the region simulator (the global one prints no progress)")
	fs.BoolVar(&doorman, "doorman", false, "run Doorman's scenario seven in weir's mappings and print the comparison")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: go run ./sim -global [flags]\n\nSimulates a global limit leased to regions by the lease group's state machine, and checks\nthe invariant, the machine's Check and the global envelope. Exit status 1 when one breaks.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\n%s\n\n%s\n\n%s\n", FaultSyntax, ScheduleSyntax, GridSyntax)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sim -global: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	l, err := ParseLatency(latency)
	if err != nil {
		return fail(fmt.Errorf("-latency: %w", err))
	}
	c.Latency = l
	if c.Faults, err = ParseFaults(faults); err != nil {
		return fail(fmt.Errorf("-faults: %w", err))
	}
	if schedule != "" {
		if c.Schedule, err = ParseSchedule(schedule); err != nil {
			return fail(fmt.Errorf("-schedule: %w", err))
		}
		if c.Demand == DemandConstant {
			c.Demand = DemandSchedule
		}
	}
	if doorman {
		return Doorman(c.Seed, stdout, stderr)
	}
	if sweep != "" {
		g, err := ParseGrid(sweep)
		if err != nil {
			return fail(err)
		}
		base := c
		if base.Duration == time.Minute && !flagSet(fs, "duration") {
			base.Duration = 50 * time.Second
		}
		res, err := Sweep(base, g, stdout, nil)
		if err != nil {
			return fail(err)
		}
		for _, r := range res {
			if !r.OK() {
				return 1
			}
		}
		return 0
	}
	res, err := Run(c)
	if err != nil {
		return fail(err)
	}
	res.Summary(stdout)
	if !res.OK() {
		fmt.Fprintf(stdout, "reproduce: go run ./sim %s\n", res.Config.Flags())
		return 1
	}
	return 0
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Doorman runs Doorman's scenario seven (DoormanConfig) in four ways (3 and
// 9 regions, Doorman's timings and weir's) and writes the comparison with
// Doorman's published figures. It returns the exit code.
func Doorman(seed uint64, stdout, stderr io.Writer) int {
	type col struct {
		name string
		res  *Result
	}
	var cols []col
	for _, regions := range []int{3, 9} {
		for _, dt := range []bool{true, false} {
			c := DoormanConfig(regions, dt, seed)
			r, err := Run(c)
			if err != nil {
				fmt.Fprintf(stderr, "sim -global -doorman: %v\n", err)
				return 2
			}
			t := "weir timings 1s/10s"
			if dt {
				t = "Doorman timings 8s/60s"
			}
			cols = append(cols, col{fmt.Sprintf("weir, %d regions, %s", regions, t), r})
		}
	}
	fmt.Fprintf(stdout, "Doorman scenario seven: 45 clients (3 regions × 3 data centres × 5), capacity 500/s, an hour, a mishap a minute (seed %d)\n\n", seed)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure\tDoorman (published)")
	for _, c := range cols {
		fmt.Fprintf(tw, "\t%s", c.name)
	}
	fmt.Fprintf(tw, "\n")
	row := func(name, doorman string, f func(r *Result) string) {
		fmt.Fprintf(tw, "%s\t%s", name, doorman)
		for _, c := range cols {
			fmt.Fprintf(tw, "\t%s", f(c.res))
		}
		fmt.Fprintf(tw, "\n")
	}
	pct := func(x float64) string { return fmt.Sprintf("%.2f%%", 100*x) }
	row("capacity handed out on average (Σ shares ÷ capacity)", "96.6%", func(r *Result) string { return pct(r.SharesMean) })
	row("peak Σ shares ÷ capacity", "106.05%", func(r *Result) string { return pct(r.SharesPeak) })
	row("admitted ÷ capacity per second, mean", "-", func(r *Result) string { return pct(r.WindowMean) })
	row("admitted ÷ capacity per second, worst", "-", func(r *Result) string { return pct(r.WindowWorst) })
	row("envelope: 1 + (B + a·L + fault term) ÷ L", "-", func(r *Result) string { return pct(1 + r.Bound/float64(r.Config.Limit)) })
	row("admitted ÷ min(demand, capacity) per second, mean", "-", func(r *Result) string { return pct(r.FillMean) })
	row("admitted ÷ min(demand, capacity) per second, worst", "-", func(r *Result) string { return pct(r.FillWorst) })
	row("mishaps: spikes / elections / outages", "-", func(r *Result) string {
		return fmt.Sprintf("%d / %d / %d", r.Spikes, r.Elections, r.Outages)
	})
	row("checks (invariant, Check, envelope)", "-", func(r *Result) string {
		if r.OK() {
			return "ok"
		}
		return fmt.Sprintf("%d VIOLATIONS", r.ViolationCount)
	})
	tw.Flush()
	code := 0
	for _, c := range cols {
		if !c.res.OK() {
			fmt.Fprintf(stdout, "\nVIOLATION in %s:\n  %s\n  reproduce: go run ./sim %s\n", c.name, strings.Join(c.res.Violations, "\n  "), c.res.Config.Flags())
			code = 1
		}
	}
	return code
}
