package region

import (
	"unsafe"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/sim/engine"
)

// node is one simulated gateway: the real cluster.Coordinator and the
// real cluster.Links (the policy of the exchanges with peers: one in flight
// per peer, Nagle's sending, the breakers) in an adapter that does under
// the virtual clock what shell.Node does with goroutines and sockets:
//
//   - A decision is followed by what Links.Decided makes of it: a flush
//     now, or the backstop flush after the linger (nodeFlush), or nothing.
//     Tick runs every tick, followed by Links.Tick and a flush.
//   - A flush sends each batch through Links.Send: it starts an exchange,
//     or joins the busy peer's backlog. When an exchange returns, by its
//     reply or its call timeout, the node reports its outcome
//     (Links.Outcome: the breaker), steps the reply and sends what that
//     readied, collects (Links.Collect), then sends what Links.Next
//     returns, as Shell.run does.
//   - An exchange is one request carrying one batched Message: the
//     receiver Steps it and replies with what its Ready has for the
//     sender; what its Ready has for others goes through Links.Send, as
//     Shell.Handle does.
//   - A ring change installs the ring's members (Links.SetPeers) and
//     sends what SetTable queued (Shell.SetRing); a leave sends its
//     handoffs and reports outside the one-per-peer rule, and what
//     stepping their replies readies goes as any send (Shell.flushWith).
//
// What the simulator models rather than ships: the network (latency, loss,
// partitions: the exchange and Network), the gRPC call timeout (an
// exchange that cannot return in time fails at its deadline), membership
// convergence (membership.go) and the clock's skew. The node's clock is
// the virtual clock plus its skew. A crash loses the links: a new
// incarnation starts with none, and exchanges of an old one do not touch
// its state.
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
	lk      *cluster.Links
	// backlogs[j] is what the simulator notes of the items waiting in the
	// backlog of peer j (made at the first wait).
	backlogs []*backlogTimes
	peers    []string // scratch for Links.Tick and Links.SetPeers
	tick     *nodeTick
	flushEv  *nodeFlush

	// membership: member[j] is whether j is in this node's view.
	member []bool
	epoch  uint64

	// replyAt, while a reply's flush runs, is when the reply left its
	// owner: the time of every remote completion the flush hands out
	// (-1 otherwise: each wait's ownerAt says).
	replyAt int64

	// stats of earlier incarnations.
	past cluster.Stats

	// A multi-rule run's requests in progress (rules.go): reqs by slot,
	// the free slots, and the slots whose pending Take completed, which
	// contEv continues after the event that completed them.
	reqs     []ruleReq
	freeReqs []int32
	conts    []int32
	contSet  bool
	contEv   *nodeCont
}

type wait struct {
	cost    int64
	ownerAt int64 // virtual time the owner decided it (remote results), -1 if not known
	// ident is the request's identity, or in a multi-rule run −1 − the
	// slot of the request (node.reqs) whose Take waits.
	ident int32
	live  bool
}

// waitQueue holds a node's pending requests by ticket. The coordinator
// numbers its tickets 1, 2, 3, ... and the node waits on nearly every one
// (not on those of requests relayed for other nodes), so ticket t sits at
// t − base, base being the ticket of q[0]: a slice, not a map. The waits
// before head are done.
type waitQueue struct {
	q    []wait
	head int
	base uint64
	n    int // live waits
}

// add waits on ticket, a request of identity ident costing cost.
func (wq *waitQueue) add(ticket uint64, ident int32, cost int64) {
	n := len(wq.q)
	switch {
	case n == 0:
		wq.base = ticket
	case wq.base+uint64(n) > ticket:
		panic("sim: the coordinator's tickets go back")
	default:
		// Tickets the coordinator used for requests it relayed for other
		// nodes during a warm-up (cluster/warmup.go) are never waited on
		// here: their slots stay empty.
		for ; wq.base+uint64(n) < ticket; n++ {
			wq.q = append(wq.q, wait{})
		}
	}
	if n < cap(wq.q) { // written in place, field by field
		wq.q = wq.q[:n+1]
	} else {
		wq.q = append(wq.q, wait{})
	}
	w := &wq.q[n]
	w.cost, w.ownerAt, w.ident, w.live = cost, -1, ident, true
	wq.n++
}

// get returns the live wait of ticket t, or nil.
func (wq *waitQueue) get(t uint64) *wait {
	// A ticket before base wraps around to a huge index.
	if i := t - wq.base; i >= uint64(wq.head) && i < uint64(len(wq.q)) && wq.q[i].live {
		return &wq.q[i]
	}
	return nil
}

