package cluster

import (
	"math"
	"strings"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/prefetch"
	"github.com/weir-dev/weir/quota"
)

// This file is blind spend: how a shared rule decides an identity far from
// its limit without an entry on any node (docs/overshoot.md, "Blind
// spend").
//
//   - A node with no entry of an identity admits it within its slack, as
//     on first sight, and keeps only the amount not yet acknowledged,
//     under a 64-bit key (Coordinator.blindU). The admission joins the
//     open blind report to the identity's owner: one report per owner in
//     flight at a time, acknowledged as a whole (BlindAck), so what a node
//     sends per admission is a rule, an identity and a cost, and what it
//     gets back is nothing per admission.
//   - The owner charges each item to its bucket of the identity when it
//     keeps one, else to a TAT sketch (tatSketch): a count-min of TATs
//     whose estimate never falls below the identity's own bucket charged
//     with every report. When the charge leaves the bucket more than half
//     spent (TAT − now > B·T/2), or more than blindHorizon from full, the
//     owner makes it a bucket of its own
//     (at the estimate) and answers Track: the node then keeps an entry,
//     with a view, syncs and the owner's decisions, as for every identity
//     before blind spend existed.
//   - The owner's own requests for an identity it keeps no bucket of are
//     decided on the sketch the same way, with no entry.
//
// So an acknowledgement without a Track says that the owner's bucket could
// pay when it charged the report (TAT − now ≤ B·T/2 ≤ B·T), which is what a
// node needs before it spends its slack again: the envelope's argument
// holds as it is, with S unchanged, and nothing accumulates (every blind
// admission is charged, once, by the report's sequence number).

// blindDepth is the rows of an owner's TAT sketch.
const blindDepth = 4

// Widths of an owner's TAT sketch per row: it starts narrow, grows
// (grownWidth) while a sample of its cells finds more than a quarter of
// them live (a TAT after now) and halves while it finds fewer than a
// sixteenth, within [blindMinWidth, maxBlindWidth(MaxKeys)].
const (
	blindMinWidth = 256
	blindMaxWidth = 1 << 20
	blindSample   = 256
)

// blindHorizon bounds how far ahead of now a TAT sketch holds a TAT: an
// identity whose bucket would be more than half spent, or more than this
// far from full, gets a bucket of its own. So a sketch's cells are all
// past within a horizon of being last raised, and a sketch that changes
// width keeps its old cells no longer than that: it follows a stream that
// grows within seconds, whatever the rule's window. (A rule whose token
// takes longer than the horizon to come back, a daily quota say, spends
// blind only an identity's first admission on each node.)
const blindHorizon = time.Second

// maxBlindWidth is the widest sketch of a coordinator that keeps at most
// maxKeys entries per rule: two cells per row for each identity it could
// keep an entry of, a power of two within [blindMinWidth, blindMaxWidth].
func maxBlindWidth(maxKeys int) int {
	w := blindMinWidth
	for w < 2*maxKeys && w < blindMaxWidth {
		w *= 2
	}
	return w
}

// maxBlindReport bounds the items of one blind report: beyond it a node
// keeps entries for the identities it admits until the report in flight is
// acknowledged (and a message's parts, cut between reports only, stay
// bounded).
const maxBlindReport = 2048

// tatSketch is an owner's sketch of the TATs of the identities of one rule
// it keeps no bucket of. Each row maps an identity to one cell, and a
// cell holds the latest TAT of the identities it maps (raise); an
// identity's estimate, the earliest of its cells, is never earlier than
// its own TAT.
//
// A sketch that changes width starts its cells anew (cur) and keeps the
// previous ones (old) until every TAT in them is past: an estimate is the
// later of the two, so it never falls, and the new cells' occupancy is
// that of the identities charged since, which the next change of width
// is decided on.
type tatSketch struct {
	cur, old tatRows
	oldUntil int64 // no cell of old is after it
	sample   int   // the next cell of cur the occupancy sample reads
	maxWidth int
}

// tatRows are blindDepth rows of width cells (none: no cells).
type tatRows struct {
	cells []int64
	width int // a power of two
}

// tatSlots are the cells of one identity in a sketch's rows.
type tatSlots struct {
	cur, old [blindDepth]int
	hasOld   bool
}

