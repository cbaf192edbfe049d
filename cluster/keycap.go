package cluster

import (
	"math"

	"github.com/weir-dev/weir/bucket"

	"github.com/weir-dev/weir/internal/strtable"
)

// This file keeps, per rule, the coordinator's entries in two lazy min-heaps
// of wake times, so that neither Tick nor the key cap walks every entry:
//
//   - a node entry's wake time (Coordinator.wake) is the earliest time at
//     which Tick could have something to do with it: its sync falls due, its
//     demand grant lapses, or it becomes idle (equal to no entry). An entry
//     whose only business is a forwarded request still pending has none
//     until a message changes it.
//   - an owner entry's wake time is its TAT: the time its bucket is full
//     again and it may be dropped (one that a node may still hold a grant
//     of is looked at again at every scan, as before).
//
// The heaps are lazy: a change that moves an entry's wake time earlier
// pushes a new item (the entry remembers the earliest it is queued at,
// heapAt); a change that moves it later pushes nothing, and the early item,
// when it comes out, is put back at the entry's current wake time. An item
// whose time is not the entry's heapAt, or whose entry is gone, is stale and
// skipped. Visiting an entry when nothing is due is harmless (Tick used to
// visit every entry at every scan), so only one thing must hold: an entry
// that is due or idle at a scan has an item at or before that scan.

// never is the wake time of an entry that waits on a message.
const never = math.MaxInt64

// heapItem is one queued wake time of an entry of type T.
type heapItem[T any] struct {
	at int64
	p  *T
}

// wakeHeap is a binary min-heap of wake times.
type wakeHeap[T any] []heapItem[T]

func (h *wakeHeap[T]) push(at int64, p *T) {
	*h = append(*h, heapItem[T]{at, p})
	s := *h
	i := len(s) - 1
	it := s[i]
	for i > 0 {
		up := (i - 1) / 2
		if s[up].at <= at {
			break
		}
		s[i] = s[up]
		i = up
	}
	s[i] = it
}

// top returns the earliest item; the heap must not be empty.
func (h wakeHeap[T]) top() heapItem[T] { return h[0] }

func (h *wakeHeap[T]) pop() heapItem[T] {
	s := *h
	top := s[0]
	last := len(s) - 1
	x := s[last]
	s[last] = heapItem[T]{}
	s = s[:last]
	*h = s
	if last == 0 {
		return top
	}
	// Sift x down from the root: the smaller child moves up while it is
	// earlier than x (the right one only when strictly earlier). Indexes
	// are compared with len(s) and kept as uint, so that the compiler
	// drops the bounds checks.
	i := uint(0)
	for {
		c := 2*i + 1
		if c >= uint(len(s)) {
			break
		}
		if r := c + 1; r < uint(len(s)) && s[r].at < s[c].at {
			c = r
		}
		if s[c].at >= x.at {
			break
		}
		s[i] = s[c]
		i = c
	}
	s[i] = x
	return top
}

// ruleKeys is what the coordinator keeps per rule ID for its entries: their
// count (owner and node entries) and their wake heaps.
type ruleKeys struct {
	rule   string
	n      int
	nodes  wakeHeap[nodeEntry]
	owners wakeHeap[ownerEntry]
}

// keysOf returns the per-rule state of rule, creating it.
func (c *Coordinator) keysOf(rule string) *ruleKeys {
	if rk := c.lastKeys; rk != nil && sameString(rk.rule, rule) {
		return rk
	}
	rk := c.keys[rule]
	if rk == nil {
		rk = &ruleKeys{rule: rule}
		c.keys[rule] = rk
		c.keyList = append(c.keyList, rk)
	}
	c.lastKeys = rk
	return rk
}

