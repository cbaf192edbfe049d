package engine

import "math"

// A log-normal delay is Median·exp(Sigma·Z) truncated to whole
// nanoseconds, and math.Exp is the costliest part of a draw. expFast
// computes exp far faster with a relative error below 2⁻³⁶ (a table of
// 2^(j/1024) and a quadratic); LogNormal.Draw uses it only when the
// truncated delay cannot depend on that error (no whole nanosecond, and not
// the cap, lies within a margin of 2⁻³² of the delay) and calls math.Exp
// otherwise. The delays are therefore exactly math.Exp's, draw for draw
// (TestExpFastExact checks the error bound and the draws).

// expTableBits is log2 of the table size: the reduced argument is at most
// ln2/2¹¹ in magnitude, where 1 + r + r²/2 is accurate to 2⁻³⁷ (r³/6),
// well inside the 2⁻³² margin lognormalNS allows. The table (8 KiB) costs
// less than the polynomial's higher terms did.
const expTableBits = 10

// expTable[j] is 2^(j/1024).
var expTable = func() (t [1 << expTableBits]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / (1 << expTableBits))
	}
	return t
}()

// expMaxArg bounds the arguments expFast takes; beyond it, math.Exp.
const expMaxArg = 700

// expFast returns e^x for |x| ≤ expMaxArg with a relative error below 2⁻³⁶.
func expFast(x float64) float64 {
	const n = 1 << expTableBits
	// k is x·n/ln2 rounded to an integer by the add-and-subtract of
	// 1.5·2⁵² (to nearest, ties to even; exact for |x·n/ln2| < 2⁵¹):
	// cheaper than math.Round, and any integer within ½ of it will do.
	const shifter = 0x1.8p52
	kf := (x*(n/math.Ln2) + shifter) - shifter
	k := int64(kf)
	// One step of reduction: its rounding errs by at most |x|·2⁻⁵² in r,
	// below 2⁻⁴² for |x| ≤ 700, which the bound above leaves room for
	// (no fdlibm split of ln 2 is needed at this accuracy).
	r := x - kf*(math.Ln2/n)
	// e^r for |r| ≤ ln2/2048: Taylor to r² (the next term is below 2⁻³⁷).
	p := 1 + r*(1+r*(1.0/2))
	j, m := k&(n-1), k>>expTableBits
	// 2^m as a float64 (m is within the normal exponent range for |x| ≤ 700).
	scale := math.Float64frombits(uint64(m+1023) << 52)
	return expTable[j] * p * scale
}

// lognormalNS returns int64(min(median·e^x, cap)) (cap ≤ 0: no cap) exactly
// as math.Exp would give it.
func lognormalNS(median, x, cap float64) int64 {
	if x > -expMaxArg && x < expMaxArg {
		d := median * expFast(x)
		margin := d * 0x1p-32
		lo, hi := d-margin, d+margin
		switch {
		case cap > 0 && lo > cap:
			return int64(cap)
		case cap > 0 && hi >= cap:
			// The cap is within the margin: decide exactly.
		case lo >= 0 && hi < 0x1p62 && int64(lo) == int64(hi):
			// Truncation, as int64(d) does it, gives one integer over
			// the whole margin (math.Floor(lo) == math.Floor(hi) for
			// these, without the calls; anything else is decided
			// exactly below).
			return int64(d)
		}
	}
	d := median * math.Exp(x)
	if cap > 0 && d > cap {
		d = cap
	}
	return int64(d)
}
