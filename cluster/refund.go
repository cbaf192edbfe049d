package cluster

import "github.com/weir-dev/weir/bucket"

// This file is the refund of a request's admission by a cluster rule when
// another rule of the request rejects it (internal/policy): the tokens go
// back where they were charged.
//
//   - On the owner, the owner's own charge is given back on its bucket at
//     once.
//   - On a non-owner, slack spend not yet reported is taken off the spend
//     still to report. Anything else was charged by the owner: its
//     decision of a forwarded request, or slack spend already reported.
//     The node adds the tokens to its entry's cumulative refund count
//     (nodeEntry.refunded) and reports the count at once, in a sync: the
//     next batch to the owner carries it (SyncItem.Refunded).
//   - The owner keeps, per node and generation, the count it has taken
//     (report.refunded), gives back only what is beyond it, and echoes it
//     in the acknowledgement (AckItem.Refunded), which settles the
//     refunds on the node. A repeated, reordered or retried report thus
//     never gives back twice. A report also carries the count already
//     settled (SyncItem.RefundBase): an owner that lost its record (its
//     bucket was dropped full, or evicted) gives back only what is not
//     settled, not the generation's whole history.
//   - A node resends unsettled refunds with its syncs, every sync
//     interval, and gives them up (they are then kept, the conservative
//     outcome of a lost message) once the oldest has waited a decide
//     timeout: an owner that does not know the fields never echoes them.
//   - A ring change starts a new generation with no refunds: what was not
//     settled is kept.

// RefundRange names refunds in a node entry's cumulative count: the tokens
// (From, To] that node Node asked the owner of Identity under Rule to give
// back, in generation Gen of its entry. Refund returns the range it asked
// for; CoordinatorConfig.OnRefund reports, on the owner, each range it gave
// back.
type RefundRange struct {
	Node, Rule, Identity string
	Gen                  uint64
	From, To             int64
}

// Refund gives back cost tokens that Decide admitted with source src for a
// request the caller then did not let through (another rule rejected it).
//
// What this node holds is given back here: an owner's own charge, or slack
// spend within this node's slack not yet reported. What the identity's
// owner charged (its decision of a forwarded request, or slack spend
// already reported to it) is asked of the owner: the next batch to it
// carries the refund, and Refund returns its range and true. The owner
// gives it back once; the node gives it up (keeps it) if the owner has not
// acknowledged it within a decide timeout.
//
// Not given back: a sketch's admission (its counters are shared by
// colliding identities, so lowering them could undercount another), an
// on_failure decision, and an exact algorithm's admission other than
// GCRA's by a remote owner (refundOwned says why).
func (c *Coordinator) Refund(now int64, ruleID, identity string, cost int64, src Source) (RefundRange, bool) {
	now = c.clock(now)
	r, ok := c.rules[ruleID]
	if !ok || cost <= 0 {
		return RefundRange{}, false
	}
	k := entryKey{ruleID, identity}
	switch src {
	case SourceOwner:
		oe := c.owned.get(k)
		if oe == nil && r.bs != nil && !r.bs.idle(now, r.blindHash(identity)) {
			// Decided on the sketch (blindOwn): the identity gets a
			// bucket at the sketch's estimate, never below its own, and
			// the refund comes off that bucket.
			oe = c.ownedEntry(now, r, k, hashID(identity))
		}
		if oe != nil {
			c.refundOwned(now, r, k, oe, cost, false)
		}
	case SourceSlack, SourceRemote:
		e := c.entries.get(k)
		if e == nil {
			// No entry: the identity became this node's since (its
			// bucket came with the previous owner's handoff, the charge
			// included), or the entry was dropped, its view of the
			// owner's bucket full: nothing left to give back.
			if oe := c.owned.get(k); oe != nil && src == SourceRemote {
				c.refundOwned(now, r, k, oe, cost, true)
			} else if src == SourceSlack && r.blind {
				// Blind spend is given back while its report is open;
				// once sent, the owner charges it (never too little).
				c.refundBlind(r, k, cost)
			}
			return RefundRange{}, false
		}
		if src == SourceSlack && e.spent-cost >= e.sent {
			e.spent -= cost
			c.watch(e)
			return RefundRange{}, false
		}
		if r.exact != nil {
			return RefundRange{}, false // the owner could not give it back exactly
		}
		rg := RefundRange{Node: c.cfg.Self, Rule: ruleID, Identity: identity, Gen: e.gen, From: e.refunded, To: e.refunded + cost}
		if e.refunded == e.refundBase {
			e.refundAt = now
		}
		e.refunded += cost
		c.sync(now, k, e)
		c.watch(e)
		return rg, true
	}
	return RefundRange{}, false
}

// refundOwned gives cost tokens back on this node's bucket oe of k under r
// at now, and reports whether it changed the bucket. remote is true for a
// charge made on behalf of another node, which the owner learns of a
// message later.
//
//   - gcra: the TAT moves back by cost·T (the share's T for a leased
//     rule), never below now: a bucket fuller than full would admit more
//     than the burst.
//   - the other algorithms: their own refund (exact.go), which gives back
//     the owner's own charges only.
func (c *Coordinator) refundOwned(now int64, r *RuleParams, k entryKey, oe *ownerEntry, cost int64, remote bool) bool {
	if r.exact != nil {
		if !r.exact.refund(oe, now, cost, remote) {
			return false
		}
		c.watchOwned(oe)
		return true
	}
	t := r.gcra.Interval().Nanoseconds()
	if r.leased {
		g, _ := c.cfg.Shares.Share(now, k.rule, k.identity, &oe.tat)
		t = g.Interval().Nanoseconds()
	}
	if int64(oe.tat) <= now {
		return false // full: the charge has been paid back by refill
	}
	oe.tat = bucket.TAT(max(int64(oe.tat)-cost*t, now))
	c.watchOwned(oe)
	return true
}

// takeRefunds is the owner's side of the refunds a sync s from node from
// carries, for the generation its report p of oe records: what of
// (s.RefundBase, s.Refunded] it has not taken yet is given back, once.
func (c *Coordinator) takeRefunds(now int64, r *RuleParams, k entryKey, oe *ownerEntry, from string, p *report, s *SyncItem) {
	lo := max(p.refunded, s.RefundBase)
	if s.Refunded <= lo {
		p.refunded = max(p.refunded, s.Refunded)
		return
	}
	p.refunded = s.Refunded
	if c.refundOwned(now, r, k, oe, s.Refunded-lo, true) && c.cfg.OnRefund != nil {
		c.cfg.OnRefund(RefundRange{Node: from, Rule: k.rule, Identity: k.identity, Gen: s.Gen, From: lo, To: s.Refunded})
	}
}

// settleRefunds gives up e's unsettled refunds once the oldest has waited
// the decide timeout: they are kept.
func (c *Coordinator) settleRefunds(now int64, e *nodeEntry) {
	if e.refunded > e.refundBase && now-e.refundAt >= c.timeout {
		e.refundBase = e.refunded
	}
}
