package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPCGExact: PCG's draws, and those of its Std, are exactly the
// draws of a *rand.Rand over rand.NewPCG with the same seeds, in any mix,
// the ziggurats' slow paths included; and the tables read out of
// math/rand/v2 send most draws the fast way.
func TestPCGExact(t *testing.T) {
	for seed := range uint64(4) {
		p := NewPCG(seed, 0x9e3779b97f4a7c15)
		want := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		var slowNorm, slowExp int
		for i := range 400_000 {
			k := i % 9
			var got, exp float64
			switch k {
			case 0:
				got, exp = float64(p.Uint64()), float64(want.Uint64())
			case 1:
				got, exp = p.Float64(), want.Float64()
			case 2:
				n := 1 + int(want.Uint64()%1000) // the same n both sides
				p.Uint64()
				got, exp = float64(p.IntN(n)), float64(want.IntN(n))
			case 3:
				got, exp = float64(p.IntN(1<<20)), float64(want.IntN(1<<20)) // a power of two
			case 4:
				got, exp = float64(p.IntN(3<<61)), float64(want.IntN(3<<61)) // rejections are likely
			case 5, 6:
				peek := PCG{hi: p.hi, lo: p.lo} // the word the draw starts from
				u := peek.Uint64()
				j := int64(int32(u))
				if uint64(max(j, -j)) >= uint64(zig.norm[u>>32&0x7F].k) {
					slowNorm++
				}
				got, exp = p.NormFloat64(), want.NormFloat64()
			case 7:
				peek := PCG{hi: p.hi, lo: p.lo}
				if u := peek.Uint64(); uint32(u) >= zig.exp[uint8(u>>32)].k {
					slowExp++
				}
				got, exp = p.ExpFloat64(), want.ExpFloat64()
			default:
				got, exp = p.Std().NormFloat64(), want.NormFloat64()
			}
			if got != exp && !(math.IsNaN(got) && math.IsNaN(exp)) {
				t.Fatalf("seed %d draw %d (kind %d): %v, want %v", seed, i, k, got, exp)
			}
		}
		if slowNorm < 100 || slowExp < 10 {
			t.Errorf("seed %d: few slow paths taken (normal %d, exponential %d): the test misses them", seed, slowNorm, slowExp)
		}
	}
	fast := 0
	for i := range zig.norm {
		if zig.norm[i].k > 1<<30 {
			fast++
		}
	}
	for i := range zig.exp {
		if zig.exp[i].k > 1<<31 {
			fast++
		}
	}
	if fast < 300 {
		t.Fatalf("only %d of 384 strips have a wide fast path", fast)
	}
}

// BenchmarkDraws: the per-request draws through PCG against the same
// draws through *rand.Rand (the reference), in the same run.
func BenchmarkDraws(b *testing.B) {
	b.Run("PCG", func(b *testing.B) {
		p := NewPCG(1, 2)
		var s float64
		for b.Loop() {
			s += p.Float64() + float64(p.IntN(100)) + p.ExpFloat64() + p.NormFloat64()
		}
		_ = s
	})
	b.Run("rand.Rand", func(b *testing.B) {
		r := rand.New(rand.NewPCG(1, 2))
		var s float64
		for b.Loop() {
			s += r.Float64() + float64(r.IntN(100)) + r.ExpFloat64() + r.NormFloat64()
		}
		_ = s
	})
}
