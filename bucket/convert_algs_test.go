package bucket

import (
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Fixed window conversion against its definition: the count carries, the
// window keeps its start and takes the new length; an ended window is empty.
func TestFixedConvertMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ow := rapid.Int64Range(1, 1e6).Draw(t, "oldWindow")
		nw := rapid.Int64Range(1, 1e6).Draw(t, "newWindow")
		old, _ := NewFixedWindow(rapid.Int64Range(1, 100).Draw(t, "oldLimit"), time.Duration(ow))
		f, _ := NewFixedWindow(rapid.Int64Range(1, 100).Draw(t, "newLimit"), time.Duration(nw))
		var s FixedState
		at := rapid.Int64Range(0, 1e7).Draw(t, "at")
		old.Step(&s, at, rapid.Int64Range(1, old.limit).Draw(t, "cost"))
		now := at + rapid.Int64Range(0, 2*ow).Draw(t, "elapsed")
		got := f.Convert(old, s, now)
		start := s.End - ow
		switch {
		case s.End <= now || start+nw <= now:
			if got != (FixedState{}) {
				t.Fatalf("ended window converted to %+v", got)
			}
		default:
			if got != (FixedState{End: start + nw, Count: s.Count}) {
				t.Fatalf("got %+v from %+v (start %d)", got, s, start)
			}
			want := max(f.limit-s.Count, 0)
			if d := f.Peek(got, now); d.Remaining != want {
				t.Fatalf("remaining %d, want %d", d.Remaining, want)
			}
		}
	})
}

// A leaky queue carries as tokens: ⌈q·T'/T⌉ ns, clamped to the new max delay.
func TestLeakyConvertMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mk := func(name string) Leaky {
			l, err := NewLeaky(rapid.Int64Range(1, 1000).Draw(t, name+"limit"), time.Duration(rapid.Int64Range(1000, 1e12).Draw(t, name+"window")), time.Duration(rapid.Int64Range(0, 1e12).Draw(t, name+"maxDelay")))
			if err != nil {
				t.Skip(err)
			}
			return l
		}
		old, l := mk("old"), mk("new")
		now := rapid.Int64Range(0, 1e15).Draw(t, "now")
		q := rapid.Int64Range(-1e12, 1e13).Draw(t, "queue")
		got := int64(l.Convert(old, Departure(now+q), now)) - now
		if q <= 0 {
			if got != q {
				t.Fatalf("empty queue changed: %d → %d", q, got)
			}
			return
		}
		w := new(big.Int).Mul(big.NewInt(q), big.NewInt(l.t))
		w.Add(w, big.NewInt(old.t-1))
		w.Quo(w, big.NewInt(old.t))
		if w.Cmp(big.NewInt(l.maxDelay)) > 0 {
			w.SetInt64(l.maxDelay)
		}
		if got != w.Int64() {
			t.Fatalf("queue %d under T=%d into T'=%d max %d: %d, want %d", q, old.t, l.t, l.maxDelay, got, w.Int64())
		}
	})
}

// The sliding window's roll-over for aligned states is the aligned window
// containing now, as before states could be carried over from another
// window length.
func TestSlidingCurrentAligned(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.Int64Range(1, 1e6).Draw(t, "window")
		sw, _ := NewSlidingWindow(100, time.Duration(w))
		k := rapid.Int64Range(0, 1e6).Draw(t, "k")
		s := SlidingState{Start: k * w, End: (k + 1) * w, Prev: rapid.Int64Range(0, 100).Draw(t, "prev"), Cur: rapid.Int64Range(0, 100).Draw(t, "cur")}
		now := rapid.Int64Range(k*w, (k+4)*w).Draw(t, "now")
		got := sw.current(s, now)
		start := floorDiv(now, w) * w
		var want SlidingState
		switch {
		case s.Prev == 0 && s.Cur == 0:
			want = SlidingState{Start: start, End: start + w}
		case now < s.End:
			want = s
		case start == s.End:
			want = SlidingState{Start: start, End: start + w, Prev: s.Cur}
		default:
			want = SlidingState{Start: start, End: start + w}
		}
		if got != want {
			t.Fatalf("current(%+v, %d) = %+v, want %+v", s, now, got, want)
		}
	})
}

