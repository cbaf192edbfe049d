package bucket

import (
	"math"
	"math/bits"
)

// Convert returns the TAT that carries a bucket of old, in state tat at now,
// over to the rule g: spend carries over as tokens, not as time.
//
// A bucket of old at now holds x = Burst − (tat−now)/T tokens (x may be
// negative: debt). Under g it holds x' = min(x + max(0, B'−B), B'): a raised
// burst adds its extra capacity (a full bucket stays full, a bucket that
// had spent s tokens has still spent s), a lowered one clamps the tokens to
// the new burst, and debt carries over as debt. The returned TAT is
// now + (B'−x')·T', rounded up to the nanosecond, so a converted bucket
// never holds more than x' tokens. A full bucket (tat <= now) stays full
// and is returned unchanged. The result saturates at math.MaxInt64.
//
// So a raised limit or burst never rejects a request that a bucket of g
// holding the same tokens would admit, and a lowered one never lets an
// identity spend more than it had.
func (g GCRA) Convert(old GCRA, tat TAT, now int64) TAT {
	used := int64(tat) - now
	if used <= 0 {
		return tat
	}
	if old.t == g.t && old.burst == g.burst {
		return tat
	}
	// Tokens lost to a lowered burst, in old-interval ns.
	if g.burst < old.burst {
		used -= (old.burst - g.burst) * old.t
		if used <= 0 {
			return TAT(now)
		}
	}
	// used' = ceil(used · T' / T), in 128 bits.
	hi, lo := bits.Mul64(uint64(used), uint64(g.t))
	if hi >= uint64(old.t) { // the quotient would not fit in 64 bits
		return TAT(math.MaxInt64)
	}
	q, r := bits.Div64(hi, lo, uint64(old.t))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return TAT(math.MaxInt64)
	}
	return TAT(satAdd(now, int64(q)))
}
