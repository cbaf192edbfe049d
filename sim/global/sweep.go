package global

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir/sim/engine"
)

// Grid is a sweep: every combination of its dimensions is one run; an
// empty dimension keeps the base config's value.
type Grid struct {
	Regions []int
	Demand  []string
	Refresh []time.Duration
	Faults  [][]Fault
}

// GridSyntax documents -sweep.
const GridSyntax = `A sweep spec is dimensions separated by ";", each NAME=VALUE,VALUE...
  regions=2,3,5  demand=constant,move,bursty,poisson  refresh=500ms,1s
  faults=[none][partition:r1@5s-25s]   (each fault spec in brackets)
"default" is the built-in grid (DefaultGrid).`

// DefaultGrid is the built-in sweep: 2, 3 and 5 regions; constant,
// moving, bursty and Poisson demand; no fault, a region cut off for longer
// than a lease, a leader crash, 5 % message loss, and a cut and a crash
// together.
func DefaultGrid() Grid {
	g, err := ParseGrid("regions=2,3,5;demand=constant,move,bursty,poisson;" +
		"faults=[none][partition:r1@15s-35s][leader@15s][loss:0.05][partition:r0@12s-30s,leader@20s]")
	if err != nil {
		panic(err)
	}
	return g
}

// ParseGrid parses a sweep spec (GridSyntax).
func ParseGrid(spec string) (Grid, error) {
	var g Grid
	spec = strings.TrimSpace(spec)
	if spec == "default" {
		return DefaultGrid(), nil
	}
	dims, err := engine.SplitGrid(spec)
	if err != nil {
		return g, fmt.Errorf("sweep spec %w", err)
	}
	for _, d := range dims {
		name, vals := d.Name, strings.Join(d.Values, ",")
		if name == "faults" {
			if !d.Bracketed {
				return g, fmt.Errorf("sweep spec faults=%q: want [SPEC][SPEC]...", vals)
			}
			for _, v := range d.Values {
				fs, err := ParseFaults(v)
				if err != nil {
					return g, fmt.Errorf("sweep spec: %w", err)
				}
				g.Faults = append(g.Faults, fs)
			}
			continue
		}
		for _, v := range d.Values {
			switch name {
			case "regions":
				n, err := strconv.Atoi(v)
				if err != nil || n < 2 || n > 24 {
					return g, fmt.Errorf("sweep spec regions=%q: want 2 to 24", v)
				}
				g.Regions = append(g.Regions, n)
			case "demand":
				if !slices.Contains(DemandKinds, v) || v == DemandSchedule || v == DemandDoorman {
					return g, fmt.Errorf("sweep spec demand=%q: want constant, poisson, bursty or move", v)
				}
				g.Demand = append(g.Demand, v)
			case "refresh":
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return g, fmt.Errorf("sweep spec refresh=%q: want a positive duration", v)
				}
				g.Refresh = append(g.Refresh, d)
			default:
				return g, errors.New("sweep spec: unknown dimension " + strconv.Quote(name) + " (regions, demand, refresh, faults)")
			}
		}
	}
	return g, nil
}

// Configs expands the grid over base; run i gets seed base.Seed + i.
func (g Grid) Configs(base Config) []Config {
	var out []Config
	engine.Product([]int{len(g.Regions), len(g.Demand), len(g.Refresh), len(g.Faults)}, func(i []int) {
		cfg := base
		if len(g.Regions) > 0 {
			cfg.Regions = g.Regions[i[0]]
		}
		if len(g.Demand) > 0 {
			cfg.Demand = g.Demand[i[1]]
		}
		if len(g.Refresh) > 0 {
			cfg.Refresh = g.Refresh[i[2]]
		}
		if len(g.Faults) > 0 {
			cfg.Faults = g.Faults[i[3]]
		}
		cfg.Seed = base.Seed + uint64(len(out))
		out = append(out, cfg)
	})
	return out
}

// Sweep runs every config of the grid, writes one line per run and, for
// every run that broke a check, its violations and the flags that
// reproduce it. progress, when set, is called after each run.
func Sweep(base Config, g Grid, w io.Writer, progress func(done, total int)) ([]*Result, error) {
	cfgs := g.Configs(base)
	for i, c := range cfgs {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("sweep run %d (%s): %w", i, c.Flags(), err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\tregions\tdemand\trefresh\tfaults\tpeak Σshares\tmean Σshares\texcess\tbound\tfault term\twin mean\twin worst\tfollow med\tfollow max\tok\t\n")
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
		med, worst := r.FollowStats()
		fmt.Fprintf(tw, "%d\t%d\t%s\t%v\t%s\t%.1f%%\t%.1f%%\t%.1f\t%.1f\t%.1f\t%.1f%%\t%.1f%%\t%v\t%v\t%s\t\n", i, r.Config.Regions, r.Config.Demand,
			r.Config.Refresh, FormatFaults(r.Config.Faults), 100*r.SharesPeak, 100*r.SharesMean, r.Excess, r.Bound, r.FaultTerm,
			100*r.WindowMean, 100*r.WindowWorst, med, worst, ok)
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
