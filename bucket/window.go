package bucket

import (
	"fmt"
	"math/bits"
	"time"
)

// FixedState is the state of one fixed-window counter: the end of the window
// it counts (ns) and the tokens admitted in it. The zero value (or any state
// with End <= now) is an empty window, which equals no entry.
type FixedState struct {
	End   int64
	Count int64
}

// Idle reports whether the window has ended (or counts nothing) at now.
func (s *FixedState) Idle(now int64) bool { return s.End <= now || s.Count == 0 }

// FixedWindow admits at most Limit tokens per window, windows aligned to
// multiples of the window length on the caller's clock: window k is
// [k·W, (k+1)·W). Reset is the time until the window ends.
//
// Boundary effect: the count restarts at each boundary, so up to 2× the
// limit can pass within a stretch shorter than one window: Limit tokens just
// before a boundary and Limit more just after it (with limit 10 per minute,
// 10 at 0:59.9 and 10 at 1:00.0 pass, 20 within 100 ms). Use GCRA or
// SlidingLog when that matters.
//
// Counting. By default only admitted tokens are counted: a rejected
// request leaves the window as it was, so a smaller one may pass after it.
// CountingRejected returns the variant that counts every request's tokens,
// admitted or not, as envoyproxy/ratelimit's Redis counter does (INCRBY,
// then compare): a request of cost c passes iff Count + c <= Limit after
// Count was raised by c either way, so once a rejection pushed Count past
// Limit nothing passes, not even a cost-0 look, until the window ends, and a
// rejection's Remaining is 0. That variant admits at most Limit per window
// too, and never more than the default; under overload it admits less
// (docs/overshoot.md).
//
// Edge cases: cost 0 is a peek; a negative cost is treated as 0; cost >
// Limit is rejected with RetryAfter Never (and counted by the counting
// variant). If now goes backwards into an earlier window than the state's,
// the request counts against the state's (later) window: conservative,
// never over-admitting. The zero FixedWindow is not valid; use
// NewFixedWindow. Immutable, safe for concurrent use.
type FixedWindow struct {
	limit int64
	w     int64
	// countRejected: rejected tokens are counted too (CountingRejected).
	countRejected bool
}

// NewFixedWindow returns a FixedWindow of limit tokens per window. It
// returns an error naming the bad parameter if limit < 1 or window <= 0.
func NewFixedWindow(limit int64, window time.Duration) (FixedWindow, error) {
	if limit < 1 {
		return FixedWindow{}, fmt.Errorf("bucket: fixed window limit %d: must be >= 1", limit)
	}
	if window <= 0 {
		return FixedWindow{}, fmt.Errorf("bucket: fixed window window %v: must be > 0", window)
	}
	return FixedWindow{limit: limit, w: int64(window)}, nil
}

// CountingRejected returns f counting every request's tokens, admitted or
// not (see FixedWindow). f itself is unchanged.
func (f FixedWindow) CountingRejected() FixedWindow {
	f.countRejected = true
	return f
}

// CountsRejected reports whether f counts rejected tokens too.
func (f FixedWindow) CountsRejected() bool { return f.countRejected }

// Step decides a request of cost tokens at now, counting it when admitted
// (or always, under CountingRejected).
func (f *FixedWindow) Step(s *FixedState, now, cost int64) Decision {
	st := f.current(*s, now)
	d := f.decide(st, now, cost)
	switch {
	case cost <= 0:
	case d.Allowed:
		st.Count += cost
		*s = st
		d.Remaining = f.limit - st.Count
	case f.countRejected:
		st.Count = satAdd(st.Count, cost)
		*s = st
		d.Remaining = 0
	}
	return d
}

// Peek reports what Step with cost 0 would, changing nothing.
func (f *FixedWindow) Peek(s FixedState, now int64) Decision {
	return f.decide(f.current(s, now), now, 0)
}

// current is the state rolled forward to the window containing now.
func (f *FixedWindow) current(s FixedState, now int64) FixedState {
	if s.End > now && s.Count > 0 {
		return s
	}
	start := floorDiv(now, f.w) * f.w
	return FixedState{End: start + f.w}
}

func (f *FixedWindow) decide(s FixedState, now, cost int64) Decision {
	cost = max(cost, 0)
	d := Decision{Limit: f.limit, Remaining: max(f.limit-s.Count, 0), Reset: time.Duration(s.End - now)}
	switch {
	case cost > f.limit:
		d.RetryAfter = Never
	case s.Count+cost > f.limit:
		d.RetryAfter = time.Duration(s.End - now)
	default:
		d.Allowed = true
	}
	return d
}

// SlidingState is the state of one sliding-window counter: the current
// aligned window [Start, End), the tokens admitted in it (Cur) and in the
// window before it (Prev). The zero value equals no entry; so does any state
// at now >= End + (End − Start), when both windows are out of view.
type SlidingState struct {
	Start, End int64
	Prev, Cur  int64
}

// Idle reports whether nothing the state counts is in view at now.
func (s *SlidingState) Idle(now int64) bool {
	return (s.Prev == 0 && s.Cur == 0) || now >= s.End+(s.End-s.Start)
}