// wake returns the earliest time at which Tick may have to sync e, lapse
// its grant or drop it (never: not before a message changes it).
func (c *Coordinator) wake(e *nodeEntry) int64 {
	w := int64(never)
	if e.grant.extra > 0 {
		w = e.grant.until
	}
	if e.spent > e.acked || e.grant.unreported() || e.rejected > e.rejSent {
		w = min(w, e.lastSync+c.interval)
	}
	if e.refunded > e.refundBase {
		w = min(w, e.lastSync+c.interval, e.refundAt+c.timeout)
	}
	if e.spent == e.acked && e.pending == 0 && e.grant.idle() && e.rejected == e.rejSent {
		w = min(w, max(e.view, int64(e.fallback)))
	}
	return w
}

// watch queues e at its wake time if that is earlier than where it is
// queued: every change of e's state calls it.
func (c *Coordinator) watch(e *nodeEntry) {
	if w := c.wake(e); w < e.heapAt {
		e.heapAt = w
		e.rk.nodes.push(w, e)
	}
}

// watchOwned queues oe at its TAT if that is earlier than where it is
// queued.
func (c *Coordinator) watchOwned(oe *ownerEntry) {
	if t := int64(oe.tat); t < oe.heapAt {
		oe.heapAt = t
		oe.rk.owners.push(t, oe)
	}
}

// newNodeEntry returns a zeroed node entry of k, whose identity's hashID is
// h, from the spares if any, and counts it, making room at the key cap
// first.
func (c *Coordinator) newNodeEntry(now int64, k entryKey, h uint64) *nodeEntry {
	rk := c.keysOf(k.rule)
	c.makeRoom(now, rk)
	var e *nodeEntry
	if n := len(c.spareNodes); n > 0 {
		e, c.spareNodes = c.spareNodes[n-1], c.spareNodes[:n-1]
	} else {
		e = &nodeEntry{}
	}
	*e = nodeEntry{key: k, h: h, rk: rk, heapAt: never}
	rk.n++
	return e
}

// dropEntry deletes the node entry e.
func (c *Coordinator) dropEntry(e *nodeEntry) {
	c.drops++
	c.entries.delH(e.key, e.h)
	e.rk.n--
	e.dead = true
	// Stale heap items may still point at e: it is reused only through
	// newNodeEntry, which sets heapAt afresh, and a stale item whose time
	// happens to match only makes Tick look at a live entry once more.
	if len(c.spareNodes) < maxSpareEntries {
		c.spareNodes = append(c.spareNodes, e)
	}
}

// newOwnerEntry returns a new owner entry of k, whose identity's hashID is
// h, counted, making room at the key cap first.
func (c *Coordinator) newOwnerEntry(now int64, k entryKey, h uint64) *ownerEntry {
	rk := c.keysOf(k.rule)
	c.makeRoom(now, rk)
	rk.n++
	var oe *ownerEntry
	if n := len(c.spareOwned); n > 0 {
		oe, c.spareOwned = c.spareOwned[n-1], c.spareOwned[:n-1]
	} else {
		oe = &ownerEntry{}
	}
	*oe = ownerEntry{key: k, h: h, rk: rk, heapAt: never}
	if r := c.rules[k.rule]; r != nil && r.bs != nil {
		// The blind spend charged to the rule's sketch comes with the
		// bucket, whatever makes it (blind.go).
		var idx tatSlots
		r.bs.slots(r.blindHash(k.identity), &idx)
		oe.tat = bucket.TAT(max(r.bs.estimate(&idx), 0))
	}
	c.watchOwned(oe) // an empty bucket is full: dropped at the next scan unless charged
	return oe
}

// dropOwned deletes the owner entry oe (c.owned.get(oe.key) must be oe).
func (c *Coordinator) dropOwned(oe *ownerEntry) {
	c.owned.delH(oe.key, oe.h)
	oe.rk.n--
	oe.dead = true
	if oe.reports != nil && len(c.spareReports) < maxSpareReports {
		clear(oe.reports)
		c.spareReports = append(c.spareReports, oe.reports[:0])
	}
	oe.reports = nil
	// As for node entries, stale heap items may still point at oe.
	if len(c.spareOwned) < maxSpareEntries {
		c.spareOwned = append(c.spareOwned, oe)
	}
}

