package bucket

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// MaxSlidingLogLimit is the largest limit NewSlidingLog accepts: the log
// keeps one entry per admission, so it is meant for small limits (login
// attempts, OTPs).
const MaxSlidingLogLimit = 10_000

// logEntry is one admission (or several at the same instant).
type logEntry struct {
	at   int64
	cost int64
}

// SlidingLogState is the state of one exact sliding log: the admissions of
// the last window in a ring buffer, allocated on the first admission and
// grown by doubling up to one entry per token of the limit (every entry holds
// at least one token), so memory is bounded by the limit. The zero value
// equals no entry; so does any state at now >= Until. Copies share the ring:
// do not step two copies of one state.
type SlidingLogState struct {
	ring  []logEntry
	head  int   // index of the oldest entry
	n     int   // entries in use
	total int64 // tokens in the log
	// Until is when the newest admission leaves the window (ns); from then on
	// the state equals no entry.
	Until int64
}

// Idle reports whether the log holds nothing in view at now.
func (s *SlidingLogState) Idle(now int64) bool { return s.n == 0 || now >= s.Until }

// Total returns the tokens currently recorded (including any that a Step at
// a later time would expire).
func (s *SlidingLogState) Total() int64 { return s.total }

// SlidingLog is the exact sliding window: a request of cost c at now passes
// iff the tokens admitted in (now − W, now] plus c are at most Limit, so over
// any interval of length W it admits at most Limit tokens, exactly as a full
// log of timestamps would.
//
// Edge cases: cost 0 is a peek; negative cost counts as 0; cost > Limit is
// rejected with RetryAfter Never. If now goes backwards an admission is
// recorded at the newest time in the log instead (keeping the ring sorted),
// so it is held at least as long as it should be: conservative. Immutable,
// safe for concurrent use; use NewSlidingLog.
type SlidingLog struct {
	limit int64
	w     int64
}

// NewSlidingLog returns a SlidingLog of limit tokens per window. It returns
// an error naming the bad parameter if limit < 1, limit >
// MaxSlidingLogLimit, or window <= 0.
func NewSlidingLog(limit int64, window time.Duration) (SlidingLog, error) {
	switch {
	case limit < 1:
		return SlidingLog{}, fmt.Errorf("bucket: sliding log limit %d: must be >= 1", limit)
	case limit > MaxSlidingLogLimit:
		return SlidingLog{}, fmt.Errorf("bucket: sliding log limit %d: above %d (use SlidingWindow or GCRA)", limit, MaxSlidingLogLimit)
	case window <= 0:
		return SlidingLog{}, fmt.Errorf("bucket: sliding log window %v: must be > 0", window)
	}
	return SlidingLog{limit: limit, w: int64(window)}, nil
}

// Step decides a request of cost tokens at now and records it when admitted.
func (l *SlidingLog) Step(s *SlidingLogState, now, cost int64) Decision {
	l.expire(s, now)
	d := l.decide(s, now, cost)
	if !d.Allowed || cost <= 0 {
		return d
	}
	at := now
	if s.n > 0 {
		last := &s.ring[(s.head+s.n-1)%len(s.ring)]
		at = max(at, last.at)
		if last.at == at {
			last.cost += cost
			s.total += cost
			l.after(s, now, &d)
			return d
		}
	}
	if s.n == len(s.ring) {
		s.grow(int(l.limit))
	}
	s.ring[(s.head+s.n)%len(s.ring)] = logEntry{at: at, cost: cost}
	s.n++
	s.total += cost
	s.Until = at + l.w
	l.after(s, now, &d)
	return d
}

func (l *SlidingLog) after(s *SlidingLogState, now int64, d *Decision) {
	d.Remaining = max(l.limit-s.total, 0)
	d.Reset = time.Duration(s.Until - now)
}

