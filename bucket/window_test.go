package bucket

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestFixedWindowTable(t *testing.T) {
	f, err := NewFixedWindow(3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewFixedWindow(0, time.Second); err == nil || !contains(err.Error(), "limit") {
		t.Errorf("limit 0: %v", err)
	}
	if _, err := NewFixedWindow(1, 0); err == nil || !contains(err.Error(), "window") {
		t.Errorf("window 0: %v", err)
	}
	sec := int64(time.Second)
	var s FixedState
	steps := []struct {
		now, cost int64
		want      Decision
	}{
		{10*sec + 100*ms, 0, Decision{Allowed: true, Limit: 3, Remaining: 3, Reset: 900 * time.Millisecond}},
		{10*sec + 100*ms, 2, Decision{Allowed: true, Limit: 3, Remaining: 1, Reset: 900 * time.Millisecond}},
		{10*sec + 200*ms, 2, Decision{Limit: 3, Remaining: 1, Reset: 800 * time.Millisecond, RetryAfter: 800 * time.Millisecond}},
		{10*sec + 200*ms, 4, Decision{Limit: 3, Remaining: 1, Reset: 800 * time.Millisecond, RetryAfter: Never}},
		{10*sec + 300*ms, 1, Decision{Allowed: true, Limit: 3, Remaining: 0, Reset: 700 * time.Millisecond}},
		{9 * sec, 1, Decision{Limit: 3, Remaining: 0, Reset: 2 * time.Second, RetryAfter: 2 * time.Second}}, // clock backwards: counts against the later window
		{11 * sec, 3, Decision{Allowed: true, Limit: 3, Remaining: 0, Reset: time.Second}},                  // new window at the boundary
		{1000 * sec, 1, Decision{Allowed: true, Limit: 3, Remaining: 2, Reset: time.Second}},                // huge gap
		{-1500 * ms, 1, Decision{Allowed: true, Limit: 3, Remaining: 1, Reset: 1002500 * time.Millisecond}}, // backwards again: still the later window
	}
	for i, st := range steps {
		if d := f.Step(&s, st.now, st.cost); d != st.want {
			t.Errorf("step %d: got %+v, want %+v", i, d, st.want)
		}
	}
	// Negative times align by floor: window [-2s, -1s).
	var n FixedState
	f.Step(&n, -1500*ms, 1)
	if n.End != -sec {
		t.Errorf("negative alignment: end %d", n.End)
	}
}

// The boundary effect stated in FixedWindow's doc: 2× the limit within 100 ms.
func TestFixedWindowTwiceAcrossBoundary(t *testing.T) {
	f, _ := NewFixedWindow(10, time.Minute)
	var s FixedState
	boundary := int64(60 * time.Minute)
	passed := 0
	for i := 0; i < 20; i++ {
		at := boundary - 100*ms
		if i >= 10 {
			at = boundary
		}
		if f.Step(&s, at, 1).Allowed {
			passed++
		}
	}
	if passed != 20 {
		t.Fatalf("passed %d across the boundary, want 20 (2× limit)", passed)
	}
}

func TestFixedWindowProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 20).Draw(rt, "limit")
		W := rapid.Int64Range(1, 1000).Draw(rt, "W")
		f, _ := NewFixedWindow(limit, time.Duration(W))
		var s FixedState
		now := rapid.Int64Range(-10000, 10000).Draw(rt, "t0")
		per := map[int64]int64{}
		for i := 0; i < 200; i++ {
			now += rapid.Int64Range(0, W/2+1).Draw(rt, "gap")
			c := rapid.Int64Range(0, limit+1).Draw(rt, "cost")
			if f.Step(&s, now, c).Allowed {
				per[floorDiv(now, W)] += c
			}
		}
		for k, n := range per {
			if n > limit {
				rt.Fatalf("window %d admitted %d > %d", k, n, limit)
			}
		}
	})
}

