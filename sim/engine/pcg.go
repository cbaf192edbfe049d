package engine

import (
	"math/bits"
	"math/rand/v2"
)

// PCG is a run's random source: math/rand/v2's PCG (the same state, the
// same stream), with the draws a run makes for every request and message
// (Float64, IntN, ExpFloat64, NormFloat64) as direct calls instead of
// calls through a *rand.Rand and its Source interface. Each returns
// exactly what the *rand.Rand method of that name returns from the same
// state, draw for draw, and leaves the same state behind; Std is such a
// *rand.Rand over the same state, for every other draw, so the two can be
// mixed freely (TestPCGExact).
//
// ExpFloat64 and NormFloat64 are ziggurat samplers that answer more than
// 99 % of draws from one uniform word and two small tables. PCG takes the
// fast path where its tables say the standard one would, and otherwise
// hands the word it drew to the standard sampler (replay), which then
// finishes the draw exactly as it would have. The tables are read out of
// the standard sampler itself (zigTables), so nothing is copied that could
// drift from it.
type PCG struct {
	hi, lo uint64
	std    *rand.Rand
	// replay is a *rand.Rand whose first Uint64 is a word PCG drew
	// already (pending), and whose later ones come from PCG's stream.
	replay  *rand.Rand
	pending uint64
	hasPend bool
}

// NewPCG returns the source rand.NewPCG(seed1, seed2) would be.
func NewPCG(seed1, seed2 uint64) *PCG {
	p := &PCG{hi: seed1, lo: seed2}
	p.std = rand.New(pcgSource{p})
	p.replay = rand.New(replaySource{p})
	return p
}

// Std returns a *rand.Rand that draws from p's state.
func (p *PCG) Std() *rand.Rand { return p.std }

// Uint64 returns the next word of the stream: rand.PCG.Uint64.
func (p *PCG) Uint64() uint64 {
	// math/rand/v2's arithmetic, unchanged: a 128-bit LCG step, then the
	// DXSM output function.
	const (
		mulHi    = 2549297995355413924
		mulLo    = 4865540595714422341
		incHi    = 6364136223846793005
		incLo    = 1442695040888963407
		cheapMul = 0xda942042e4dd58b5
	)
	hi, lo := bits.Mul64(p.lo, mulLo)
	hi += p.hi*mulLo + p.lo*mulHi
	lo, c := bits.Add64(lo, incLo, 0)
	hi, _ = bits.Add64(hi, incHi, c)
	p.lo, p.hi = lo, hi
	hi ^= hi >> 32
	hi *= cheapMul
	hi ^= hi >> 48
	hi *= lo | 1
	return hi
}

// Float64 returns a float64 in [0, 1): rand.Rand.Float64.
func (p *PCG) Float64() float64 {
	return float64(p.Uint64()<<11>>11) / (1 << 53)
}

// IntN returns an int in [0, n): rand.Rand.IntN. It panics if n <= 0.
func (p *PCG) IntN(n int) int {
	if n <= 0 {
		panic("engine: invalid argument to IntN")
	}
	if ^uint(0)>>32 == 0 {
		return p.std.IntN(n) // 32-bit platforms reduce another way
	}
	// rand.Rand.uint64n for a 64-bit n: Lemire's multiply, rejecting the
	// biased low products.
	m := uint64(n)
	if m&(m-1) == 0 {
		return int(p.Uint64() & (m - 1))
	}
	hi, lo := bits.Mul64(p.Uint64(), m)
	if lo < m {
		thresh := -m % m
		for lo < thresh {
			hi, lo = bits.Mul64(p.Uint64(), m)
		}
	}
	return int(hi)
}

// ExpFloat64 returns an exponentially distributed float64 of rate 1:
// rand.Rand.ExpFloat64.
func (p *PCG) ExpFloat64() float64 {
	u := p.Uint64()
	j, i := uint32(u), uint8(u>>32)
	if t := &zig.exp[i]; j < t.k {
		return float64(j) * t.w
	}
	return p.replayWith(u).ExpFloat64()
}