// scanNodes pops rk's node entries whose wake time has come: it lapses
// their grants, appends those due for a sync to due, and drops the idle
// ones; the others are queued again at their next wake time.
func (c *Coordinator) scanNodes(now int64, rk *ruleKeys, due []*nodeEntry) []*nodeEntry {
	h := &rk.nodes
	back := c.back[:0]
	for len(*h) > 0 && h.top().at <= now {
		it := h.pop()
		e := it.p
		if e.dead || it.at != e.heapAt {
			continue
		}
		e.heapAt = never
		e.grant.lapse(now)
		c.settleRefunds(now, e)
		switch {
		case (e.spent > e.acked || e.grant.unreported() || e.refunded > e.refundBase || e.rejected > e.rejSent) && now-e.lastSync >= c.interval:
			due = append(due, e)
		case e.idle(now):
			c.dropEntry(e)
		default:
			back = append(back, e)
		}
	}
	for _, e := range back {
		c.watch(e)
	}
	clear(back)
	c.back = back[:0]
	return due
}

// scanOwned drops rk's owner entries whose bucket is full again and that
// no node may still use a grant of.
func (c *Coordinator) scanOwned(now int64, rk *ruleKeys) {
	h := &rk.owners
	back := c.backOwned[:0]
	for len(*h) > 0 && h.top().at <= now {
		it := h.pop()
		oe := it.p
		if oe.dead || it.at != oe.heapAt {
			continue
		}
		oe.heapAt = never
		switch {
		case int64(oe.tat) > now:
			back = append(back, oe)
		case !oe.reserving() && oe.relaying == 0:
			c.dropOwned(oe)
		default:
			// A node may still use a grant, or a request is relayed to
			// the previous owner (warmup.go): look again at the next
			// scan, as the walk of every entry did.
			back = append(back, oe)
		}
	}
	for _, oe := range back {
		t := max(int64(oe.tat), now)
		oe.heapAt = t
		rk.owners.push(t, oe)
	}
	clear(back)
	c.backOwned = back[:0]
}

// DefaultMaxKeys is CoordinatorConfig.MaxKeys's default: entries per rule
// on one node.
const DefaultMaxKeys = 1_000_000

// evictTries bounds how many entries at the top of a heap one eviction
// looks at and sets aside (a pending request, a handoff or a grant keeps
// an entry), so that making room stays O(log n).
const evictTries = 8

// makeRoom evicts rk's entries while rk is at the key cap, in this order
// (each found at a heap top, O(log n) amortised, with no walk of the map):
//
//  1. an owner bucket that is full and that no node holds a grant of, or
//     an idle node entry (spend acknowledged, nothing pending, view and
//     fallback bucket repaid): both equal no entry (EvictedIdle);
//  2. otherwise whichever forgives less: the node entry, spend
//     acknowledged and nothing pending, whose view is repaid first (it
//     forgives no spend, but the node may admit its slack s once more
//     before it learns the bucket again: EvictedViews), or the owner
//     bucket with the least debt, the smallest TAT (the debt is forgiven:
//     EvictedForgiven, ForgivenTokens).
//
// Least forgiveness rather than the oldest entry: the envelope's term is
// what an eviction forgives, and the least recently used bucket may be the
// deepest in debt. Never evicted: a node entry with a pending request, spend
// not yet acknowledged or a grant, an owner bucket warming up for a handoff
// or handed over and still spent, or one a node may hold a grant of. When
// nothing can go, the entry is made over the cap (OverCap): what keeps
// entries is bounded by the requests in flight and the views' horizon.
func (c *Coordinator) makeRoom(now int64, rk *ruleKeys) {
	for rk.n >= c.cfg.MaxKeys {
		// More than one goes only after entries were made over the cap.
		if !c.evictOne(now, rk) {
			c.stats.OverCap++
			return
		}
	}
}

