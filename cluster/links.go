package cluster

import (
	"slices"
	"time"
)

// Links is one node's policy for talking to its peers, as a pure state
// machine: what the adapter around the Coordinators (the shell on a
// gateway, the simulator's node) does with the messages Ready returns is
// decided here, and the adapter only carries it out. It holds no
// goroutine, lock, socket or clock: time comes in as an argument, and a
// caller that uses it from several goroutines serialises the calls.
//
// The policy, peer by peer:
//
//   - One exchange in flight per peer. What is due to a peer while one is
//     on its way joins the peer's Backlog and leaves as the next exchange
//     when the one in flight returns (Send, Next): under load batches grow
//     instead of calls multiplying, and one peer's messages are stepped in
//     the order they were made.
//   - Nagle's sending (Decided, Collect): work the core queued goes at once
//     when no exchange of this node is in flight (an idle cluster pays one
//     round trip, not a linger), else with the next exchange to return;
//     the linger flush (one scheduled at a time) is a backstop, so that
//     work for a healthy peer never waits on a slow peer's exchange. A core
//     with a full batch queued flushes at once.
//   - A circuit breaker per peer (Outcome, Tick): BreakerFailures failed
//     exchanges in a row open it, and the peer's identities are decided by
//     their rule's on_failure until it closes; after the cooldown the next
//     exchange is a trial (half-open: one more failure reopens it at once),
//     and a successful exchange closes it. A peer that is back in the ring,
//     or at a new address, is a new run of that node: its breaker resets
//     (SetPeers).
//
// The zero Links is not usable; make one with NewLinks.
type Links struct {
	cfg     LinkConfig
	links   map[string]*link
	breaks  map[string]*breaker
	members map[string]string // the ring in force: name → address
	open    int               // breakers open
	// inflight counts the links with an exchange in flight; pending is
	// set when the core queued work while one was, for the next exchange
	// to return to collect; lingering while the backstop flush is due.
	inflight           int
	pending, lingering bool
}

// LinkConfig configures a node's Links.
type LinkConfig struct {
	// BreakerFailures is how many failed exchanges in a row open a
	// peer's breaker (3 when 0).
	BreakerFailures int
	// BreakerCooldown is how long a breaker stays open before the next
	// exchange is a trial (1 s when 0).
	BreakerCooldown time.Duration
	// MaxBatch is the number of queued items at which a core flushes at
	// once, whatever is in flight (1024 when 0).
	MaxBatch int
}

// link is one peer's side of the exchanges. Most pairs of nodes in a big
// region never queue: the Backlog is made when something first waits.
type link struct {
	busy bool     // an exchange is in flight
	gone bool     // the peer left the ring while busy: forget the link once idle
	q    *Backlog // what waits for the next exchange while one is in flight (nil: nothing yet)
}

// waiting reports whether anything waits in k's backlog.
func (k *link) waiting() bool { return k != nil && k.q != nil && !k.q.Empty() }

// breaker is one peer's circuit breaker: failures in a row, and whether
// (and since when, on the node's clock) it is open.
type breaker struct {
	failures int
	open     bool
	openAt   int64
}

// Nudge is what the adapter does after a decision (Links.Decided).
type Nudge uint8

const (
	// NudgeNone: nothing to send now.
	NudgeNone Nudge = iota
	// NudgeFlush: take what the cores have ready and send it now.
	NudgeFlush
	// NudgeLinger: schedule the backstop flush after the linger, and call
	// Lingered when it fires.
	NudgeLinger
)

// Breaker is a change of a peer's breaker (Links.Outcome): the adapter
// marks the peer down in every core when it opens (Coordinator.SetPeerDown)
// and up when it closes.
type Breaker uint8

const (
	// BreakerSame: no change.
	BreakerSame Breaker = iota
	// BreakerOpened: the peer is down; schedule the backstop flush too
	// (its identities' waiting requests complete by on_failure then).
	BreakerOpened
	// BreakerClosed: the peer answers again.
	BreakerClosed
)

