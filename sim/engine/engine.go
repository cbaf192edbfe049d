// Package engine is the core of weir's deterministic discrete-event
// simulator: a virtual clock, an event queue with a deterministic tie-break,
// one seeded random source and a simulated network. It knows nothing of rate
// limiting: the state machines it drives (the cluster coordinator today, the
// lease state machine of the Raft group later) plug in from outside.
//
// # The loop
//
// One goroutine pops the earliest event, sets the clock to its time and
// fires it; an event may schedule more. Events due at the same virtual time
// fire in the order they were scheduled (a sequence number breaks the tie),
// so a run depends only on its inputs and its seed: the same seed gives the
// same run, byte for byte. Nothing here reads the wall clock, draws from the
// global math/rand, or ranges over a map where the order would matter.
//
// # Plugging a state machine in
//
// A state machine is driven through three seams, none of which changes the
// loop:
//
//   - An adapter type owns the pure step machine (for example a
//     *cluster.Coordinator, or the lease state machine) and plays the role of
//     its production shell: it turns the machine's outputs (messages, timers)
//     into events, and events into calls of the machine (Step, Tick, ...),
//     passing the node's own clock (Sim.Now plus the node's skew).
//   - Its events implement Event. Long-lived events (a ticker, a traffic
//     source) are values that reschedule themselves, so that the hot loop
//     does not allocate per firing.
//   - Its messages travel through Network.Send, which draws latency and loss
//     from the network model and checks partitions and liveness at delivery;
//     the payload is the adapter's own type, opaque to the network.
//
// The Raft lease group of issue 5 plugs in the same way: an adapter around
// the lease state machine with its election and heartbeat timers as events
// and its RPCs as Network messages, beside (or instead of) the coordinator
// adapters, in the same loop and the same network.
package engine

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
)

// Event is something that happens at a virtual time. Fire runs on the
// loop's goroutine with the clock set to the event's time.
type Event interface {
	Fire(s *Sim)
}

// EventFunc adapts a function to Event. It allocates a closure per event, so
// use it for rare events (faults, membership changes), not per request.
type EventFunc func(s *Sim)

// Fire calls f(s).
func (f EventFunc) Fire(s *Sim) { f(s) }

type item struct {
	at  int64
	seq uint64
	ev  Event
}

// queue is a 4-ary min-heap of items ordered by (at, seq), written out
// rather than through container/heap so that a push does not box the item.
// Four children per node halve the depth of a binary heap, and a pop's
// comparisons of siblings touch one or two cache lines. (at, seq) is a
// total order, so the pop order, and with it the run, does not depend on
// the heap's shape.
type queue []item

func (it *item) before(o *item) bool {
	if it.at != o.at {
		return it.at < o.at
	}
	return it.seq < o.seq
}