func TestSlidingWindowTable(t *testing.T) {
	sw, err := NewSlidingWindow(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSlidingWindow(0, time.Second); err == nil {
		t.Error("limit 0 accepted")
	}
	sec := int64(time.Second)
	var s SlidingState
	if d := sw.Step(&s, 5*sec, 11); d.Allowed || d.RetryAfter != Never {
		t.Fatalf("cost > limit: %+v", d)
	}
	if !s.Idle(5 * sec) {
		t.Fatal("rejected request left state")
	}
	if d := sw.Step(&s, 5*sec+900*ms, 10); !d.Allowed || d.Remaining != 0 || d.Reset != 1100*time.Millisecond {
		t.Fatalf("fill: %+v", d)
	}
	// Next window at 6.25 s: estimate = 10·0.75 = 7.5 (rounded up: 8), so 2 fit.
	if d := sw.Step(&s, 6*sec+250*ms, 3); d.Allowed || d.Remaining != 2 || d.RetryAfter != 50*time.Millisecond || d.Reset != 750*time.Millisecond {
		t.Fatalf("weighted: %+v", d) // 3 fit once 10·(1−e) <= 7: e >= 0.3 → 6.3 s
	}
	if d := sw.Step(&s, 6*sec+250*ms, 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("weighted fit: %+v", d)
	}
	// Cur = 2 now; a cost 9 needs the next window with Prev' = 2: 2(1−e) <= 1 → e >= 0.5.
	if d := sw.Step(&s, 6*sec+500*ms, 9); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("next window retry: %+v", d)
	}
	if d := sw.Step(&s, 7*sec+500*ms, 9); !d.Allowed {
		t.Fatalf("retry honoured: %+v", d)
	}
	if d := sw.Step(&s, 3*sec, 1); d.Allowed { // clock backwards: e clamped to 0, estimate = Prev + Cur
		t.Fatalf("backwards: %+v", d)
	}
	if !s.Idle(9*sec) || s.Idle(9*sec-1) {
		t.Fatal("Idle must be exactly two windows after the state's start")
	}
	var z SlidingState
	if p := sw.Peek(z, sec); !p.Allowed || p.Remaining != 10 || p.Reset != 0 {
		t.Fatalf("peek empty: %+v", p)
	}
}

// TestSlidingWindowBoundProperty checks the bounds in SlidingWindow's doc:
// every interval of length W holds at most L + P − ⌈P·(b−t)/W⌉ <= 2L − 1
// tokens, and a client that retries when told gets >= L − c per window.
func TestSlidingWindowBoundProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		L := rapid.Int64Range(1, 30).Draw(rt, "limit")
		W := rapid.Int64Range(10, 10000).Draw(rt, "W")
		sw, _ := NewSlidingWindow(L, time.Duration(W))
		var s SlidingState
		now := rapid.Int64Range(0, 1e9).Draw(rt, "t0")
		var at, cs []int64
		perWin := map[int64]int64{}
		for i := 0; i < 300; i++ {
			now += rapid.Int64Range(0, W/3).Draw(rt, "gap")
			c := rapid.Int64Range(1, L).Draw(rt, "cost")
			if sw.Step(&s, now, c).Allowed {
				at, cs = append(at, now), append(cs, c)
				perWin[floorDiv(now, W)] += c
			}
		}
		for i := range at {
			t0 := at[i]
			b := (floorDiv(t0, W) + 1) * W // the boundary inside [t0, t0+W), if any
			var sum int64
			for j := i; j < len(at) && at[j] < t0+W; j++ {
				sum += cs[j]
			}
			P := perWin[floorDiv(t0, W)]
			bound := L + P - mulDivFloor(P, b-t0, W) // ⌈⌉ rounded down: a looser check
			if t0%W == 0 {
				bound = L // the interval is one aligned window
			}
			if sum > bound || sum > 2*L-1 && sum > L {
				rt.Fatalf("[%d,%d): %d admitted, bound %d (L=%d P=%d)", t0, t0+W, sum, bound, L, P)
			}
		}
	})
	rapid.Check(t, func(rt *rapid.T) {
		L := rapid.Int64Range(1, 30).Draw(rt, "limit")
		W := rapid.Int64Range(10, 10000).Draw(rt, "W")
		sw, _ := NewSlidingWindow(L, time.Duration(W))
		var s SlidingState
		now := rapid.Int64Range(0, 1e9).Draw(rt, "t0")
		first := floorDiv(now, W)
		perWin := map[int64]int64{}
		cmax := int64(0)
		c := rapid.Int64Range(1, L).Draw(rt, "cost")
		for i := 0; i < 400; i++ {
			d := sw.Step(&s, now, c)
			if d.Allowed {
				perWin[floorDiv(now, W)] += c
				cmax = max(cmax, c)
				c = rapid.Int64Range(1, L).Draw(rt, "cost")
				continue
			}
			cmax = max(cmax, c)
			now += int64(d.RetryAfter)
		}
		last := floorDiv(now, W)
		for k := first + 1; k < last; k++ {
			if perWin[k] < L-cmax {
				rt.Fatalf("window %d: saturating client got %d < L − c = %d", k, perWin[k], L-cmax)
			}
		}
	})
}

// naiveLog is the reference exact log: every admission kept, counted by
// brute force.
type naiveLog struct {
	at, cost []int64
	limit, w int64
}

func (n *naiveLog) allow(now, c int64) bool {
	var sum int64
	for i := range n.at {
		if n.at[i] > now-n.w {
			sum += n.cost[i]
		}
	}
	if c <= n.limit && sum+c <= n.limit {
		n.at, n.cost = append(n.at, now), append(n.cost, c)
		return true
	}
	return false
}