// NewLinks returns the Links of a node with no exchange in flight and
// every breaker closed.
func NewLinks(cfg LinkConfig) *Links {
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = 3
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = time.Second
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	return &Links{cfg: cfg, links: map[string]*link{}, breaks: map[string]*breaker{}}
}

// Decided tells the links what a decision left in its core: whether it
// waits for a peer's answer (pending), whether the core has anything ready
// (Coordinator.HasReady) and how many items it has queued for peers
// (Coordinator.Queued). It returns what the adapter does now.
func (l *Links) Decided(pending, ready bool, queued int) Nudge {
	if queued >= l.cfg.MaxBatch {
		return NudgeFlush
	}
	if !pending && !ready {
		return NudgeNone
	}
	if l.inflight == 0 {
		l.pending = false
		return NudgeFlush
	}
	l.pending = true
	return l.linger()
}

// linger schedules the backstop flush unless one is due already.
func (l *Links) linger() Nudge {
	if !l.Kick() {
		return NudgeNone
	}
	return NudgeLinger
}

// Kick asks for the backstop flush after the linger, as a ring change or
// an opened breaker does, and reports whether the adapter schedules it:
// false when one is due already.
func (l *Links) Kick() bool {
	if l.lingering {
		return false
	}
	l.lingering = true
	return true
}

// Lingered tells the links the backstop flush fired: the adapter flushes
// now. The pending flag stays as it is: a stale one costs the next Collect
// an empty flush, or sends early what came without a decision.
func (l *Links) Lingered() { l.lingering = false }

// Collect reports whether work is pending for a returning exchange to
// send, and clears the flag: the adapter flushes when it is true.
func (l *Links) Collect() bool {
	p := l.pending
	l.pending = false
	return p
}

// Queue adds m's items to the backlog of the peer to when an exchange with
// it is in flight, and reports whether it did; else nothing changes. The
// Backlog copies the items: m's arrays stay the caller's.
func (l *Links) Queue(to string, m *Message) bool {
	k := l.links[to]
	if k == nil || !k.busy {
		return false
	}
	k.queue(m)
	return true
}

// queue adds m's items to k's backlog.
func (k *link) queue(m *Message) {
	if k.q == nil {
		k.q = &Backlog{}
	}
	k.q.Add(m)
}

// Send is Queue, or, when no exchange with to is in flight, marks one in
// flight and returns true: the adapter then starts the exchange of m, and
// calls Outcome and Next when it returns.
func (l *Links) Send(to string, m *Message) bool {
	k := l.links[to]
	if k == nil {
		k = &link{}
		l.links[to] = k
	}
	if k.busy {
		k.queue(m)
		return false
	}
	k.busy = true
	l.inflight++
	return true
}

// Waiting reports whether anything waits in the backlog of the peer to.
func (l *Links) Waiting(to string) bool {
	return l.links[to].waiting()
}

// Next is called when an exchange with to has returned and its reply was
// stepped (and Collect asked): it returns the peer's backlog as the next
// exchange, whose arrays are those of done's when done is not nil (the
// exchange just over: the transport kept nothing of it), and true; or,
// when nothing waits, marks the peer idle and returns false (done stays
// the caller's). A peer gone from the ring is forgotten once idle.
func (l *Links) Next(to string, done *Message) (Message, bool) {
	k := l.links[to]
	if k == nil || !k.busy {
		return Message{}, false
	}
	if k.waiting() {
		if done != nil {
			k.q.Reuse(done)
		}
		return k.q.Take(), true
	}
	l.inflight--
	if k.gone {
		delete(l.links, to)
		return Message{}, false
	}
	k.busy = false
	return Message{}, false
}

// Drop marks the exchange with to over and forgets the peer's link, its
// backlog included (a node that is closing sends nothing more).
func (l *Links) Drop(to string) {
	if k, ok := l.links[to]; ok {
		if k.busy {
			l.inflight--
		}
		delete(l.links, to)
	}
}