func newTATSketch(maxWidth int) *tatSketch {
	return &tatSketch{cur: newTATRows(blindMinWidth), maxWidth: max(maxWidth, blindMinWidth)}
}

func newTATRows(width int) tatRows {
	return tatRows{cells: make([]int64, blindDepth*width), width: width}
}

// slots returns in idx the cells of the identity whose hashID is h.
func (s *tatSketch) slots(h uint64, idx *tatSlots) {
	s.cur.slots(h, &idx.cur)
	idx.hasOld = s.old.cells != nil
	if idx.hasOld {
		s.old.slots(h, &idx.old)
	}
}

func (rs *tatRows) slots(h uint64, idx *[blindDepth]int) {
	mask := uint64(rs.width - 1)
	for r := range blindDepth {
		idx[r] = r*rs.width + int(bucket.Splitmix64(h+uint64(r+1)*0x9e3779b97f4a7c15)&mask)
	}
}

// prefetch starts loading the cells of the identity whose hashID is h.
func (s *tatSketch) prefetch(h uint64) {
	var idx tatSlots
	s.slots(h, &idx)
	for _, i := range idx.cur {
		prefetch.Line(uintptr(unsafe.Pointer(&s.cur.cells[i])))
	}
	if idx.hasOld {
		for _, i := range idx.old {
			prefetch.Line(uintptr(unsafe.Pointer(&s.old.cells[i])))
		}
	}
}

// estimate returns the identity's estimate: the earliest TAT of its cells,
// the later of the two when there are old cells.
func (s *tatSketch) estimate(idx *tatSlots) int64 {
	est := s.cur.estimate(&idx.cur)
	if idx.hasOld {
		est = max(est, s.old.estimate(&idx.old))
	}
	return est
}

func (rs *tatRows) estimate(idx *[blindDepth]int) int64 {
	est := rs.cells[idx[0]]
	for _, i := range idx[1:] {
		est = min(est, rs.cells[i])
	}
	return est
}

// idle reports whether the estimate of the identity whose hashID is h is
// at or before now: a full bucket.
func (s *tatSketch) idle(now int64, h uint64) bool {
	var idx tatSlots
	s.slots(h, &idx)
	return s.estimate(&idx) <= now
}

// raise makes every cell of idx at least tat.
func (s *tatSketch) raise(idx *tatSlots, tat int64) {
	for _, i := range idx.cur {
		s.cur.cells[i] = max(s.cur.cells[i], tat)
	}
}

// check forgets the old cells once they are all past, and samples
// blindSample cells: with no old cells, a sketch more than a quarter live
// doubles its width, one less than a sixteenth live halves it.
func (s *tatSketch) check(now int64) {
	if s.old.cells != nil && now >= s.oldUntil {
		s.old = tatRows{}
	}
	live := 0
	n := len(s.cur.cells)
	for range blindSample {
		if s.cur.cells[s.sample] > now {
			live++
		}
		s.sample = (s.sample + 1) % n
	}
	w := s.cur.width
	switch {
	case s.old.cells != nil:
	case live*4 > blindSample && w < s.maxWidth:
		s.resize(min(grownWidth(w, live), s.maxWidth))
	case live*16 < blindSample && w > blindMinWidth:
		s.resize(w / 2)
	}
}

// grownWidth is the width a sketch of width w grows to when live of
// blindSample cells are live: about four cells per row for each identity
// the row holds, at least twice w. A row with a fraction ρ of its cells
// live holds about −w·ln(1 − ρ) identities (linear counting), so a sketch
// far too narrow grows to its width at once, not by doubling once per
// lifetime of its old cells.
func grownWidth(w, live int) int {
	rho := float64(min(live, blindSample-1)) / blindSample
	n := -float64(w) * math.Log1p(-rho)
	g := 2 * w
	for float64(g) < 4*n {
		g *= 2
	}
	return g
}

// resize starts cells of width w, keeping the current ones as old.
func (s *tatSketch) resize(w int) {
	s.old, s.oldUntil = s.cur, 0
	for _, v := range s.old.cells {
		s.oldUntil = max(s.oldUntil, v)
	}
	s.cur, s.sample = newTATRows(w), 0
}

