package cluster

import (
	"time"

	"github.com/weir-dev/weir/bucket"
)

// This file is the warm-up that follows a ring change (docs/cluster.md: no
// rejection window at a ring change).
//
// When the members change, an identity may move to this node while its
// bucket is still with its previous owner, on its way as a handoff. For a
// while (until that owner's handed-over marker for this ring arrives, or
// HandoffTimeout passes) a bucket this node makes for such an identity is
// warming, and:
//
//   - A request for it, this node's own or forwarded here, is relayed to the
//     previous owner, which decides it on the bucket it holds (a fresh one if
//     it holds none) and answers. So the identity is decided on one bucket
//     throughout: no free window, and no rejection while tokens remain.
//   - The previous owner, asked by the node its own ring gives the identity
//     to (it has seen the change too), decides on what it holds and sends
//     what it admitted there as a handoff, after the bucket itself if it had
//     not handed it yet: the spend follows the identity. Handoffs add, in any
//     order, so it does not matter which comes first. (Asked by any other
//     node, whose ring lags, it decides on its bucket as before: split
//     ownership while the views converge.)
//   - A node's spend report is charged but not acknowledged: an
//     acknowledgement of a fresh bucket would let the node spend its slack
//     again at every round trip, one of a spent bucket would make it reject
//     with tokens left. The node keeps its spend unconfirmed, asks beyond its
//     slack, and reports again after the sync interval.
//   - The warm-up of a bucket ends when the previous owner's marker for this
//     ring or a handoff of it arrives and nothing relayed is out, when the
//     handoff timeout passes, or when the previous owner leaves the ring.
//
// When the previous owner does not answer a relayed request within half the
// decide timeout (it crashed and membership has not noticed yet, or it is
// slow), or its breaker is open, this node decides on its own bucket and
// that bucket's warm-up ends: the previous owner's state is lost to it, the
// owner-crash fault term of docs/overshoot.md (at most the lost bucket, B
// plus the slack spent against it), and an answer that the previous owner
// sends late is ignored (what it admitted meanwhile is still charged here
// when its handoff arrives: conservative, never an excess). A previous owner
// that is not in the new ring (it crashed, or it left and handed its buckets
// over before leaving) is not waited for at all. A relayed request is never
// relayed back to the node it came from: two nodes whose views each give
// the identity to themselves decide on their own buckets (split ownership).
// Three or more such views could pass a request around; the first relay to
// expire ends that bucket's warm-up, and its node then decides it.

// clock returns now, or the latest time passed in before if now is
// earlier: the coordinator's time never goes back (the callers' clocks are
// monotonic, but a time read before another call took the lock may arrive
// after it).
func (c *Coordinator) clock(now int64) int64 {
	if now < c.last {
		return c.last
	}
	c.last = now
	return now
}

// newMembers notes t, about to be installed at now, for the warm-up: a
// table with other members than the one in force starts one (and becomes
// the previous owners' table's successor); one with the same members, a
// membership view announced again under a new epoch, moves nothing and
// starts none.
func (c *Coordinator) newMembers(now int64, t OwnerTable) {
	if c.table != nil && c.table.Digest() == t.Digest() {
		return
	}
	if c.table != nil {
		c.prev = c.table
		c.warmUntil = now + c.handoff
	}
	names := t.Names()
	c.members = make(map[string]bool, len(names))
	for _, n := range names {
		c.members[n] = true
	}
}

// prevOwner returns the member that owned identity before the last change
// of members, if it is another member of the ring in force: "" when this
// node owned it, or when that owner has left the ring. A node whose table
// held only itself before (it just started, and did not decide anything
// that counts) takes the owner of identity in the ring without itself:
// who owned it before it joined.
func (c *Coordinator) prevOwner(identity string) string {
	if c.prev == nil || c.table == nil {
		return ""
	}
	var o string
	if c.prev.Len() <= 1 {
		o = c.table.OwnerNameExcept(identity, c.cfg.Self)
	} else {
		o = c.prev.OwnerName(identity)
	}
	if o == c.cfg.Self || !c.members[o] {
		return ""
	}
	return o
}

// warming reports whether oe still waits for its previous owner's state
// (see the file comment), ending its warm-up when it no longer does.
func (c *Coordinator) warming(now int64, oe *ownerEntry) bool {
	if oe.warming && oe.relaying == 0 &&
		(now >= c.warmUntil || c.handedOver[oe.from] == c.table.Digest() || !c.members[oe.from]) {
		oe.warming = false
	}
	return oe.warming
}

// relayTarget returns the previous owner that should decide a request for
// the warming bucket oe, forwarded by from ("" for this node's own): "" when
// this node decides it: the warm-up is over, the previous owner is down or
// sent the request, or from is not in this node's ring (its answer would go
// back later, in an exchange of its own, and this node does not know where
// that member is yet; the views disagree: the split-ownership term).
func (c *Coordinator) relayTarget(now int64, oe *ownerEntry, from string) string {
	if !c.warming(now, oe) || oe.from == from || c.down[oe.from] || (from != "" && !c.members[from]) {
		return ""
	}
	return oe.from
}