// Outcome records how an exchange with peer ended at now (the node's
// clock): ok when it succeeded. It returns the change of the peer's
// breaker.
func (l *Links) Outcome(now int64, peer string, ok bool) Breaker {
	if ok && len(l.breaks) == 0 {
		return BreakerSame // the common case
	}
	b := l.breaks[peer]
	if ok {
		if b == nil {
			return BreakerSame
		}
		delete(l.breaks, peer)
		if b.open {
			l.open--
			return BreakerClosed
		}
		return BreakerSame
	}
	if b == nil {
		b = &breaker{}
		l.breaks[peer] = b
	}
	b.failures++
	if b.failures >= l.cfg.BreakerFailures && !b.open {
		b.open, b.openAt = true, now
		l.open++
		return BreakerOpened
	}
	return BreakerSame
}

// Tick makes every breaker that cooled down by now half-open: the adapter
// marks those peers up again in every core, and the next exchange with
// each is the trial (one more failure reopens it at once). It appends the
// peers to into, in name order, and returns it.
func (l *Links) Tick(now int64, into []string) []string {
	if l.open == 0 {
		return into
	}
	start := len(into)
	for peer, b := range l.breaks {
		if b.open && now-b.openAt >= int64(l.cfg.BreakerCooldown) {
			b.open, b.failures = false, l.cfg.BreakerFailures-1
			l.open--
			into = append(into, peer)
		}
	}
	slices.Sort(into[start:])
	return into
}

// Open reports whether the breaker of peer is open.
func (l *Links) Open(peer string) bool {
	b := l.breaks[peer]
	return b != nil && b.open
}

// SetPeers installs the members of the ring now in force. A member that
// is back in the ring, or at a new address, is a new run of that node (a
// restart): the failures its breaker counted were the old run's, so the
// breaker resets, and SetPeers appends the peer to into, in name order,
// when it was open (the adapter marks it up at once instead of after the
// cooldown). The links of peers gone from the ring are forgotten once
// idle. The first call sets the members and resets nothing.
func (l *Links) SetPeers(members []Member, into []string) []string {
	old := l.members
	l.members = make(map[string]string, len(members))
	for _, m := range members {
		l.members[m.Name] = m.Addr
	}
	for peer, k := range l.links {
		_, in := l.members[peer]
		switch {
		case !in && !k.busy:
			delete(l.links, peer)
		default: // busy: forgotten once idle if gone
			k.gone = !in
		}
	}
	if old == nil {
		return into
	}
	start := len(into)
	for peer, b := range l.breaks {
		addr, in := l.members[peer]
		if !in {
			continue
		}
		if was, ok := old[peer]; ok && was == addr {
			continue
		}
		delete(l.breaks, peer)
		if b.open {
			l.open--
			into = append(into, peer)
		}
	}
	slices.Sort(into[start:])
	return into
}

// InFlight reports whether an exchange with to is in flight.
func (l *Links) InFlight(to string) bool {
	k := l.links[to]
	return k != nil && k.busy
}

// Busy returns the number of peers with an exchange in flight.
func (l *Links) Busy() int { return l.inflight }

// LinkStats is a snapshot of a node's Links, for metrics and checks.
type LinkStats struct {
	// Busy is the number of peers with an exchange in flight, Backlogged
	// the number whose backlog holds items for the next one.
	Busy, Backlogged int
	// Pending: the cores queued work while an exchange was in flight,
	// for the next one to return to collect. Lingering: the backstop
	// flush is due.
	Pending, Lingering bool
	// Open is the number of peers whose breaker is open.
	Open int
}

// Stats returns a snapshot of the links.
func (l *Links) Stats() LinkStats {
	st := LinkStats{Busy: l.inflight, Pending: l.pending, Lingering: l.lingering, Open: l.open}
	for _, k := range l.links {
		if k.waiting() {
			st.Backlogged++
		}
	}
	return st
}
