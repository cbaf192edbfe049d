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
	waits   waitQueue
	rd      cluster.Ready // reused by every Ready of this node (ReadyInto)
	breaks  []breaker     // by peer id
	queued  bool          // a linger flush is scheduled
	tick    *nodeTick
	flushEv *nodeFlush

	// unclean counts breakers that are not closed with no failure, open
	// those open: a reply or a tick with none skips the walk.
	unclean, open int

	// membership: member[j] is whether j is in this node's view.
	member []bool
	epoch  uint64

	// stats of earlier incarnations.
	past cluster.Stats
}

type wait struct {
	ticket  uint64
	ident   int
	cost    int64
	arrived int64 // virtual time the request arrived
	ownerAt int64 // virtual time the owner decided it (remote results), -1 if not known
	live    bool
}

// waitQueue holds a node's pending requests by ticket. The coordinator
// numbers its tickets 1, 2, 3, ... and the node waits on every one, so
// ticket t sits at head + t − the first's ticket: a slice, not a map.
type waitQueue struct {
	q    []wait
	head int
	n    int // live waits
}

func (wq *waitQueue) add(w wait) {
	if n := len(wq.q); n > wq.head && wq.q[n-1].ticket+1 != w.ticket {
		panic("sim: the coordinator's tickets are not consecutive")
	}
	w.live = true
	wq.q = append(wq.q, w)
	wq.n++
}

// get returns the live wait of ticket t, or nil.
func (wq *waitQueue) get(t uint64) *wait {
	if wq.head == len(wq.q) {
		return nil
	}
	first := wq.q[wq.head].ticket
	if t < first || t-first >= uint64(len(wq.q)-wq.head) {
		return nil
	}
	if w := &wq.q[wq.head+int(t-first)]; w.live && w.ticket == t {
		return w
	}
	return nil
}

// done forgets w (from get); w must not be used afterwards.
func (wq *waitQueue) done(w *wait) {
	w.live = false
	wq.n--
	for wq.head < len(wq.q) && !wq.q[wq.head].live {
		wq.head++
	}
	switch {
	case wq.head == len(wq.q):
		wq.q, wq.head = wq.q[:0], 0
	case wq.head >= 64 && wq.head >= len(wq.q)/2:
		k := copy(wq.q, wq.q[wq.head:])
		wq.q, wq.head = wq.q[:k], 0
	}
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
	// A gated rule's sketch hashes with a per-process seed, drawn from
	// the run's source (only when gating is on: ungated runs draw as
	// before).
	var seed uint64
	if n.rg.cfg.Sketch > 0 {
		seed = n.rg.sim.Rand().Uint64()
	}
	n.coord = cluster.NewCoordinator(cluster.CoordinatorConfig{
		Self:          n.name,
		SyncInterval:  n.rg.cfg.Sync,
		DecideTimeout: n.rg.cfg.DecideTimeout,
		Incarnation:   inc,
		SketchSeed:    seed,
		MaxKeys:       n.rg.cfg.KeyCap,
		OnEvict:       n.rg.evicted,
	})
	n.coord.SetRules([]cluster.RuleParams{n.rg.params})
	n.waits = waitQueue{}
	n.rd = cluster.Ready{}
	n.breaks = make([]breaker, len(n.rg.nodes))
	n.unclean, n.open = 0, 0
	n.queued = false
	n.member = view
	n.epoch = 0
	n.coord.SetTable(n.now(), n.rg.tableOf(n, n.epoch))
	n.tick = &nodeTick{n: n, inc: inc}
	n.flushEv = &nodeFlush{n: n, inc: inc}
	n.rg.sim.AfterIn(n.rg.tickLane, n.rg.tickPhase(n.id), n.tick)
}

// stop ends the node's run; its state is lost.
func (n *node) stop() {
	if !n.up {
		return
	}
	n.addPast()
	n.up, n.serving = false, false
	n.coord, n.waits = nil, waitQueue{}
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
	p.SketchAdmits += s.SketchAdmits
	p.SketchPromotions += s.SketchPromotions
	addEvictions(p, s)
}

// addEvictions adds s's key cap counters to p.
func addEvictions(p *cluster.Stats, s cluster.Stats) {
	p.EvictedIdle += s.EvictedIdle
	p.EvictedViews += s.EvictedViews
	p.EvictedForgiven += s.EvictedForgiven
	p.ForgivenTokens += s.ForgivenTokens
	p.OverCap += s.OverCap
}