// done forgets w (from get); w must not be used afterwards.
func (wq *waitQueue) done(w *wait) {
	w.live = false
	wq.n--
	if wq.n == 0 {
		wq.q, wq.head = wq.q[:0], 0
		return
	}
	for !wq.q[wq.head].live { // a live wait lies ahead: n > 0
		wq.head++
	}
	if wq.head >= 64 && wq.head >= len(wq.q)/2 {
		k := copy(wq.q, wq.q[wq.head:])
		wq.q, wq.base, wq.head = wq.q[:k], wq.base+uint64(wq.head), 0
	}
}

// backlogTimes is when the items waiting in a peer's backlog were taken
// from the coordinator, for the checks: readyAt is the virtual time of the
// earliest flush whose items wait (valid while the backlog is not empty);
// runs gives, in order, how many of its results each flush added and when
// (the owner's decision times).
type backlogTimes struct {
	waiting bool // something was queued since the backlog was last taken
	readyAt int64
	runs    []resultRun
}

// resultRun is count results of a message decided at virtual time at.
type resultRun struct {
	count int
	at    int64
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
	cc := cluster.CoordinatorConfig{
		Self:          n.name,
		SyncInterval:  n.rg.cfg.Sync,
		DecideTimeout: n.rg.cfg.DecideTimeout,
		Incarnation:   inc,
		SketchSeed:    seed,
		MaxKeys:       n.rg.cfg.KeyCap,
		OnEvict:       n.rg.evicted,
	}
	if n.rg.multi {
		cc.OnRefund = n.rg.refundGiven // the refunds asked of this owner (refunds.go)
	}
	n.coord = cluster.NewCoordinator(cc)
	if n.rg.multi {
		n.coord.SetRules(n.now(), n.rg.allParams)
	} else {
		n.coord.SetRules(n.now(), []cluster.RuleParams{n.rg.params})
	}
	n.waits = waitQueue{}
	n.rd = cluster.Ready{}
	n.lk = cluster.NewLinks(cluster.LinkConfig{BreakerFailures: n.rg.cfg.BreakerFailures,
		BreakerCooldown: n.rg.cfg.BreakerCooldown})
	// The Links number the peers in the order they are first named: as
	// the region does, so that a node index is the peer's.
	for j, name := range n.rg.names {
		if n.lk.Peer(name) != j {
			panic("sim: the links number the peers otherwise")
		}
	}
	n.backlogs = make([]*backlogTimes, len(n.rg.nodes))
	n.member = view
	n.epoch = 0
	t := n.rg.tableOf(n, n.epoch)
	n.coord.SetTable(n.now(), t)
	n.lk.SetPeers(t.Members(), nil)
	n.tick = &nodeTick{n: n, inc: inc}
	n.flushEv = &nodeFlush{n: n, inc: inc}
	if n.rg.multi {
		n.contEv = &nodeCont{n: n, inc: inc}
	}
	n.rg.sim.AfterIn(n.rg.tickLane, n.rg.tickPhase(n.id), n.tick)
}

// stop ends the node's run; its state is lost.
func (n *node) stop() {
	if !n.up {
		return
	}
	n.addPast()
	if n.rg.multi {
		n.dropRules()
	}
	n.up, n.serving = false, false
	n.coord, n.waits = nil, waitQueue{}
	n.lk, n.backlogs = nil, nil
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
	addBlind(p, s)
}

// addBlind adds s's blind spend counters to p.
func addBlind(p *cluster.Stats, s cluster.Stats) {
	p.BlindAdmits += s.BlindAdmits
	p.BlindOwn += s.BlindOwn
	p.BlindCharged += s.BlindCharged
	p.BlindTracks += s.BlindTracks
	p.BlindReports += s.BlindReports
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
	var o cluster.Outcome // written in place, not copied out of the call
	ids := n.rg.ids
	if err := n.coord.DecideInto(&o, n.now(), ruleID, ids.keys[ident], cost); err != nil {
		panic(err) // the only rule is always installed
	}
	vnow := n.rg.sim.Now()
	if o.Pending {
		n.waits.add(o.Ticket, int32(ident), cost)
	} else {
		n.rg.outcome(ident, vnow, &o, cost)
		if n.rg.spans != nil && o.Allowed {
			n.holdSlot(ident, o.Ticket, vnow, cost, o.Degraded)
		}
	}
	if !o.Pending && !n.coord.HasReady() {
		return // Links.Decided: nothing to send (the common case, kept cheap)
	}
	switch n.lk.Decided(o.Pending, true, n.coord.Queued()) {
	case cluster.NudgeFlush:
		n.flush()
	case cluster.NudgeLinger:
		n.linger()
	}
}