// convert carries every cell over from rule o's parameters to r's at now,
// as a bucket's TAT is (the conversion keeps the order of TATs, so no
// estimate falls below its identity's converted TAT).
func (s *tatSketch) convert(o, r *RuleParams, now int64) {
	for _, rs := range []*tatRows{&s.cur, &s.old} {
		for i, v := range rs.cells {
			if v > now {
				rs.cells[i] = int64(r.convertTAT(o, bucket.TAT(v), now))
			}
		}
	}
	s.oldUntil = 0
	for _, v := range s.old.cells {
		s.oldUntil = max(s.oldUntil, v)
	}
}

func (s *tatSketch) bytes() int { return 8 * (len(s.cur.cells) + len(s.old.cells)) }

// blindItem is a blind admission not yet acknowledged by its owner.
type blindItem struct {
	rule, identity string
	key            uint64 // its key in Coordinator.blindU
	cost           int64
}

// blindDest is a node's blind reports to one owner.
type blindDest struct {
	to     string
	seq    uint64      // the sequence number of the report in flight, or of the last one
	flying bool        // flight is sent and not acknowledged
	flight []blindItem // the report in flight
	sentAt int64       // when flight was last sent
	open   []blindItem // admitted since, sent once flight is acknowledged
}

// blindSender names the stream of blind reports of one coordinator of one
// node, on the owner.
type blindSender struct {
	from   string
	stream uint64
}

// setBlind readies r for blind spend (SetRules): every shared gcra rule
// that is not leased or gated, with its sketch carried over from the rule
// it replaces, o (nil for none), converted when its parameters changed.
func (c *Coordinator) setBlind(o, r *RuleParams, now int64) {
	r.blind = !r.leased && r.SpendsBlind()
	r.salt = xxhash.Sum64String(r.ID) | 1
	r.bseed = bucket.Splitmix64(c.cfg.SketchSeed+blindGolden) ^ r.salt
	r.trackAt = min(r.gcra.Interval().Nanoseconds()*r.Burst/2, int64(blindHorizon))
	r.blindMax = r.Burst - r.Burst/2
	r.bs = nil // a RuleParams from another coordinator carries its sketch
	if !r.blind {
		return
	}
	if o != nil && o.bs != nil {
		r.bs = o.bs
		if o.gcra != r.gcra {
			r.bs.convert(o, r, now)
		}
		return
	}
	r.bs = newTATSketch(maxBlindWidth(c.cfg.MaxKeys))
}

// SpendsBlind reports whether the rule's identities far from their limit
// are spent blind (docs/overshoot.md, "Blind spend") where it is not
// leased to a region (scope: global): a shared gcra rule with no sketch
// gating and TrackAll unset.
func (p *RuleParams) SpendsBlind() bool {
	return p.Algorithm == quota.AlgorithmGCRA && p.Mode == quota.ModeShared && p.Sketch.Threshold == 0 && !p.TrackAll
}

// blindHash is identity's hash in r's blind-spend sketch and the key of
// its unacknowledged blind spend: xxhash seeded by the rule and
// CoordinatorConfig.SketchSeed, not the tables' per-process hash, so that
// a run of the simulator makes the same collisions every time (a sketch
// cell shared is a decision changed), while a node's own seed keeps
// identities chosen to collide out of reach.
func (r *RuleParams) blindHash(identity string) uint64 {
	return bucket.Splitmix64(xxhash.Sum64String(identity) ^ r.bseed)
}

// blindGolden separates the blind sketch's seed from the gated sketches'.
const blindGolden = 0x6a09e667f3bcc909

// blindSpend returns the blind spend of identity under r that its owner
// has not acknowledged.
func (c *Coordinator) blindSpend(r *RuleParams, identity string) int64 {
	if len(c.blindU) == 0 {
		return 0
	}
	return c.blindU[r.blindHash(identity)]
}

