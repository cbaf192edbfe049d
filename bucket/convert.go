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

// ceilMulDiv is ⌈a·b/c⌉ for a, b >= 0, c > 0, saturating at math.MaxInt64.
func ceilMulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Spent returns the whole tokens a bucket in state tat has spent at now:
// ⌈(tat−now)/T⌉, so a token partly earned back still counts as spent (0
// for a full bucket; debt counts beyond Burst). It is what an algorithm
// change charges to the rule's new algorithm.
func (g GCRA) Spent(tat TAT, now int64) int64 {
	if int64(tat) <= now {
		return 0
	}
	return ceilMulDiv(int64(tat)-now, 1, g.t)
}

// Booked returns the state of a fresh bucket of g charged k tokens at now,
// k clamped to [0, Burst]: a state never holds more spend than the rule
// allows.
func (g GCRA) Booked(k, now int64) TAT {
	k = min(max(k, 0), g.burst)
	if k == 0 {
		return 0
	}
	return TAT(satAdd(now, k*g.t))
}

// Convert returns s, a window of old at now, carried over to the rule f:
// the count of the current window carries over and is read against f's
// limit (a count above it rejects until the window ends); the window keeps
// its start and ends at start + f's window length, so if that is already
// past at now the identity starts a fresh window (the zero state). An idle
// state at now converts to the zero state.
func (f FixedWindow) Convert(old FixedWindow, s FixedState, now int64) FixedState {
	if s.Idle(now) {
		return FixedState{}
	}
	end := satAdd(s.End-old.w, f.w)
	if end <= now {
		return FixedState{}
	}
	return FixedState{End: end, Count: s.Count}
}

// Spent returns the tokens counted in the window containing now (0 when the
// state's window has ended).
func (f FixedWindow) Spent(s FixedState, now int64) int64 {
	if s.Idle(now) {
		return 0
	}
	return s.Count
}

// Booked returns a fresh state of f charged k tokens at now in the aligned
// window containing now, k clamped to [0, Limit].
func (f FixedWindow) Booked(k, now int64) FixedState {
	k = min(max(k, 0), f.limit)
	if k == 0 {
		return FixedState{}
	}
	start := floorDiv(now, f.w) * f.w
	return FixedState{End: start + f.w, Count: k}
}

// Convert returns s, a sliding window of old at now, carried over to the
// rule sw. The state is first rolled to now under old; then its current
// window keeps its start and its count, and ends at start + sw's window
// length; the previous window's count carries too. From then on the counts
// are read against sw's length: at elapsed e into the current window the
// previous count weighs (W'−e)/W'. If the lengthened or shortened current
// window has already ended at now, it becomes the previous window of a new
// one that starts at its end (and if that one has ended too, the state is
// empty). Windows after a converted one follow on from it, not from the
// aligned grid, until the state empties.
func (sw SlidingWindow) Convert(old SlidingWindow, s SlidingState, now int64) SlidingState {
	if s.Idle(now) {
		return SlidingState{}
	}
	s = old.current(s, now)
	if s.Prev == 0 && s.Cur == 0 {
		return SlidingState{}
	}
	s.End = satAdd(s.Start, sw.w)
	if now >= s.End {
		if now >= satAdd(s.End, sw.w) || s.Cur == 0 {
			return SlidingState{}
		}
		s = SlidingState{Start: s.End, End: s.End + sw.w, Prev: s.Cur}
	}
	return s
}

// Spent returns the estimate of the tokens in the last window at now,
// ⌈Prev·(W−e)/W⌉ + Cur, the figure a request is decided against.
func (sw SlidingWindow) Spent(s SlidingState, now int64) int64 {
	if s.Idle(now) {
		return 0
	}
	s = sw.current(s, now)
	return sw.weighted(s, now) + s.Cur
}

// Booked returns a fresh state of sw charged k tokens at now in the aligned
// window containing now, k clamped to [0, Limit].
func (sw SlidingWindow) Booked(k, now int64) SlidingState {
	k = min(max(k, 0), sw.limit)
	if k == 0 {
		return SlidingState{}
	}
	start := floorDiv(now, sw.w) * sw.w
	return SlidingState{Start: start, End: start + sw.w, Cur: k}
}

// Convert carries s, a log of old at now, over to the rule l in place and
// returns it: the logged admissions carry with their times, first expired
// under old at now, and from then on expire by l's window (each leaves the
// window W' after it was admitted); a lowered limit counts them. The state
// shares its ring with every copy, as in Step.
func (l SlidingLog) Convert(old SlidingLog, s SlidingLogState, now int64) SlidingLogState {
	if s.Idle(now) {
		return SlidingLogState{}
	}
	old.expire(&s, now)
	if s.n == 0 {
		return SlidingLogState{}
	}
	last := s.ring[(s.head+s.n-1)%len(s.ring)]
	s.Until = satAdd(last.at, l.w)
	l.expire(&s, now)
	if s.n == 0 {
		return SlidingLogState{}
	}
	return s
}

// Spent returns the tokens logged in (now − W, now], all of them even when
// they are more than Limit (a log converted from a higher limit).
func (l SlidingLog) Spent(s SlidingLogState, now int64) int64 {
	if s.Idle(now) {
		return 0
	}
	var k int64
	for i := range s.n {
		if e := s.ring[(s.head+i)%len(s.ring)]; e.at > now-l.w {
			k += e.cost
		}
	}
	return k
}

// Booked returns a fresh log of l holding one admission of k tokens at now,
// k clamped to [0, Limit].
func (l SlidingLog) Booked(k, now int64) SlidingLogState {
	k = min(max(k, 0), l.limit)
	if k == 0 {
		return SlidingLogState{}
	}
	var s SlidingLogState
	l.Step(&s, now, k)
	return s
}

// Convert returns dep, a queue of old at now, carried over to the rule l as
// tokens: a queue of q = dep − now ns holds q/T tokens under old and the
// same tokens under l, ⌈q·T'/T⌉ ns, clamped to l's MaxDelay. An empty
// queue stays empty.
func (l Leaky) Convert(old Leaky, dep Departure, now int64) Departure {
	q := int64(dep) - now
	if q <= 0 {
		return dep
	}
	if old.t == l.t && q <= l.maxDelay {
		return dep
	}
	q = min(ceilMulDiv(q, l.t, old.t), l.maxDelay)
	if q <= 0 {
		return Departure(now)
	}
	return Departure(satAdd(now, q))
}

// Spent returns the whole tokens queued at now: ⌈(dep−now)/T⌉.
func (l Leaky) Spent(dep Departure, now int64) int64 {
	if int64(dep) <= now {
		return 0
	}
	return ceilMulDiv(int64(dep)-now, 1, l.t)
}

// Booked returns a fresh queue of l holding k tokens at now, k clamped to
// [0, Limit] (the queue's capacity in cost-1 positions).
func (l Leaky) Booked(k, now int64) Departure {
	k = min(max(k, 0), l.Limit())
	if k == 0 {
		return 0
	}
	return Departure(satAdd(now, k*l.t))
}

// Convert returns s, the slots in flight under old, carried over to the
// limit c: requests in flight stay in flight (their release still applies),
// and c's limit decides the next acquisition. It is s itself.
func (c Concurrency) Convert(old Concurrency, s Inflight) Inflight { return s }

// Convert returns s, a penalty box state of old, carried over to p: the
// rejection count and any current lockout carry as they are, and p's
// threshold, window and lockout lengths apply from the next decision. It is
// s itself.
func (p Penalty) Convert(old Penalty, s PenaltyState) PenaltyState { return s }