// request is a client request for identity ident arriving at this node.
func (n *node) request(ident int, cost int64) {
	o, err := n.coord.Decide(n.now(), ruleID, n.rg.idNames[ident], cost)
	if err != nil {
		panic(err) // the only rule is always installed
	}
	vnow := n.rg.sim.Now()
	if o.Pending {
		n.waits.add(wait{ticket: o.Ticket, ident: ident, cost: cost, arrived: vnow, ownerAt: -1})
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
	n.rg.sim.AfterIn(n.rg.flushLane, int64(n.rg.cfg.Linger), n.flushEv)
}

// flush hands out completions and sends every queued batch.
func (n *node) flush() {
	rd := &n.rd
	n.coord.ReadyInto(rd)
	n.complete(rd.Completions)
	for i := range rd.Messages {
		n.send(&rd.Messages[i])
	}
}

// complete records the late decisions of pending requests. A remote
// decision counts at the time the owner made it, so that intervals measure
// the limiter, not the wire.
func (n *node) complete(cs []cluster.Completion) {
	vnow := n.rg.sim.Now()
	for i := range cs {
		c := &cs[i]
		wp := n.waits.get(c.Ticket)
		if wp == nil {
			continue
		}
		w := *wp
		n.waits.done(wp)
		at := vnow
		if c.Outcome.Source == cluster.SourceRemote && w.ownerAt >= 0 {
			at = w.ownerAt
		}
		n.rg.outcome(n, w.ident, at, c.Outcome, w.cost)
	}
}

// send starts one exchange with env.To.
func (n *node) send(env *cluster.Envelope) {
	rg := n.rg
	to, ok := rg.nodeIndex(env.To)
	if !ok {
		return
	}
	now := rg.sim.Now()
	x := rg.newExchange()
	x.rg, x.from, x.fromInc, x.to, x.recv, x.msg, x.sentAt, x.deadline = rg, n, n.inc, to, rg.nodes[to], env.Msg, now, now+int64(rg.cfg.CallTimeout)
	x.stepper = n.coord
	rg.exchanges++
	x.transmit(n.id, to)
}

// transmit hands the exchange to the network, from a to b, and arms the
// timeout if it cannot arrive in time.
func (x *exchange) transmit(a, b int) {
	at, ok := x.rg.net.SendDirect(a, b, x)
	if ok {
		x.refs++
	}
	if !ok || at > x.deadline {
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
	x.refs++
	x.rg.sim.At(x.deadline, &x.timer)
}

// newExchange returns a zeroed exchange from the region's free list.
func (rg *Region) newExchange() *exchange {
	x := rg.freeX
	if x == nil {
		x = &exchange{}
	} else {
		rg.freeX = x.next
		x.next = nil
	}
	x.timer.x = x
	return x
}

// release puts the exchange back on the free list once no scheduled event
// refers to it any more (the network's deliveries and the timeout each
// hold a reference while scheduled).
func (x *exchange) release() {
	if x.refs > 0 {
		return
	}
	rg := x.rg
	*x = exchange{next: rg.freeX}
	rg.freeX = x
}

// exchange is one request and its reply. It fires twice at most: at the
// receiver (phase 0), then back at the sender (phase 1). Exchanges are
// recycled through a free list once no event refers to them (refs).
type exchange struct {
	// rg and recv are x.from.rg and rg.nodes[to], held here so that a
	// delivery reaches them without a chain of loads through cold memory.
	rg       *Region
	recv     *node
	from     *node
	fromInc  uint64
	to       int
	msg      cluster.Message
	stepper  *cluster.Coordinator // made msg; receives its arrays back once it is stepped
	refs     int                  // scheduled deliveries and timeouts that refer to x
	next     *exchange            // free list
	sentAt   int64
	deadline int64 // sentAt + the call timeout
	timerSet bool
	phase    uint8
	done     bool // the sender has seen the reply or the timeout
	replyAt  int64
	timer    exchangeTimer
}

// Fire delivers the request (phase 0) or the reply (phase 1), unless a
// partition cuts it (x is sent with Network.SendDirect). It releases
// x at every return rather than by a defer: it runs twice per exchange.
func (x *exchange) Fire(s *engine.Sim) {
	x.refs--
	rg := x.rg
	a, b := x.from.id, x.to
	if x.phase == 1 {
		a, b = b, a
	}
	if !rg.net.Arrives(a, b) {
		// A partition cut the request or the reply at delivery.
		x.fail()
		x.release()
		return
	}
	if x.phase == 0 {
		recv := x.recv
		if !recv.up {
			x.fail() // nobody answers; the sender times out
			x.release()
			return
		}
		recv.noteResults(&x.msg, x.sentAt)
		recv.coord.Step(recv.now(), x.from.name, &x.msg)
		// Stepped: nothing reads the request's items any more.
		x.stepper.Recycle(&x.msg)
		rd := &recv.rd
		recv.coord.ReadyInto(rd)
		// The request's items are recycled: x.msg becomes the reply (the
		// message the receiver has for the sender, if any) in place.
		x.msg = cluster.Message{}
		replied := false
		for i := range rd.Messages {
			if rd.Messages[i].To == x.from.name {
				x.msg, replied = rd.Messages[i].Msg, true
				break
			}
		}
		recv.complete(rd.Completions)
		// What the receiver has for others goes at once. send does not
		// call Ready, so rd stays as it is meanwhile.
		if !replied || len(rd.Messages) > 1 {
			for i := range rd.Messages {
				if rd.Messages[i].To != x.from.name {
					recv.send(&rd.Messages[i])
				}
			}
		}
		x.stepper = recv.coord
		x.phase = 1
		x.replyAt = s.Now()
		rg.replies++
		x.transmit(x.to, x.from.id)
		x.release()
		return
	}
	n := x.from
	if x.done || !n.up || n.inc != x.fromInc {
		x.release()
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
	x.stepper.Recycle(&x.msg)
	x.msg = cluster.Message{}
	n.flush()
	x.release()
}

// noteResults notes when the owner decided the results in m: when it sent
// m. The coordinator puts a result in its outbox while it Steps the
// request, and every Step is followed by a send at the same instant, so the
// send time is the decision time, whether the result rides in a reply or in
// a request of the owner's own.
func (n *node) noteResults(m *cluster.Message, sentAt int64) {
	for i := range m.Results {
		if w := n.waits.get(m.Results[i].Ticket); w != nil {
			w.ownerAt = sentAt
		}
	}
}

type exchangeTimer struct{ x *exchange }

func (t *exchangeTimer) Fire(*engine.Sim) {
	x := t.x
	x.refs--
	defer x.release()
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
	if *b == (breaker{}) {
		n.unclean++
	}
	b.failures++
	if b.failures >= n.rg.cfg.BreakerFailures && b.openAt == 0 {
		b.openAt = n.now()
		n.open++
		n.coord.SetPeerDown(n.now(), n.rg.names[peer], true)
		n.rg.breakerOpens++
	}
}

func (n *node) peerOK(peer int) {
	if n.unclean == 0 {
		return // the common case
	}
	b := &n.breaks[peer]
	if *b == (breaker{}) {
		return
	}
	if b.openAt != 0 {
		n.coord.SetPeerDown(0, n.rg.names[peer], false)
		n.open--
	}
	*b = breaker{}
	n.unclean--
}

// retryBreakers makes a cooled-down breaker half-open, as Shell does on
// every tick.
func (n *node) retryBreakers() {
	if n.open == 0 {
		return
	}
	now := n.now()
	for peer := range n.breaks {
		b := &n.breaks[peer]
		if b.openAt != 0 && now-b.openAt >= int64(n.rg.cfg.BreakerCooldown) {
			n.coord.SetPeerDown(now, n.rg.names[peer], false)
			b.openAt = 0
			b.failures = n.rg.cfg.BreakerFailures - 1
			n.open--
			if *b == (breaker{}) {
				n.unclean--
			}
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
	if st := n.coord.Stats(); st.Entries > 0 || st.Owned > 0 || n.waits.n > 0 {
		n.coord.Tick(n.now())
	}
	n.retryBreakers()
	n.flush()
	if s.Now() < n.rg.end {
		s.AfterIn(n.rg.tickLane, int64(n.rg.cfg.Tick), t)
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
