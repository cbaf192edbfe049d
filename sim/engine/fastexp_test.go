package engine

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestExpFastExact: expFast is within its stated error of math.Exp, and a
// log-normal draw through it is exactly the draw through math.Exp, for
// medians, sigmas and caps around the simulator's, on the same random
// streams.
func TestExpFastExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	for range 2_000_000 {
		x := (r.Float64()*2 - 1) * 20
		if e := math.Abs(expFast(x)/math.Exp(x) - 1); e > worst {
			worst = e
		}
	}
	if worst > 0x1p-36 {
		t.Fatalf("expFast: relative error %g, want ≤ 2⁻³⁶", worst)
	}
	for _, l := range []LogNormal{
		{Median: 200 * time.Microsecond, Sigma: 0.5},
		{Median: 40 * time.Millisecond, Sigma: 0.3},
		{Median: 400 * time.Microsecond, Sigma: 0.8, Cap: 2 * time.Millisecond},
		{Median: 3, Sigma: 2, Cap: 7},
		{Median: 1000, Sigma: 0},
		{Median: 0, Sigma: 1},
	} {
		a := NewPCG(7, 9)
		b := rand.New(rand.NewPCG(7, 9))
		for i := range 1_000_000 {
			got := l.Draw(a)
			d := float64(l.Median) * math.Exp(l.Sigma*b.NormFloat64())
			if l.Cap > 0 && d > float64(l.Cap) {
				d = float64(l.Cap)
			}
			if want := int64(d); got != want {
				t.Fatalf("%v draw %d: %d, math.Exp gives %d", l, i, got, want)
			}
		}
	}
	// Exact integers and the cap itself at the boundary take the exact
	// path and still agree.
	for _, x := range []float64{0, math.Ln2, -math.Ln2, 1e-300, 699.9, -699.9, 800, -800} {
		for _, med := range []float64{1, 1000, 1 << 20} {
			for _, cp := range []float64{0, med, 2 * med} {
				d := med * math.Exp(x)
				if cp > 0 && d > cp {
					d = cp
				}
				if got, want := lognormalNS(med, x, cp), int64(d); got != want {
					t.Fatalf("lognormalNS(%g, %g, %g) = %d, want %d", med, x, cp, got, want)
				}
			}
		}
	}
}

// BenchmarkLogNormal: a draw through the fast exp against one through
// math.Exp (the reference), in the same run.
func BenchmarkLogNormal(b *testing.B) {
	l := LogNormal{Median: 200 * time.Microsecond, Sigma: 0.5}
	b.Run("fast", func(b *testing.B) {
		r := NewPCG(1, 2)
		var s int64
		for b.Loop() {
			s += l.Draw(r)
		}
		_ = s
	})
	b.Run("math.Exp", func(b *testing.B) {
		r := rand.New(rand.NewPCG(1, 2))
		var s int64
		for b.Loop() {
			s += int64(float64(l.Median) * math.Exp(l.Sigma*r.NormFloat64()))
		}
		_ = s
	})
}