// blindAdmit admits a request of cost tokens of k (no entry here) that
// owner owns, within this node's slack, as blind spend: ok is
// false when it does not fit (the caller makes an entry).
func (c *Coordinator) blindAdmit(now int64, r *RuleParams, k entryKey, owner string, cost int64) (Outcome, bool) {
	s := c.slack(r)
	if cost < 0 || cost > s || cost > r.blindMax {
		return Outcome{}, false
	}
	key := r.blindHash(k.identity)
	u := c.blindU[key]
	if u+cost > s {
		return Outcome{}, false
	}
	d := c.blindDestOf(owner)
	if len(d.open) >= maxBlindReport {
		return Outcome{}, false
	}
	if cost > 0 {
		if c.blindU == nil {
			c.blindU = map[uint64]int64{}
		}
		c.blindU[key] = u + cost
		d.open = append(d.open, blindItem{rule: r.ID, identity: k.identity, key: key, cost: cost})
		if !d.flying {
			c.blindDue = true
		}
	}
	c.stats.LocalAdmits++
	c.stats.BlindAdmits++
	t := r.gcra.Interval().Nanoseconds()
	return Outcome{Source: SourceSlack, Decision: bucket.Decision{
		Allowed:   true,
		Limit:     r.Burst,
		Remaining: r.Burst - u - cost,
		Reset:     time.Duration((u + cost) * t),
	}}, true
}

// blindDestOf returns the blind reports to owner, starting them.
func (c *Coordinator) blindDestOf(owner string) *blindDest {
	if d := c.lastBlind; d != nil && sameString(d.to, owner) {
		return d
	}
	for _, d := range c.blindTo {
		if d.to == owner {
			c.lastBlind = d
			return d
		}
	}
	d := &blindDest{to: owner}
	c.blindTo = append(c.blindTo, d)
	c.lastBlind = d
	return d
}

// sealBlinds sends the open report of every owner with none in flight
// (ReadyInto, before the round's messages are taken).
func (c *Coordinator) sealBlinds() {
	if !c.blindDue {
		return
	}
	c.blindDue = false
	for _, d := range c.blindTo {
		if d.flying || len(d.open) == 0 {
			continue
		}
		d.seq++
		d.flight, d.open = d.open, d.flight[:0]
		d.flying, d.sentAt = true, c.last
		c.emitBlind(d)
	}
}

// emitBlind queues d's report in flight to its owner.
func (c *Coordinator) emitBlind(d *blindDest) {
	m := c.outbox(d.to)
	for _, it := range d.flight {
		m.Blinds = appendItem(m.Blinds, &c.pools.blinds, BlindItem{Stream: c.stream, Seq: d.seq, Rule: it.rule, Identity: it.identity, Cost: it.cost})
	}
	c.stats.BlindReports++
}

// unblind takes cost tokens off the unacknowledged blind spend of key.
func (c *Coordinator) unblind(key uint64, cost int64) {
	if u := c.blindU[key] - cost; u > 0 {
		c.blindU[key] = u
	} else {
		delete(c.blindU, key)
	}
}

// blindAck is a node receiving the acknowledgement of a blind report from
// its owner.
func (c *Coordinator) blindAck(from string, a *BlindAck) {
	if a.Stream != c.stream {
		return
	}
	d := c.blindDestOf(from)
	if !d.flying || a.Seq != d.seq {
		return // a repeated acknowledgement, or of a report given up
	}
	for _, it := range d.flight {
		c.unblind(it.key, it.cost)
	}
	clear(d.flight)
	d.flight, d.flying = d.flight[:0], false
	if len(d.open) > 0 {
		c.blindDue = true
	}
}

// resendBlinds sends again the reports in flight that have waited a sync
// interval for their acknowledgement (Tick): a lost report or reply. The
// owner charges a report once, by its sequence number.
func (c *Coordinator) resendBlinds(now int64) {
	for _, d := range c.blindTo {
		if d.flying && now-d.sentAt >= c.interval {
			d.sentAt = now
			c.emitBlind(d)
		}
	}
}

