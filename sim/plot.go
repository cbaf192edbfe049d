package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/weir-dev/weir/sim/region"
)

// plotRun writes rate.svg: the cluster's admitted rate over time against
// the reference's, all identities together.
func plotRun(dir string, r *region.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("admitted rate: %d nodes, %s, %s traffic, faults %s", r.Config.Nodes, r.Config.Mode, r.Config.Traffic, region.FormatFaults(r.Config.Faults))
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = "tokens admitted per second"
	bin := r.Bin.Seconds()
	series := func(v []int64) plotter.XYs {
		n := min(len(v), int(math.Ceil(r.Config.Duration.Seconds()/bin)))
		xy := make(plotter.XYs, n)
		for i := range n {
			xy[i].X = float64(i) * bin
			xy[i].Y = float64(v[i]) / bin
		}
		return xy
	}
	ref, err := plotter.NewLine(series(r.Reference))
	if err != nil {
		return err
	}
	ref.Color = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	ref.Width = vg.Points(2)
	cl, err := plotter.NewLine(series(r.Cluster))
	if err != nil {
		return err
	}
	cl.Color = color.RGBA{R: 0xc0, G: 0x30, B: 0x20, A: 0xff}
	p.Add(ref, cl)
	p.Legend.Add("reference (one exact GCRA)", ref)
	p.Legend.Add("cluster", cl)
	p.Legend.Top = true
	return p.Save(10*vg.Inch, 4*vg.Inch, filepath.Join(dir, "rate.svg"))
}

// plotSweep writes excess.svg: each run's worst excess over B + r·Δ in
// fault-free intervals against its S = Σ sᵢ (N·s), with the line y = S.
func plotSweep(dir string, rs []*region.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "worst excess over B + r·Δ (fault-free intervals) against S = Σ sᵢ"
	p.X.Label.Text = "S (tokens)"
	p.Y.Label.Text = "worst excess (tokens)"
	var pts plotter.XYs
	maxS := 1.0
	for _, r := range rs {
		if math.IsInf(r.ExcessClean, 0) || math.IsNaN(r.ExcessClean) {
			continue
		}
		pts = append(pts, plotter.XY{X: float64(r.S), Y: r.ExcessClean})
		maxS = max(maxS, float64(r.S))
	}
	if len(pts) == 0 {
		return nil
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.Color = color.RGBA{R: 0x20, G: 0x50, B: 0xc0, A: 0xff}
	bound, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: maxS, Y: maxS}})
	if err != nil {
		return err
	}
	bound.Color = color.RGBA{R: 0xc0, G: 0x30, B: 0x20, A: 0xff}
	bound.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(sc, bound)
	p.Legend.Add("runs", sc)
	p.Legend.Add("bound: S", bound)
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(6*vg.Inch, 5*vg.Inch, filepath.Join(dir, "excess.svg"))
}