// collect flushes when a decision left work pending for a returning
// exchange (Links.Collect).
func (n *node) collect() {
	if n.lk.Collect() {
		n.flush()
	}
}

// kick asks for the backstop flush (Links.Kick), as a ring change or an
// opened breaker does.
func (n *node) kick() {
	if n.lk.Kick() {
		n.linger()
	}
}

// linger schedules the backstop flush after the linger.
func (n *node) linger() {
	n.rg.sim.AfterIn(n.rg.flushLane, int64(n.rg.cfg.Linger), n.flushEv)
}

// flush hands out completions and sends every queued batch.
func (n *node) flush() {
	if !n.coord.HasReady() {
		return // Ready would hand out nothing
	}
	rd := &n.rd
	readyInto(n.coord, rd)
	n.complete(rd.Completions)
	// send does not call Ready: rd stays as it is meanwhile.
	for i, msgs := 0, rd.Messages; i < len(msgs); i++ {
		n.send(&msgs[i])
	}
}

// readyInto is c.ReadyInto(rd) with rd's slices cut to length 0 first.
// ReadyInto clears what they held (so that old messages pin no memory)
// and then overwrites them from the start: here nothing they hold needs
// letting go (the message arrays are the coordinators' recycled ones, the
// names the region's), and the clearing cost about 90 instructions per
// decision of the benchmark run (2 % of the whole).
func readyInto(c *cluster.Coordinator, rd *cluster.Ready) {
	rd.Messages, rd.Completions = rd.Messages[:0], rd.Completions[:0]
	c.ReadyInto(rd)
}

// flushDirect is Shell.flushWith's sending, for a leave: every queued
// batch goes at once as an exchange of its own, whether or not one with
// its peer is in flight.
func (n *node) flushDirect() {
	rd := &n.rd
	readyInto(n.coord, rd)
	n.complete(rd.Completions)
	for i := range rd.Messages {
		if to, ok := n.rg.nodeIndex(rd.Messages[i].To); ok {
			n.exchange(to, &rd.Messages[i].Msg, nil, n.rg.sim.Now(), true)
		}
	}
}

// complete records the late decisions of pending requests. A remote
// decision counts at the time the owner made it, so that intervals measure
// the limiter, not the wire.
func (n *node) complete(cs []cluster.Completion) {
	if len(cs) == 0 {
		return // the common case at an owner: kept small enough to inline
	}
	n.completeAll(cs)
}

// completeAll is complete's loop, for at least one completion.
func (n *node) completeAll(cs []cluster.Completion) {
	vnow := n.rg.sim.Now()
	for i := range cs {
		c := &cs[i]
		wp := n.waits.get(c.Ticket)
		if wp == nil {
			continue
		}
		ident, cost, at := wp.ident, wp.cost, vnow
		if c.Outcome.Source == cluster.SourceRemote {
			switch {
			case n.replyAt >= 0:
				at = n.replyAt
			case wp.ownerAt >= 0:
				at = wp.ownerAt
			}
		}
		n.waits.done(wp)
		if ident < 0 {
			n.continueRules(-1-ident, at, &c.Outcome)
			continue
		}
		n.rg.outcome(int(ident), at, &c.Outcome, cost)
		if n.rg.spans != nil && c.Outcome.Allowed {
			n.holdSlot(int(ident), c.Ticket, at, cost, c.Outcome.Degraded)
		}
	}
}

// holdSlot holds an admitted request of a concurrency rule, decided by its
// owner at at, for the run's hold from now, then releases its slot (as the
// middleware's Done does), unless this node stopped meanwhile. A decision
// by on_failure releases the ticket at once: the owner may still grant it
// a slot (the root package's policy).
func (n *node) holdSlot(ident int, ticket uint64, at, cost int64, degraded bool) {
	rg := n.rg
	end := rg.sim.Now() + int64(rg.cfg.Hold)
	rg.spans.spans = append(rg.spans.spans, slotSpan{from: at - rg.t0, to: end - rg.t0, ident: ident, cost: cost, degraded: degraded})
	if degraded {
		n.release(ident, ticket, cost)
		return
	}
	inc := n.inc
	rg.sim.At(end, engine.EventFunc(func(*engine.Sim) {
		if n.up && n.inc == inc {
			n.release(ident, ticket, cost)
		}
	}))
}