// readdressBlinds moves, after a ring change, the blind spend queued for
// an owner that is no longer a member, and the open spend whose identity
// moved, to the identities' owners in t: as new reports, or charged here
// when this node owns them now. What is in flight to a member stays: that
// owner charges and acknowledges it.
func (c *Coordinator) readdressBlinds(now int64, t OwnerTable) {
	// The streams of senders that left are forgotten: a sender that comes
	// back and sends a charged report again has it charged twice, which
	// over-counts (never under-counts) its spend.
	for k := range c.blindHigh {
		if !c.members[k.from] {
			delete(c.blindHigh, k)
		}
	}
	if len(c.blindTo) == 0 {
		return
	}
	var move []blindItem
	keep := c.blindTo[:0]
	for _, d := range c.blindTo {
		if !c.members[d.to] {
			move = append(move, d.flight...)
			move = append(move, d.open...)
			continue
		}
		open := d.open[:0]
		for _, it := range d.open {
			if t.OwnerName(it.identity) == d.to {
				open = append(open, it)
			} else {
				move = append(move, it)
			}
		}
		clear(d.open[len(open):])
		d.open = open
		keep = append(keep, d)
	}
	clear(c.blindTo[len(keep):])
	c.blindTo = keep
	c.lastBlind = nil
	for _, it := range move {
		c.unblind(it.key, it.cost)
		r, ok := c.rules[it.rule]
		owner := t.OwnerName(it.identity)
		switch {
		case !ok:
		case owner == "" || owner == c.cfg.Self:
			c.chargeBlind(now, "", r, it.rule, it.identity, it.cost)
		default:
			d := c.blindDestOf(owner)
			c.blindU[it.key] += it.cost
			d.open = append(d.open, it)
			if !d.flying {
				c.blindDue = true
			}
		}
	}
}

// takeBlinds is the owner's side of blind reports: each report whose
// sequence number is new for its sender's stream is charged, item by
// item, and every report is acknowledged.
func (c *Coordinator) takeBlinds(now int64, from string, items []BlindItem) {
	for k := range min(blindAhead, len(items)) {
		c.prefetchBlind(&items[k])
	}
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && items[j].Stream == items[i].Stream && items[j].Seq == items[i].Seq {
			j++
		}
		key := blindSender{from, items[i].Stream}
		fresh := items[i].Seq > c.blindHigh[key]
		if fresh {
			if c.blindHigh == nil {
				c.blindHigh = map[blindSender]uint64{}
			}
			c.blindHigh[key] = items[i].Seq
		}
		for k := i; k < j; k++ {
			if k+blindAhead < len(items) {
				c.prefetchBlind(&items[k+blindAhead])
			}
			it := &items[k]
			r, ok := c.rule(it.Rule)
			switch {
			case !ok:
			case fresh && it.Cost > 0:
				c.chargeBlind(now, from, r, it.Rule, it.Identity, it.Cost)
			default:
				// Charged already (a report sent again, its reply
				// lost): the acknowledgement still says which of its
				// identities to track, as the first one did.
				c.trackIfKept(now, from, r, it.Rule, it.Identity)
			}
		}
		m := c.outbox(from)
		m.BlindAcks = appendItem(m.BlindAcks, &c.pools.backs, BlindAck{Stream: items[i].Stream, Seq: items[i].Seq})
		i = j
	}
}

// blindAhead is how many items ahead of the one it charges takeBlinds
// starts loading an item's sketch cells (the first blindAhead at once,
// across reports: a shard's part of a message is often a few items): a
// report's identities are scattered over sketches larger than the caches,
// and the loads of a few items overlap each other and the charging of the
// ones before.
const blindAhead = 8

// prefetchBlind starts loading the sketch cells of the blind item it.
func (c *Coordinator) prefetchBlind(it *BlindItem) {
	if r, ok := c.rule(it.Rule); ok && r.bs != nil {
		r.bs.prefetch(r.blindHash(it.Identity))
	}
}

// chargeBlind charges cost tokens of identity under r, blind spend of node
// from ("" for this node's own, moved here by a ring change): to the bucket
// this node keeps of it, else to the sketch while that leaves the bucket
// at most half spent, else to a bucket made at the sketch's estimate. A
// node is told to track an identity charged to a bucket.
func (c *Coordinator) chargeBlind(now int64, from string, r *RuleParams, rule, identity string, cost int64) {
	k := entryKey{rule, identity}
	h := hashID(identity)
	oe := c.ownedOf(r).GetH(h, identity)
	if oe == nil && r.bs != nil && !c.mayWarm(now, identity) {
		var idx tatSlots
		r.bs.slots(r.blindHash(identity), &idx)
		est := r.bs.estimate(&idx)
		tat := bucket.TAT(est)
		r.gcra.Charge(&tat, now, cost)
		c.stats.BlindCharged++
		if int64(tat)-now <= r.trackAt {
			r.bs.raise(&idx, int64(tat))
			return
		}
		oe = c.ownedEntry(now, r, kept(k), h) // at est: ownedEntry
	} else if oe == nil {
		// A warm-up: the identity's state may be on its way from its
		// previous owner; its bucket here decides as any other.
		oe = c.ownedEntry(now, r, kept(k), h)
	}
	c.chargeOwned(now, r, k, oe, cost)
	c.watchOwned(oe)
	if from != "" {
		m := c.outbox(from)
		m.Tracks = appendItem(m.Tracks, &c.pools.tracks, TrackItem{Rule: rule, Identity: identity, Debt: ownerDebt(now, r, oe)})
		c.stats.BlindTracks++
	}
}

