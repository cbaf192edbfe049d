package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/region"
)

// writePlot writes svg to path, making its directory.
func writePlot(path string, svg []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, svg, 0o644)
}

// The plots' colours.
const (
	colAdmitted = "#c0392b"
	colRef      = "#7f8c8d"
	colBound    = "#1f3a93"
	colFallback = "#e67e22"
	colCrash    = "#b03a2e"
	colStart    = "#1e8449"
	colLeave    = "#a04000"
	colSkew     = "#7d3c98"
	fillTail    = "#fcf3cf"
	fillCut     = "#f5b7b1"
	fillLoss    = "#aed6f1"
)

// rateChart is the run's plot: the tokens admitted per second, bin by bin
// (Result.Bin), by the cluster and by the reference, the envelope's bound
// on each bin, the faults as marks and spans and the ring changes as ticks.
func rateChart(r *region.Result) *chart {
	c := r.Config
	bin := r.Bin
	n := int((c.Duration + bin - 1) / bin)
	steps := func(v func(b int) float64) [][2]float64 {
		pts := make([][2]float64, 0, 2*n)
		for b := range n {
			from, to := time.Duration(b)*bin, min(time.Duration(b+1)*bin, c.Duration)
			y := v(b) / (to - from).Seconds()
			pts = append(pts, [2]float64{from.Seconds(), y}, [2]float64{to.Seconds(), y})
		}
		return pts
	}
	at := func(v []int64) func(int) float64 {
		return func(b int) float64 {
			if b < len(v) {
				return float64(v[b])
			}
			return 0
		}
	}
	ch := &chart{xLabel: "simulated time (s)", xMin: 0, xMax: c.Duration.Seconds(),
		yLabel: fmt.Sprintf("tokens admitted per second (%s bins)", fmtDur(bin))}
	ch.title, ch.subtitle = rateTitle(r)
	if r.Bound != nil {
		ch.lines = append(ch.lines, chartLine{name: boundName(r), class: "bound", color: colBound, dash: "7 4", width: 1.8, rank: 2,
			pts: steps(func(b int) float64 { return r.Bound[b] })})
	}
	ch.lines = append(ch.lines,
		chartLine{name: refName(c), class: "reference", color: colRef, width: 4, rank: 1, pts: steps(at(r.Reference))},
		chartLine{name: "admitted by the cluster", class: "admitted", color: colAdmitted, width: 1.8, pts: steps(at(r.Cluster))})
	if r.DegradedAdmitted > 0 {
		ch.lines = append(ch.lines, chartLine{name: "of which on_failure admitted (owner unreachable)", class: "fallback",
			color: colFallback, width: 1.5, rank: 3, pts: steps(at(r.Fallback))})
	}
	ch.scale()
	ch.addFaults(r)
	return ch
}

// scale sets the y axis to the highest value drawn; when the bound (loose
// in a fault's stretch) rises far above the rest, the axis ends well above
// the rest instead, so that admitted and reference stay readable, and a
// note at the first stretch the bound leaves the scale gives its peak.
func (ch *chart) scale() {
	rest, bound := 0.0, 0.0
	var boundLine *chartLine
	for i, l := range ch.lines {
		for _, p := range l.pts {
			if l.class == "bound" {
				bound = max(bound, p[1])
			} else {
				rest = max(rest, p[1])
			}
		}
		if l.class == "bound" {
			boundLine = &ch.lines[i]
		}
	}
	ch.yMax = max(rest, bound) * 1.08
	if boundLine != nil && bound > 2.5*rest && rest > 0 {
		ch.yMax = 1.6 * rest
		for _, p := range boundLine.pts {
			if p[1] > ch.yMax {
				ch.notes = append(ch.notes, chartNote{x: p[0], y: ch.yMax,
					text: fmt.Sprintf("bound above the scale here, up to %.0f per second", bound)})
				break
			}
		}
	}
	ch.yMax = max(ch.yMax, 1)
}

