package region

import (
	"math"

	"github.com/weir-dev/weir/sim/engine"
)

// zipf draws exactly what math/rand/v2's Zipf draws from the same source,
// value for value, but mostly without its exp and log: the standard
// generator's arithmetic is copied here unchanged (rejection-inversion,
// Hörmann and Derflinger), and a table in front of it answers most draws.
//
// Each loop of the standard generator turns one Float64 r into either a
// value k or a rejection, through x = hinv(ur(r)), which moves monotonically
// with r. The table splits [0, 1) into zipfCells equal cells and holds,
// for each, the k that the exact arithmetic gives at both ends of the cell
// when both ends give the same k, accept it by the first test (k − x ≤ s),
// and lie at least zipfMargin away from every boundary of these outcomes
// (x = k − 0.5, where the rounding changes k, and x = k − s, where the
// first test changes). Between the ends, x lies between the ends' values
// give or take a few ulps of rounding, which the margin covers many times
// over: every r in the cell gets that k from the exact arithmetic too.
// Other cells hold zipfNone and their draws run the exact arithmetic
// (as do values from zipfNone up, which the table does not hold).
type zipf struct {
	r            *engine.PCG
	imax         float64
	v            float64
	q            float64
	s            float64
	oneminusQ    float64
	oneminusQinv float64
	hxm          float64
	hx0minusHxm  float64
	cell         []uint16
}

// zipfCells is the number of cells of the table (a power of two, so that
// r·zipfCells is exact; 2¹⁴ cells of two bytes stay in a core's cache and
// answer 92 % of the draws of exponent 1.1 over 1 000 values), zipfMargin
// the distance a cell's ends keep from the outcome boundaries, zipfNone a
// cell's mark for "run the exact arithmetic".
const (
	zipfCells  = 1 << 14
	zipfMargin = 1e-6
	zipfNone   = math.MaxUint16
)

// newZipf returns a generator of the values rand.NewZipf(r.Std(), s, v,
// imax) generates, or nil where that returns nil.
func newZipf(r *engine.PCG, s, v float64, imax uint64) *zipf {
	if s <= 1.0 || v < 1 {
		return nil
	}
	z := &zipf{r: r, imax: float64(imax), v: v, q: s}
	z.oneminusQ = 1.0 - z.q
	z.oneminusQinv = 1.0 / z.oneminusQ
	z.hxm = z.h(z.imax + 0.5)
	z.hx0minusHxm = z.h(0.5) - math.Exp(math.Log(z.v)*(-z.q)) - z.hxm
	z.s = 1 - z.hinv(z.h(1.5)-math.Exp(-z.q*math.Log(z.v+1.0)))
	z.cell = make([]uint16, zipfCells)
	const ulp = 1.0 / (1 << 53) // Float64 returns multiples of it
	for i := range z.cell {
		lo, hi := float64(i)/zipfCells, float64(i+1)/zipfCells-ulp
		k, ok := z.sure(lo)
		if k2, ok2 := z.sure(hi); !ok || !ok2 || k2 != k {
			z.cell[i] = zipfNone
			continue
		}
		z.cell[i] = uint16(k)
	}
	return z
}

func (z *zipf) h(x float64) float64 {
	return math.Exp(z.oneminusQ*math.Log(z.v+x)) * z.oneminusQinv
}

func (z *zipf) hinv(x float64) float64 {
	return math.Exp(z.oneminusQinv*math.Log(z.oneminusQ*x)) - z.v
}

// sure returns the k one loop of the exact arithmetic gives for r, and
// whether it is accepted by the first test with zipfMargin to spare from
// both outcome boundaries.
func (z *zipf) sure(r float64) (float64, bool) {
	x := z.hinv(z.hxm + r*z.hx0minusHxm)
	k := math.Floor(x + 0.5)
	ok := k-x <= z.s-zipfMargin && // accepted, well inside
		x+0.5-k >= zipfMargin && k+0.5-x >= zipfMargin && // rounds to k, well inside
		k >= 0 && k <= z.imax && k < zipfNone
	return k, ok
}

// Uint64 returns the next value: the one rand.Zipf.Uint64 returns.
func (z *zipf) Uint64() uint64 {
	k := 0.0
	for {
		r := z.r.Float64() // r on [0,1)
		if c := z.cell[int(r*zipfCells)]; c != zipfNone {
			return uint64(c)
		}
		ur := z.hxm + r*z.hx0minusHxm
		x := z.hinv(ur)
		k = math.Floor(x + 0.5)
		if k-x <= z.s {
			break
		}
		if ur >= z.h(k+0.5)-math.Exp(-math.Log(k+z.v)*z.q) {
			break
		}
	}
	return uint64(k)
}
