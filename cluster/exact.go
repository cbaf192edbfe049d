package cluster

import (
	"math"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// exactAlgo is an algorithm that only an identity's owner decides (mode
// exact): fixed_window, sliding_window, sliding_log, leaky_bucket and
// concurrency (concurrency.go). The
// owner's entry holds its state; nodes keep no view of it and forward every
// request. GCRA, which nodes also decide within their slack, is the
// coordinator's own path and has no exactAlgo (RuleParams.exact is nil).
//
// Every method steps the algorithm's own functions in bucket/ on the state
// the owner entry holds, and leaves ownerEntry.tat at the time from which
// the state equals no entry (an ended window, a drained queue, an empty
// log): all the wake heaps and the key cap read of an entry.
type exactAlgo interface {
	// step decides a request of cost tokens at now and counts it when
	// admitted.
	step(oe *ownerEntry, now, cost int64) bucket.Decision
	// charge counts spent tokens unconditionally (beyond the limit if so):
	// spend a node admitted before its rule became exact.
	charge(oe *ownerEntry, now, spent int64)
	// spent is what the state holds against its identity at now, in whole
	// tokens (bucket's Spent), and book replaces the state by a fresh one
	// charged spent tokens (bucket's Booked): an algorithm change.
	spent(oe *ownerEntry, now int64) int64
	book(oe *ownerEntry, spent, now int64)
	// convert carries the state of old (the same algorithm, other
	// parameters) over at now; same reports whether old reads a state as
	// this one does.
	convert(old exactAlgo, oe *ownerEntry, now int64)
	same(old exactAlgo) bool
	// refund gives back cost tokens of a charge the owner made (remote:
	// on behalf of another node) and reports whether the state changed.
	refund(oe *ownerEntry, now, cost int64, remote bool) bool
	// debtTokens is what the state holds against its identity, for the
	// key cap's count of what an eviction forgives.
	debtTokens(oe *ownerEntry, now int64) int64
	// inspect fills st with the state at now (oe nil: none).
	inspect(oe *ownerEntry, now int64, st *BucketState)
	// handOff writes the state into h for a new owner, and handDelta what
	// one admission of cost made after the state was handed (before is
	// the entry's tat before it): merged into the handed state, it counts
	// the admission there too.
	handOff(oe *ownerEntry, now int64, h *HandoffItem)
	handDelta(oe *ownerEntry, now int64, before bucket.TAT, cost int64, h *HandoffItem)
	// take merges a handed state into oe's: what either owner counted
	// counts.
	take(oe *ownerEntry, now int64, h *HandoffItem)
	// convertHandoff carries a handed state written under old over to
	// this algorithm's parameters at now.
	convertHandoff(old exactAlgo, now int64, h *HandoffItem)
	// maxCost is the largest cost a request can ever be admitted at.
	maxCost() int64
}

// newExactAlgo returns the exactAlgo of a rule of algorithm algo with the
// given limit, window and leaky queue delay, or nil for gcra.
func newExactAlgo(algo quota.Algorithm, limit int64, window, maxDelay time.Duration) (exactAlgo, int64, error) {
	switch algo {
	case quota.AlgorithmFixedWindow:
		fw, err := bucket.NewFixedWindow(limit, window)
		return &fixedAlgo{fw}, limit, err
	case quota.AlgorithmSlidingWindow:
		sw, err := bucket.NewSlidingWindow(limit, window)
		return &slidingAlgo{sw, int64(window)}, limit, err
	case quota.AlgorithmSlidingLog:
		l, err := bucket.NewSlidingLog(limit, window)
		return &logAlgo{l, int64(window)}, limit, err
	case quota.AlgorithmLeakyBucket:
		lk, err := bucket.NewLeaky(limit, window, maxDelay)
		return &leakyAlgo{lk}, lk.Limit(), err
	case quota.AlgorithmConcurrency:
		// The window is the longest a slot is held without its release.
		c, err := newConcAlgo(limit, window)
		if err != nil {
			return nil, 0, err
		}
		return c, limit, nil
	}
	return nil, 0, nil
}

// ---- fixed_window: tat is the window's End, count its Count.

type fixedAlgo struct{ fw bucket.FixedWindow }

func (a *fixedAlgo) step(oe *ownerEntry, now, cost int64) bucket.Decision {
	st := oe.fixedState()
	d := a.fw.Step(&st, now, cost)
	oe.setFixed(st)
	return d
}

func (a *fixedAlgo) charge(oe *ownerEntry, now, spent int64) {
	if spent <= 0 {
		return
	}
	st := oe.fixedState()
	// The window in force at now, as bucket.FixedWindow rolls it: a peek
	// reports its end; another end than the state's is a new window.
	if end := now + int64(a.fw.Peek(st, now).Reset); end != st.End || st.Count <= 0 {
		st = bucket.FixedState{End: end}
	}
	st.Count += spent
	oe.setFixed(st)
}

func (a *fixedAlgo) spent(oe *ownerEntry, now int64) int64 { return a.fw.Spent(oe.fixedState(), now) }
func (a *fixedAlgo) book(oe *ownerEntry, spent, now int64) { oe.setFixed(a.fw.Booked(spent, now)) }
func (a *fixedAlgo) same(old exactAlgo) bool               { o, ok := old.(*fixedAlgo); return ok && *o == *a }
func (a *fixedAlgo) maxCost() int64                        { return a.fw.Limit() }

func (a *fixedAlgo) convert(old exactAlgo, oe *ownerEntry, now int64) {
	oe.setFixed(a.fw.Convert(old.(*fixedAlgo).fw, oe.fixedState(), now))
}

// refund lowers the count while the window lasts, for the owner's own
// charge (Refund follows its charge within the request). A remote charge is
// not given back: the owner cannot tell from a report which window it was
// counted in, and a count given back in a later window would admit past the
// limit in it.
func (a *fixedAlgo) refund(oe *ownerEntry, now, cost int64, remote bool) bool {
	if remote || int64(oe.tat) <= now || oe.count <= 0 {
		return false
	}
	oe.count = max(oe.count-cost, 0)
	return true
}

func (a *fixedAlgo) debtTokens(oe *ownerEntry, now int64) int64 { return oe.count }

func (a *fixedAlgo) inspect(oe *ownerEntry, now int64, st *BucketState) {
	st.Remaining = st.Burst
	if oe == nil {
		return
	}
	if fs := oe.fixedState(); !fs.Idle(now) {
		st.Held = true
		st.Count = fs.Count
		st.ResetAfter = time.Duration(fs.End - now)
		st.Remaining = max(st.Burst-fs.Count, 0)
		st.Debt = max(fs.Count-st.Burst, 0)
	}
}

func (a *fixedAlgo) handOff(oe *ownerEntry, now int64, h *HandoffItem) {
	h.Debt, h.Count = int64(oe.tat)-now, oe.count
}

func (a *fixedAlgo) handDelta(oe *ownerEntry, now int64, _ bucket.TAT, cost int64, h *HandoffItem) {
	h.Debt, h.Count = int64(oe.tat)-now, cost
}

// take merges a handed-over window into oe's. The old owner's window ends
// h.Debt from now on this node's clock (late by the message's delay: held
// longer, never shorter); after it this node's own aligned windows resume
// (bucket.FixedWindow rolls an ended window to the one containing now).
// When both are live the counts add and the later end holds: what either
// admitted counts until both windows are over, so a join or a graceful
// leave never gives a fresh window.
func (a *fixedAlgo) take(oe *ownerEntry, now int64, h *HandoffItem) {
	in := bucket.FixedState{End: now + max(h.Debt, 0), Count: max(h.Count, 0)}
	cur := oe.fixedState()
	switch {
	case in.Idle(now):
	case cur.Idle(now):
		cur = in
	default:
		cur.End, cur.Count = max(cur.End, in.End), cur.Count+in.Count
	}
	oe.setFixed(cur)
}

func (a *fixedAlgo) convertHandoff(old exactAlgo, now int64, h *HandoffItem) {
	st := a.fw.Convert(old.(*fixedAlgo).fw, bucket.FixedState{End: now + max(h.Debt, 0), Count: h.Count}, now)
	h.Debt, h.Count = st.End-now, st.Count
	if st.Idle(now) {
		h.Debt, h.Count = 0, 0
	}
}

// ---- leaky_bucket: tat is the queue's departure time.

type leakyAlgo struct{ lk bucket.Leaky }

func (a *leakyAlgo) dep(oe *ownerEntry) *bucket.Departure { return (*bucket.Departure)(&oe.tat) }

func (a *leakyAlgo) step(oe *ownerEntry, now, cost int64) bucket.Decision {
	return a.lk.Step(a.dep(oe), now, cost)
}

// charge queues spent tokens behind the queue: its spacing is a GCRA
// interval, so a charge moves the departure as it moves a TAT.
func (a *leakyAlgo) charge(oe *ownerEntry, now, spent int64) {
	if spent <= 0 {
		return
	}
	t := a.lk.Interval().Nanoseconds()
	oe.tat = bucket.TAT(max(int64(oe.tat), now) + spent*t)
}

func (a *leakyAlgo) spent(oe *ownerEntry, now int64) int64 { return a.lk.Spent(*a.dep(oe), now) }
func (a *leakyAlgo) book(oe *ownerEntry, spent, now int64) {
	oe.tat, oe.count = bucket.TAT(a.lk.Booked(spent, now)), 0
}
func (a *leakyAlgo) same(old exactAlgo) bool { o, ok := old.(*leakyAlgo); return ok && *o == *a }

// maxCost: a leaky bucket admits any cost into an empty queue.
func (a *leakyAlgo) maxCost() int64 { return math.MaxInt64 }

func (a *leakyAlgo) convert(old exactAlgo, oe *ownerEntry, now int64) {
	oe.tat = bucket.TAT(a.lk.Convert(old.(*leakyAlgo).lk, *a.dep(oe), now))
}

// refund moves the queue's departure back by the spacing of cost, for the
// owner's own charge. A remote charge is not given back: requests queued
// behind it since were spaced after it, and a departure moved back past
// them would let the next request leave too close to them.
func (a *leakyAlgo) refund(oe *ownerEntry, now, cost int64, remote bool) bool {
	if remote || int64(oe.tat) <= now {
		return false
	}
	oe.tat = bucket.TAT(max(int64(oe.tat)-cost*a.lk.Interval().Nanoseconds(), now))
	return true
}

func (a *leakyAlgo) debtTokens(oe *ownerEntry, now int64) int64 {
	t := a.lk.Interval().Nanoseconds()
	return (int64(oe.tat) - now + t - 1) / t
}

func (a *leakyAlgo) inspect(oe *ownerEntry, now int64, st *BucketState) {
	st.Interval = a.lk.Interval()
	dep := bucket.Departure(0)
	if oe != nil {
		dep = *a.dep(oe)
		st.Held = !dep.Idle(now)
	}
	d := a.lk.Peek(dep, now)
	st.Remaining, st.ResetAfter = d.Remaining, d.Reset
}

func (a *leakyAlgo) handOff(oe *ownerEntry, now int64, h *HandoffItem) { h.Debt = int64(oe.tat) - now }

func (a *leakyAlgo) handDelta(oe *ownerEntry, now int64, before bucket.TAT, _ int64, h *HandoffItem) {
	h.Debt = int64(oe.tat) - int64(max(before, bucket.TAT(now)))
}

// take appends the handed queue to oe's: as debts add.
func (a *leakyAlgo) take(oe *ownerEntry, now int64, h *HandoffItem) {
	oe.tat = bucket.TAT(now + max(int64(oe.tat)-now, 0) + max(h.Debt, 0))
}

func (a *leakyAlgo) convertHandoff(old exactAlgo, now int64, h *HandoffItem) {
	h.Debt = int64(a.lk.Convert(old.(*leakyAlgo).lk, bucket.Departure(now+max(h.Debt, 0)), now)) - now
}

// ---- sliding_window: the state is in oe.ext.sw; tat is when both of its
// windows are out of view.

type slidingAlgo struct {
	sw bucket.SlidingWindow
	w  int64 // the window, ns
}

func (a *slidingAlgo) state(oe *ownerEntry) *bucket.SlidingState {
	if oe.ext == nil {
		oe.ext = new(exactState)
	}
	return &oe.ext.sw
}

// settle sets oe.tat from the state: the end of the window after the
// current one, or now-or-earlier once nothing is in view.
func (a *slidingAlgo) settle(oe *ownerEntry) {
	st := a.state(oe)
	if st.Prev == 0 && st.Cur == 0 {
		oe.tat = 0
		return
	}
	oe.tat = bucket.TAT(st.End + (st.End - st.Start))
}

func (a *slidingAlgo) step(oe *ownerEntry, now, cost int64) bucket.Decision {
	d := a.sw.Step(a.state(oe), now, cost)
	a.settle(oe)
	return d
}

// charge counts spent tokens in the window containing now (a peek at cost
// 0 rolls the state there; a rejection never changes it).
func (a *slidingAlgo) charge(oe *ownerEntry, now, spent int64) {
	if spent <= 0 {
		return
	}
	st := a.state(oe)
	*st = a.sw.Convert(a.sw, *st, now) // rolled to now, same parameters
	if st.Prev == 0 && st.Cur == 0 {
		*st = a.sw.Booked(1, now) // the aligned window holding now
		st.Cur = 0
	}
	st.Cur += spent
	a.settle(oe)
}

func (a *slidingAlgo) spent(oe *ownerEntry, now int64) int64 { return a.sw.Spent(*a.state(oe), now) }
func (a *slidingAlgo) book(oe *ownerEntry, spent, now int64) {
	*a.state(oe) = a.sw.Booked(spent, now)
	oe.count = 0
	a.settle(oe)
}
func (a *slidingAlgo) same(old exactAlgo) bool { o, ok := old.(*slidingAlgo); return ok && *o == *a }
func (a *slidingAlgo) maxCost() int64          { return a.sw.Limit() }

func (a *slidingAlgo) convert(old exactAlgo, oe *ownerEntry, now int64) {
	st := a.state(oe)
	*st = a.sw.Convert(old.(*slidingAlgo).sw, *st, now)
	a.settle(oe)
}

// refund lowers the current window's count for the owner's own charge, as
// a fixed window does (a remote charge is not given back: the owner cannot
// tell which window it was counted in).
func (a *slidingAlgo) refund(oe *ownerEntry, now, cost int64, remote bool) bool {
	st := a.state(oe)
	if remote || now >= st.End || st.Cur <= 0 {
		return false
	}
	st.Cur = max(st.Cur-cost, 0)
	a.settle(oe)
	return true
}

func (a *slidingAlgo) debtTokens(oe *ownerEntry, now int64) int64 { return a.spent(oe, now) }

func (a *slidingAlgo) inspect(oe *ownerEntry, now int64, st *BucketState) {
	var s bucket.SlidingState
	if oe != nil && oe.ext != nil {
		s = oe.ext.sw
	}
	st.Held = !s.Idle(now)
	d := a.sw.Peek(s, now)
	st.Count = a.sw.Spent(s, now)
	st.Remaining, st.ResetAfter = d.Remaining, d.Reset
	st.Debt = max(st.Count-st.Burst, 0)
}

// handOff hands the windows as durations: the current one ends Debt from
// now and spans Span; Count and Prev are its count and the one before.
func (a *slidingAlgo) handOff(oe *ownerEntry, now int64, h *HandoffItem) {
	st := a.sw.Convert(a.sw, *a.state(oe), now) // rolled to now
	if st.Prev == 0 && st.Cur == 0 {
		return
	}
	h.Debt, h.Span, h.Count, h.Prev = st.End-now, st.End-st.Start, st.Cur, st.Prev
}

func (a *slidingAlgo) handDelta(oe *ownerEntry, now int64, _ bucket.TAT, cost int64, h *HandoffItem) {
	st := a.state(oe)
	h.Debt, h.Span, h.Count = st.End-now, st.End-st.Start, cost
}

// take merges a handed state into oe's, both rolled to the window holding
// now. When both are live the counts add, the later end holds and the
// later start: the previous window weighs at least as much as in either,
// so what either owner admitted counts at least as long as it did there.
func (a *slidingAlgo) take(oe *ownerEntry, now int64, h *HandoffItem) {
	in := handedSliding(now, h)
	st := a.state(oe)
	cur := a.sw.Convert(a.sw, *st, now)
	switch {
	case in.Prev == 0 && in.Cur == 0:
	case cur.Prev == 0 && cur.Cur == 0:
		cur = in
	default:
		cur = bucket.SlidingState{Start: max(cur.Start, in.Start), End: max(cur.End, in.End),
			Prev: cur.Prev + in.Prev, Cur: cur.Cur + in.Cur}
	}
	*st = cur
	a.settle(oe)
}

// handedSliding is the state h hands over, on this node's clock at now.
func handedSliding(now int64, h *HandoffItem) bucket.SlidingState {
	if h.Debt <= 0 && h.Prev == 0 || h.Span <= 0 {
		return bucket.SlidingState{}
	}
	end := now + h.Debt
	return bucket.SlidingState{Start: end - h.Span, End: end, Prev: max(h.Prev, 0), Cur: max(h.Count, 0)}
}

func (a *slidingAlgo) convertHandoff(old exactAlgo, now int64, h *HandoffItem) {
	st := a.sw.Convert(old.(*slidingAlgo).sw, handedSliding(now, h), now)
	h.Debt, h.Span, h.Count, h.Prev = 0, 0, 0, 0
	if st.Prev != 0 || st.Cur != 0 {
		h.Debt, h.Span, h.Count, h.Prev = st.End-now, st.End-st.Start, st.Cur, st.Prev
	}
}

// ---- sliding_log: the log is in oe.ext.log; tat is its Until.

type logAlgo struct {
	l bucket.SlidingLog
	w int64 // the window, ns
}

func (a *logAlgo) state(oe *ownerEntry) *bucket.SlidingLogState {
	if oe.ext == nil {
		oe.ext = new(exactState)
	}
	return &oe.ext.log
}

func (a *logAlgo) settle(oe *ownerEntry) { oe.tat = bucket.TAT(a.state(oe).Until) }

func (a *logAlgo) step(oe *ownerEntry, now, cost int64) bucket.Decision {
	d := a.l.Step(a.state(oe), now, cost)
	a.settle(oe)
	return d
}

func (a *logAlgo) charge(oe *ownerEntry, now, spent int64) {
	if spent <= 0 {
		return
	}
	a.l.Merge(a.state(oe), []bucket.LogEntry{{At: now, Cost: spent}})
	a.settle(oe)
}

func (a *logAlgo) spent(oe *ownerEntry, now int64) int64 { return a.l.Spent(*a.state(oe), now) }
func (a *logAlgo) book(oe *ownerEntry, spent, now int64) {
	*a.state(oe) = a.l.Booked(spent, now)
	oe.count = 0
	a.settle(oe)
}
func (a *logAlgo) same(old exactAlgo) bool { o, ok := old.(*logAlgo); return ok && *o == *a }
func (a *logAlgo) maxCost() int64          { return a.l.Limit() }

func (a *logAlgo) convert(old exactAlgo, oe *ownerEntry, now int64) {
	st := a.state(oe)
	*st = a.l.Convert(old.(*logAlgo).l, *st, now)
	a.settle(oe)
}

// refund takes cost tokens off the newest admission for the owner's own
// charge, which Refund follows within its request; a remote charge is not
// given back (the owner cannot tell which admission it was).
func (a *logAlgo) refund(oe *ownerEntry, now, cost int64, remote bool) bool {
	st := a.state(oe)
	if remote || st.Idle(now) {
		return false
	}
	es := st.Entries()
	last := &es[len(es)-1]
	last.Cost -= min(cost, last.Cost)
	*st = bucket.SlidingLogState{}
	a.l.Merge(st, es)
	a.settle(oe)
	return true
}

func (a *logAlgo) debtTokens(oe *ownerEntry, now int64) int64 { return a.spent(oe, now) }

func (a *logAlgo) inspect(oe *ownerEntry, now int64, st *BucketState) {
	var s bucket.SlidingLogState
	if oe != nil && oe.ext != nil {
		s = oe.ext.log
	}
	st.Held = !s.Idle(now)
	d := a.l.Peek(s, now)
	st.Count = a.l.Spent(s, now)
	st.Remaining, st.ResetAfter = d.Remaining, d.Reset
	st.Debt = max(st.Count-st.Burst, 0)
}

// handOff hands the admissions still in view, each as its age at now.
func (a *logAlgo) handOff(oe *ownerEntry, now int64, h *HandoffItem) {
	st := a.state(oe)
	h.Debt = st.Until - now
	h.Log = h.Log[:0]
	for _, e := range st.Entries() {
		if e.At > now-a.w {
			h.Log = append(h.Log, LogItem{Age: now - e.At, Cost: e.Cost})
		}
	}
}

func (a *logAlgo) handDelta(oe *ownerEntry, now int64, _ bucket.TAT, cost int64, h *HandoffItem) {
	h.Debt = a.state(oe).Until - now
	h.Log = append(h.Log[:0], LogItem{Age: 0, Cost: cost})
}

// take merges the handed admissions into oe's log, each at its age before
// now on this node's clock (late by the message's delay: held longer,
// never shorter).
func (a *logAlgo) take(oe *ownerEntry, now int64, h *HandoffItem) {
	a.l.Merge(a.state(oe), handedLog(now, h))
	a.settle(oe)
}

// handedLog is the log h hands over, on this node's clock at now.
func handedLog(now int64, h *HandoffItem) []bucket.LogEntry {
	in := make([]bucket.LogEntry, 0, len(h.Log))
	for _, it := range h.Log {
		in = append(in, bucket.LogEntry{At: now - max(it.Age, 0), Cost: it.Cost})
	}
	return in
}

func (a *logAlgo) convertHandoff(old exactAlgo, now int64, h *HandoffItem) {
	var st bucket.SlidingLogState
	o := old.(*logAlgo)
	o.l.Merge(&st, handedLog(now, h))
	st = a.l.Convert(o.l, st, now)
	// A new slice: h's log is the received message's.
	h.Debt, h.Log = st.Until-now, nil
	for _, e := range st.Entries() {
		h.Log = append(h.Log, LogItem{Age: now - e.At, Cost: e.Cost})
	}
}

// exactState is the state of an owner entry whose algorithm needs more
// than a time and a count.
type exactState struct {
	sw   bucket.SlidingState
	log  bucket.SlidingLogState
	conc concState
}
