package engine

import (
	"fmt"
	"time"
)

// Latency is a one-way message delay distribution. Draw must take all its
// randomness from r.
type Latency interface {
	// Draw returns one delay in nanoseconds (>= 0), drawing from the
	// run's source.
	Draw(r *PCG) int64
	// String describes the distribution in the fault-spec syntax.
	String() string
}

// Const is a fixed delay.
type Const struct{ D time.Duration }

// Draw returns D.
func (c Const) Draw(*PCG) int64 { return int64(c.D) }

// String returns "const:D".
func (c Const) String() string { return fmt.Sprintf("const:%v", c.D) }

// Uniform is a delay drawn uniformly from [Lo, Hi].
type Uniform struct{ Lo, Hi time.Duration }

// Draw returns a delay in [Lo, Hi].
func (u Uniform) Draw(r *PCG) int64 {
	if u.Hi <= u.Lo {
		return int64(u.Lo)
	}
	return int64(u.Lo) + r.Std().Int64N(int64(u.Hi-u.Lo)+1)
}

// String returns "uniform:LO:HI".
func (u Uniform) String() string { return fmt.Sprintf("uniform:%v:%v", u.Lo, u.Hi) }

// LogNormal is a delay whose logarithm is normal: Median·exp(Sigma·Z). It
// has the long right tail of real networks; Sigma 0 is a constant Median.
// Delays are capped at Cap when Cap > 0.
type LogNormal struct {
	Median time.Duration
	Sigma  float64
	Cap    time.Duration
}

// Draw returns one delay.
//
// It is exactly int64(min(Median·math.Exp(Sigma·Z), Cap)), computed
// through a faster exp where that cannot change the result (fastexp.go).
func (l LogNormal) Draw(r *PCG) int64 {
	return lognormalNS(float64(l.Median), l.Sigma*r.NormFloat64(), float64(l.Cap))
}

// String returns "lognormal:MEDIAN:SIGMA".
func (l LogNormal) String() string { return fmt.Sprintf("lognormal:%v:%g", l.Median, l.Sigma) }

// Network is the simulated network between the nodes of a run, numbered
// 0..n-1. A message is lost with the current loss probability, delayed by a
// draw from the latency distribution (so messages reorder whenever the
// distribution is not constant), and dropped at delivery if a partition
// separates its ends at that moment. Liveness of the receiver is the
// adapter's business (it knows incarnations); the network only carries.
type Network struct {
	sim     *Sim
	n       int
	latency Latency
	loss    float64
	parts   map[int][]int // active partitions: id → group of each node
	partIDs []int         // active partition ids, in creation order
	nextID  int
	free    *delivery
	// plain is set while no message can be lost or cut and the latency
	// is LogNormal, which ln then is: a send is a count, one draw and a
	// schedule (SendDirect).
	plain bool
	ln    LogNormal

	// Sent, Lost and Cut count messages handed to Send, lost on the way,
	// and dropped by a partition.
	Sent, Lost, Cut uint64
}

// NewNetwork returns a network of n nodes on s with the given latency and no
// loss.
func NewNetwork(s *Sim, n int, latency Latency) *Network {
	nw := &Network{sim: s, n: n, latency: latency, parts: map[int][]int{}}
	nw.replan()
	return nw
}

// replan sets plain (and ln) after a change of the latency, the loss or
// the partitions.
func (nw *Network) replan() {
	var ok bool
	nw.ln, ok = nw.latency.(LogNormal)
	nw.plain = ok && nw.loss == 0 && len(nw.partIDs) == 0
}

// Nodes returns the number of nodes.
func (nw *Network) Nodes() int { return nw.n }

// Grow makes room for node ids up to n-1 (nodes that join later).
func (nw *Network) Grow(n int) {
	if n <= nw.n {
		return
	}
	for _, id := range nw.partIDs {
		g := nw.parts[id]
		for len(g) < n {
			g = append(g, -1) // a node unknown to the partition is in a group of its own
		}
		nw.parts[id] = g
	}
	nw.n = n
}

// SetLatency replaces the latency distribution.
func (nw *Network) SetLatency(l Latency) {
	nw.latency = l
	nw.replan()
}

// Latency returns the latency distribution in force.
func (nw *Network) Latency() Latency { return nw.latency }

// SetLoss sets the probability in [0, 1] that a message is lost.
func (nw *Network) SetLoss(p float64) {
	nw.loss = p
	nw.replan()
}