// Sliding window conversion: the counts carry; the current window keeps its
// start and takes the new length, or, if that has ended, becomes the
// previous window of the next one.
func TestSlidingConvertMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ow := rapid.Int64Range(1, 1e6).Draw(t, "oldWindow")
		nw := rapid.Int64Range(1, 1e6).Draw(t, "newWindow")
		old, _ := NewSlidingWindow(100, time.Duration(ow))
		sw, _ := NewSlidingWindow(rapid.Int64Range(1, 100).Draw(t, "newLimit"), time.Duration(nw))
		var s SlidingState
		at := rapid.Int64Range(0, 1e7).Draw(t, "at")
		old.Step(&s, at, rapid.Int64Range(1, 50).Draw(t, "c1"))
		at2 := at + rapid.Int64Range(0, 2*ow).Draw(t, "gap")
		old.Step(&s, at2, rapid.Int64Range(1, 50).Draw(t, "c2"))
		now := at2 + rapid.Int64Range(0, 3*ow).Draw(t, "elapsed")
		rolled := old.current(s, now)
		got := sw.Convert(old, s, now)
		end := rolled.Start + nw
		var want SlidingState
		switch {
		case s.Idle(now) || (rolled.Prev == 0 && rolled.Cur == 0):
		case now < end:
			want = SlidingState{Start: rolled.Start, End: end, Prev: rolled.Prev, Cur: rolled.Cur}
		case now < end+nw && rolled.Cur > 0:
			want = SlidingState{Start: end, End: end + nw, Prev: rolled.Cur}
		}
		if got != want {
			t.Fatalf("Convert(%+v at %d) = %+v, want %+v", s, now, got, want)
		}
		// The previous count of a converted state never weighs more than it did.
		if got.Prev > max(rolled.Prev, rolled.Cur) {
			t.Fatalf("previous count grew: %+v from %+v", got, rolled)
		}
	})
}

// Sliding log conversion: the admissions in view under both windows carry.
func TestSlidingLogConvertMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ow := rapid.Int64Range(1, 1e6).Draw(t, "oldWindow")
		nw := rapid.Int64Range(1, 1e6).Draw(t, "newWindow")
		old, _ := NewSlidingLog(50, time.Duration(ow))
		l, _ := NewSlidingLog(rapid.Int64Range(1, 50).Draw(t, "newLimit"), time.Duration(nw))
		var s SlidingLogState
		var ats, costs []int64
		at := int64(0)
		for i := range rapid.IntRange(1, 10).Draw(t, "n") {
			at += rapid.Int64Range(0, ow).Draw(t, "gap")
			c := rapid.Int64Range(1, 5).Draw(t, "cost")
			if old.Step(&s, at, c).Allowed {
				ats, costs = append(ats, at), append(costs, c)
			}
			_ = i
		}
		now := at + rapid.Int64Range(0, 2*ow).Draw(t, "elapsed")
		var want int64
		for i := range ats {
			if ats[i] > now-ow && ats[i] > now-nw {
				want += costs[i]
			}
		}
		got := l.Convert(old, s, now)
		if sp := l.Spent(got, now); sp != want || got.Total() != want {
			t.Fatalf("spent %d total %d, want %d", sp, got.Total(), want)
		}
	})
}

// Spent of a state Booked with k tokens is k clamped to what the rule allows.
func TestBookedSpentRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 100).Draw(t, "limit")
		w := time.Duration(rapid.Int64Range(1000, 1e12).Draw(t, "window"))
		burst := rapid.Int64Range(1, 100).Draw(t, "burst")
		k := rapid.Int64Range(-5, 200).Draw(t, "k")
		now := rapid.Int64Range(0, 1e15).Draw(t, "now")
		g, _ := NewGCRA(limit, w, burst)
		if got := g.Spent(g.Booked(k, now), now); got != min(max(k, 0), burst) {
			t.Fatalf("gcra: %d", got)
		}
		f, _ := NewFixedWindow(limit, w)
		if got := f.Spent(f.Booked(k, now), now); got != min(max(k, 0), limit) {
			t.Fatalf("fixed: %d", got)
		}
		sw, _ := NewSlidingWindow(limit, w)
		if got := sw.Spent(sw.Booked(k, now), now); got != min(max(k, 0), limit) {
			t.Fatalf("sliding: %d", got)
		}
		sl, _ := NewSlidingLog(limit, w)
		if got := sl.Spent(sl.Booked(k, now), now); got != min(max(k, 0), limit) {
			t.Fatalf("log: %d", got)
		}
		lk, _ := NewLeaky(limit, w, time.Duration(rapid.Int64Range(0, int64(w)).Draw(t, "maxDelay")))
		if got := lk.Spent(lk.Booked(k, now), now); got != min(max(k, 0), lk.Limit()) {
			t.Fatalf("leaky: %d", got)
		}
		// A GCRA bucket's spend read back is never below what it was charged.
		var s TAT
		c := rapid.Int64Range(1, burst).Draw(t, "cost")
		g.Step(&s, now, c)
		later := now + rapid.Int64Range(0, int64(g.tau)).Draw(t, "later")
		exact := new(big.Rat).SetFrac64(max(int64(s)-later, 0), g.t)
		if sp := g.Spent(s, later); new(big.Rat).SetInt64(sp).Cmp(exact) < 0 || sp > c {
			t.Fatalf("spent %d of %v", sp, exact)
		}
	})
}