func TestSlidingLogEqualsNaive(t *testing.T) {
	if _, err := NewSlidingLog(MaxSlidingLogLimit+1, time.Second); err == nil || !contains(err.Error(), "limit") {
		t.Fatalf("limit above max: %v", err)
	}
	rapid.Check(t, func(rt *rapid.T) {
		L := rapid.Int64Range(1, 40).Draw(rt, "limit")
		W := rapid.Int64Range(1, 1000).Draw(rt, "W")
		l, _ := NewSlidingLog(L, time.Duration(W))
		ref := &naiveLog{limit: L, w: W}
		var s SlidingLogState
		now := rapid.Int64Range(-1e6, 1e6).Draw(rt, "t0")
		for i := 0; i < 300; i++ {
			now += rapid.Int64Range(0, W/4+1).Draw(rt, "gap")
			c := rapid.Int64Range(0, L+1).Draw(rt, "cost")
			d := l.Step(&s, now, c)
			want := ref.allow(now, c)
			if d.Allowed != want {
				rt.Fatalf("step %d now %d cost %d: got %v want %v", i, now, c, d.Allowed, want)
			}
			if len(s.ring) > int(L) {
				rt.Fatalf("ring %d above limit %d", len(s.ring), L)
			}
			if !d.Allowed && d.RetryAfter != Never {
				// The retry hint is exact: one ns earlier still fails, at it passes.
				probe := &naiveLog{limit: L, w: W, at: append([]int64(nil), ref.at...), cost: append([]int64(nil), ref.cost...)}
				retry := now + int64(d.RetryAfter)
				if probe.allow(retry-1, c) || !probe.allow(retry, c) {
					rt.Fatalf("retry after %v not exact", d.RetryAfter)
				}
			}
		}
	})
}

func TestSlidingLogTable(t *testing.T) {
	l, _ := NewSlidingLog(3, time.Second)
	sec := int64(time.Second)
	var s SlidingLogState
	if d := l.Step(&s, sec, 0); !d.Allowed || d.Remaining != 3 || s.ring != nil {
		t.Fatalf("peek allocated or failed: %+v", d)
	}
	if d := l.Step(&s, sec, 4); d.Allowed || d.RetryAfter != Never || s.ring != nil {
		t.Fatalf("cost > limit: %+v", d)
	}
	l.Step(&s, sec, 1)
	l.Step(&s, sec, 1) // merged with the previous entry
	if s.n != 1 || s.total != 2 {
		t.Fatalf("merge: n=%d total=%d", s.n, s.total)
	}
	l.Step(&s, sec+500*ms, 1)
	if d := l.Step(&s, sec+600*ms, 1); d.Allowed || d.RetryAfter != 400*time.Millisecond {
		t.Fatalf("full: %+v", d)
	}
	if d := l.Step(&s, sec/2, 1); d.Allowed { // backwards: still full
		t.Fatalf("backwards: %+v", d)
	}
	if p := l.Peek(s, 2*sec); p.Remaining != 2 {
		t.Fatalf("peek: %+v", p)
	}
	if d := l.Step(&s, 2*sec, 2); !d.Allowed || d.Remaining != 0 || d.Reset != time.Second {
		t.Fatalf("after expiry: %+v", d)
	}
	if s.Idle(3*sec-1) || !s.Idle(3*sec) {
		t.Fatal("Idle at Until")
	}
}

func TestLeakyTable(t *testing.T) {
	if _, err := NewLeaky(10, time.Second, -1); err == nil || !contains(err.Error(), "maxDelay") {
		t.Fatalf("negative maxDelay: %v", err)
	}
	l, _ := NewLeaky(10, time.Second, 300*time.Millisecond) // T = 100 ms, 4 positions
	if l.Limit() != 4 || l.Interval() != 100*time.Millisecond {
		t.Fatalf("limit %d interval %v", l.Limit(), l.Interval())
	}
	now := int64(time.Second)
	var s Departure
	for i := int64(0); i < 4; i++ {
		d := l.Step(&s, now, 1)
		if !d.Allowed || d.Delay != time.Duration(i)*100*time.Millisecond || d.Remaining != 3-i {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if d := l.Step(&s, now, 1); d.Allowed || d.RetryAfter != 100*time.Millisecond || d.Reset != 400*time.Millisecond {
		t.Fatalf("full: %+v", d)
	}
	if d := l.Step(&s, now+100*ms, 5); !d.Allowed || d.Delay != 300*time.Millisecond {
		t.Fatalf("cost 5 at the tail: %+v", d)
	}
	if d := l.Peek(s, now+100*ms); d.Allowed {
		t.Fatalf("over-long queue: %+v", d)
	}
	if d := l.Step(&s, now-int64(time.Hour), 1); d.Allowed { // backwards: looks longer
		t.Fatalf("backwards: %+v", d)
	}
}

func TestLeakyProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 100).Draw(rt, "limit")
		maxDelay := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(rt, "maxDelay"))
		l, _ := NewLeaky(limit, time.Second, maxDelay)
		T := int64(l.Interval())
		var s Departure
		now := int64(1)
		lastOut, lastCost := int64(-1), int64(0)
		for i := 0; i < 300; i++ {
			now += rapid.Int64Range(0, 2*T).Draw(rt, "gap")
			c := rapid.Int64Range(1, 5).Draw(rt, "cost")
			d := l.Step(&s, now, c)
			if !d.Allowed {
				continue
			}
			if d.Delay > maxDelay {
				rt.Fatalf("delay %v > %v", d.Delay, maxDelay)
			}
			out := now + int64(d.Delay)
			if lastOut >= 0 && out-lastOut < lastCost*T {
				rt.Fatalf("spacing %d < %d", out-lastOut, lastCost*T)
			}
			lastOut, lastCost = out, c
		}
	})
}