// evictOne evicts one entry of rk (see makeRoom) and reports whether it
// could.
func (c *Coordinator) evictOne(now int64, rk *ruleKeys) bool {
	oe := c.findOwned(now, rk)
	var e *nodeEntry
	if oe == nil || int64(oe.tat) > now {
		e = c.findNode(now, rk)
	}
	switch {
	case oe != nil && int64(oe.tat) <= now:
		c.evictOwned(now, rk, oe)
	case e != nil && e.view <= now:
		c.evictNode(now, e)
	case e != nil && oe != nil:
		// A view costs the node's slack, a bucket its debt.
		var s, debt int64
		r := c.rules[rk.rule]
		if r != nil {
			s, debt = r.Slack(c.n()), r.debtTokens(now, oe)
		}
		if r != nil && r.gcra.Interval() > 0 && s >= debt {
			c.evictOwned(now, rk, oe)
		} else {
			c.evictNode(now, e)
		}
	case e != nil:
		c.evictNode(now, e)
	case oe != nil:
		c.evictOwned(now, rk, oe)
	}
	// Put back what the searches set aside.
	for _, x := range c.aside {
		rk.nodes.push(x.heapAt, x)
	}
	clear(c.aside)
	c.aside = c.aside[:0]
	for _, x := range c.asideOwned {
		rk.owners.push(x.heapAt, x)
	}
	clear(c.asideOwned)
	c.asideOwned = c.asideOwned[:0]
	return oe != nil || e != nil
}

// ownersTop returns the owner bucket with the smallest TAT of rk, after
// putting stale heap items right, or nil.
func (c *Coordinator) ownersTop(rk *ruleKeys) *ownerEntry {
	h := &rk.owners
	for len(*h) > 0 {
		it := h.top()
		oe := it.p
		switch {
		case oe.dead || it.at != oe.heapAt:
			h.pop()
		case int64(oe.tat) > it.at:
			// Charged since it was queued: queue it at its TAT.
			h.pop()
			oe.heapAt = int64(oe.tat)
			h.push(oe.heapAt, oe)
		default:
			return oe
		}
	}
	return nil
}

// findOwned returns the owner bucket of rk with the least debt that may be
// evicted (left at the top of rk.owners), looking at evictTries at most;
// those it passes over are set aside in c.asideOwned.
func (c *Coordinator) findOwned(now int64, rk *ruleKeys) *ownerEntry {
	for range evictTries {
		oe := c.ownersTop(rk)
		if oe == nil {
			return nil
		}
		spent := int64(oe.tat) > now
		if !oe.reserving() && !(oe.warming && c.warming(now, oe)) && !(spent && oe.handed) {
			return oe
		}
		rk.owners.pop()
		c.asideOwned = append(c.asideOwned, oe)
	}
	return nil
}

// findNode returns the node entry of rk that may be evicted whose view is
// repaid first (left at the top of rk.nodes), looking at evictTries at
// most; those it passes over are set aside in c.aside.
func (c *Coordinator) findNode(now int64, rk *ruleKeys) *nodeEntry {
	h := &rk.nodes
	for tries := 0; tries < evictTries && len(*h) > 0; {
		it := h.top()
		e := it.p
		if e.dead || it.at != e.heapAt {
			h.pop()
			continue
		}
		if e.spent == e.acked && e.pending == 0 && int64(e.fallback) <= now && e.grant.idle() {
			return e
		}
		h.pop()
		c.aside = append(c.aside, e)
		tries++
	}
	return nil
}

// debtTokens is what oe holds against its identity, in tokens: a GCRA
// bucket's debt, rounded up, or what another algorithm's state counts
// (admitted again if the entry goes).
func (r *RuleParams) debtTokens(now int64, oe *ownerEntry) int64 {
	if r.exact != nil {
		return r.exact.debtTokens(oe, now)
	}
	t := r.gcra.Interval().Nanoseconds()
	if t <= 0 {
		return 0
	}
	return (int64(oe.tat) - now + t - 1) / t
}