// release frees ticket's slot and sends what that queues as a decision's
// messages are sent.
func (n *node) release(ident int, ticket uint64, cost int64) {
	n.coord.Release(n.now(), ruleID, n.rg.ids.names[ident], ticket, cost)
	if !n.coord.HasReady() {
		return
	}
	switch n.lk.Decided(false, true, n.coord.Queued()) {
	case cluster.NudgeFlush:
		n.flush()
	case cluster.NudgeLinger:
		n.linger()
	}
}

// send starts an exchange with env.To, or queues env.Msg for the next one
// if one with that peer is in flight (Shell.send). The message's items were
// taken from the coordinator now (by a flush, or by a Step's Ready).
func (n *node) send(env *cluster.Envelope) {
	rg := n.rg
	to, ok := rg.nodeIndex(env.To)
	if !ok {
		return
	}
	now := rg.sim.Now()
	if n.lk.Send(to, &env.Msg) {
		n.exchange(to, &env.Msg, nil, now, false)
		return
	}
	// Queued in the peer's backlog, which copied the items.
	bt := n.backlogs[to]
	if bt == nil {
		bt = &backlogTimes{}
		n.backlogs[to] = bt
	}
	if !bt.waiting {
		bt.waiting, bt.readyAt = true, now
	}
	if k := len(env.Msg.Results); k > 0 {
		bt.runs = append(bt.runs, resultRun{count: k, at: now})
	}
	n.coord.Recycle(&env.Msg)
}

// exchange starts one exchange of *msg (copied) with peer to. readyAt is
// when its earliest items were taken from the coordinator, runs when its
// results were decided (nil: all at the send); direct exchanges (a
// leave's) are outside the one-per-peer rule and its breaker.
func (n *node) exchange(to int, msg *cluster.Message, runs []resultRun, readyAt int64, direct bool) {
	rg := n.rg
	now := rg.sim.Now()
	x := rg.newExchange()
	x.msg = *msg
	// x.rg is rg already (newExchange).
	x.from, x.fromInc, x.to, x.recv, x.sentAt, x.deadline = n, n.inc, to, rg.nodes[to], now, now+int64(rg.cfg.CallTimeout)
	x.readyAt, x.direct = readyAt, direct
	if len(runs) > 0 || len(x.runs) > 0 {
		x.runs = append(x.runs[:0], runs...)
	}
	x.stepper = n.coord
	rg.exchanges++
	x.transmit(n.id, to)
}