func refName(c region.Config) string {
	switch {
	case len(c.Rules) > 0:
		return "reference: the request policy over exact limiters"
	case c.Algorithm == quota.AlgorithmGCRA || c.Algorithm == quota.AlgorithmTokenBucket:
		return "reference: one exact limiter (GCRA) per identity"
	}
	return fmt.Sprintf("reference: one exact %s per identity", c.Algorithm)
}

func boundName(r *region.Result) string {
	lag := fmtDur(r.BoundLag.Round(10 * time.Millisecond))
	if r.Config.IDs > 1 {
		return fmt.Sprintf("bound: B + r·Δ + S per identity, or what it asked for in the bin and the %s before if less, summed", lag)
	}
	return fmt.Sprintf("bound: B + r·Δ + S, or what was asked for in the bin and the %s before if less", lag)
}

// rateTitle is the rate plot's title and subtitle: what ran, and what the
// checks found.
func rateTitle(r *region.Result) ([]string, []string) {
	c := r.Config
	ids := "1 identity"
	if c.IDs > 1 {
		ids = fmt.Sprintf("%d identities", c.IDs)
	}
	mode := string(c.Mode) + " mode"
	if c.Algorithm != quota.AlgorithmGCRA {
		mode += ", " + string(c.Algorithm)
	}
	title := fmt.Sprintf("Tokens admitted per second: %d nodes, %s, %s traffic, %s", c.Nodes, mode, c.Traffic, ids)
	faults := "none"
	if len(c.Faults) > 0 {
		var items []string
		for _, f := range c.Faults {
			items = append(items, f.Text)
		}
		faults = strings.Join(items, ", ")
	}
	rule := fmt.Sprintf("Rule %d per %s, burst B = %d; slack S = %d tokens; faults: %s; seed %d.",
		c.Limit, fmtDur(c.Window), c.Burst, r.S, faults, c.Seed)
	verdict := "Within the envelope."
	if !r.OK() {
		verdict = "A bound was broken: see the run's output."
	}
	what := "Worst excess over B + r·Δ"
	if r.Bound == nil {
		what = fmt.Sprintf("Admitted that one %s fed them refuses", c.Algorithm)
	}
	found := fmt.Sprintf("%s: %.2f of %.2f tokens over the run, %.2f of S = %d in fault-free stretches. %s",
		what, r.ExcessAccounted, r.BoundAccounted, r.ExcessClean, r.S, verdict)
	if math.IsInf(r.ExcessClean, 0) {
		found = fmt.Sprintf("%s: %.2f of %.2f tokens over the run (no fault-free stretch). %s",
			what, r.ExcessAccounted, r.BoundAccounted, verdict)
	}
	return []string{title}, []string{rule, found}
}

