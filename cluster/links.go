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
// Peers are named by the index Peer gives them, so that an adapter that
// knows its peers by number (the simulator) looks nothing up.
//
// The zero Links is not usable; make one with NewLinks.
type Links struct {
	cfg   LinkConfig
	ids   map[string]int // peer name → index into peers and busy
	peers []peer
	// busy[p]: an exchange with peer p is in flight. Apart from peers
	// because every send reads it: a few cache lines for all peers.
	busy []bool
	open int // breakers open
	// unclean counts the breakers with a failure counted or open: while
	// it is 0, a successful exchange changes nothing and reads no peer.
	unclean int
	// backlogged counts the peers whose backlog holds items: while it is
	// 0, a returning exchange need not look at its peer's.
	backlogged int
	// gone counts the peers marked gone (left the ring while busy).
	gone int
	// members is the ring in force (name → address); nil before SetPeers.
	members map[string]string
	// inflight counts the peers with an exchange in flight; pending is set
	// when the core queued work while one was, for the next exchange to
	// return to collect; lingering while the backstop flush is due.
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

// peer is one peer's side of the exchanges and its breaker. Most pairs of
// nodes in a big region never queue: the Backlog is made when something
// first waits, and let go when the peer leaves the ring.
type peer struct {
	name string
	gone bool     // the peer left the ring while busy: let the backlog go once idle
	q    *Backlog // what waits for the next exchange while one is in flight (nil: nothing yet)
	// The breaker: failures in a row, and whether (and since when, on the
	// node's clock) it is open.
	failures int
	open     bool
	openAt   int64
}

// waiting reports whether anything waits in k's backlog.
func (k *peer) waiting() bool { return k.q != nil && !k.q.Empty() }

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
	return &Links{cfg: cfg, ids: map[string]int{}}
}

// Peer returns the index of the peer named name, giving it the next one at
// first sight. An index stays the peer's for the life of the Links.
func (l *Links) Peer(name string) int {
	if i, ok := l.ids[name]; ok {
		return i
	}
	i := len(l.peers)
	l.ids[name] = i
	l.peers = append(l.peers, peer{name: name})
	l.busy = append(l.busy, false)
	return i
}

// Name returns the name of peer p.
func (l *Links) Name(p int) string { return l.peers[p].name }

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

// Queue adds m's items to the backlog of peer p when an exchange with it is
// in flight, and reports whether it did; else nothing changes. The Backlog
// copies the items: m's arrays stay the caller's.
func (l *Links) Queue(p int, m *Message) bool {
	if !l.busy[p] {
		return false
	}
	k := &l.peers[p]
	if k.q == nil {
		k.q = &Backlog{}
	}
	if k.q.Empty() {
		l.backlogged++
	}
	k.q.Add(m)
	return true
}

// Send is Queue, or, when no exchange with peer p is in flight, marks one
// in flight and returns true: the adapter then starts the exchange of m,
// and calls Outcome and Next when it returns.
func (l *Links) Send(p int, m *Message) bool {
	if l.Queue(p, m) {
		return false
	}
	l.busy[p] = true
	l.inflight++
	return true
}

// Next is called when an exchange with peer p has returned and its reply
// was stepped (and Collect asked): it returns the peer's backlog as the
// next exchange, whose arrays are those of done's when done is not nil
// (the exchange just over: the transport kept nothing of it), and true;
// or, when nothing waits, marks the peer idle and returns false (done
// stays the caller's). The backlog of a peer gone from the ring is let go
// once it is idle.
func (l *Links) Next(p int, done *Message) (Message, bool) {
	if !l.busy[p] {
		return Message{}, false
	}
	if l.backlogged > 0 {
		if k := &l.peers[p]; k.waiting() {
			if done != nil {
				k.q.Reuse(done)
			}
			l.backlogged--
			return k.q.Take(), true
		}
	}
	l.busy[p] = false
	l.inflight--
	if l.gone > 0 {
		if k := &l.peers[p]; k.gone {
			k.q, k.gone = nil, false
			l.gone--
		}
	}
	return Message{}, false
}