// finish ends the exchange with peer that just returned (its reply was
// stepped, or it failed), as Shell.run does: collect, then send the peer's
// backlog as the next exchange, or mark the peer idle and collect again.
func (n *node) finish(peer int) {
	n.collect()
	msg, more := n.lk.Next(peer, nil)
	if !more {
		n.collect()
		return
	}
	bt := n.backlogs[peer]
	n.exchange(peer, &msg, bt.runs, bt.readyAt, false)
	bt.runs, bt.waiting = bt.runs[:0], false
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

// newExchange returns an exchange from the region's free list: its
// flags (phase, done, timerSet) and refs are zero, the rest is what the
// last use left, for exchange to set.
func (rg *Region) newExchange() *exchange {
	x := rg.freeX
	if x == nil {
		x = &exchange{rg: rg}
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
	// Only what exchange does not set is reset: the flags (refs is 0).
	// The rest (the message's slices, which its coordinator has back
	// already, and the pointers) is overwritten at the next use.
	rg := x.rg
	x.timerSet, x.phase, x.done = false, 0, false
	x.next, rg.freeX = rg.freeX, x
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
	// readyAt is when the request's earliest items were taken from the
	// sender's coordinator (sentAt, unless they waited in a backlog);
	// runs says when its results were decided, if not all at sentAt.
	readyAt  int64
	runs     []resultRun
	direct   bool // a leave's exchange (Shell.flushWith): no busy link, no breaker
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
	if x.phase == 0 {
		x.request(s)
	} else {
		x.reply(s)
	}
}

// request is Fire delivering the request at the receiver: it steps it
// and turns x into the reply.
func (x *exchange) request(s *engine.Sim) {
	rg, from := x.rg, x.from
	if !rg.net.Arrives(from.id, x.to) {
		// A partition cut the request at delivery.
		x.fail()
		x.release()
		return
	}
	recv := x.recv
	if !recv.up {
		x.fail() // nobody answers; the sender times out
		x.release()
		return
	}
	if len(x.msg.Results) > 0 {
		recv.noteResults(&x.msg, x.runs, x.sentAt)
	}
	recv.coord.Step(recv.now(), from.name, &x.msg)
	// Stepped: nothing reads the request's items any more.
	x.stepper.Recycle(&x.msg)
	rd := &recv.rd
	readyInto(recv.coord, rd)
	// The request's items are recycled: x.msg becomes the reply (the
	// message the receiver has for the sender, if any) in place.
	msgs := rd.Messages
	if len(msgs) == 1 && sameName(msgs[0].To, from.name) {
		// The common round: the reply and nothing for others.
		x.msg = msgs[0].Msg
		recv.complete(rd.Completions)
	} else {
		replied := false
		for i := range msgs {
			if sameName(msgs[i].To, from.name) {
				x.msg, replied = msgs[i].Msg, true
				break
			}
		}
		if !replied {
			x.msg = cluster.Message{}
		}
		recv.complete(rd.Completions)
		// What the receiver has for others goes at once. send does not
		// call Ready, so rd stays as it is meanwhile.
		for i := range msgs {
			if !sameName(msgs[i].To, from.name) {
				recv.send(&msgs[i])
			}
		}
	}
	x.stepper = recv.coord
	x.phase = 1
	x.replyAt = s.Now()
	rg.replies++
	x.transmit(x.to, from.id)
	x.release()
}

// reply is Fire delivering the reply back at the sender.
func (x *exchange) reply(s *engine.Sim) {
	rg, n := x.rg, x.from
	if !rg.net.Arrives(x.to, n.id) {
		// A partition cut the reply at delivery.
		x.fail()
		x.release()
		return
	}
	if x.done || !n.up || n.inc != x.fromInc {
		x.release()
		return
	}
	x.done = true
	// ℓ's term: from when the request's items were ready to the reply.
	if late := s.Now() - x.readyAt; late > rg.maxLate {
		rg.maxLate = late
	}
	if !x.direct {
		n.peerOK(x.to)
	}
	if !x.msg.Empty() {
		n.coord.Step(n.now(), rg.names[x.to], &x.msg)
	}
	// x.msg is not read again: the exchange's next use sets it.
	x.stepper.Recycle(&x.msg)
	// The remote completions this flush hands out are those of the
	// reply's results (every Step is followed by a flush, so none is left
	// from before), decided when the reply left the owner: replyAt
	// stands for what noteResults would note of each.
	n.replyAt = x.replyAt
	n.flush() // a leave's too: what its reply's step readied goes as any send (Shell.flushWith)
	n.replyAt = -1
	if !x.direct {
		n.finish(x.to)
	}
	x.release()
}

// sameName is a == b, answered without comparing bytes when both are the
// same string in memory: node names reach the coordinators as the strings
// of Region.names and come back in their envelopes.
func sameName(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// noteResults notes when the owner decided the results in m. The
// coordinator puts a result in its outbox while it Steps the request, and
// every Step is followed by a Ready at the same instant, whose messages are
// sent or queued for their peer then: so a result was decided when the
// message that carries it left the coordinator. That is sentAt for a reply
// and for a request sent at once (runs nil); a request that waited in a
// backlog carries the time of each flush's results in runs, in order.
func (n *node) noteResults(m *cluster.Message, runs []resultRun, sentAt int64) {
	k, left, at := 0, 0, sentAt
	if len(runs) > 0 {
		left, at = runs[0].count, runs[0].at
	}
	for i := range m.Results {
		if len(runs) > 0 {
			for left == 0 {
				k++
				left, at = runs[k].count, runs[k].at
			}
			left--
		}
		if w := n.waits.get(m.Results[i].Ticket); w != nil {
			w.ownerAt = at
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
	if x.direct {
		return // Shell.flushWith: a failure ends the batch and feeds no breaker
	}
	n.peerFailed(x.to)
	n.finish(x.to)
}

// peerFailed reports a failed exchange with peer to its breaker.
func (n *node) peerFailed(peer int) {
	if n.lk.Outcome(n.now(), peer, false) == cluster.BreakerOpened {
		n.coord.SetPeerDown(n.now(), n.rg.names[peer], true)
		n.rg.breakerOpens++
		n.kick() // Shell.setPeerDown: the on_failure completions go at the backstop flush
	}
}

// peerOK reports a successful exchange with peer to its breaker.
func (n *node) peerOK(peer int) {
	if n.lk.Outcome(n.now(), peer, true) == cluster.BreakerClosed {
		n.coord.SetPeerDown(0, n.rg.names[peer], false)
	}
}

// retryBreakers makes the cooled-down breakers half-open (Links.Tick), as
// Shell does on every tick.
func (n *node) retryBreakers() {
	now := n.now()
	n.peers = n.lk.Tick(now, n.peers[:0])
	for _, peer := range n.peers {
		n.coord.SetPeerDown(now, peer, false)
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
	n.lk.Lingered()
	n.flush()
}