// Peek reports what Step with cost 0 would, changing nothing.
func (l *SlidingLog) Peek(s SlidingLogState, now int64) Decision {
	// Count without expiring: entries at <= now − W are out of view.
	var total int64
	for k := 0; k < s.n; k++ {
		if e := s.ring[(s.head+k)%len(s.ring)]; e.at > now-l.w {
			total += e.cost
		}
	}
	d := Decision{Limit: l.limit, Allowed: true, Remaining: max(l.limit-total, 0)}
	if total > 0 {
		d.Reset = time.Duration(s.Until - now)
	}
	return d
}

// expire drops entries out of view at now (at <= now − W).
func (l *SlidingLog) expire(s *SlidingLogState, now int64) {
	for s.n > 0 {
		e := &s.ring[s.head]
		if e.at > now-l.w {
			return
		}
		s.total -= e.cost
		*e = logEntry{}
		s.head = (s.head + 1) % len(s.ring)
		s.n--
	}
	s.head = 0
}

func (l *SlidingLog) decide(s *SlidingLogState, now, cost int64) Decision {
	cost = max(cost, 0)
	d := Decision{Limit: l.limit, Remaining: max(l.limit-s.total, 0)}
	if s.n > 0 {
		d.Reset = time.Duration(s.Until - now)
	}
	switch {
	case cost > l.limit:
		d.RetryAfter = Never
	case s.total+cost <= l.limit:
		d.Allowed = true
	default:
		// Wait until enough of the oldest admissions leave the window.
		need := s.total + cost - l.limit
		for k := 0; k < s.n; k++ {
			e := s.ring[(s.head+k)%len(s.ring)]
			need -= e.cost
			if need <= 0 {
				d.RetryAfter = time.Duration(e.at + l.w - now)
				break
			}
		}
	}
	return d
}

// grow doubles the ring (first allocation: 8 entries), never beyond limit
// entries.
func (s *SlidingLogState) grow(limit int) {
	n := min(max(2*len(s.ring), 8), limit)
	if n <= len(s.ring) {
		n = len(s.ring) + 1 // unreachable: entries <= tokens <= limit
	}
	r := make([]logEntry, n)
	for k := 0; k < s.n; k++ {
		r[k] = s.ring[(s.head+k)%len(s.ring)]
	}
	s.ring, s.head = r, 0
}

// LogEntry is one admission a sliding log holds: when it was admitted (ns)
// and its tokens.
type LogEntry struct {
	At, Cost int64
}

// Entries returns a copy of the admissions s holds, oldest first (those a
// later Step would expire included).
func (s *SlidingLogState) Entries() []LogEntry {
	out := make([]LogEntry, s.n)
	for k := range s.n {
		e := s.ring[(s.head+k)%len(s.ring)]
		out[k] = LogEntry{At: e.at, Cost: e.cost}
	}
	return out
}

// Merge adds the admissions in to s, in any order, as if each had been
// admitted at its time: the log stays sorted, admissions at one instant
// share an entry, entries of no token are left out, and Until follows the
// newest. Nothing is decided: the log may hold more than Limit tokens
// afterwards (two logs of one identity merged), and its next Steps reject
// until enough leaves the window. It is for a log handed from another
// holder; the result shares no memory with in.
func (l *SlidingLog) Merge(s *SlidingLogState, in []LogEntry) {
	all := append(s.Entries(), in...)
	slices.SortStableFunc(all, func(a, b LogEntry) int { return cmp.Compare(a.At, b.At) })
	merged := all[:0]
	for _, e := range all {
		switch {
		case e.Cost <= 0:
		case len(merged) > 0 && merged[len(merged)-1].At == e.At:
			merged[len(merged)-1].Cost = satAdd(merged[len(merged)-1].Cost, e.Cost)
		default:
			merged = append(merged, e)
		}
	}
	*s = SlidingLogState{}
	if len(merged) == 0 {
		return
	}
	s.ring = make([]logEntry, max(len(merged), 8))
	for k, e := range merged {
		s.ring[k] = logEntry{at: e.At, cost: e.Cost}
		s.total = satAdd(s.total, e.Cost)
	}
	s.n = len(merged)
	s.Until = satAdd(merged[len(merged)-1].At, l.w)
}

// Limit returns the tokens the last window may hold.
func (l SlidingLog) Limit() int64 { return l.limit }