// evictOwned evicts the owner bucket oe, counting what it forgives.
func (c *Coordinator) evictOwned(now int64, rk *ruleKeys, oe *ownerEntry) {
	ev := Eviction{Rule: oe.key.rule, Identity: oe.key.identity, Owner: true, Idle: int64(oe.tat) <= now}
	if ev.Idle {
		c.stats.EvictedIdle++
	} else {
		c.stats.EvictedForgiven++
		if r := c.rules[rk.rule]; r != nil {
			ev.Forgiven = r.debtTokens(now, oe)
			c.stats.ForgivenTokens += ev.Forgiven
		}
	}
	if c.cfg.OnEvict != nil {
		c.cfg.OnEvict(ev)
	}
	c.dropOwned(oe)
}

// evictNode evicts the node entry e (spend acknowledged, nothing pending).
func (c *Coordinator) evictNode(now int64, e *nodeEntry) {
	ev := Eviction{Rule: e.key.rule, Identity: e.key.identity, Idle: e.view <= now}
	if ev.Idle {
		c.stats.EvictedIdle++
	} else {
		c.stats.EvictedViews++
	}
	if c.cfg.OnEvict != nil {
		c.cfg.OnEvict(ev)
	}
	c.dropEntry(e)
}

// keyMap maps entry keys to entries of type P: one table by identity per
// rule (internal/strtable), so that a lookup hashes and compares the identity
// alone (the rule is found by a comparison with the rule used last, mostly),
// and no slot holds a string (the entry knows its key). Its zero value is
// empty and ready to use.
//
// Under churn (identities that come and go, as with an attacker rotating
// keys against the key cap) a rule's table does not grow: a deletion leaves
// no tombstone, and the table is made again at its live size once it has
// seen more deletions than rebuildAfter(live) (amortised, one copy per
// deletion), which gives back what a peak took.
type keyMap[P strtable.Entry] struct {
	byRule map[string]*strTable[P]
	rule   string       // the rule of last, the table used last
	last   *strTable[P] // nil: none yet
	n      int          // entries over all rules
}

// of returns rule's table, nil if it has none and add is false.
func (m *keyMap[P]) of(rule string, add bool) *strTable[P] {
	if m.last != nil && sameString(m.rule, rule) {
		return m.last
	}
	ids := m.byRule[rule]
	if ids == nil {
		if !add {
			return nil
		}
		if m.byRule == nil {
			m.byRule = map[string]*strTable[P]{}
		}
		ids = &strTable[P]{}
		m.byRule[rule] = ids
	}
	m.rule, m.last = rule, ids
	return ids
}

// get returns k's entry, or nil.
func (m *keyMap[P]) get(k entryKey) P {
	ids := m.of(k.rule, false)
	if ids == nil {
		var none P
		return none
	}
	return ids.Get(k.identity)
}

// getH is get of k whose identity's hashID is h.
func (m *keyMap[P]) getH(k entryKey, h uint64) P {
	ids := m.of(k.rule, false)
	if ids == nil {
		var none P
		return none
	}
	return ids.GetH(h, k.identity)
}

// set makes v k's entry.
func (m *keyMap[P]) set(k entryKey, v P) { m.setH(k, hashID(k.identity), v) }

// setH is set of k whose identity's hashID is h.
func (m *keyMap[P]) setH(k entryKey, h uint64, v P) {
	if m.of(k.rule, true).SetH(h, k.identity, v) {
		m.n++
	}
}

// delH deletes k, whose identity's hashID is h, if it has an entry. A
// rule's table stays when it empties: the rules are few, and their entries
// come back.
func (m *keyMap[P]) delH(k entryKey, h uint64) {
	if ids := m.of(k.rule, false); ids != nil && ids.DelH(h, k.identity) {
		m.n--
	}
}

// len returns the number of entries.
func (m *keyMap[P]) len() int { return m.n }

// all calls f for every entry, in no particular order (callers that need an
// order collect the keys and sort them); f may delete the entry it is
// given. It walks a copy of the entries taken first.
func (m *keyMap[P]) all(f func(k entryKey, v P)) {
	var keys []entryKey
	var vs []P
	var ids []string
	for rule, t := range m.byRule {
		ids, vs = t.AppendAll(ids[:0], vs)
		for _, id := range ids {
			keys = append(keys, entryKey{rule, id})
		}
	}
	for i, k := range keys {
		f(k, vs[i])
	}
}