func (q *queue) push(it item) {
	*q = append(*q, it)
	h := *q
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !it.before(&h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = it
}

func (q *queue) pop() item {
	h := *q
	top := h[0]
	last := len(h) - 1
	x := h[last]
	h[last] = item{}
	h = h[:last]
	*q = h
	if last == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= last {
			break
		}
		m := c
		for j, e := c+1, min(c+4, last); j < e; j++ {
			if h[j].before(&h[m]) {
				m = j
			}
		}
		if !h[m].before(&x) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = x
	return top
}

// wheel is a calendar queue for the events due within about a
// millisecond of now: wheelSlots buckets of 2^wheelShift ns each, every
// bucket its items in (at, seq) order, and a bitmap of the buckets that
// hold any. Message deliveries land a few hundred microseconds ahead,
// where the heap's pops cost a dozen unpredictable comparisons each; here
// a push writes an item into a bucket that is mostly empty and a pop
// scans the bitmap from now's bucket. A bucket's first item sits in the
// bucket itself (slot), so that a bucket of one item, the common case,
// costs no list node; the others follow in a list of nodes (more).
//
// An item goes into the wheel only if its bucket number (at >> wheelShift)
// is less than now's plus span (wheelSlots). Every item in the wheel is
// due at or after now, and now only advances, so the wheel's items always
// lie within wheelSlots buckets from now's: bucket numbers modulo
// wheelSlots are then distinct, and the first non-empty bucket from now's
// holds the earliest item. The order is (at, seq) throughout, exactly as
// the heap's.
type wheel struct {
	slot [wheelSlots]item  // each bucket's first item (valid where its bit is set)
	more [wheelSlots]int32 // each bucket's further items: first node, -1 none
	bits [wheelSlots / 64]uint64
	// nodes hold the items after a bucket's first, in lists; free is the
	// first free node (-1 none).
	nodes []wheelNode
	free  int32
	n     int
	// span is how many buckets from now's an item may be in: wheelSlots
	// (0 in tests that compare with the heap alone).
	span int64
}

// wheelNode is an item in a bucket's list, or a free node.
type wheelNode struct {
	it   item
	next int32
}

const (
	wheelShift = 10   // a bucket is 1024 ns
	wheelSlots = 1024 // buckets: the wheel spans about a millisecond
)

func newWheel() *wheel {
	w := &wheel{free: -1, span: wheelSlots}
	for i := range w.more {
		w.more[i] = -1
	}
	return w
}

// fits reports whether an item due at at may go into the wheel at now.
func (w *wheel) fits(now, at int64) bool {
	return at>>wheelShift-now>>wheelShift < w.span
}

// push adds it (which fits) to its bucket, in (at, seq) order.
func (w *wheel) push(it item) {
	w.n++
	b := int(it.at>>wheelShift) & (wheelSlots - 1)
	word, bit := &w.bits[b>>6], uint64(1)<<(b&63)
	if *word&bit == 0 { // an empty bucket: the common case
		*word |= bit
		w.slot[b] = it
		return
	}
	if it.before(&w.slot[b]) {
		it, w.slot[b] = w.slot[b], it
	}
	k := w.free
	if k >= 0 {
		w.free = w.nodes[k].next
	} else {
		k = int32(len(w.nodes))
		w.nodes = append(w.nodes, wheelNode{})
	}
	p := &w.more[b]
	for *p >= 0 && w.nodes[*p].it.before(&it) {
		p = &w.nodes[*p].next
	}
	nd := &w.nodes[k]
	nd.it, nd.next = it, *p
	*p = k
}

// first returns the bucket of the earliest item at now; the wheel must not
// be empty.
func (w *wheel) first(now int64) int {
	b := int(now>>wheelShift) & (wheelSlots - 1)
	i := b >> 6
	if m := w.bits[i] >> (b & 63); m != 0 {
		return b + bits.TrailingZeros64(m)
	}
	for range wheelSlots / 64 {
		i = (i + 1) & (wheelSlots/64 - 1)
		if m := w.bits[i]; m != 0 {
			return i<<6 + bits.TrailingZeros64(m)
		}
	}
	panic("engine: wheel count and bitmap disagree")
}

// pop removes the first item of bucket b and returns its event.
func (w *wheel) pop(b int) Event {
	b &= wheelSlots - 1
	ev := w.slot[b].ev
	// The slot keeps its item until it is overwritten: its event is one
	// the caller holds anyway, and clearing it cost a write per event.
	if k := w.more[b]; k >= 0 {
		nd := &w.nodes[k]
		w.slot[b], w.more[b] = nd.it, nd.next
		nd.next, w.free = w.free, k
	} else {
		w.bits[b>>6] &^= 1 << (b & 63)
	}
	w.n--
	return ev
}

// Sim is the virtual clock, the event queue and the random source of one
// run. The zero Sim is not usable; call New. A Sim is not safe for
// concurrent use: everything runs on the goroutine that calls Run.
type Sim struct {
	now int64
	seq uint64
	q   queue
	// front, when hasFront, is the earliest scheduled event, held out of
	// the heap: an event scheduled before all others (the next arrival
	// of a traffic source, mostly) then costs no heap push and pop.
	front    item
	hasFront bool
	// wheel holds the other events due within about a millisecond; the
	// heap those further ahead.
	wheel *wheel
	rng   *rand.Rand // pcg.Std()
	pcg   *PCG
	fired uint64
	// lanes are FIFO queues of events scheduled a fixed delay ahead (see
	// Lane): their items arrive in (at, seq) order, so each is kept in
	// order by appending, without the heap.
	lanes []*Lane
	// laneMin is the lane whose first item is the earliest of all the
	// lanes' (nil: all are empty), unless laneStale: a pop from it may
	// have changed that, and Step looks at every lane again.
	laneMin   *Lane
	laneStale bool
	// laneAt is the time of laneMin's first item (math.MaxInt64 when
	// every lane is empty), so that Step compares one integer while the
	// lanes' next event lies ahead of the others.
	laneAt int64
}

// Lane is a FIFO queue of events for a Sim, for a kind of event that is
// mostly scheduled a fixed delay from now (a linger flush, a ticker): such
// events are scheduled in the order they fire, so appending keeps the
// lane sorted by (at, seq) and costs no heap push or pop. An event that
// would fire before the lane's last one goes to the heap instead, so the
// firing order is exactly the order without lanes: (at, seq) over all
// events.
type Lane struct {
	q    []item
	head int
}

// Lane returns a new lane of s.
func (s *Sim) Lane() *Lane {
	l := &Lane{}
	s.lanes = append(s.lanes, l)
	return l
}

// AtIn schedules ev at virtual time at, as At does, in lane l when that
// keeps it in order.
func (s *Sim) AtIn(l *Lane, at int64, ev Event) {
	if at < s.now {
		at = s.now
	}
	if n := len(l.q); n > l.head && at < l.q[n-1].at {
		s.At(at, ev) // out of the lane's order: the heap orders it
		return
	}
	s.seq++
	it := item{at: at, seq: s.seq, ev: ev}
	if len(l.q) == l.head && !s.laneStale {
		// l's first item: it may precede the other lanes' first.
		if m := s.laneMin; m == nil || it.before(&m.q[m.head]) {
			s.laneMin, s.laneAt = l, at
		}
	}
	l.q = append(l.q, it)
}

// AfterIn schedules ev d nanoseconds from now, in lane l when that keeps it
// in order.
func (s *Sim) AfterIn(l *Lane, d int64, ev Event) { s.AtIn(l, s.now+d, ev) }

// pop removes l's first item and returns its event.
func (l *Lane) pop() Event {
	ev := l.q[l.head].ev
	l.q[l.head] = item{}
	l.head++
	switch {
	case l.head == len(l.q):
		l.q, l.head = l.q[:0], 0
	case l.head >= 64 && l.head >= len(l.q)/2:
		k := copy(l.q, l.q[l.head:])
		clear(l.q[k:])
		l.q, l.head = l.q[:k], 0
	}
	return ev
}

// New returns a Sim whose clock reads start (virtual nanoseconds) and whose
// random source is PCG seeded with seed (the second PCG word is fixed, so a
// single integer names a run).
func New(start int64, seed uint64) *Sim {
	p := NewPCG(seed, 0x9e3779b97f4a7c15)
	return &Sim{now: start, wheel: newWheel(), rng: p.Std(), pcg: p,
		laneAt: math.MaxInt64}
}

// Now returns the virtual time in nanoseconds.
func (s *Sim) Now() int64 { return s.now }

// Rand returns the run's random source. Every random draw of a run must
// come from it, in loop order, for the run to be reproducible.
func (s *Sim) Rand() *rand.Rand { return s.rng }

// PCG returns the run's random source itself: its draws and those of
// Rand come from one stream, in loop order, and each of its methods draws
// what Rand's method of that name would.
func (s *Sim) PCG() *PCG { return s.pcg }

// At schedules ev at virtual time at. A time in the past fires at the
// current time, after the events already due then.
func (s *Sim) At(at int64, ev Event) {
	if at < s.now {
		at = s.now
	}
	s.seq++
	it := item{at: at, seq: s.seq, ev: ev}
	if s.hasFront {
		if it.before(&s.front) {
			it, s.front = s.front, it
		}
		// it follows the front: the wheel's if it fits there (inline,
		// as the common case of a message delivery), else the heap's.
		if w := s.wheel; w.fits(s.now, it.at) {
			w.push(it)
			return
		}
		s.q.push(it)
		return
	}
	if len(s.q) == 0 || it.before(&s.q[0]) {
		s.front, s.hasFront = it, true
		return
	}
	s.place(it)
}

// place queues it, which follows the front: in the wheel if it fits there,
// else in the heap. The front precedes every item of the heap; the wheel
// is a source of its own, like a lane.
func (s *Sim) place(it item) {
	if s.wheel.fits(s.now, it.at) {
		s.wheel.push(it)
		return
	}
	s.q.push(it)
}

// After schedules ev d nanoseconds from now.
func (s *Sim) After(d int64, ev Event) { s.At(s.now+d, ev) }

// Pending returns the number of scheduled events.
func (s *Sim) Pending() int {
	n := len(s.q) + s.wheel.n
	if s.hasFront {
		n++
	}
	for _, l := range s.lanes {
		n += len(l.q) - l.head
	}
	return n
}

// Fired returns the number of events fired so far.
func (s *Sim) Fired() uint64 { return s.fired }

// Step fires the next event if it is due at or before until, and reports
// whether it did.
func (s *Sim) Step(until int64) bool {
	// The earliest event is the front (which precedes the heap), else the
	// heap's top, unless the earliest lane's first or the wheel's is
	// earlier still. The lanes keep the time of their first item at
	// hand: while it is later, they cost one comparison. The candidate's
	// (at, seq) are kept in locals, not behind a pointer.
	src := fromNone
	at, seq := int64(math.MaxInt64), uint64(math.MaxUint64)
	switch {
	case s.hasFront:
		at, seq, src = s.front.at, s.front.seq, fromFront
	case len(s.q) > 0:
		at, seq, src = s.q[0].at, s.q[0].seq, fromHeap
	}
	if s.laneStale {
		s.findLaneMin()
	}
	if l := s.laneMin; s.laneAt <= at && l != nil {
		if it := &l.q[l.head]; it.at < at || it.at == at && it.seq < seq {
			at, seq, src = it.at, it.seq, fromLane
		}
	}
	wb := 0 // the wheel's bucket, when its first item is the earliest
	if w := s.wheel; w.n > 0 {
		b := w.first(s.now) & (wheelSlots - 1)
		if it := &w.slot[b]; it.at < at || it.at == at && it.seq < seq {
			at, src, wb = it.at, fromWheel, b
		}
	}
	if at > until || src == fromNone {
		return false
	}
	var ev Event
	switch src {
	case fromWheel:
		ev = s.wheel.pop(wb)
	case fromLane:
		ev = s.laneMin.pop()
		s.laneStale = true
	case fromFront:
		ev, s.hasFront = s.front.ev, false // the stale front is overwritten before it is read
	default:
		ev = s.q.pop().ev
	}
	s.now = at
	s.fired++
	ev.Fire(s)
	return true
}

// Where Step found the earliest event.
const (
	fromNone = iota
	fromFront
	fromHeap
	fromLane
	fromWheel
)

// findLaneMin sets laneMin to the lane whose first item is the earliest.
func (s *Sim) findLaneMin() {
	var m *Lane
	at := int64(math.MaxInt64)
	for _, l := range s.lanes {
		if l.head < len(l.q) && (m == nil || l.q[l.head].before(&m.q[m.head])) {
			m, at = l, l.q[l.head].at
		}
	}
	s.laneMin, s.laneAt, s.laneStale = m, at, false
}

// Run fires events in order until none is due at or before until, then sets
// the clock to until.
func (s *Sim) Run(until int64) {
	for s.Step(until) {
	}
	if until > s.now {
		s.now = until
	}
}

// Product calls visit once for every combination of indexes idx[i] in
// [0, max(sizes[i], 1)), in odometer order: the last index turns fastest. A
// size of 0 counts as one (a dimension the grid leaves at its base value).
// Sweeps use it to expand their grids in a fixed order.
func Product(sizes []int, visit func(idx []int)) {
	idx := make([]int, len(sizes))
	for {
		visit(idx)
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < max(sizes[i], 1) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return
		}
	}
}

