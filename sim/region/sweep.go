package region

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// Grid is a sweep: every combination of its dimensions is one run. An
// empty dimension keeps the base config's value.
type Grid struct {
	Nodes    []int
	Accuracy []float64
	Sync     []time.Duration
	Traffic  []string
	Faults   [][]Fault
	Mode     []quota.Mode
	Load     []float64
	Scheme   []string
	// Sketch is the sketch gating threshold θ (0: off); it applies to
	// shared rules only, exact runs stay ungated.
	Sketch []int64
	// KeyCap is the coordinators' key cap (0: the default).
	KeyCap []int
	// Track says whether shared rules spend blind ("blind", the
	// default) or keep an entry of every identity ("all":
	// cluster.RuleParams.TrackAll).
	Track []bool
	// Algorithm is the rule's algorithm ("": gcra); one other than gcra
	// runs in mode exact only (a shared combination is left out), and the
	// window algorithms without clock skews (Config.skipped).
	Algorithm []quota.Algorithm
}

// GridSyntax documents the sweep spec; -help prints it.
const GridSyntax = `A sweep spec is dimensions separated by ";", each NAME=VALUE,VALUE...
  nodes=3,5,10  accuracy=0.05,0.1  sync=20ms,100ms  traffic=uneven,saturate
  mode=shared,exact  load=2,3  scheme=fixed,demand  sketch=0,4 (θ; 0: off; shared rules only)
  keycap=0,50 (entries per rule per node; 0: the default)
  algorithm=gcra,fixed_window,sliding_window,sliding_log,leaky_bucket (other than gcra: exact
    mode only, and fixed_window and sliding_window without clock skews; other runs are left out)
  faults=[none][crash:n1@2s,restart:n1@4s]   (each fault spec in brackets)
"default" is the built-in grid (DefaultGrid).`

// ErrGridSpec is wrapped by every error ParseGrid returns.
var ErrGridSpec = errors.New("sweep spec")

// DefaultGrid is the built-in sweep: 3, 5 and 10 nodes; accuracy 5 % and
// 10 %; sync 20 ms and 100 ms; constant, uneven, onenode, saturate, bursty
// and zipf traffic; no fault, an owner crash and restart, a partition, 1 %
// loss, a graceful leave and join, and a clock step; fixed and
// demand-following slack.
func DefaultGrid() Grid {
	g, err := ParseGrid("nodes=3,5,10;accuracy=0.05,0.1;sync=20ms,100ms;traffic=constant,uneven,onenode,saturate,bursty,zipf;scheme=fixed,demand;" +
		"faults=[none][crash:n1@3s,restart:n1@6s][partition:n0@3s-5s][loss:0.01][leave:n1@3s,join:n1@6s][skew:n0:+200ms@3s]")
	if err != nil {
		panic(err)
	}
	return g
}

