package engine

import "math"

// A log-normal delay is Median·exp(Sigma·Z) truncated to whole
// nanoseconds, and math.Exp is the costliest part of a draw. expFast
// computes exp far faster with a relative error below 2⁻⁵⁰ (a table of
// 2^(j/64) and a short polynomial); LogNormal.Draw uses it only when the
// truncated delay cannot depend on that error (no whole nanosecond, and not
// the cap, lies within a margin of 2⁻³² of the delay) and calls math.Exp
// otherwise. The delays are therefore exactly math.Exp's, draw for draw
// (TestExpFastExact checks the error bound and the draws).

// expTableBits is log2 of the table size: the reduced argument is at most
// ln2/2⁷ in magnitude, where a degree-5 polynomial is accurate to 2⁻⁵⁷.
const expTableBits = 6

// expTable[j] is 2^(j/64).
var expTable = func() (t [1 << expTableBits]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / (1 << expTableBits))
	}
	return t
}()

const (
	// ln2Hi + ln2Lo = ln 2 (fdlibm's split: ln2Hi has 32 trailing zero
	// bits, so k·ln2Hi/64 is exact for the |k| < 2²⁰ used here).
	ln2Hi = 6.93147180369123816490e-01
	ln2Lo = 1.90821492927058770002e-10
	// expMaxArg bounds the arguments expFast takes; beyond it, math.Exp.
	expMaxArg = 700
)

// expFast returns e^x for |x| ≤ expMaxArg with a relative error below 2⁻⁵⁰.
func expFast(x float64) float64 {
	const n = 1 << expTableBits
	// k is x·n/ln2 rounded to an integer by the add-and-subtract of
	// 1.5·2⁵² (to nearest, ties to even; exact for |x·n/ln2| < 2⁵¹):
	// cheaper than math.Round, and any integer within ½ of it will do.
	const shifter = 0x1.8p52
	kf := (x*(n/math.Ln2) + shifter) - shifter
	k := int64(kf)
	r := (x - kf*(ln2Hi/n)) - kf*(ln2Lo/n)
	// e^r for |r| ≤ ln2/128: Taylor to r⁵ (the next term is below 2⁻⁵⁷).
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120)))))
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
