package bucket

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The counting variant of FixedWindow (CountingRejected) step by step: a
// rejected request's tokens are counted, so a smaller one does not pass after
// it, and a cost-0 look is over the limit once the count passed it.
func TestFixedWindowCountingRejectedTable(t *testing.T) {
	plain, _ := NewFixedWindow(3, time.Second)
	f := plain.CountingRejected()
	if plain.CountsRejected() || !f.CountsRejected() {
		t.Fatalf("CountingRejected changed the receiver or did not set the option")
	}
	sec := int64(time.Second)
	var s FixedState
	steps := []struct {
		now, cost int64
		want      Decision
		count     int64
	}{
		{10*sec + 100*ms, 2, Decision{Allowed: true, Limit: 3, Remaining: 1, Reset: 900 * time.Millisecond}, 2},
		{10*sec + 100*ms, 0, Decision{Allowed: true, Limit: 3, Remaining: 1, Reset: 900 * time.Millisecond}, 2},
		{10*sec + 200*ms, 2, Decision{Limit: 3, Remaining: 0, Reset: 800 * time.Millisecond, RetryAfter: 800 * time.Millisecond}, 4},
		// The default would admit this one (2 + 1 <= 3); the count is 4 now.
		{10*sec + 300*ms, 1, Decision{Limit: 3, Remaining: 0, Reset: 700 * time.Millisecond, RetryAfter: 700 * time.Millisecond}, 5},
		{10*sec + 300*ms, 0, Decision{Limit: 3, Remaining: 0, Reset: 700 * time.Millisecond, RetryAfter: 700 * time.Millisecond}, 5},
		{10*sec + 400*ms, 9, Decision{Limit: 3, Remaining: 0, Reset: 600 * time.Millisecond, RetryAfter: Never}, 14},
		{11 * sec, 3, Decision{Allowed: true, Limit: 3, Remaining: 0, Reset: time.Second}, 3}, // the next window starts empty
		{11 * sec, 0, Decision{Allowed: true, Limit: 3, Remaining: 0, Reset: time.Second}, 3}, // at the limit, not over it
	}
	for i, st := range steps {
		if d := f.Step(&s, st.now, st.cost); d != st.want {
			t.Errorf("step %d: got %+v, want %+v", i, d, st.want)
		}
		if s.Count != st.count {
			t.Errorf("step %d: count %d, want %d", i, s.Count, st.count)
		}
	}
}

// Envoy's apply_on_stream_done pattern, a look with cost 0 then a charge of
// 1, is limited under the counting variant after Limit charges: the charge
// that passes the limit is counted, and every look after it is over. The
// default never limits it (each look passes at the limit, each charge past
// it is dropped).
func TestFixedWindowCountingRejectedCheckThenCharge(t *testing.T) {
	plain, _ := NewFixedWindow(10, time.Hour)
	for _, f := range []FixedWindow{plain, plain.CountingRejected()} {
		var s FixedState
		looksRejected := 0
		for i := range 12 {
			now := int64(i) * ms
			if d := f.Step(&s, now, 0); !d.Allowed {
				looksRejected++
			}
			f.Step(&s, now, 1)
		}
		want := 0
		if f.CountsRejected() {
			want = 1 // the 12th look: after 11 charges the count is 11 > 10
		}
		if looksRejected != want {
			t.Errorf("counting %v: %d looks rejected, want %d", f.CountsRejected(), looksRejected, want)
		}
	}
}

// The counting variant against a reference: envoyproxy/ratelimit's counter
// as its limiter reads it (add the hits, then over iff the sum > limit;
// remaining limit − sum when not over, else 0), per aligned window.
func TestFixedWindowCountingRejectedReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 20).Draw(rt, "limit")
		W := rapid.Int64Range(1, 1000).Draw(rt, "W")
		plain, _ := NewFixedWindow(limit, time.Duration(W))
		f := plain.CountingRejected()
		var s FixedState
		refWindow, refCount := int64(0), int64(0)
		admitted := map[int64]int64{}
		now := rapid.Int64Range(0, 10000).Draw(rt, "t0")
		for range rapid.IntRange(1, 60).Draw(rt, "n") {
			now += rapid.Int64Range(0, W/2+1).Draw(rt, "gap")
			c := rapid.Int64Range(0, limit+2).Draw(rt, "cost")
			if k := floorDiv(now, W); k != refWindow {
				refWindow, refCount = k, 0
			}
			refCount += c
			over := refCount > limit
			d := f.Step(&s, now, c)
			if d.Allowed == over {
				rt.Fatalf("at %d cost %d: allowed %v, reference over %v (count %d)", now, c, d.Allowed, over, refCount)
			}
			wantRem := max(limit-refCount, 0)
			if d.Remaining != wantRem {
				rt.Fatalf("at %d cost %d: remaining %d, reference %d", now, c, d.Remaining, wantRem)
			}
			if want := time.Duration((refWindow+1)*W - now); d.Reset != want {
				rt.Fatalf("at %d: reset %v, reference %v", now, d.Reset, want)
			}
			if d.Allowed {
				admitted[refWindow] += c
			}
		}
		for k, a := range admitted {
			if a > limit {
				rt.Fatalf("window %d admitted %d > limit %d", k, a, limit)
			}
		}
	})
}
