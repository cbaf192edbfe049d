package bucket

import "math/bits"

// debtor is implemented by the state types of bucket's algorithms. debt is
// what evicting the state at now would forgive, in the state's own unit:
// tokens for states that count admissions (inTime false), nanoseconds for
// states that hold a time (inTime true: a TAT's or a queue's time to drain,
// a lockout's rest). The unit is fixed per type, so within one Store (one
// state type) debts compare. A state that is Idle at now owes 0. A Store at
// its key cap evicts the candidate with the least debt. A state type without
// the method owes nothing as far as a Store can tell: its candidates tie and
// the first examined goes.
type debtor interface {
	debt(now int64) (owed int64, inTime bool)
}

var (
	_ debtor = (*TAT)(nil)
	_ debtor = (*Departure)(nil)
	_ debtor = (*FixedState)(nil)
	_ debtor = (*SlidingState)(nil)
	_ debtor = (*SlidingLogState)(nil)
	_ debtor = (*Inflight)(nil)
	_ debtor = (*PenaltyState)(nil)
)

// debt of a TAT is the time until the bucket is full again, tat − now: its
// spend (and any debt) is that divided by the rule's emission interval.
func (t *TAT) debt(now int64) (int64, bool) { return max(int64(*t)-now, 0), true }

// debt of a queue is the time until it has drained, departure − now.
func (d *Departure) debt(now int64) (int64, bool) { return max(int64(*d)-now, 0), true }

// debt of a fixed window is its count while the window lasts.
func (s *FixedState) debt(now int64) (int64, bool) {
	if s.Idle(now) {
		return 0, false
	}
	return max(s.Count, 0), false
}

// debt of a sliding window is its estimate of the tokens in the last window
// length at now, ⌈Prev·(W−e)/W⌉ + Cur, with the windows rolled to now (W =
// End − Start, the length the state was written under).
func (s *SlidingState) debt(now int64) (int64, bool) {
	w := s.End - s.Start
	if s.Idle(now) || w <= 0 {
		return 0, false
	}
	prev, cur, end := s.Prev, s.Cur, s.End
	if now >= end { // the current window is the previous one at now
		prev, cur, end = cur, 0, end+w
	}
	rest := min(max(end-now, 0), w) // W − e
	hi, lo := bits.Mul64(uint64(max(prev, 0)), uint64(rest))
	q, r := bits.Div64(hi, lo, uint64(w)) // q <= prev: no overflow
	if r != 0 {
		q++
	}
	return int64(q) + max(cur, 0), false
}

// debt of a sliding log is the tokens of its entries still in view at now.
// The window length is the one the newest entry was logged under (Until is
// its time plus the window).
func (s *SlidingLogState) debt(now int64) (int64, bool) {
	if s.Idle(now) {
		return 0, false
	}
	last := s.ring[(s.head+s.n-1)%len(s.ring)]
	from := now - (s.Until - last.at) // entries at <= from are out of view
	var total int64
	for k := 0; k < s.n; k++ {
		if e := s.ring[(s.head+k)%len(s.ring)]; e.at > from {
			total += e.cost
		}
	}
	return total, false
}

// debt of a concurrency limit is the slots in flight. Evicting it forgives
// them: their releases later find no entry and release nothing (a release
// never takes a count below 0), so the identity may hold that many more
// requests in flight until they end.
func (f *Inflight) debt(int64) (int64, bool) { return max(int64(*f), 0), false }

// debt of a penalty box is the rest of its lockout (0 when not locked):
// evicting it lets the identity in at once.
func (s *PenaltyState) debt(now int64) (int64, bool) { return max(s.Until-now, 0), true }

// debtOf is the debt of the state at p, or none if its type has no debt.
func debtOf(p any, now int64) (owed int64, inTime bool) {
	if d, ok := p.(debtor); ok {
		return d.debt(now)
	}
	return 0, false
}