// addFaults marks the run's faults: a dashed line at each crash, restart,
// join, leave and clock step; a shaded span for each partition and window
// of loss; the stretches that are not fault-free (a fault and its tail,
// where the bound has the fault terms) lightly; a tick at each ring a node
// installed.
func (ch *chart) addFaults(r *region.Result) {
	c := r.Config
	end := c.Duration
	tail := "a fault and its tail: the bound adds the fault terms"
	if r.Bound == nil {
		tail = "a fault and its tail"
	}
	at := time.Duration(0)
	for _, s := range r.FaultFree {
		if s.From > at {
			ch.spans = append(ch.spans, chartSpan{from: at.Seconds(), to: min(s.From, end).Seconds(), fill: fillTail,
				class: "tail", name: tail})
		}
		at = max(at, s.To)
	}
	if at < end {
		ch.spans = append(ch.spans, chartSpan{from: at.Seconds(), to: end.Seconds(), fill: fillTail, class: "tail", name: tail})
	}
	for _, f := range c.Faults {
		x := f.At.Seconds()
		switch f.Kind {
		case region.FaultCrash:
			ch.marks = append(ch.marks, chartMark{x: x, label: "crash " + f.Node, color: colCrash})
		case region.FaultRestart, region.FaultJoin:
			ch.marks = append(ch.marks, chartMark{x: x, label: f.Kind.String() + " " + f.Node, color: colStart})
		case region.FaultLeave:
			ch.marks = append(ch.marks, chartMark{x: x, label: "leave " + f.Node, color: colLeave})
		case region.FaultSkew:
			if f.Windowed {
				ch.marks = append(ch.marks, chartMark{x: x, label: fmt.Sprintf("clock %s %s%s", f.Node, map[bool]string{true: "+"}[f.Skew >= 0], fmtDur(f.Skew)), color: colSkew})
			}
		case region.FaultPartition:
			ch.spans = append(ch.spans, chartSpan{from: x, to: min(f.End, end).Seconds(), fill: fillCut, class: "fault partition",
				label: "partition " + partitionText(f), name: "partition (healed at its end)"})
		case region.FaultLoss:
			if f.Windowed {
				ch.spans = append(ch.spans, chartSpan{from: x, to: min(f.End, end).Seconds(), fill: fillLoss, class: "fault loss",
					label: fmt.Sprintf("loss %g%%", f.Loss*100), name: "message loss"})
			}
		}
	}
	for _, rc := range r.Rings {
		if rc.At <= end {
			ch.ticks = append(ch.ticks, rc.At.Seconds())
		}
	}
	ch.tickName = "a node installs a new ring"
}

// partitionText names a partition's sides: "n0,n1 | the rest".
func partitionText(f region.Fault) string {
	var sides []string
	for _, g := range f.Groups {
		sides = append(sides, strings.Join(g, ","))
	}
	return strings.Join(append(sides, "rest"), " | ")
}

// sweepChart is the sweep's plot: each run's worst excess over B + r·Δ in
// fault-free intervals against its S, with the bound y = S.
func sweepChart(rs []*region.Result) *chart {
	ch := &chart{
		title:  []string{"Worst excess over B + r·Δ in fault-free intervals, against the slack S = Σ sᵢ"},
		xLabel: "S = Σ sᵢ: the region's slack (tokens)", yLabel: "worst excess in fault-free intervals (tokens)"}
	var in, over [][2]float64
	maxS, lo, hi := 1.0, 0.0, 1.0
	for _, r := range rs {
		if math.IsInf(r.ExcessClean, 0) || math.IsNaN(r.ExcessClean) {
			continue
		}
		p := [2]float64{float64(r.S), r.ExcessClean}
		if r.ExcessClean > float64(r.S)+1e-6 {
			over = append(over, p)
		} else {
			in = append(in, p)
		}
		maxS, lo, hi = max(maxS, p[0]), min(lo, p[1]), max(hi, p[1])
	}
	runs := fmt.Sprintf("One point per run, %d runs.", len(rs))
	if k := len(in) + len(over); k < len(rs) {
		runs = fmt.Sprintf("One point per run with a fault-free stretch, %d of %d runs.", k, len(rs))
	}
	ch.subtitle = []string{runs + " The envelope holds while a point is on or under the line."}
	ch.xMax = maxS * 1.05
	ch.yMin, ch.yMax = lo-0.05*(max(hi, maxS)-lo), max(hi, maxS)*1.08
	ch.lines = []chartLine{{name: "bound: excess = S", class: "bound", color: colBound, dash: "7 4", width: 1.8,
		pts: [][2]float64{{0, 0}, {maxS, maxS}}}}
	ch.dots = []chartDots{{name: "a run's worst excess", class: "runs", color: "#2e86c1", pts: in}}
	if len(over) > 0 {
		ch.dots = append(ch.dots, chartDots{name: "a run over its bound", class: "over", color: colAdmitted, pts: over})
	}
	return ch
}

// fmtDur writes d as Go does, without the zero units it ends in: 1m, not
// 1m0s.
func fmtDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