// ParseGrid parses a sweep spec (see GridSyntax).
func ParseGrid(spec string) (Grid, error) {
	var g Grid
	spec = strings.TrimSpace(spec)
	if spec == "default" {
		return DefaultGrid(), nil
	}
	dims, err := engine.SplitGrid(spec)
	if err != nil {
		return g, fmt.Errorf("%w: %w", ErrGridSpec, err)
	}
	for _, d := range dims {
		name := d.Name
		if name == "faults" {
			if !d.Bracketed {
				return g, fmt.Errorf("%w: faults=%q: want [SPEC][SPEC]...", ErrGridSpec, strings.Join(d.Values, ","))
			}
			for _, v := range d.Values {
				fs, err := ParseFaults(v)
				if err != nil {
					return g, fmt.Errorf("%w: %w", ErrGridSpec, err)
				}
				g.Faults = append(g.Faults, fs)
			}
			continue
		}
		for _, v := range d.Values {
			bad := func(err error) error { return fmt.Errorf("%w: %s=%q: %v", ErrGridSpec, name, v, err) }
			switch name {
			case "nodes":
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return g, bad(errors.New("want a positive integer"))
				}
				g.Nodes = append(g.Nodes, n)
			case "accuracy":
				a, err := strconv.ParseFloat(v, 64)
				if err != nil || a <= 0 || a > 0.5 {
					return g, bad(errors.New("want a number in (0, 0.5]"))
				}
				g.Accuracy = append(g.Accuracy, a)
			case "sync":
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return g, bad(errors.New("want a positive duration"))
				}
				g.Sync = append(g.Sync, d)
			case "traffic":
				if !slices.Contains(TrafficKinds, v) {
					return g, bad(fmt.Errorf("want one of %s", strings.Join(TrafficKinds, ", ")))
				}
				g.Traffic = append(g.Traffic, v)
			case "mode":
				if v != string(quota.ModeShared) && v != string(quota.ModeExact) {
					return g, bad(errors.New("want shared or exact"))
				}
				g.Mode = append(g.Mode, quota.Mode(v))
			case "scheme":
				if v != "fixed" && v != "demand" {
					return g, bad(errors.New("want fixed or demand"))
				}
				g.Scheme = append(g.Scheme, v)
			case "load":
				l, err := strconv.ParseFloat(v, 64)
				if err != nil || l <= 0 {
					return g, bad(errors.New("want a positive number"))
				}
				g.Load = append(g.Load, l)
			case "sketch":
				th, err := strconv.ParseInt(v, 10, 64)
				if err != nil || th < 0 || th > quota.MaxSketchThreshold {
					return g, bad(fmt.Errorf("want an integer in [0, %d]", quota.MaxSketchThreshold))
				}
				g.Sketch = append(g.Sketch, th)
			case "algorithm":
				a := quota.Algorithm(v)
				if a != quota.AlgorithmGCRA && !slices.Contains(SimAlgorithms, a) {
					return g, bad(fmt.Errorf("want gcra or one of %v", SimAlgorithms))
				}
				g.Algorithm = append(g.Algorithm, a)
			case "track":
				if v != "blind" && v != "all" {
					return g, bad(errors.New("want blind or all"))
				}
				g.Track = append(g.Track, v == "all")
			case "keycap":
				k, err := strconv.Atoi(v)
				if err != nil || k < 0 {
					return g, bad(errors.New("want an integer >= 0"))
				}
				g.KeyCap = append(g.KeyCap, k)
			default:
				return g, fmt.Errorf("%w: unknown dimension %q (nodes, accuracy, sync, traffic, mode, load, scheme, sketch, keycap, algorithm, track, faults)", ErrGridSpec, name)
			}
		}
	}
	return g, nil
}

// Configs expands the grid over base. Run i gets seed base.Seed + i.
func (g Grid) Configs(base Config) []Config {
	var out []Config
	sizes := []int{len(g.Nodes), len(g.Accuracy), len(g.Sync), len(g.Traffic), len(g.Faults), len(g.Mode), len(g.Load), len(g.Scheme), len(g.Sketch), len(g.KeyCap), len(g.Algorithm), len(g.Track)}
	engine.Product(sizes, func(i []int) {
		cfg := base
		if len(g.Scheme) > 0 {
			cfg.Scheme = g.Scheme[i[7]]
		}
		if len(g.Nodes) > 0 {
			cfg.Nodes = g.Nodes[i[0]]
		}
		if len(g.Accuracy) > 0 {
			cfg.Accuracy = g.Accuracy[i[1]]
		}
		if len(g.Sync) > 0 {
			cfg.Sync = g.Sync[i[2]]
		}
		if len(g.Traffic) > 0 {
			cfg.Traffic = g.Traffic[i[3]]
		}
		if len(g.Faults) > 0 {
			cfg.Faults = g.Faults[i[4]]
		}
		if len(g.Mode) > 0 {
			cfg.Mode = g.Mode[i[5]]
		}
		if len(g.Load) > 0 {
			cfg.Load = g.Load[i[6]]
		}
		if len(g.Sketch) > 0 {
			cfg.Sketch = g.Sketch[i[8]]
		}
		if len(g.KeyCap) > 0 {
			cfg.KeyCap = g.KeyCap[i[9]]
		}
		if len(g.Algorithm) > 0 {
			cfg.Algorithm = g.Algorithm[i[10]]
		}
		if len(g.Track) > 0 {
			cfg.TrackAll = g.Track[i[11]]
		}
		if cfg.Mode == quota.ModeExact {
			cfg.Sketch = 0
		}
		if cfg.withDefaults().skipped() {
			return
		}
		cfg.Seed = base.Seed + uint64(len(out))
		out = append(out, cfg)
	})
	return out
}

