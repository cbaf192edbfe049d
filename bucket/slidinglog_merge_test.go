package bucket

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSlidingLogMerge: a log merged from two holders' admissions decides
// as one log that had admitted them all at their times, and keeps them in
// order with one entry per instant.
func TestSlidingLogMerge(t *testing.T) {
	const w = int64(time.Second)
	l, err := NewSlidingLog(50, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var a, b, all SlidingLogState
		now := int64(0)
		for range rng.IntN(40) {
			now += rng.Int64N(w / 10)
			c := 1 + rng.Int64N(3)
			// a and b each decide their own; the union is what the merge
			// must hold.
			s := &a
			if rng.IntN(2) == 0 {
				s = &b
			}
			if l.Step(s, now, c).Allowed {
				l.Merge(&all, []LogEntry{{At: now, Cost: c}})
			}
		}
		merged := a
		l.Merge(&merged, b.Entries())
		// Step expires what has left the window; Merge keeps it (a later
		// Step expires it): compare what is in view.
		inView := func(es []LogEntry) []LogEntry {
			return slices.DeleteFunc(es, func(e LogEntry) bool { return e.At <= now-w })
		}
		got, want := inView(merged.Entries()), inView(all.Entries())
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: merged %v, want %v", round, got, want)
		}
		if len(want) > 0 && merged.Until != all.Until {
			t.Fatalf("round %d: until %d, want %d", round, merged.Until, all.Until)
		}
		for k := range 5 {
			at := now + int64(k)*w/4
			if g, w := l.Peek(merged, at), l.Peek(all, at); g != w {
				t.Fatalf("round %d at +%d: peek %+v, want %+v", round, k, g, w)
			}
		}
		if !slices.IsSortedFunc(got, func(x, y LogEntry) int { return int(x.At - y.At) }) {
			t.Fatalf("round %d: entries out of order: %v", round, got)
		}
	}
	// Merging entries of no token keeps nothing; a merge shares no memory
	// with its input.
	var s SlidingLogState
	in := []LogEntry{{At: 5, Cost: 0}, {At: 3, Cost: 2}, {At: 3, Cost: 1}}
	l.Merge(&s, in)
	in[1].Cost = 99
	if got := s.Entries(); !slices.Equal(got, []LogEntry{{At: 3, Cost: 3}}) || s.Until != 3+w {
		t.Errorf("merge of %v: %v until %d", in, got, s.Until)
	}
}