// Loss returns the loss probability in force.
func (nw *Network) Loss() float64 { return nw.loss }

// Partition starts a partition: group[i] is node i's side (nodes on the
// same side reach each other). It returns an id for Heal.
func (nw *Network) Partition(group []int) int {
	g := make([]int, nw.n)
	copy(g, group)
	for i := len(group); i < nw.n; i++ {
		g[i] = -1
	}
	nw.nextID++
	nw.parts[nw.nextID] = g
	nw.partIDs = append(nw.partIDs, nw.nextID)
	nw.replan()
	return nw.nextID
}

// Heal ends the partition id.
func (nw *Network) Heal(id int) {
	delete(nw.parts, id)
	for i, p := range nw.partIDs {
		if p == id {
			nw.partIDs = append(nw.partIDs[:i], nw.partIDs[i+1:]...)
			break
		}
	}
	nw.replan()
}

// Reachable reports whether a message from a can reach b now: no active
// partition puts them on different sides.
func (nw *Network) Reachable(a, b int) bool {
	for _, id := range nw.partIDs {
		g := nw.parts[id]
		if g[a] != g[b] || g[a] < 0 && a != b {
			return false
		}
	}
	return true
}

// Dropper is implemented by messages that want to know when a partition
// cut them at delivery.
type Dropper interface {
	Dropped(s *Sim)
}

// Send carries a message from node a to node b: unless it is lost or cut
// at either end of its flight, ev fires at b after the drawn latency. It
// returns the arrival time and true, or false if the message was lost or
// cut at once. A message cut at delivery by a partition is dropped, and if
// ev is a Dropper it is told so at that moment. The arrival time lets a
// sender that waits with a timeout know whether the message can arrive in
// time without scheduling a timer for every message.
func (nw *Network) Send(a, b int, ev Event) (int64, bool) {
	at, ok := nw.carry(a, b)
	if !ok {
		return 0, false
	}
	d := nw.free
	if d != nil {
		nw.free = d.next
	} else {
		d = &delivery{nw: nw}
	}
	d.a, d.b, d.ev, d.next = a, b, ev, nil
	nw.sim.At(at, d)
	return at, true
}

// SendDirect is Send for a message event that checks its own delivery: ev
// is scheduled as it is, with no wrapper, and its Fire must call
// Arrives(a, b) first and drop the message (Dropper's business) when that
// is false. It saves the wrapper's scheduling and its extra call on the
// busiest path of a run.
func (nw *Network) SendDirect(a, b int, ev Event) (int64, bool) {
	if nw.plain { // carry's common case: nothing lost or cut, LogNormal latency
		nw.Sent++
		s := nw.sim
		at := s.now + nw.ln.Draw(s.pcg)
		s.At(at, ev)
		return at, true
	}
	at, ok := nw.carry(a, b)
	if ok {
		nw.sim.At(at, ev)
	}
	return at, ok
}

// carry counts a message from a to b and decides its fate: lost, cut at
// once, or arriving at the returned time.
func (nw *Network) carry(a, b int) (int64, bool) {
	nw.Sent++
	if nw.loss > 0 && nw.sim.pcg.Float64() < nw.loss {
		nw.Lost++
		return 0, false
	}
	if len(nw.partIDs) > 0 && !nw.Reachable(a, b) {
		nw.Cut++
		return 0, false
	}
	if ln, ok := nw.latency.(LogNormal); ok { // the common case, inlined
		return nw.sim.now + ln.Draw(nw.sim.pcg), true
	}
	return nw.sim.now + nw.latency.Draw(nw.sim.pcg), true
}

// Arrives reports whether a message sent from a to b with SendDirect is
// delivered now: false, counted as cut, when a partition separates them.
func (nw *Network) Arrives(a, b int) bool {
	if len(nw.partIDs) == 0 || nw.Reachable(a, b) {
		return true
	}
	nw.Cut++
	return false
}

// delivery checks a message against the partitions at arrival. Deliveries
// are recycled through a free list (the loop is single-threaded).
type delivery struct {
	nw   *Network
	a, b int
	ev   Event
	next *delivery
}

func (d *delivery) Fire(s *Sim) {
	nw, a, b, ev := d.nw, d.a, d.b, d.ev
	d.ev, d.next, nw.free = nil, nw.free, d
	if !nw.Reachable(a, b) {
		nw.Cut++
		if dr, ok := ev.(Dropper); ok {
			dr.Dropped(s)
		}
		return
	}
	ev.Fire(s)
}
