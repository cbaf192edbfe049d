package cluster

import (
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// Concurrency rules in mode exact: the identity's owner holds the region's
// slots (docs/overshoot.md, "Concurrency across the region").
//
//   - Every acquisition is decided by the owner, as for the other exact
//     algorithms: the owner's own requests on its entry, the others'
//     forwarded in the next batch. An admitted acquisition is a slot of the
//     owner's entry that names its holder (the node whose request took it)
//     and the holder's ticket for the request, and that lapses one window
//     after it was taken: the rule's window is the longest a slot is held
//     without its release.
//   - The request's end releases its slot: Coordinator.Release on the
//     holder, which frees it at once on the owner, or sends the owner a
//     release (a DecideItem with Release set) naming the ticket. A release
//     goes to the identity's owner in the holder's ring at the time of the
//     release, so that a slot handed to a new owner is released there.
//   - A release that finds no slot (it overtook the handoff that carries
//     its slot, or the slot lapsed) is kept as a tombstone until the slot
//     would have lapsed, and a handed slot that matches a tombstone is
//     dropped on arrival.
//   - A slot is freed without its release when it lapses (a lost release,
//     a holder that hung) or when its holder leaves the owner's ring (a
//     crashed or departed gateway: SetTable).
//   - A join or a graceful leave hands the slots over with their holders,
//     tickets and the time each has left. The new owner does not wait for
//     them (no warm-up relay: a relayed acquisition would name the relaying
//     node as its holder), so until the handoff arrives the region may
//     hold up to the limit more in flight.

// ownSlotTicket marks the tickets of an owner's own slots, apart from its
// forwarded requests' tickets.
const ownSlotTicket = 1 << 63

// slot is one admitted acquisition of a concurrency rule on its owner.
type slot struct {
	holder string // the node whose request took it ("" when not known)
	ticket uint64 // the holder's ticket of the request (0 when not known)
	cost   int64  // slots taken
	until  int64  // when it lapses without a release
}

// concState is an owner entry's slots, and the releases that found none.
type concState struct {
	slots []slot
	freed []slot // tombstones: cost unused
}

// concAlgo is a concurrency rule in mode exact: at most n slots in flight,
// each held at most hold ns.
type concAlgo struct {
	c    bucket.Concurrency
	n    int64
	hold int64
}

func newConcAlgo(n int64, hold time.Duration) (*concAlgo, error) {
	c, err := bucket.NewConcurrency(n)
	if err != nil {
		return nil, err
	}
	return &concAlgo{c: c, n: n, hold: max(int64(hold), 1)}, nil
}

func (a *concAlgo) state(oe *ownerEntry) *concState {
	if oe.ext == nil {
		oe.ext = new(exactState)
	}
	return &oe.ext.conc
}

// expire drops the slots and tombstones that lapsed by now, and sets tat
// to when the last one left lapses (the entry equals no entry from then).
func (a *concAlgo) expire(oe *ownerEntry, now int64) *concState {
	st := a.state(oe)
	last := int64(0)
	keep := func(s []slot) []slot {
		out := s[:0]
		for _, x := range s {
			if x.until > now {
				out = append(out, x)
				last = max(last, x.until)
			}
		}
		return out
	}
	st.slots, st.freed = keep(st.slots), keep(st.freed)
	oe.tat = bucket.TAT(last)
	return st
}

// inFlight is the slots st holds.
func inFlight(st *concState) int64 {
	var n int64
	for _, s := range st.slots {
		n += s.cost
	}
	return n
}

func (a *concAlgo) step(oe *ownerEntry, now, cost int64) bucket.Decision {
	st := a.expire(oe, now)
	cur := bucket.Inflight(inFlight(st))
	d := a.c.Step(&cur, now, cost)
	if d.Allowed && cost > 0 {
		a.add(oe, st, slot{cost: cost, until: now + a.hold})
	}
	return d
}

// add adds s to st, oe's state.
func (a *concAlgo) add(oe *ownerEntry, st *concState, s slot) {
	st.slots = append(st.slots, s)
	oe.tat = max(oe.tat, bucket.TAT(s.until))
}

// tag names the holder and ticket of the slot step just added.
func (a *concAlgo) tag(oe *ownerEntry, holder string, ticket uint64) {
	st := a.state(oe)
	if n := len(st.slots); n > 0 {
		st.slots[n-1].holder, st.slots[n-1].ticket = holder, ticket
	}
}

// release frees the slot that holder took with ticket, or, when there is
// none, keeps a tombstone of it for a handed slot still on its way.
func (a *concAlgo) release(oe *ownerEntry, now int64, holder string, ticket uint64) {
	st := a.expire(oe, now)
	for i, s := range st.slots {
		if s.ticket == ticket && s.holder == holder {
			st.slots = append(st.slots[:i], st.slots[i+1:]...)
			a.expire(oe, now)
			return
		}
	}
	st.freed = append(st.freed, slot{holder: holder, ticket: ticket, until: now + a.hold})
	oe.tat = max(oe.tat, bucket.TAT(now+a.hold))
}

// dropHolders frees the slots of holders that are not members.
func (a *concAlgo) dropHolders(oe *ownerEntry, now int64, member func(string) bool) {
	st := a.expire(oe, now)
	out := st.slots[:0]
	for _, s := range st.slots {
		if s.holder == "" || member(s.holder) {
			out = append(out, s)
		}
	}
	st.slots = out
	a.expire(oe, now)
}

// charge takes spent slots of no known holder: they lapse one hold later.
func (a *concAlgo) charge(oe *ownerEntry, now, spent int64) {
	if spent > 0 {
		a.add(oe, a.expire(oe, now), slot{cost: spent, until: now + a.hold})
	}
}

func (a *concAlgo) spent(oe *ownerEntry, now int64) int64 { return inFlight(a.expire(oe, now)) }

func (a *concAlgo) book(oe *ownerEntry, spent, now int64) {
	*a.state(oe) = concState{}
	oe.tat, oe.count = 0, 0
	a.charge(oe, now, spent)
}

func (a *concAlgo) same(old exactAlgo) bool { o, ok := old.(*concAlgo); return ok && *o == *a }
func (a *concAlgo) maxCost() int64          { return a.n }

// convert keeps the slots in flight under the new limit and hold: a slot
// lapses when it would have under the old hold.
func (a *concAlgo) convert(_ exactAlgo, oe *ownerEntry, now int64) { a.expire(oe, now) }

// refund frees the newest slot of cost for the owner's own admission, which
// Refund follows within its request. A remote admission is freed by its
// holder's release instead (the ticket names it).
func (a *concAlgo) refund(oe *ownerEntry, now, cost int64, remote bool) bool {
	st := a.expire(oe, now)
	if remote {
		return false
	}
	for i := len(st.slots) - 1; i >= 0; i-- {
		if st.slots[i].cost == cost {
			st.slots = append(st.slots[:i], st.slots[i+1:]...)
			a.expire(oe, now)
			return true
		}
	}
	return false
}

func (a *concAlgo) debtTokens(oe *ownerEntry, now int64) int64 { return a.spent(oe, now) }

func (a *concAlgo) inspect(oe *ownerEntry, now int64, st *BucketState) {
	st.Remaining = a.n
	if oe == nil {
		return
	}
	cs := a.expire(oe, now)
	st.Count = inFlight(cs)
	st.Held = len(cs.slots) > 0
	st.Remaining = max(a.n-st.Count, 0)
	if st.Held {
		st.ResetAfter = time.Duration(int64(oe.tat) - now)
	}
}

// handOff hands every slot in flight with the time it has left.
func (a *concAlgo) handOff(oe *ownerEntry, now int64, h *HandoffItem) {
	st := a.expire(oe, now)
	h.Debt = int64(oe.tat) - now
	h.Slots = h.Slots[:0]
	for _, s := range st.slots {
		h.Slots = append(h.Slots, SlotItem{Holder: s.holder, Ticket: s.ticket, Cost: s.cost, Left: s.until - now})
	}
}

// handDelta hands the slot the last admission took. It serves the previous
// owner's decisions for a new owner that waits for its state
// (decideHanded), which a concurrency rule's new owner never asks for (it
// takes the rule without a warm-up).
func (a *concAlgo) handDelta(oe *ownerEntry, now int64, _ bucket.TAT, cost int64, h *HandoffItem) {
	st := a.state(oe)
	h.Slots = h.Slots[:0]
	if n := len(st.slots); n > 0 {
		s := st.slots[n-1]
		h.Slots = append(h.Slots, SlotItem{Holder: s.holder, Ticket: s.ticket, Cost: s.cost, Left: s.until - now})
	}
	h.Debt = int64(oe.tat) - now
}

// take adds the handed slots to oe's, each lapsing when it has left on this
// node's clock (late by the message's delay: held longer, never shorter),
// except those a tombstone says were released already.
func (a *concAlgo) take(oe *ownerEntry, now int64, h *HandoffItem) {
	st := a.expire(oe, now)
next:
	for _, it := range h.Slots {
		if it.Left <= 0 || it.Cost <= 0 {
			continue
		}
		if it.Ticket != 0 {
			for i, f := range st.freed {
				if f.ticket == it.Ticket && f.holder == it.Holder {
					st.freed = append(st.freed[:i], st.freed[i+1:]...)
					continue next
				}
			}
			for _, s := range st.slots {
				if s.ticket == it.Ticket && s.holder == it.Holder {
					continue next // handed twice: counted once
				}
			}
		}
		a.add(oe, st, slot{holder: it.Holder, ticket: it.Ticket, cost: it.Cost, until: now + it.Left})
	}
	a.expire(oe, now)
}

// convertHandoff keeps the handed slots as they are: a slot is a request in
// flight whatever the limit.
func (a *concAlgo) convertHandoff(_ exactAlgo, _ int64, _ *HandoffItem) {}

// SlotItem is one slot of a handed concurrency state: Cost slots that
// Holder's request with ticket Ticket took, lapsing Left ns after the
// sender's now.
type SlotItem struct {
	Holder string
	Ticket uint64
	Cost   int64
	Left   int64
}

// Release frees the concurrency slot that this node's request took under
// ticket (the Outcome.Ticket of its admission) for identity under ruleID:
// at once when this node owns the identity, else in the next batch to its
// owner. It does nothing for a rule that is not a concurrency rule in mode
// exact, or while the owner is down (the slot lapses, or is freed when the
// owner's ring drops this node).
func (c *Coordinator) Release(now int64, ruleID, identity string, ticket uint64, cost int64) {
	now = c.clock(now)
	r, ok := c.rule(ruleID)
	if !ok || r.conc == nil || ticket == 0 {
		return
	}
	owner := c.cfg.Self
	if c.table != nil {
		if o := c.table.OwnerName(identity); o != "" {
			owner = o
		}
	}
	if sameString(owner, c.cfg.Self) {
		c.releaseFrom(now, r, c.cfg.Self, identity, ticket)
		return
	}
	if c.down[owner] {
		return
	}
	m := c.outbox(owner)
	m.Decides = addItem(m.Decides, &c.pools.decides)
	it := &m.Decides[len(m.Decides)-1]
	it.Ticket, it.Cost, it.Release = ticket, max(cost, 0), true
	it.Rule, it.Identity, it.h = ruleID, identity, 0
	c.stats.Releases++
}

// releaseFrom is the owner freeing holder's slot of ticket.
func (c *Coordinator) releaseFrom(now int64, r *RuleParams, holder, identity string, ticket uint64) {
	k := entryKey{r.ID, identity}
	h := hashID(identity)
	oe := c.ownedOf(r).GetH(h, identity)
	if oe == nil {
		if now >= c.warmUntil {
			return // nothing held, and no handoff is on its way
		}
		oe = c.newOwnerEntry(now, k, h)
		c.owned.setH(k, h, oe)
	}
	r.conc.release(oe, now, holder, ticket)
	c.watchOwned(oe)
}

// hasConcurrency reports whether a rule in force is a concurrency rule
// (any order of the rules gives the same answer).
func (c *Coordinator) hasConcurrency() bool {
	for _, r := range c.rules {
		if r.conc != nil {
			return true
		}
	}
	return false
}

// memberOf returns whether a name is one of t's members.
func memberOf(t OwnerTable) func(string) bool {
	names := t.Names()
	return func(n string) bool { return slices.Contains(names, n) }
}

// dropDeparted frees, on this node's concurrency entries, the slots of
// holders that are not members of t.
func (c *Coordinator) dropDeparted(now int64, t OwnerTable) {
	if !c.hasConcurrency() {
		return // no walk over the owned entries
	}
	var keys []entryKey
	c.owned.all(func(k entryKey, oe *ownerEntry) {
		if r := c.rules[k.rule]; r != nil && r.conc != nil {
			keys = append(keys, k)
		}
	})
	if len(keys) == 0 {
		return
	}
	slices.SortFunc(keys, cmpKey)
	member := memberOf(t)
	for _, k := range keys {
		if oe := c.owned.get(k); oe != nil {
			c.rules[k.rule].conc.dropHolders(oe, now, member)
			c.watchOwned(oe)
		}
	}
}