// kept is k with its identity copied, for a bucket that keeps it: a blind
// item's identity is a substring of its whole report's (the shell decodes
// a report's identities as one string), which a bucket must not hold on
// to for its lifetime.
func kept(k entryKey) entryKey {
	k.identity = strings.Clone(k.identity)
	return k
}

// mayWarm reports whether a bucket of identity made now would warm up:
// the identity moved here with the last ring change and its previous
// owner, still a member, has not said it handed everything over
// (warmup.go). Its blind spend then goes to a bucket, not the sketch.
func (c *Coordinator) mayWarm(now int64, identity string) bool {
	if now >= c.warmUntil || c.table == nil {
		return false
	}
	from := c.prevOwner(identity)
	return from != "" && c.handedOver[from] != c.table.Digest()
}

// trackIfKept tells node from to track identity under r when this node
// keeps a bucket of it.
func (c *Coordinator) trackIfKept(now int64, from string, r *RuleParams, rule, identity string) {
	if oe := c.ownedOf(r).GetH(hashID(identity), identity); oe != nil {
		m := c.outbox(from)
		m.Tracks = appendItem(m.Tracks, &c.pools.tracks, TrackItem{Rule: rule, Identity: identity, Debt: ownerDebt(now, r, oe)})
		c.stats.BlindTracks++
	}
}

// blindOwn decides the owner's own request of cost tokens of an identity
// (hashID h) it keeps no bucket of, on r's sketch: ok is false when the
// decision would leave the bucket more than half spent (the caller makes
// the bucket, which starts at the sketch's estimate: ownedEntry).
func (c *Coordinator) blindOwn(now int64, r *RuleParams, identity string, cost int64) (bucket.Decision, bool) {
	var idx tatSlots
	r.bs.slots(r.blindHash(identity), &idx)
	tat := bucket.TAT(r.bs.estimate(&idx))
	d := r.gcra.Step(&tat, now, cost)
	if !d.Allowed || int64(tat)-now > r.trackAt {
		return bucket.Decision{}, false
	}
	r.bs.raise(&idx, int64(tat))
	c.stats.BlindOwn++
	return d, true
}

// track is a node told by owner from to keep an entry of an identity.
func (c *Coordinator) track(now int64, from string, t *TrackItem) {
	r, ok := c.rule(t.Rule)
	if !ok || c.table == nil {
		return
	}
	k := entryKey{t.Rule, t.Identity}
	h := hashID(t.Identity)
	e := c.nodesOf(r).GetH(h, t.Identity)
	if e == nil {
		if c.table.OwnerName(t.Identity) != from {
			return // not its owner in this node's ring
		}
		e = c.entry(now, k, h, r, from)
	}
	e.view = max(e.view, now+t.Debt)
	c.watch(e)
}

// refundBlind gives back cost tokens of blind spend of k while
// they are still in an open report, and reports whether it did.
func (c *Coordinator) refundBlind(r *RuleParams, k entryKey, cost int64) bool {
	key := r.blindHash(k.identity)
	for _, d := range c.blindTo {
		// Only the newest items: a refund follows its admission closely.
		for i := len(d.open) - 1; i >= 0 && i >= len(d.open)-64; i-- {
			if it := &d.open[i]; it.key == key && it.cost >= cost && sameString(it.identity, k.identity) {
				it.cost -= cost
				c.unblind(key, cost)
				return true
			}
		}
	}
	return false
}

// checkBlind samples the occupancy of the rules' sketches (Tick).
func (c *Coordinator) checkBlind(now int64) {
	for _, r := range c.blindRules {
		r.bs.check(now)
	}
}