func TestConcurrency(t *testing.T) {
	if _, err := NewConcurrency(0); err == nil {
		t.Fatal("n 0 accepted")
	}
	c, _ := NewConcurrency(3)
	rel := c.Release()
	var s Inflight
	if d := c.Step(&s, 0, 2); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("%+v", d)
	}
	if d := c.Step(&s, 0, 2); d.Allowed || d.RetryAfter != ConcurrencyRetryHint {
		t.Fatalf("%+v", d)
	}
	if d := c.Step(&s, 0, 4); d.Allowed || d.RetryAfter != Never {
		t.Fatalf("%+v", d)
	}
	if d := rel.Step(&s, 0, 5); !d.Allowed || s != 0 || d.Remaining != 3 {
		t.Fatalf("over-release: %+v s=%d", d, s)
	}
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.Int64Range(1, 10).Draw(rt, "n")
		c, _ := NewConcurrency(n)
		rel := c.Release()
		var s Inflight
		var held []int64
		for i := 0; i < 200; i++ {
			if rapid.Bool().Draw(rt, "acquire") || len(held) == 0 {
				k := rapid.Int64Range(0, n+1).Draw(rt, "cost")
				if c.Step(&s, 0, k).Allowed && k > 0 {
					held = append(held, k)
				}
			} else {
				rel.Step(&s, 0, held[0])
				held = held[1:]
			}
			var sum int64
			for _, h := range held {
				sum += h
			}
			if int64(s) != sum || sum > n {
				rt.Fatalf("inflight %d, held %d, n %d", s, sum, n)
			}
		}
	})
}

func TestPenalty(t *testing.T) {
	if _, err := NewPenalty(PenaltyConfig{Threshold: 0, Base: time.Second}); err == nil || !contains(err.Error(), "Threshold") {
		t.Fatalf("threshold: %v", err)
	}
	if _, err := NewPenalty(PenaltyConfig{Threshold: 1, Base: time.Second, Max: time.Millisecond}); err == nil || !contains(err.Error(), "Max") {
		t.Fatalf("max: %v", err)
	}
	p, err := NewPenalty(PenaltyConfig{Threshold: 3, Base: time.Second, Max: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := p.Recorder()
	sec := int64(time.Second)
	var s PenaltyState
	now := 100 * sec
	lockout := func(at int64) time.Duration {
		for i := 0; i < 3; i++ {
			rec.Step(&s, at, 1)
		}
		return p.Step(&s, at, 1).RetryAfter
	}
	if d := rec.Step(&s, now, 1); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("first rejection: %+v", d)
	}
	rec.Step(&s, now+61*sec, 1) // the window of one minute restarted
	rec.Step(&s, now+62*sec, 1)
	if d := p.Step(&s, now+62*sec, 1); !d.Allowed {
		t.Fatalf("2 in window locked: %+v", d)
	}
	if d := rec.Step(&s, now+63*sec, 1); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("third locks for Base: %+v", d)
	}
	now += 64 * sec
	for i, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
		if got := lockout(now); got != want {
			t.Fatalf("lockout %d: %v want %v", i, got, want)
		}
		now += int64(want)
	}
	// Quiet for Max: the level decays, and the state is idle.
	now += 4 * sec
	if !s.Idle(now) {
		t.Fatalf("not idle after quiet: %+v", s)
	}
	if got := lockout(now); got != time.Second {
		t.Fatalf("after decay: %v", got)
	}
	if d := rec.Step(&s, now, 5); d.Allowed { // recorded while locked: ignored
		t.Fatalf("%+v", d)
	}
}
