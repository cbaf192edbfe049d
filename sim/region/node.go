package region

import (
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/sim/engine"
)

// node is one simulated gateway: the real cluster.Coordinator in an adapter
// that does, under the virtual clock, what cluster.Shell does with
// goroutines and sockets:
//
//   - Decide runs at once; whatever it queues is sent after the linger
//     (one batch per peer), and Tick runs every tick, followed by a send.
//   - An exchange is one request carrying one batched Message: the
//     receiver Steps it and replies with what its Ready has for the
//     sender; what its Ready has for others it sends at once, as
//     Shell.Handle does. The sender Steps the reply and sends what its
//     Ready then has, at once.
//   - A lost request or reply surfaces as a failed exchange at the call
//     timeout. BreakerFailures failures in a row open the peer's breaker
//     (SetPeerDown true); after the cooldown a tick makes it half-open
//     (one failure reopens it); a success closes it.
//
// The node's clock is the virtual clock plus its skew.
type node struct {
	rg   *Region
	id   int
	name string

	inc     uint64 // incarnation; 0 before the first start
	up      bool   // running: deciding, serving exchanges
	serving bool   // receiving client traffic (false once it leaves)
	skew    int64
	coord   *cluster.Coordinator
	waits   map[uint64]*wait
	breaks  []breaker // by peer id
	queued  bool      // a linger flush is scheduled
	tick    *nodeTick
	flushEv *nodeFlush

	// membership: member[j] is whether j is in this node's view.
	member []bool
	epoch  uint64

	// stats of earlier incarnations.
	past cluster.Stats
}

type wait struct {
	ident   int
	cost    int64
	arrived int64 // virtual time the request arrived
	ownerAt int64 // virtual time the owner decided it (remote results), -1 if not known
}

type breaker struct {
	failures int
	openAt   int64 // node clock; 0 when closed
}

func (n *node) now() int64 { return n.rg.sim.Now() + n.skew }

// start (re)starts the node with an empty coordinator whose incarnation is
// above any earlier one, with the given view.
func (n *node) start(view []bool) {
	inc := max(uint64(n.now()), n.inc+1<<32)
	n.inc = inc
	n.up, n.serving = true, true
	n.coord = cluster.NewCoordinator(cluster.CoordinatorConfig{
		Self:          n.name,
		SyncInterval:  n.rg.cfg.Sync,
		DecideTimeout: n.rg.cfg.DecideTimeout,
		Incarnation:   inc,
	})
	n.coord.SetRules([]cluster.RuleParams{n.rg.params})
	n.waits = map[uint64]*wait{}
	n.breaks = make([]breaker, len(n.rg.nodes))
	n.queued = false
	n.member = view
	n.epoch = 0
	n.coord.SetTable(n.now(), n.rg.tableOf(n, n.epoch))
	n.tick = &nodeTick{n: n, inc: inc}
	n.flushEv = &nodeFlush{n: n, inc: inc}
	n.rg.sim.After(n.rg.tickPhase(n.id), n.tick)
}

// stop ends the node's run; its state is lost.
func (n *node) stop() {
	if !n.up {
		return
	}
	n.addPast()
	n.up, n.serving = false, false
	n.coord, n.waits = nil, nil
}

func (n *node) addPast() {
	s := n.coord.Stats()
	p := &n.past
	p.LocalAdmits += s.LocalAdmits
	p.ViewRejects += s.ViewRejects
	p.Forwarded += s.Forwarded
	p.RemoteResults += s.RemoteResults
	p.Degraded += s.Degraded
	p.SyncsSent += s.SyncsSent
	p.AcksSent += s.AcksSent
	p.ReportsCharged += s.ReportsCharged
}

// request is a client request for identity ident arriving at this node.
func (n *node) request(ident int, cost int64) {
	o, err := n.coord.Decide(n.now(), ruleID, n.rg.idNames[ident], cost)
	if err != nil {
		panic(err) // the only rule is always installed
	}
	vnow := n.rg.sim.Now()
	if o.Pending {
		n.waits[o.Ticket] = &wait{ident: ident, cost: cost, arrived: vnow, ownerAt: -1}
	} else {
		n.rg.outcome(n, ident, vnow, o, cost)
	}
	if n.coord.HasReady() {
		n.kick()
	}
}

// kick schedules a send after the linger.
func (n *node) kick() {
	if n.queued {
		return
	}
	n.queued = true
	n.rg.sim.After(int64(n.rg.cfg.Linger), n.flushEv)
}

// flush hands out completions and sends every queued batch.
func (n *node) flush() {
	rd := n.coord.Ready()
	n.complete(rd.Completions)
	for _, env := range rd.Messages {
		n.send(env)
	}
}

// complete records the late decisions of pending requests. A remote
// decision counts at the time the owner made it, so that intervals measure
// the limiter, not the wire.
func (n *node) complete(cs []cluster.Completion) {
	vnow := n.rg.sim.Now()
	for _, c := range cs {
		w := n.waits[c.Ticket]
		if w == nil {
			continue
		}
		delete(n.waits, c.Ticket)
		at := vnow
		if c.Outcome.Source == cluster.SourceRemote && w.ownerAt >= 0 {
			at = w.ownerAt
		}
		n.rg.outcome(n, w.ident, at, c.Outcome, w.cost)
	}
}