// GridDim is one dimension of a sweep spec: its name and its values.
type GridDim struct {
	Name   string
	Values []string
	// Bracketed is true when the values were written as [V][V]...
	Bracketed bool
}

// SplitGrid splits a sweep spec "NAME=V,V,...;NAME=[V][V]..." into its
// dimensions, in order. Values are comma-separated, or, when the list
// starts with '[', bracketed groups (which may hold commas: fault specs).
// The callers give each dimension its meaning; errors name the part that is
// malformed.
func SplitGrid(spec string) ([]GridDim, error) {
	var out []GridDim
	for dim := range strings.SplitSeq(spec, ";") {
		dim = strings.TrimSpace(dim)
		if dim == "" {
			continue
		}
		name, vals, ok := strings.Cut(dim, "=")
		if !ok || vals == "" {
			return nil, fmt.Errorf("%q: want NAME=VALUE,...", dim)
		}
		d := GridDim{Name: strings.TrimSpace(name)}
		rest := strings.TrimSpace(vals)
		if strings.HasPrefix(rest, "[") {
			d.Bracketed = true
			for rest != "" {
				if rest[0] != '[' {
					return nil, fmt.Errorf("%s=%q: want [SPEC][SPEC]...", d.Name, vals)
				}
				end := strings.IndexByte(rest, ']')
				if end < 0 {
					return nil, fmt.Errorf("%s=%q: missing ]", d.Name, vals)
				}
				d.Values = append(d.Values, rest[1:end])
				rest = strings.TrimSpace(rest[end+1:])
			}
		} else {
			for v := range strings.SplitSeq(vals, ",") {
				d.Values = append(d.Values, strings.TrimSpace(v))
			}
		}
		out = append(out, d)
	}
	return out, nil
}