// Drop marks the exchange with peer p over and lets its backlog go (a
// node that is closing sends nothing more).
func (l *Links) Drop(p int) {
	if l.busy[p] {
		l.busy[p] = false
		l.inflight--
	}
	k := &l.peers[p]
	if k.waiting() {
		l.backlogged--
	}
	if k.gone {
		k.gone = false
		l.gone--
	}
	k.q = nil
}

// Outcome records how an exchange with peer p ended at now (the node's
// clock): ok when it succeeded. It returns the change of the peer's
// breaker.
func (l *Links) Outcome(now int64, p int, ok bool) Breaker {
	if ok && l.unclean == 0 {
		return BreakerSame // the common case
	}
	k := &l.peers[p]
	if ok {
		open := k.open
		l.setBreaker(k, 0, false, 0)
		if open {
			l.open--
			return BreakerClosed
		}
		return BreakerSame
	}
	if k.failures+1 >= l.cfg.BreakerFailures && !k.open {
		l.setBreaker(k, k.failures+1, true, now)
		l.open++
		return BreakerOpened
	}
	l.setBreaker(k, k.failures+1, k.open, k.openAt)
	return BreakerSame
}

// setBreaker sets k's breaker, keeping the count of unclean ones.
func (l *Links) setBreaker(k *peer, failures int, open bool, openAt int64) {
	was := k.failures > 0 || k.open
	k.failures, k.open, k.openAt = failures, open, openAt
	switch is := failures > 0 || open; {
	case was && !is:
		l.unclean--
	case !was && is:
		l.unclean++
	}
}

// Tick makes every breaker that cooled down by now half-open: the adapter
// marks those peers up again in every core, and the next exchange with
// each is the trial (one more failure reopens it at once). It appends the
// peers' names to into, in name order, and returns it.
func (l *Links) Tick(now int64, into []string) []string {
	if l.open == 0 {
		return into
	}
	start := len(into)
	for i := range l.peers {
		k := &l.peers[i]
		if k.open && now-k.openAt >= int64(l.cfg.BreakerCooldown) {
			l.setBreaker(k, l.cfg.BreakerFailures-1, false, k.openAt)
			l.open--
			into = append(into, k.name)
		}
	}
	slices.Sort(into[start:])
	return into
}

// Open reports whether the breaker of peer p is open.
func (l *Links) Open(p int) bool { return l.peers[p].open }

// SetPeers installs the members of the ring now in force. A member that
// is back in the ring, or at a new address, is a new run of that node (a
// restart): the failures its breaker counted were the old run's, so the
// breaker resets, and SetPeers appends the peer's name to into, in name
// order, when it was open (the adapter marks it up at once instead of
// after the cooldown). The backlogs of peers gone from the ring are let go
// once idle. The first call sets the members and resets nothing.
func (l *Links) SetPeers(members []Member, into []string) []string {
	old := l.members
	l.members = make(map[string]string, len(members))
	for _, m := range members {
		l.members[m.Name] = m.Addr
	}
	start := len(into)
	for i := range l.peers {
		k := &l.peers[i]
		addr, in := l.members[k.name]
		if gone := !in && l.busy[i]; gone != k.gone {
			k.gone = gone
			if gone {
				l.gone++
			} else {
				l.gone--
			}
		}
		if !in {
			if !l.busy[i] {
				k.q = nil // idle: its backlog is empty
			}
			continue
		}
		if old == nil || k.failures == 0 && !k.open {
			continue
		}
		if was, ok := old[k.name]; ok && was == addr {
			continue
		}
		if k.open {
			l.open--
			into = append(into, k.name)
		}
		l.setBreaker(k, 0, false, 0)
	}
	slices.Sort(into[start:])
	return into
}

// InFlight reports whether an exchange with peer p is in flight.
func (l *Links) InFlight(p int) bool { return l.busy[p] }

// Waiting reports whether anything waits in the backlog of peer p.
func (l *Links) Waiting(p int) bool { return l.peers[p].waiting() }

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
	return LinkStats{Busy: l.inflight, Backlogged: l.backlogged, Pending: l.pending, Lingering: l.lingering, Open: l.open}
}