// Sweep runs every config of the grid, writes one line per run to w, and
// returns the results. A run that breaks a bound is reported with the
// seed and the flags of `go run ./sim` that reproduce it; the caller
// decides what to do with it (the command exits non-zero). progress, when
// set, is called after every run.
func Sweep(base Config, g Grid, w io.Writer, progress func(done, total int)) ([]*Result, error) {
	cfgs := g.Configs(base)
	for i, c := range cfgs {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("sweep run %d (%s): %w", i, c.Flags(), err)
		}
	}
	// Gated sweeps get a sketch column (θ, and the measured sketch term
	// per aligned period against N·θ_eff); ungated ones print as before.
	gated := slices.ContainsFunc(cfgs, func(c Config) bool { return c.Sketch > 0 })
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	sk := ""
	if gated {
		sk = "sketch\tterm\tN·θ\t"
	}
	// Key cap sweeps get a column of evictions (idle/views/forgiven) and
	// the key cap term.
	capped := slices.ContainsFunc(cfgs, func(c Config) bool { return c.KeyCap > 0 })
	if capped {
		sk += "keycap\tevicted i/v/f\tmax term\t"
	}
	fmt.Fprintf(tw, "run\tnodes\tmode\tacc\tslack\tsync\ttraffic\tfaults\t%sS\texcess\tbound\tclean\tshortfall\tbound\ton_failure\tmsgs/s\tfwd\tok\t\n", sk)
	var out []*Result
	for i, c := range cfgs {
		r, err := Run(c)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		ok := "yes"
		if !r.OK() {
			ok = "NO"
		}
		sk := ""
		if gated {
			sk = fmt.Sprintf("%d\t%s\t%s\t", r.Config.Sketch, fmtTok(r.SketchPerPeriod), fmtTok(r.SketchBound()))
			if r.SketchN == 0 {
				sk = "0\t-\t-\t"
			}
		}
		if capped {
			st := &r.Coord
			sk += fmt.Sprintf("%d\t%d/%d/%d\t%s\t", r.Config.KeyCap, st.EvictedIdle, st.EvictedViews, st.EvictedForgiven, fmtTok(r.KeyCapTerm))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%g\t%s\t%v\t%s\t%s\t%s%d\t%s\t%s\t%s\t%s\t%s\t%d\t%.0f\t%d\t%s\t\n",
			i, r.Config.Nodes, r.Config.ruleKind(), r.Config.Accuracy, r.Config.Scheme, r.Config.Sync, r.Config.Traffic, shorten(FormatFaults(r.Config.Faults), 32),
			sk, r.S, fmtTok(r.ExcessAccounted), fmtTok(r.BoundAccounted), fmtTok(r.ExcessClean), fmtTok(r.Shortfall), fmtBound(r),
			r.Degraded, r.MessagesPerSecond(), r.Coord.Forwarded, ok)
		if progress != nil {
			progress(i+1, len(cfgs))
		}
	}
	tw.Flush()
	bad := 0
	for i, r := range out {
		if r.OK() {
			continue
		}
		bad++
		fmt.Fprintf(w, "\nVIOLATION in run %d (seed %d):\n  %s\n  reproduce: go run ./sim %s\n", i, r.Config.Seed,
			strings.Join(r.Violations, "\n  "), r.Config.Flags())
	}
	fmt.Fprintf(w, "\n%d runs, %d violations\n", len(out), bad)
	return out, nil
}

func fmtBound(r *Result) string {
	if math.IsNaN(r.Shortfall) {
		return "-"
	}
	return fmtTok(r.BoundShortfall)
}

func shorten(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