// SlidingWindow is the sliding window counter: windows aligned as in
// FixedWindow, and at elapsed time e into the current window the estimate of
// the tokens in the last W is
//
//	est = Prev·(W − e)/W + Cur
//
// A request of cost c passes iff est + c <= Limit, computed exactly in
// integers (Prev·(W−e)/W is rounded up, which decides identically since the
// other terms are integers).
//
// Error bound, over-admission. Any interval I = [t, t+W) meets at most two
// aligned windows, k−1 and k, split at a boundary b. Let P be window k−1's
// total. Tokens admitted in window k up to its last admission τ in I satisfy
// Cur <= L − ⌈P·(W−e_τ)/W⌉ with W − e_τ > b − t, so I holds at most
//
//	L + P − ⌈P·(b−t)/W⌉  <=  2L − 1   (for P >= 1; at most L when P = 0)
//
// tokens. The worst case is real: window k−1's L tokens all arrive just
// before b and window k's just before its end: nearly 2× the limit within
// one window length. The excess never accumulates: over an interval of n·W
// it is still below L.
//
// Error bound, under-admission. Relative to an exact sliding log the
// estimate counts window k−1's tokens as if spread evenly, so at elapsed e it
// can reject a request an exact log would admit, by up to ⌈P·(W−e)/W⌉ tokens
// (up to L right after a boundary, when window k−1's traffic came early).
// A client that retries when RetryAfter says is still admitted at least
// L − c tokens in every aligned window it keeps sending in.
//
// Edge cases: cost 0 is a peek; negative cost counts as 0; cost > Limit is
// rejected with RetryAfter Never; a clock going backwards counts against the
// state's current window (e clamped to 0, conservative). Immutable, safe for
// concurrent use; use NewSlidingWindow.
type SlidingWindow struct {
	limit int64
	w     int64
}

// NewSlidingWindow returns a SlidingWindow of limit tokens per window. It
// returns an error naming the bad parameter if limit < 1 or window <= 0.
func NewSlidingWindow(limit int64, window time.Duration) (SlidingWindow, error) {
	if limit < 1 {
		return SlidingWindow{}, fmt.Errorf("bucket: sliding window limit %d: must be >= 1", limit)
	}
	if window <= 0 {
		return SlidingWindow{}, fmt.Errorf("bucket: sliding window window %v: must be > 0", window)
	}
	return SlidingWindow{limit: limit, w: int64(window)}, nil
}

// Step decides a request of cost tokens at now, counting it when admitted.
func (sw *SlidingWindow) Step(s *SlidingState, now, cost int64) Decision {
	st := sw.current(*s, now)
	d := sw.decide(st, now, cost)
	if d.Allowed && cost > 0 {
		st.Cur += cost
		*s = st
		d.Remaining = max(sw.limit-sw.weighted(st, now)-st.Cur, 0)
		d.Reset = time.Duration(st.End + sw.w - now)
	}
	return d
}

// Peek reports what Step with cost 0 would, changing nothing.
func (sw *SlidingWindow) Peek(s SlidingState, now int64) Decision {
	return sw.decide(sw.current(s, now), now, 0)
}

// current rolls the state to the window containing now (or keeps it when
// now went back before its start).
func (sw *SlidingWindow) current(s SlidingState, now int64) SlidingState {
	if s.Prev == 0 && s.Cur == 0 {
		start := floorDiv(now, sw.w) * sw.w
		return SlidingState{Start: start, End: start + sw.w}
	}
	if now < s.End {
		return s
	}
	if now < s.End+sw.w {
		// The next window: for an aligned state the one containing now. (A
		// state carried over from another window length by Convert is not
		// aligned; its windows follow on from it.)
		return SlidingState{Start: s.End, End: s.End + sw.w, Prev: s.Cur}
	}
	start := floorDiv(now, sw.w) * sw.w
	return SlidingState{Start: start, End: start + sw.w}
}

// weighted is ⌈Prev·(W−e)/W⌉ with e = now − Start clamped to [0, W].
func (sw *SlidingWindow) weighted(s SlidingState, now int64) int64 {
	if s.Prev == 0 {
		return 0
	}
	e := min(max(now-s.Start, 0), sw.w)
	hi, lo := bits.Mul64(uint64(s.Prev), uint64(sw.w-e))
	q, r := bits.Div64(hi, lo, uint64(sw.w)) // q <= Prev: no overflow
	if r != 0 {
		q++
	}
	return int64(q)
}

func (sw *SlidingWindow) decide(s SlidingState, now, cost int64) Decision {
	cost = max(cost, 0)
	pw := sw.weighted(s, now)
	d := Decision{Limit: sw.limit, Remaining: max(sw.limit-pw-s.Cur, 0)}
	switch {
	case s.Cur > 0:
		d.Reset = time.Duration(s.End + sw.w - now)
	case s.Prev > 0:
		d.Reset = time.Duration(s.End - now)
	}
	switch {
	case cost > sw.limit:
		d.RetryAfter = Never
	case pw+s.Cur+cost <= sw.limit:
		d.Allowed = true
	default:
		d.RetryAfter = time.Duration(sw.fitsAt(s, cost) - now)
	}
	return d
}

// fitsAt is the earliest time at which cost fits, for a rejected cost <=
// limit with no other traffic.
func (sw *SlidingWindow) fitsAt(s SlidingState, cost int64) int64 {
	room := sw.limit - s.Cur - cost
	if room >= 0 {
		// Within this window: Prev·(W−e) <= room·W ⟺ e >= W − ⌊room·W/Prev⌋.
		// Rejected now means room < Prev, so the quotient is below W.
		return s.Start + sw.w - mulDivFloor(room, sw.w, s.Prev)
	}
	// In the next window Prev' = Cur, Cur' = 0, room' = limit − cost >= 0.
	room = sw.limit - cost
	if s.Cur <= room {
		return s.End
	}
	return s.End + sw.w - mulDivFloor(room, sw.w, s.Cur)
}

// mulDivFloor is ⌊a·b/c⌋ for a, b >= 0, c > 0 with a < c.
func mulDivFloor(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// Limit returns the tokens a window admits.
func (f FixedWindow) Limit() int64 { return f.limit }

// Limit returns the tokens the last window may hold.
func (sw SlidingWindow) Limit() int64 { return sw.limit }
