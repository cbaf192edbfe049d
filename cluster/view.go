package cluster

import (
	"cmp"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// nodeEntry is what a non-owner knows of an identity it admits for.
type nodeEntry struct {
	// What Decide reads first comes first.
	epoch    uint64
	owner    string
	spent    int64 // cumulative admitted locally in this generation
	acked    int64 // highest total acknowledged
	view     int64 // the owner's TAT as this node sees it (its clock), 0 = full
	pending  int   // forwarded requests awaiting a result
	heapAt   int64 // the earliest time it is queued at in rk.nodes (never: not queued)
	lastSync int64
	fallback bucket.TAT
	grant    nodeGrant // demand-following slack only
	sent     int64     // highest total reported
	version  uint64
	gen      uint64
	rk       *ruleKeys // its rule's keys (keycap.go)
	key      entryKey
	h        uint64 // hashID(key.identity)
	dead     bool   // dropped: items left in the heap are stale

	// refunded is the cumulative tokens of this generation the owner is
	// asked to give back, refundBase the part of it settled (acknowledged,
	// or given up), refundAt when the oldest unsettled refund was asked
	// (refund.go).
	refunded, refundBase, refundAt int64

	// rejected is the cumulative tokens of this generation this node
	// rejected on its view, for a leased rule, and rejSent the part of it
	// reported (SyncItem.Rejected).
	rejected, rejSent int64
}

// TableID returns e's identity, its key in its strTable.
func (e *nodeEntry) TableID() string { return e.key.identity }

// idle reports whether e equals no entry at now and may be dropped: its
// spend is acknowledged, nothing is pending, and its view of the owner's
// bucket, its fallback bucket and its grant are spent out.
func (e *nodeEntry) idle(now int64) bool {
	return e.spent == e.acked && e.pending == 0 && e.view <= now && int64(e.fallback) <= now && e.grant.idle() && e.rejected == e.rejSent
}

// pendingReq is a forwarded request awaiting its owner's result, in the
// coordinator's queue of them (see Coordinator.pend).
type pendingReq struct {
	ticket   uint64
	key      entryKey
	e        *nodeEntry // k's entry when it was forwarded (see entryOf)
	owner    string
	cost     int64
	deadline int64
	live     bool // false once a result, a timeout or a down peer decided it
	// relay is set for a request this node owns and relayed to the
	// identity's previous owner during a warm-up (warmup.go): origin is
	// the node that forwarded it here ("" for this node's own request)
	// and oticket that node's ticket.
	relay   bool
	origin  string
	oticket uint64
}

// ViewReject is the state behind a rejection by a node's view (SourceView):
// what Decide's arithmetic needs to decide the same request again. While
// nothing else changes the coordinator (no Step, Tick, SetTable, SetRules,
// Refund, SetPeerDown, FlushAll or HandoffAll, no other decision of the
// identity, and no entry dropped: Drops), a request of the same rule and
// identity costing at least Cost is decided by Reject exactly as Decide
// would decide it, so that an adapter may answer it without the
// coordinator's lock (the Shell's reject cache).
type ViewReject struct {
	Rule, Identity string
	Cost           int64
	// View is the owner's TAT as the node saw it, Unconfirmed its spend
	// not yet acknowledged; Interval (T) and Tau (T·B) are in nanoseconds.
	View, Unconfirmed, Interval, Tau, Burst int64
}

// Reject decides a request of cost tokens at now from the state in v, as
// Decide's view does: ok is false when the view would not reject it (then
// only Decide can decide it).
func (v *ViewReject) Reject(now, cost int64) (bucket.Decision, bool) {
	if cost < v.Cost || cost > v.Burst {
		return bucket.Decision{}, false
	}
	t := v.Interval
	w := max(v.View, now) + (v.Unconfirmed+cost)*t
	if w-now <= v.Tau {
		return bucket.Decision{}, false
	}
	return bucket.Decision{
		Limit:      v.Burst,
		Remaining:  max((v.Tau-(w-cost*t-now))/t, 0),
		Reset:      time.Duration(w - cost*t - now),
		RetryAfter: time.Duration(w - now - v.Tau),
	}, true
}

// LastViewReject returns the state behind the last decision that Decide
// returned with Source SourceView and a finite RetryAfter (see ViewReject).
// It is meaningful right after such a Decide, before any other call.
func (c *Coordinator) LastViewReject() ViewReject { return c.lastView }

// nodesOf returns r's table of node entries, as c.entries.of(r.ID, true)
// does: the tables of a keyMap stay once made.
func (c *Coordinator) nodesOf(r *RuleParams) *strTable[*nodeEntry] {
	if r.nodesT == nil {
		r.nodesT = c.entries.of(r.ID, true)
	}
	return r.nodesT
}

// entry returns a new node entry of k (which has none), whose identity's
// hashID is h, for owner.
func (c *Coordinator) entry(now int64, k entryKey, h uint64, r *RuleParams, owner string) *nodeEntry {
	c.gen++
	e := c.newNodeEntry(now, k, h)
	e.owner, e.epoch, e.version, e.gen = owner, c.epoch, r.Version, c.gen
	c.entries.setH(k, h, e)
	return e
}

// sync queues a cumulative report of k's spend to its owner.
func (c *Coordinator) sync(now int64, k entryKey, e *nodeEntry) {
	m := c.outbox(e.owner)
	m.Syncs = appendItem(m.Syncs, &c.pools.syncs, SyncItem{Rule: k.rule, Identity: k.identity, Gen: e.gen, Total: e.spent,
		GrantEpoch: e.grant.epoch, Grant: e.grant.extra, Refunded: e.refunded, RefundBase: e.refundBase, Rejected: e.rejected})
	e.grant.repEpoch, e.grant.repExtra = e.grant.epoch, e.grant.extra
	e.sent, e.rejSent = e.spent, e.rejected
	e.lastSync = now
	c.stats.SyncsSent++
}

// failure decides by the rule's on_failure while the owner is unreachable.
func (c *Coordinator) failure(now int64, r *RuleParams, e *nodeEntry, cost int64) Outcome {
	c.stats.Degraded++
	o := Outcome{Source: SourceFailure, Degraded: true}
	switch r.OnFailure {
	case quota.OnFailureOpen:
		o.Decision = bucket.Decision{Allowed: true, Limit: r.Burst, Remaining: r.Burst}
	case quota.OnFailureClosed:
		o.Decision = bucket.Decision{Limit: r.Burst, RetryAfter: time.Second}
	default:
		// local: this node enforces limit ÷ live nodes, with a
		// proportional burst that still fits the largest cost.
		n := int64(c.n())
		lim := max(r.Limit/n, 1)
		burst := max(r.Burst/n, cost, 1)
		g, err := bucket.NewGCRA(lim, r.Window, burst)
		if err != nil {
			o.Decision = bucket.Decision{Allowed: true}
			return o
		}
		o.Decision = g.Step(&e.fallback, now, cost)
	}
	return o
}

// ack is a node receiving an acknowledgement.
func (c *Coordinator) ack(now int64, a *AckItem) {
	e := c.entries.get(entryKey{a.Rule, a.Identity})
	if e == nil || a.Gen != e.gen || a.Total < e.acked {
		return // stale: another generation, or older than what we know
	}
	e.acked = min(a.Total, e.spent)
	if a.Refunded > e.refundBase {
		e.refundBase = min(a.Refunded, e.refunded)
	}
	e.view = max(e.view, now+a.Debt)
	e.grant.onAck(now, GrantLifetime(c.interval), *a)
	c.watch(e)
}

// result is a node receiving the owner's decision of a forwarded request.
func (c *Coordinator) result(now int64, r *ResultItem) {
	pp := c.pendingOf(r.Ticket)
	if pp == nil {
		return // timed out already and decided by on_failure
	}
	if pp.relay {
		c.relayed(now, pp, r)
		return
	}
	key, pe := pp.key, pp.e
	c.settle(pp) // may move the queue: only the copies are read below
	if e := c.entryOfKey(key, pe); e != nil {
		e.pending--
		e.view = max(e.view, now+r.Debt)
		c.watch(e)
	}
	c.stats.RemoteResults++
	rp, _ := c.rule(key.rule)
	var limit int64
	if rp != nil {
		limit = rp.Burst
	}
	// Written in place: cleared, then field by field (no copy of a whole
	// completion; it holds no pointers, so no write barriers either).
	n := len(c.done)
	c.done = grow1(c.done)
	cp := &c.done[n]
	*cp = Completion{}
	cp.Ticket, cp.Outcome.Source = r.Ticket, SourceRemote
	d := &cp.Outcome.Decision
	d.Allowed, d.Limit, d.Remaining = r.Allowed, limit, r.Remaining
	d.Reset, d.RetryAfter, d.Delay = time.Duration(r.Reset), time.Duration(r.RetryAfter), time.Duration(r.Delay)
}

// pendingOf returns the live forwarded request of ticket t, or nil.
func (c *Coordinator) pendingOf(t uint64) *pendingReq {
	if c.pendHead == len(c.pend) {
		return nil
	}
	first := c.pend[c.pendHead].ticket
	if t < first || t-first >= uint64(len(c.pend)-c.pendHead) {
		return nil
	}
	if p := &c.pend[c.pendHead+int(t-first)]; p.live && p.ticket == t {
		return p
	}
	return nil
}

// settle marks p decided and lets the queue's decided head go.
func (c *Coordinator) settle(p *pendingReq) {
	p.live = false
	for c.pendHead < len(c.pend) && !c.pend[c.pendHead].live {
		c.popPending()
	}
}

// popPending drops the head of the queue of forwarded requests, which is
// decided or about to be.
func (c *Coordinator) popPending() {
	c.pend[c.pendHead] = pendingReq{}
	c.pendHead++
	switch {
	case c.pendHead == len(c.pend):
		if cap(c.pend) > 1024 {
			c.pend = nil // let a long queue's array go
		} else {
			c.pend = c.pend[:0]
		}
		c.pendHead = 0
	case c.pendHead >= 64 && c.pendHead >= len(c.pend)/2:
		n := copy(c.pend, c.pend[c.pendHead:])
		clear(c.pend[n:])
		c.pend = c.pend[:n]
		c.pendHead = 0
	}
}

// expire decides the forwarded request p by on_failure.
func (c *Coordinator) expire(now int64, p *pendingReq) {
	if p.relay {
		c.relayExpired(now, p)
		return
	}
	t := p.ticket
	p.live = false
	e := c.entryOf(p)
	r := c.rules[p.key.rule]
	if e == nil || r == nil {
		c.done = append(c.done, Completion{Ticket: t, Outcome: Outcome{Source: SourceFailure, Degraded: true, Decision: bucket.Decision{Allowed: true}}})
		return
	}
	e.pending--
	c.done = append(c.done, Completion{Ticket: t, Outcome: c.failure(now, r, e, p.cost)})
	c.watch(e)
}

// entryOf returns the entry of p's key, as c.entries.get(p.key) does: the
// entry p was forwarded from while it is still that key's (a dropped entry
// is dead until it is reused, and a reused one has its new key).
func (c *Coordinator) entryOf(p *pendingReq) *nodeEntry { return c.entryOfKey(p.key, p.e) }

// entryOfKey is entryOf of a request of key k forwarded from entry e.
func (c *Coordinator) entryOfKey(k entryKey, e *nodeEntry) *nodeEntry {
	if e != nil && !e.dead && sameString(e.key.identity, k.identity) && sameString(e.key.rule, k.rule) {
		return e
	}
	return c.entries.get(k)
}

// pendAppend queues a forwarded request with the next ticket (c.ticket),
// written in place: the slots past the queue's length are zero.
func (c *Coordinator) pendAppend(k entryKey, e *nodeEntry, owner string, cost, deadline int64) {
	n := len(c.pend)
	c.pend = grow1(c.pend)
	p := &c.pend[n]
	p.ticket, p.cost, p.deadline, p.live = c.ticket, cost, deadline, true
	p.key, p.e, p.owner = k, e, owner
}

func cmpKey(a, b entryKey) int {
	if c := cmp.Compare(a.rule, b.rule); c != 0 {
		return c
	}
	return cmp.Compare(a.identity, b.identity)
}

// decideAsNode decides a request for an identity another node owns: the
// rule's on_failure while the owner is down, else this node's view and
// slack, else a forward to the owner in the next batch. e is its entry here,
// or nil for none yet.
func (c *Coordinator) decideAsNode(out *Outcome, now int64, r *RuleParams, k entryKey, h uint64, e *nodeEntry, owner string, gated bool, cost int64) {
	down := len(c.down) > 0 && c.down[owner]
	if e == nil {
		if r.sk != nil && !down && !gated {
			if o, ok := c.gate(now, r, k.identity, cost); ok {
				*out = o
				return
			}
		}
		if r.blind && !down && c.table != nil {
			if o, ok := c.blindAdmit(now, r, k, owner, cost); ok {
				*out = o
				return
			}
		}
		e = c.entry(now, k, h, r, owner)
	}
	if down {
		o := c.failure(now, r, e, cost)
		c.watch(e)
		*out = o
		return
	}
	t := r.gcra.Interval().Nanoseconds()
	tau := t * r.Burst
	// Blind spend not yet acknowledged is unconfirmed too (blind.go).
	unconf := e.spent - e.acked + c.blindSpend(r, k.identity)
	// The view: the owner's state as last seen plus this node's
	// unconfirmed spend, which the owner has not charged yet.
	v := max(e.view, now) + (unconf+cost)*t
	if cost > r.maxCost { // a leaky bucket admits any cost into an empty queue
		c.watch(e)
		*out = Outcome{Decision: bucket.Decision{Limit: r.Burst, RetryAfter: bucket.Never}, Source: SourceView}
		return
	}
	// Exact rules skip the view: the owner decides every request, so that
	// exact equals the reference bucket fed in the owner's order (the view,
	// built from receive times, is late by up to a one-way delay and would
	// reject a request the owner could still admit).
	if v-now > tau && r.Mode != quota.ModeExact {
		c.stats.ViewRejects++
		if r.leased {
			// The owner counts it as its region's demand (SyncItem.Rejected).
			e.rejected += cost
		}
		c.watch(e)
		c.lastView = ViewReject{Rule: k.rule, Identity: k.identity, Cost: cost, View: e.view, Unconfirmed: unconf, Interval: t, Tau: tau, Burst: r.Burst}
		*out = Outcome{Source: SourceView, Decision: bucket.Decision{
			Limit:      r.Burst,
			Remaining:  max((tau-(v-cost*t-now))/t, 0),
			Reset:      time.Duration(v - cost*t - now),
			RetryAfter: time.Duration(v - now - tau),
		}}
		return
	}
	s := c.slack(r)
	if r.Scheme == SlackDemand {
		s += e.grant.extraAt(now)
	}
	// A cost-0 look at a count_rejected window goes to the owner: only it
	// knows whether the count passed the limit.
	if unconf+cost <= s && (cost > 0 || !r.CountRejected) {
		e.spent += cost
		c.stats.LocalAdmits++
		if e.spent-e.sent >= max((s+1)/2, 1) {
			c.sync(now, k, e)
		}
		c.watch(e)
		*out = Outcome{Source: SourceSlack, Decision: bucket.Decision{
			Allowed:   true,
			Limit:     r.Burst,
			Remaining: (tau - (v - now)) / t,
			Reset:     time.Duration(v - now),
		}}
		return
	}
	// Beyond the slack: the owner decides. Report unsent spend first so it
	// is charged before this request.
	if e.spent > e.sent {
		c.sync(now, k, e)
	} else if r.Scheme == SlackDemand && r.Mode == quota.ModeShared && (e.lastSync == 0 || now-e.lastSync >= max(c.interval/4, 1)) {
		// Ask for a grant: the report carries no new spend, but the
		// owner counts the forwarded requests as this node's demand.
		c.sync(now, k, e)
	}
	c.ticket++
	c.pendAppend(k, e, owner, cost, now+c.timeout)
	e.pending++
	c.watch(e)
	m := c.outbox(owner)
	m.Decides = addItem(m.Decides, &c.pools.decides)
	// Written field by field, every field (the slot may hold an old
	// item): no copy of a whole item.
	it := &m.Decides[len(m.Decides)-1]
	it.Ticket, it.Cost, it.Release = c.ticket, cost, false
	it.Rule, it.Identity, it.h = k.rule, k.identity, h
	c.stats.Forwarded++
	*out = Outcome{Pending: true, Ticket: c.ticket, Source: SourceRemote}
}