// NormFloat64 returns a standard normal float64: rand.Rand.NormFloat64.
func (p *PCG) NormFloat64() float64 {
	u := p.Uint64()
	j, i := int32(u), u>>32&0x7F
	a := uint32(j)
	if j < 0 {
		a = uint32(-j)
	}
	if t := &zig.norm[i]; a < t.k {
		return float64(j) * t.w
	}
	return p.replayWith(u).NormFloat64()
}

// replayWith returns the standard generator set to draw u first, then
// p's stream.
func (p *PCG) replayWith(u uint64) *rand.Rand {
	p.pending, p.hasPend = u, true
	return p.replay
}

// pcgSource is p as a rand.Source.
type pcgSource struct{ p *PCG }

func (s pcgSource) Uint64() uint64 { return s.p.Uint64() }

// replaySource yields p's pending word once, then p's stream.
type replaySource struct{ p *PCG }

func (s replaySource) Uint64() uint64 {
	if p := s.p; p.hasPend {
		p.hasPend = false
		return p.pending
	}
	return s.p.Uint64()
}

// zigCell is one strip of a ziggurat: a draw j with |j| < k returns
// float64(j)·w at once. k = 0 sends every draw of the strip the slow way.
type zigCell struct {
	k uint32
	w float64
}

// zigTab holds the cells of the standard samplers: 256 strips for
// ExpFloat64, 128 for NormFloat64.
type zigTab struct {
	exp  [256]zigCell
	norm [128]zigCell
}

// zig is the tables, read out of math/rand/v2 when the package starts
// (about 12 000 probing draws).
var zig = zigTables()

// probe is a rand.Source that yields one chosen word, then zeros (which
// end any slow path of the samplers at once), and counts the words taken.
type probe struct {
	first uint64
	n     int
}

func (pr *probe) Uint64() uint64 {
	pr.n++
	if pr.n == 1 {
		return pr.first
	}
	return 0
}

// zigTables reads the samplers' tables out of math/rand/v2: for strip i,
// a word with j = 1 returns w_i itself by the fast path (float64(1)·w),
// and k_i is the least j ≥ 0 that leaves it (a draw that takes more than
// one word), found by bisection. A strip whose fast path does not take
// j = 1 gets k = 0: all of its draws go the standard way.
func zigTables() zigTab {
	var t zigTab
	pr := &probe{}
	r := rand.New(pr)
	fast := func(u uint64, draw func() float64) (float64, bool) {
		pr.first, pr.n = u, 0
		x := draw()
		return x, pr.n == 1
	}
	// least returns the least j in [0, max] that is not fast (max + 1
	// when all are), for words built by word(j).
	least := func(max uint64, word func(j uint64) uint64, draw func() float64) uint64 {
		lo, hi := uint64(0), max+1
		for lo < hi {
			mid := lo + (hi-lo)/2
			if _, ok := fast(word(mid), draw); ok {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		return lo
	}
	for i := range uint64(256) {
		word := func(j uint64) uint64 { return i<<32 | j }
		w, ok := fast(word(1), r.ExpFloat64)
		if !ok {
			continue
		}
		// The fast path is j < ke[i]: monotone in j, so bisection finds
		// ke[i] (capped at 2³² − 1, which no uint32 j reaches).
		k := least(1<<32-2, word, r.ExpFloat64)
		t.exp[i] = zigCell{k: uint32(k), w: w}
	}
	for i := range uint64(128) {
		word := func(j uint64) uint64 { return i<<32 | j }
		w, ok := fast(word(1), r.NormFloat64)
		if !ok {
			continue
		}
		// The fast path is |j| < kn[i], j an int32: bisect over
		// j ≥ 0 up to 2³¹ − 1. A k of 2³¹ would let j = −2³¹ through,
		// which the standard sampler takes only if kn[i] > 2³¹: cap at
		// 2³¹ − 1 so that such a j goes the standard way.
		k := least(1<<31-1, word, r.NormFloat64)
		t.norm[i] = zigCell{k: uint32(min(k, 1<<31-1)), w: w}
	}
	return t
}