// relay sends a request of cost tokens for k (whose identity's hashID is h)
// to the previous owner to, for the node origin that forwarded it under
// its ticket oticket ("" and 0 for this node's own request), and returns
// the ticket it waits under.
func (c *Coordinator) relay(now int64, k entryKey, h uint64, cost int64, to, origin string, oticket uint64) uint64 {
	if oe := c.owned.getH(k, h); oe != nil {
		oe.relaying++
	}
	c.ticket++
	// Half the decide timeout, so that a forwarding node still gets this
	// node's own decision if the previous owner does not answer. (The queue
	// is in deadline order otherwise; a relay expires when its deadline has
	// passed and the requests ahead of it are decided, at most one decide
	// timeout after it was queued.)
	c.pendAppend(k, nil, to, cost, now+max(c.timeout/2, 1))
	p := &c.pend[len(c.pend)-1]
	p.relay, p.origin, p.oticket = true, origin, oticket
	m := c.outbox(to)
	m.Decides = addItem(m.Decides, &c.pools.decides)
	it := &m.Decides[len(m.Decides)-1]
	it.Ticket, it.Cost, it.Release = c.ticket, cost, false
	it.Rule, it.Identity, it.h = k.rule, k.identity, h
	c.stats.Forwarded++
	return c.ticket
}

// relayed hands on the previous owner's decision res of the relayed
// request p.
func (c *Coordinator) relayed(now int64, p *pendingReq, res *ResultItem) {
	key, origin, ticket, oticket := p.key, p.origin, p.ticket, p.oticket
	c.settle(p) // may move the queue: only the copies are read below
	h := hashID(key.identity)
	if oe := c.owned.getH(key, h); oe != nil && oe.relaying > 0 {
		oe.relaying--
	}
	c.stats.RemoteResults++
	d := bucket.Decision{Allowed: res.Allowed, Remaining: res.Remaining, Reset: time.Duration(res.Reset),
		RetryAfter: time.Duration(res.RetryAfter), Delay: time.Duration(res.Delay)}
	if r, ok := c.rule(key.rule); ok {
		d.Limit = r.Burst
	}
	c.deliver(origin, ticket, oticket, d, res.Debt, SourceRemote)
}

// relayExpired decides the relayed request p here, the previous owner not
// having answered in time (or its peer being down): on this node's own
// bucket, whose warm-up ends.
func (c *Coordinator) relayExpired(now int64, p *pendingReq) {
	p.live = false
	k, h := p.key, hashID(p.key.identity)
	r, ok := c.rule(k.rule)
	if !ok {
		c.deliver(p.origin, p.ticket, p.oticket, bucket.Decision{Allowed: true}, 0, SourceOwner)
		return
	}
	oe := c.ownedEntry(now, r, k, h)
	if oe.relaying > 0 {
		oe.relaying--
	}
	oe.warming = false
	d, oe := c.ownerStep(now, r, k, h, p.cost, oe)
	c.deliver(p.origin, p.ticket, p.oticket, d, ownerDebt(now, r, oe), SourceOwner)
}

// deliver hands the decision d of a relayed request on: as the completion
// of ticket for this node's own (origin ""), as the result of oticket, with
// the bucket's debt, for the node that forwarded it.
func (c *Coordinator) deliver(origin string, ticket, oticket uint64, d bucket.Decision, debt int64, src Source) {
	if origin != "" {
		c.answer(origin, oticket, d, debt)
		return
	}
	c.done = append(c.done, Completion{Ticket: ticket, Outcome: Outcome{Decision: d, Source: src}})
}

// ownerFor returns the owner of identity in the ring in force when it is
// another node, "" when it is this node (or there is no ring); oe is this
// node's bucket of it, or nil.
func (c *Coordinator) ownerFor(identity string, oe *ownerEntry) string {
	if c.table == nil || (oe != nil && oe.mineIn == c.tables) {
		return ""
	}
	if o := c.table.OwnerName(identity); o != "" && !sameString(o, c.cfg.Self) {
		return o
	}
	return ""
}

// decideHanded decides a request of cost tokens for k that owner, the
// identity's owner in the ring in force, relayed here, on this node's bucket
// of it (oe, or a new one), and sends owner what it admitted: the whole
// bucket first if it was not handed over yet, else the spend of this
// decision.
func (c *Coordinator) decideHanded(now int64, r *RuleParams, k entryKey, h uint64, cost int64, oe *ownerEntry, owner string) (bucket.Decision, *ownerEntry) {
	if oe == nil {
		oe = c.newOwnerEntry(now, k, h)
		c.owned.setH(k, h, oe)
		oe.handed = true // a new bucket: everything it will hold is sent on
	}
	oe.warming = false
	before := max(int64(oe.tat), now)
	var d bucket.Decision
	if r.plain {
		d = r.gcra.Step(&oe.tat, now, cost)
	} else {
		d = c.otherStep(now, r, k, oe, cost)
	}
	c.watchOwned(oe)
	switch {
	case !oe.handed:
		c.handOff(now, owner, oe)
		oe.handed = true
	case d.Allowed && cost > 0:
		it := HandoffItem{Rule: k.rule, Identity: k.identity}
		if r.exact != nil {
			r.exact.handDelta(oe, now, bucket.TAT(before), cost, &it)
		} else {
			it.Debt = int64(oe.tat) - before
		}
		if it.Debt > 0 {
			m := c.outbox(owner)
			m.Handoffs = appendItem(m.Handoffs, &c.pools.handoffs, it)
		}
	}
	return d, oe
}