// send starts one exchange with env.To.
func (n *node) send(env cluster.Envelope) {
	to, ok := n.rg.byName[env.To]
	if !ok {
		return
	}
	now := n.rg.sim.Now()
	x := &exchange{from: n, fromInc: n.inc, to: to, msg: env.Msg, sentAt: now, deadline: now + int64(n.rg.cfg.CallTimeout)}
	x.timer.x = x
	n.rg.exchanges++
	if at, ok := n.rg.net.Send(n.id, to, x); !ok || at > x.deadline {
		x.fail()
	}
}

// fail makes the exchange fail at its deadline, as the Shell's call
// timeout does. Only exchanges that cannot succeed schedule this timer:
// a reply that arrives in time needs none.
func (x *exchange) fail() {
	if x.timerSet {
		return
	}
	x.timerSet = true
	x.from.rg.sim.At(x.deadline, &x.timer)
}

// Dropped is the network telling that a partition cut the request or the
// reply at delivery.
func (x *exchange) Dropped(*engine.Sim) { x.fail() }

// exchange is one request and its reply. It fires twice at most: at the
// receiver (phase 0), then back at the sender (phase 1).
type exchange struct {
	from     *node
	fromInc  uint64
	to       int
	msg      cluster.Message
	sentAt   int64
	deadline int64 // sentAt + the call timeout
	timerSet bool
	phase    uint8
	done     bool // the sender has seen the reply or the timeout
	replyAt  int64
	timer    exchangeTimer
}

func (x *exchange) Fire(s *engine.Sim) {
	rg := x.from.rg
	if x.phase == 0 {
		recv := rg.nodes[x.to]
		if !recv.up {
			x.fail() // nobody answers; the sender times out
			return
		}
		recv.noteResults(&x.msg, x.sentAt)
		recv.coord.Step(recv.now(), x.from.name, &x.msg)
		rd := recv.coord.Ready()
		var reply cluster.Message
		var others []cluster.Envelope
		for _, env := range rd.Messages {
			if env.To == x.from.name {
				reply = env.Msg
			} else {
				others = append(others, env)
			}
		}
		recv.complete(rd.Completions)
		for _, env := range others {
			recv.send(env)
		}
		x.msg = reply
		x.phase = 1
		x.replyAt = s.Now()
		rg.replies++
		if at, ok := rg.net.Send(x.to, x.from.id, x); !ok || at > x.deadline {
			x.fail()
		}
		return
	}
	n := x.from
	if x.done || !n.up || n.inc != x.fromInc {
		return
	}
	x.done = true
	if rtt := s.Now() - x.sentAt; rtt > rg.maxRTT {
		rg.maxRTT = rtt
	}
	n.peerOK(x.to)
	n.noteResults(&x.msg, x.replyAt)
	if !x.msg.Empty() {
		n.coord.Step(n.now(), rg.names[x.to], &x.msg)
	}
	n.flush()
}

// noteResults notes when the owner decided the results in m: when it sent
// m. The coordinator puts a result in its outbox while it Steps the
// request, and every Step is followed by a send at the same instant, so the
// send time is the decision time, whether the result rides in a reply or in
// a request of the owner's own.
func (n *node) noteResults(m *cluster.Message, sentAt int64) {
	for _, r := range m.Results {
		if w := n.waits[r.Ticket]; w != nil {
			w.ownerAt = sentAt
		}
	}
}

type exchangeTimer struct{ x *exchange }

func (t *exchangeTimer) Fire(*engine.Sim) {
	x := t.x
	n := x.from
	if x.done || !n.up || n.inc != x.fromInc {
		return
	}
	x.done = true
	n.rg.failedExchanges++
	n.peerFailed(x.to)
	n.flush()
}

func (n *node) peerFailed(peer int) {
	b := &n.breaks[peer]
	b.failures++
	if b.failures >= n.rg.cfg.BreakerFailures && b.openAt == 0 {
		b.openAt = n.now()
		n.coord.SetPeerDown(n.now(), n.rg.names[peer], true)
		n.rg.breakerOpens++
	}
}

func (n *node) peerOK(peer int) {
	b := &n.breaks[peer]
	if b.openAt != 0 {
		n.coord.SetPeerDown(0, n.rg.names[peer], false)
	}
	*b = breaker{}
}

// retryBreakers makes a cooled-down breaker half-open, as Shell does on
// every tick.
func (n *node) retryBreakers() {
	now := n.now()
	for peer := range n.breaks {
		b := &n.breaks[peer]
		if b.openAt != 0 && now-b.openAt >= int64(n.rg.cfg.BreakerCooldown) {
			n.coord.SetPeerDown(now, n.rg.names[peer], false)
			b.openAt = 0
			b.failures = n.rg.cfg.BreakerFailures - 1
		}
	}
}

type nodeTick struct {
	n   *node
	inc uint64
}

func (t *nodeTick) Fire(s *engine.Sim) {
	n := t.n
	if !n.up || n.inc != t.inc {
		return
	}
	// Tick on a coordinator with no entry, no owned bucket and no pending
	// request does nothing; skipping it keeps big idle fleets cheap.
	if st := n.coord.Stats(); st.Entries > 0 || st.Owned > 0 || len(n.waits) > 0 {
		n.coord.Tick(n.now())
	}
	n.retryBreakers()
	n.flush()
	if s.Now() < n.rg.end {
		s.After(int64(n.rg.cfg.Tick), t)
	}
}

type nodeFlush struct {
	n   *node
	inc uint64
}

func (f *nodeFlush) Fire(*engine.Sim) {
	n := f.n
	if !n.up || n.inc != f.inc {
		return
	}
	n.queued = false
	n.flush()
}
