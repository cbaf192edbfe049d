package cluster

import (
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// ownerEntry is an identity's bucket on its owner, with the last report of
// every node's current generation.
//
// For a rule of another algorithm (exact.go) the entry holds that
// algorithm's state instead: a fixed window's End in tat and its Count in
// count, a leaky queue's departure in tat, a sliding window's or a log's in
// ext. Whatever the algorithm, tat is when the entry equals no entry (a
// full bucket, an ended window, a drained queue, an empty log), which is
// all the wake heaps and the key cap read of it (keycap.go).
type ownerEntry struct {
	key      entryKey
	h        uint64    // hashID(key.identity)
	rk       *ruleKeys // its rule's keys (keycap.go)
	heapAt   int64     // the earliest time it is queued at in rk.owners (never: not queued)
	tat      bucket.TAT
	count    int64       // fixed_window rules: the tokens counted in the window ending at tat
	ext      *exactState // sliding_window and sliding_log rules: their state
	reports  []report
	dead     bool   // dropped: items left in the heap are stale
	handed   bool   // handed to a new owner: kept only for lagging peers
	warming  bool   // created during a warm-up, no handoff received yet
	from     string // the previous owner, who decides while it warms (warmup.go)
	relaying int    // requests relayed to from and not yet answered
	// mineIn is the table (Coordinator.tables) under which Decide found
	// this node the identity's owner, 0 for none: Decide then need not
	// score the ring again for it while that table is in force.
	mineIn uint64
}

// fixedState is oe's window under a fixed_window rule.
func (oe *ownerEntry) fixedState() bucket.FixedState {
	return bucket.FixedState{End: int64(oe.tat), Count: oe.count}
}

// setFixed stores the window st in oe.
func (oe *ownerEntry) setFixed(st bucket.FixedState) {
	oe.tat, oe.count = bucket.TAT(st.End), st.Count
}

type report struct {
	node  string
	gen   uint64
	total int64
	grant grantState // demand-following slack only
	// refunded is the node's cumulative refund count of generation gen
	// that the owner has taken (refund.go).
	refunded int64
	// rejected is the node's cumulative count of rejected tokens of
	// generation gen that the owner has observed (SyncItem.Rejected).
	rejected int64
}

// TableID returns oe's identity, its key in its strTable.
func (oe *ownerEntry) TableID() string { return oe.key.identity }

// ownedKeys returns the keys of the owner entries of every rule that pick
// selects, in key order, not map order (the key cap's heaps see them in
// the order they are converted).
func (c *Coordinator) ownedKeys(pick func(id string, o *RuleParams) bool) []entryKey {
	var keys []entryKey
	for id, o := range c.rules {
		if !pick(id, o) {
			continue
		}
		if t := c.owned.of(id, false); t != nil {
			ids, _ := t.AppendAll(nil, nil)
			for _, identity := range ids {
				keys = append(keys, entryKey{id, identity})
			}
		}
	}
	slices.SortFunc(keys, cmpKey)
	return keys
}

// convertOwned converts, at now, the owner buckets of the rules whose
// parameters change to next and keep their algorithm, in key order.
func (c *Coordinator) convertOwned(next map[string]*RuleParams, now int64) {
	keys := c.ownedKeys(func(id string, o *RuleParams) bool {
		r, ok := next[id]
		return ok && convertible(o, r) && !sameState(o, r)
	})
	for _, k := range keys {
		oe := c.owned.get(k)
		if oe == nil || oe.dead {
			continue
		}
		o, r := c.rules[k.rule], next[k.rule]
		if r.exact != nil {
			r.exact.convert(o.exact, oe, now)
		} else {
			oe.tat = r.convertTAT(o, oe.tat, now)
		}
		c.watchOwned(oe)
	}
}

// retype carries, at now, the owner entries of rules whose algorithm
// changes (from gcra to fixed_window, say) across the change, and drops
// those of rules that next no longer has: the whole tokens an identity had
// spent under the old algorithm are charged to a fresh state of the new one
// (bucket's Spent and Booked: never more than the new rule allows), and a
// rule removed and added again later starts empty. A leased rule's state is
// its share's: across an algorithm change it starts over, and so does a
// concurrency rule's (slots in flight and tokens spent do not convert).
func (c *Coordinator) retype(next map[string]*RuleParams, now int64) {
	keys := c.ownedKeys(func(id string, old *RuleParams) bool {
		r, ok := next[id]
		return !ok || r.Algorithm != old.Algorithm
	})
	for _, k := range keys {
		oe := c.owned.get(k)
		if oe == nil || oe.dead {
			continue
		}
		o, r := c.rules[k.rule], next[k.rule]
		if r == nil || o.leased || r.leased || o.conc != nil || r.conc != nil {
			c.dropOwned(oe)
			continue
		}
		spent := o.spentOwned(oe, now)
		oe.ext = nil
		if r.exact != nil {
			r.exact.book(oe, spent, now)
		} else {
			oe.tat, oe.count = r.gcra.Booked(spent, now), 0
		}
		c.watchOwned(oe)
	}
}

// spentOwned returns the whole tokens oe had spent under rule o at now.
func (o *RuleParams) spentOwned(oe *ownerEntry, now int64) int64 {
	if o.exact != nil {
		return o.exact.spent(oe, now)
	}
	return o.gcra.Spent(oe.tat, now)
}

// ownedOf returns r's table of owner entries, as c.owned.of(r.ID, true)
// does.
func (c *Coordinator) ownedOf(r *RuleParams) *strTable[*ownerEntry] {
	if r.ownedT == nil {
		r.ownedT = c.owned.of(r.ID, true)
	}
	return r.ownedT
}

// ownerStep decides a request on this node's own bucket of k, for itself or
// for a peer that forwarded it, and returns the bucket's entry too; h is
// k's identity's hashID. (Right after a ring change the caller first asks
// whether the identity's previous owner should decide instead: warmup.go.)
func (c *Coordinator) ownerStep(now int64, r *RuleParams, k entryKey, h uint64, cost int64, oe *ownerEntry) (bucket.Decision, *ownerEntry) {
	if oe == nil {
		oe = c.ownedEntry(now, r, k, h)
	}
	var d bucket.Decision
	switch {
	case r.plain:
		d = r.gcra.Step(&oe.tat, now, cost)
	case r.exact != nil:
		d = c.exactStep(now, r, oe, cost)
	default:
		d = c.otherStep(now, r, k, oe, cost)
	}
	c.watchOwned(oe)
	return d, oe
}

// otherStep is ownerStep's decision for a rule that is not plain gcra: an
// exact algorithm's own step on the entry's state (exact.go), or a leased
// rule's share.
func (c *Coordinator) otherStep(now int64, r *RuleParams, k entryKey, oe *ownerEntry, cost int64) bucket.Decision {
	switch {
	case r.exact != nil:
		return c.exactStep(now, r, oe, cost)
	case r.leased:
		return c.shareStep(now, r, k, oe, cost)
	}
	return r.gcra.Step(&oe.tat, now, cost)
}

// exactStep decides a request on oe by r's exact algorithm; an admitted
// concurrency acquisition's slot names the decision's holder and ticket
// (Coordinator.taker).
func (c *Coordinator) exactStep(now int64, r *RuleParams, oe *ownerEntry, cost int64) bucket.Decision {
	d := r.exact.step(oe, now, cost)
	if r.conc != nil && d.Allowed {
		r.conc.tag(oe, c.taker, c.takerTicket)
	}
	return d
}

// shareStep decides a leased rule's request at the identity's share
// (CoordinatorConfig.Shares) and reports it.
func (c *Coordinator) shareStep(now int64, r *RuleParams, k entryKey, oe *ownerEntry, cost int64) bucket.Decision {
	g, how := c.cfg.Shares.Share(now, k.rule, k.identity, &oe.tat)
	var d bucket.Decision
	switch how {
	case ShareReject:
		d = g.Peek(oe.tat, now)
		d.Allowed, d.Remaining, d.RetryAfter = false, 0, time.Second
	case ShareAdmit:
		d = bucket.Decision{Allowed: true, Limit: r.Burst, Remaining: r.Burst}
	default:
		d = g.Step(&oe.tat, now, cost)
	}
	c.cfg.Shares.Observe(now, k.rule, k.identity, cost, d.Allowed, oe.tat)
	return d
}

// ownedEntry returns this node's bucket of k, whose identity's hashID is h,
// under r (whose ID is k.rule), creating it: right after a ring change, as a
// warming one (see warmup.go).
func (c *Coordinator) ownedEntry(now int64, r *RuleParams, k entryKey, h uint64) *ownerEntry {
	oe := c.ownedOf(r).GetH(h, k.identity)
	if oe == nil {
		oe = c.newOwnerEntry(now, k, h)
		// A concurrency rule's owner takes its slots without a warm-up: a
		// relayed acquisition would name the relaying node as its holder
		// (concurrency.go).
		if now < c.warmUntil && c.table != nil && r.conc == nil {
			if from := c.prevOwner(k.identity); from != "" && c.handedOver[from] != c.table.Digest() {
				oe.warming, oe.from = true, from
			}
		}
		c.owned.setH(k, h, oe)
	}
	return oe
}

// takeHandoffs is Step taking the buckets a previous owner handed over.
func (c *Coordinator) takeHandoffs(now int64, hs []HandoffItem) {
	var member func(string) bool // made once, for a concurrency rule's slots
	for _, h := range hs {
		r := c.rules[h.Rule]
		if r == nil {
			c.hold(now, &h)
			continue
		}
		k := entryKey{h.Rule, h.Identity}
		hk := hashID(k.identity)
		keep := convertHandoff(now, r, &h)
		oe := c.owned.getH(k, hk)
		if oe == nil || oe.handed {
			// What we kept after handing it over is in the state
			// coming back.
			if oe != nil {
				c.dropOwned(oe)
			}
			oe = c.newOwnerEntry(now, k, hk)
			c.owned.setH(k, hk, oe)
		}
		// What this node charged since the ring change and what the old
		// owner charged before it are separate spend: they add. (Spend a
		// node re-reported here that the old owner had also charged but
		// not yet acknowledged is counted twice: at most its slack, once
		// per ring change, never an excess.)
		switch {
		case !keep:
		case r.exact != nil:
			r.exact.take(oe, now, &h)
			if r.conc != nil && c.table != nil {
				// Slots of a holder this ring dropped already are free.
				if member == nil {
					member = memberOf(c.table)
				}
				r.conc.dropHolders(oe, now, member)
			}
		default:
			oe.tat = bucket.TAT(now + max(int64(oe.tat)-now, 0) + max(h.Debt, 0))
		}
		// The state is here: the warm-up ends, unless requests relayed to
		// the previous owner are still out (what it admits for them comes
		// back as handoffs too, warmup.go).
		if oe.relaying == 0 {
			oe.warming = false
		}
		c.watchOwned(oe)
	}
}

// convertHandoff converts, at now, the state h hands over from the rule it
// was written under to r, the rule this node decides, when they differ: as
// SetRules converts an owner bucket. It reports false when the state does
// not carry over (the algorithm changed: the identity starts over). A
// leased rule's state is its share's, read as it is; so is a state whose
// rule h does not name (Limit 0).
func convertHandoff(now int64, r *RuleParams, h *HandoffItem) bool {
	if h.Limit == 0 || r.leased {
		return true
	}
	if h.Algorithm == r.Algorithm && h.Limit == r.Limit && h.Window == int64(r.Window) && h.Burst == r.Burst && h.MaxDelay == r.maxDelay {
		return true
	}
	if h.Algorithm != r.Algorithm {
		return false
	}
	o, err := NewRuleParams(&quota.Rule{ID: h.Rule, Mode: quota.ModeExact, Algorithm: h.Algorithm,
		Limit: h.Limit, Window: time.Duration(h.Window), Burst: h.Burst, MaxDelay: time.Duration(h.MaxDelay)}, 0)
	if err != nil {
		// Parameters no rule has: the state is read as it is, as from a
		// node that names none.
		return true
	}
	if r.exact != nil {
		r.exact.convertHandoff(o.exact, now, h)
		return true
	}
	h.Debt = int64(r.convertTAT(&o, bucket.TAT(now+max(h.Debt, 0)), now)) - now
	return true
}

// chargeOwned charges spent tokens a node reported to this node's bucket of
// k: at the rule's rate, or at the region's share for a leased rule
// (CoordinatorConfig.Shares), which also observes it as demand.
func (c *Coordinator) chargeOwned(now int64, r *RuleParams, k entryKey, oe *ownerEntry, spent int64) {
	if r.exact != nil {
		r.exact.charge(oe, now, spent)
		return
	}
	if r.leased {
		g, _ := c.cfg.Shares.Share(now, k.rule, k.identity, &oe.tat)
		g.Charge(&oe.tat, now, spent)
		c.cfg.Shares.Observe(now, k.rule, k.identity, spent, true, oe.tat)
		return
	}
	r.gcra.Charge(&oe.tat, now, spent)
}

// ownerDebt is what an owner tells a node of oe's state after a decision
// or a charge: the bucket's TAT minus now. The nodes of a rule of another
// algorithm keep no view of it (exact mode: the owner decides every
// request), so it is 0 there and their entries go once nothing is pending.
func ownerDebt(now int64, r *RuleParams, oe *ownerEntry) int64 {
	if r.exact != nil {
		return 0
	}
	return int64(oe.tat) - now
}

// charge is the owner's side of a sync: charge what is new, acknowledge.
func (c *Coordinator) charge(now int64, from string, s *SyncItem) {
	k := entryKey{s.Rule, s.Identity}
	r, ok := c.rule(s.Rule)
	if !ok {
		return
	}
	oe := c.ownedEntry(now, r, k, hashID(k.identity))
	i := slices.IndexFunc(oe.reports, func(p report) bool { return p.node == from })
	if i < 0 {
		if n := len(c.spareReports); oe.reports == nil && n > 0 {
			oe.reports, c.spareReports = c.spareReports[n-1], c.spareReports[:n-1]
		}
		oe.reports = append(oe.reports, report{node: from})
		i = len(oe.reports) - 1
	}
	p := &oe.reports[i]
	var spent int64
	switch {
	case s.Gen > p.gen:
		// A new generation starts from zero: the node only starts one
		// once the previous generation was fully acknowledged (and its
		// demand grant given back), so the old grant goes too.
		p.gen, p.total, p.refunded, p.rejected = s.Gen, 0, 0, 0
		p.grant = grantState{demand: p.grant.demand, demandAt: p.grant.demandAt, decided: p.grant.decided}
		spent = s.Total
		// Before its first acknowledgement a generation's total is
		// unconfirmed spend, at most the node's slack, within the pool.
		// More means this bucket lost the generation's earlier reports
		// (evicted at the key cap, or dropped full while the node's
		// entry lived on): what they carried was charged to the bucket
		// that is gone, so only the pool's worth is charged again.
		if pool := r.Pool(); r.Mode == quota.ModeShared && spent > pool {
			spent = pool
		}
		c.chargeOwned(now, r, k, oe, spent)
		p.total = s.Total
		c.stats.ReportsCharged++
		c.watchOwned(oe)
	case s.Gen == p.gen && s.Total > p.total:
		spent = s.Total - p.total
		c.chargeOwned(now, r, k, oe, spent)
		p.total = s.Total
		c.stats.ReportsCharged++
		c.watchOwned(oe)
	}
	if s.Gen == p.gen && s.Rejected > p.rejected {
		if r.leased {
			c.cfg.Shares.Observe(now, k.rule, k.identity, s.Rejected-p.rejected, false, oe.tat)
		}
		p.rejected = s.Rejected
	}
	total, refunded := p.total, p.refunded
	if s.Gen < p.gen {
		// A stale generation: acknowledge as is, charge nothing.
		total, refunded = s.Total, s.Refunded
	}
	warm := c.warming(now, oe)
	if s.Gen == p.gen && !warm && s.Refunded > 0 {
		// Refunds wait for the warm-up's state: given back on a bucket
		// whose state is still on its way, they would be lost.
		c.takeRefunds(now, r, k, oe, from, p, s)
		refunded = p.refunded
	}
	if warm {
		// The bucket's state is still on its way: an acknowledgement of a
		// fresh bucket would let the node spend its slack again at every
		// round trip, and one of a spent bucket would have it reject with
		// tokens left. Charged, not acknowledged: the node's spend stays
		// unconfirmed, beyond its slack it asks (and the previous owner
		// decides), and it reports again after the sync interval.
		return
	}
	debt := ownerDebt(now, r, oe)
	a := AckItem{Rule: s.Rule, Identity: s.Identity, Gen: s.Gen, Total: total, Debt: debt, Refunded: refunded}
	if s.Gen == p.gen && r.Scheme == SlackDemand && r.Mode == quota.ModeShared {
		c.regrant(now, r, oe, i, *s, spent)
		a.GrantEpoch, a.Grant = p.grant.epoch, p.grant.extra
	}
	m := c.outbox(from)
	m.Acks = appendItem(m.Acks, &c.pools.acks, a)
	c.stats.AcksSent++
}

// decideFor is the owner deciding a forwarded request.
func (c *Coordinator) decideFor(now int64, from string, d *DecideItem) {
	if d.Release {
		if r, ok := c.rule(d.Rule); ok && r.conc != nil {
			c.releaseFrom(now, r, from, d.Identity, d.Ticket)
		}
		return
	}
	c.taker, c.takerTicket = from, d.Ticket // a concurrency slot's holder
	var bd bucket.Decision
	var debt int64
	if r, ok := c.rule(d.Rule); ok {
		k := entryKey{d.Rule, d.Identity}
		h := d.h // made by Decide in this process, or 0
		if h == 0 {
			h = hashID(k.identity)
		}
		oe := c.ownedOf(r).GetH(h, k.identity)
		switch owner := c.ownerFor(k.identity, oe); {
		case owner != "" && sameString(owner, from):
			// The identity's owner in this node's ring, waiting for our
			// state, asks: decided on what we hold, which follows the
			// identity to it (warmup.go).
			bd, oe = c.decideHanded(now, r, k, h, d.Cost, oe, owner)
		case owner != "":
			// A peer whose ring lags: decided on this node's bucket of
			// it (split ownership while the views converge).
			if oe == nil {
				oe = c.newOwnerEntry(now, k, h)
				c.owned.setH(k, h, oe)
			}
			bd, oe = c.ownerStep(now, r, k, h, d.Cost, oe)
		default:
			if oe == nil {
				oe = c.ownedEntry(now, r, k, h)
			}
			oe.mineIn = c.tables
			if oe.warming {
				if to := c.relayTarget(now, oe, from); to != "" {
					c.relay(now, k, h, d.Cost, to, from, d.Ticket)
					return
				}
			}
			bd, oe = c.ownerStep(now, r, k, h, d.Cost, oe)
		}
		if r.Scheme == SlackDemand && r.Mode == quota.ModeShared {
			c.noteDemand(now, oe, from, d.Cost)
		}
		debt = ownerDebt(now, r, oe)
	} else {
		// The owner does not know the rule (rule sets converging):
		// admit, as a node without the rule would.
		bd.Allowed = true
	}
	c.answer(from, d.Ticket, bd, debt)
}

// answer queues the decision bd of ticket for the node from, with the
// owner's bucket after it as debt.
func (c *Coordinator) answer(from string, ticket uint64, bd bucket.Decision, debt int64) {
	m := c.outbox(from)
	m.Results = addItem(m.Results, &c.pools.results)
	// Written field by field, every field (the slot may hold an old
	// item): no copy of a whole item.
	it := &m.Results[len(m.Results)-1]
	it.Ticket, it.Allowed, it.Remaining, it.Debt = ticket, bd.Allowed, bd.Remaining, debt
	it.Reset, it.RetryAfter, it.Delay = int64(bd.Reset), int64(bd.RetryAfter), int64(bd.Delay)
}

// HandoffAll queues, for every bucket this node owns, a handoff to its owner
// in next (a ring without this node), and reports all unsent spend: what a
// node does before it leaves gracefully, so that no state is lost and no
// free window is handed out.
func (c *Coordinator) HandoffAll(now int64, next OwnerTable) {
	now = c.clock(now)
	var keys []entryKey
	c.owned.all(func(k entryKey, _ *ownerEntry) { keys = append(keys, k) })
	slices.SortFunc(keys, cmpKey)
	for _, k := range keys {
		oe := c.owned.get(k)
		if o := next.OwnerName(k.identity); o != "" && o != c.cfg.Self && !oe.handed {
			c.handOff(now, o, oe)
			// Handed: a ring change seen while leaving must not hand it
			// again (the new owner would count it twice).
			oe.handed = true
		}
	}
	c.markHandedOver(next)
	c.FlushAll(now)
}

// handOff queues oe's state for its new owner `to`: its debt (the TAT from
// now), or its algorithm's state (exact.go). A bucket that is full again
// (tat ≤ now) equals no entry: nothing to send.
func (c *Coordinator) handOff(now int64, to string, oe *ownerEntry) {
	if int64(oe.tat) <= now {
		return
	}
	h := HandoffItem{Rule: oe.key.rule, Identity: oe.key.identity, Debt: int64(oe.tat) - now}
	if r := c.rules[oe.key.rule]; r != nil {
		h.Algorithm, h.Limit, h.Window, h.Burst, h.MaxDelay = r.Algorithm, r.Limit, int64(r.Window), r.Burst, r.maxDelay
		if r.exact != nil {
			r.exact.handOff(oe, now, &h)
		}
	}
	m := c.outbox(to)
	m.Handoffs = appendItem(m.Handoffs, &c.pools.handoffs, h)
}

// markHandedOver tells every other member of t that this node has queued
// the handoff of every bucket it owned that t assigns elsewhere: the marker
// travels after those handoffs, and ends the new owners' warm-up.
func (c *Coordinator) markHandedOver(t OwnerTable) {
	d := t.Digest()
	for _, name := range t.Names() {
		if name != c.cfg.Self {
			c.outbox(name).HandedOver = d
		}
	}
}

// ownedBucket readies this node's bucket oe of k (nil for none yet) for a
// decision: the gate for a gated rule's new identity, the bucket made for a
// first request, the relay to its previous owner while it warms up. It
// returns the bucket to step, or nil when out holds the decision already.
func (c *Coordinator) ownedBucket(out *Outcome, now int64, r *RuleParams, k entryKey, h uint64, oe *ownerEntry, scored, gated bool, cost int64) *ownerEntry {
	if r.sk != nil && oe == nil && !gated {
		if o, ok := c.gate(now, r, k.identity, cost); ok {
			*out = o
			return nil
		}
	}
	if oe == nil {
		oe = c.ownedEntry(now, r, k, h)
	}
	if scored {
		oe.mineIn = c.tables
	}
	if oe.warming {
		// Its previous owner may still hold its state: it decides.
		if to := c.relayTarget(now, oe, ""); to != "" {
			*out = Outcome{Pending: true, Ticket: c.relay(now, k, h, cost, to, "", 0), Source: SourceRemote}
			return nil
		}
	}
	return oe
}
