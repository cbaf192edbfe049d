package cluster

import (
	"fmt"
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// This file is the two-tier decision core of one node: a pure step machine
// in the etcd-io/raft style. It holds no goroutines, sockets or clocks: time
// comes in as an argument, messages come in through Step and go out through
// Ready, and the adapter (gRPC, memberlist, timers) does the I/O. The
// simulator in sim/ drives this very code under a virtual clock.
//
// The mechanism is the "shared" mode of docs/cluster.md, rule by rule:
//
//   - A node admits locally, with no network call, while its unconfirmed
//     spend (admitted, not yet acknowledged by the owner) plus the cost fits
//     in its slack s and its view of the owner's bucket allows it. On first
//     sight of an identity the view is a full bucket.
//   - A request that does not fit, and is not known to be rejected, goes to
//     the owner in the next batch; the owner decides it exactly.
//   - Every acknowledgement and every decision carries the owner's bucket
//     state after the charge as a duration (Debt: the owner's TAT minus its
//     now). The node turns it into its own time on receipt (receive time +
//     Debt), which is never earlier than the owner's real state, and keeps
//     the latest of those views. A node never reuses acknowledged slack
//     before its view says the bucket can pay: the view includes the spend
//     just acknowledged.
//   - A node never asks about a request its view says must be rejected: the
//     owner's real state is at least as spent as the view, so the owner
//     would reject it too. A hot identity reaches its owner only through
//     syncs.
//   - A node syncs an identity when its unsent spend reaches half its slack,
//     or the sync interval passes with spend unacknowledged; all syncs due
//     to one owner travel in one message. Reports are cumulative per (node,
//     identity, rule, generation): a lost or repeated report cannot double
//     count, and the owner charges only what is new.
//   - The owner charges every report (bucket.GCRA.Charge) and never caps the
//     debt: it is paid back by refill.
//   - A node drops an identity's entry only when its spend is acknowledged
//     and its view of the owner's bucket is full again.
//   - Cached views are tied to the ring epoch and the rule version: an
//     epoch change re-reports unconfirmed spend to the new owner, a rule
//     change drops the view.
//
// "exact" is the same path with a slack of zero and no view: every request
// of a non-owner goes to the owner, batched. On the owner itself both modes are
// one map access. "local" rules never reach the coordinator. Exact mode also
// takes fixed_window, sliding_window, sliding_log and leaky_bucket rules:
// their owner entry holds the window, the counts, the log or the queue
// instead of a TAT (see ownerEntry), decided by bucket's step of that
// algorithm and handed over on ring changes (exact.go).

// DefaultSyncInterval is how often unacknowledged spend is reported when the
// half-slack trigger has not fired, when CoordinatorConfig.SyncInterval is 0.
const DefaultSyncInterval = 100 * time.Millisecond

// DefaultDecideTimeout is how long a forwarded request waits for its owner
// before the rule's on_failure decides it, when CoordinatorConfig.DecideTimeout
// is 0.
const DefaultDecideTimeout = 250 * time.Millisecond

// DefaultHandoffTimeout is CoordinatorConfig.HandoffTimeout's default: long
// enough for the members of a region to see a membership change one after
// another, short enough that a crashed previous owner delays moved
// identities only briefly.
const DefaultHandoffTimeout = time.Second

// CoordinatorConfig configures a Coordinator.
type CoordinatorConfig struct {
	// Self is this node's member name.
	Self string
	// SyncInterval bounds how long spend stays unreported; 0 means
	// DefaultSyncInterval.
	SyncInterval time.Duration
	// DecideTimeout bounds how long a forwarded request waits; 0 means
	// DefaultDecideTimeout.
	DecideTimeout time.Duration
	// HandoffTimeout bounds the warm-up after a ring change: a request for
	// an identity that moved to this node and whose state it has not got
	// is decided by the identity's previous owner (relayed to it, see
	// warmup.go) until that owner's handoff marker arrives, or this long
	// has passed (the previous owner is slow, or its view differs: the
	// split-ownership fault term). 0 means DefaultHandoffTimeout.
	HandoffTimeout time.Duration
	// Incarnation numbers this run of the node: the generations of its
	// spend reports start above it, and an owner ignores reports of an
	// older generation. A node restarted under the same name must use a
	// larger value than any earlier run (the Shell uses its start time in
	// nanoseconds), or its new reports would be taken for stale ones.
	Incarnation uint64
	// Stream identifies this coordinator's blind reports (blind.go) to
	// the owners that charge them: it must differ between the
	// coordinators of one node (the Shell gives its shards Incarnation +
	// their index) and between runs of the node. 0 means Incarnation.
	Stream uint64
	// SketchSeed seeds the hashes of gated rules' sketches (sketch.go).
	// The zero value is a fixed seed: the simulator stays deterministic,
	// and a per-process seed can be injected here.
	SketchSeed uint64
	// Shares, when not nil, overrides on the owner the rate and burst of
	// the identities of the rules it leases (scope: global rules, whose
	// region holds a share of the limit). Nil: every rule decides at its
	// own limit.
	Shares Shares
	// MaxKeys caps the entries this node keeps per rule, owner buckets
	// and node entries together; 0 (or less) means DefaultMaxKeys. At the
	// cap a new entry first evicts one that equals no entry, else one
	// whose eviction forgives the least (keycap.go, docs/overshoot.md).
	MaxKeys int
	// OnEvict, when set, is called for every entry the key cap evicts,
	// from within the call that made room (it must not call back into
	// the coordinator). The simulator charges each eviction's term to its
	// identity with it.
	OnEvict func(Eviction)
	// OnRefund, when set, is called on the owner for every refund of a
	// peer it gives back on its bucket (refund.go), from within Step (it
	// must not call back into the coordinator). The simulator settles
	// the refunded charges with it.
	OnRefund func(RefundRange)
}

// Eviction is one entry evicted at the key cap (CoordinatorConfig.OnEvict).
type Eviction struct {
	Rule, Identity string
	// Owner is true for an owner bucket, false for a node entry.
	Owner bool
	// Idle is true when the entry equalled no entry: nothing is forgiven.
	Idle bool
	// Forgiven is the debt an evicted owner bucket held, in tokens rounded
	// up (0 for an idle one and for node entries).
	Forgiven int64
}

// Shares lets an owner decide some rules' identities at another rate and
// burst than the rule's: a global rule's region share (lease/regional.go).
// The coordinator asks it on its owner paths only (its own decisions,
// forwarded ones, charged syncs), and only for rules Leases accepted when
// they were installed, so other rules never reach it. One Shares serves
// every shard of a Shell, so its methods may be called concurrently (for
// different identities) and must be safe for that; they must not call back
// into the coordinator.
type Shares interface {
	// Leases reports whether rule's identities are decided through Share.
	Leases(rule string) bool
	// Share returns the bucket parameters to decide identity under rule
	// at now, and how: ShareEnforce decides with g, ShareReject rejects,
	// ShareAdmit admits; in every case spend reported by other nodes is
	// charged with g. It may rewrite *tat when the parameters change.
	Share(now int64, rule, identity string, tat *bucket.TAT) (g bucket.GCRA, how ShareMode)
	// Observe reports what the owner was asked for identity under rule
	// at now (cost tokens, allowed or not; spend charged from a sync
	// counts as allowed) and its bucket's TAT after it.
	Observe(now int64, rule, identity string, cost int64, allowed bool, tat bucket.TAT)
}

// OwnerTable tells who owns an identity. *Ring implements it through
// RingTable; the simulator may supply its own. A table does not change once
// installed with SetTable (the coordinator reads its Epoch then): a new view
// is a new table.
type OwnerTable interface {
	// Epoch identifies the membership view; it changes with every change.
	Epoch() uint64
	// Digest identifies the member set, the same on every node that has
	// the same members (epochs are local to a node).
	Digest() uint64
	// Len is the number of live members.
	Len() int
	// OwnerName is the name of the member that owns identity ("" if none).
	OwnerName(identity string) string
	// OwnerNameExcept is the owner of identity among the members other
	// than except: who owned it before except joined.
	OwnerNameExcept(identity, except string) string
	// Names lists the members.
	Names() []string
}

type entryKey struct{ rule, identity string }

// smallOutboxes is how many destinations a round looks up by a linear scan
// before it indexes them in a map: most rounds have one or two.
const smallOutboxes = 8

// maxReuse bounds the item arrays kept for reuse (Recycle).
const maxReuse = 64

// maxSpareEntries bounds the node entries kept for reuse.
const maxSpareEntries = 256

// maxSpareReports bounds the report lists of dropped buckets kept for
// reuse: each holds up to one report per member of the ring.
const maxSpareReports = 16

// Stats are a coordinator's counters.
type Stats struct {
	LocalAdmits, ViewRejects, Forwarded, RemoteResults, Degraded uint64
	SyncsSent, AcksSent, ReportsCharged                          uint64
	// Releases counts concurrency slots released to another owner.
	Releases       uint64
	Entries, Owned int
	// Blind spend (blind.go): BlindAdmits counts admissions without an
	// entry within a node's slack (counted in LocalAdmits too), BlindOwn
	// the owner's own decisions on its sketch, BlindCharged the items of
	// blind reports charged to a sketch, BlindTracks the identities an
	// owner told a node to keep an entry of, BlindReports the reports
	// sent (a report sent again counts again).
	BlindAdmits, BlindOwn, BlindCharged, BlindTracks, BlindReports uint64
	// SketchAdmits counts admissions through a gated rule's sketch;
	// SketchPromotions the identities that passed its threshold and got
	// an entry; SketchBytes is the memory the sketches hold.
	SketchAdmits, SketchPromotions uint64
	SketchBytes                    int
	// The key cap (CoordinatorConfig.MaxKeys, keycap.go): EvictedIdle
	// counts entries dropped to make room that equalled no entry (a full
	// bucket nobody holds a grant of; a node entry acknowledged, repaid
	// and not waiting); EvictedViews node entries dropped with their view
	// of a spent owner bucket (spend acknowledged, nothing pending: the
	// node may then admit its slack once more before it learns the
	// bucket again); EvictedForgiven owner buckets dropped in debt, and
	// ForgivenTokens the debt they held, rounded up. OverCap counts
	// entries made over the cap because none could be evicted.
	EvictedIdle, EvictedViews, EvictedForgiven, OverCap uint64
	ForgivenTokens                                      int64
	// HandoffsHeld counts the handed states this node keeps for rules it
	// does not know yet (a joining node can be handed its states before
	// its rules are loaded: held.go); HandoffsDropped those it let go
	// over the key cap before their rule came.
	HandoffsHeld    int
	HandoffsDropped uint64
}

// Coordinator is one node's two-tier decision core. It is not safe for
// concurrent use: the adapter serialises calls (one goroutine or a mutex).
type Coordinator struct {
	// The fields a decision touches come first, close together.
	cfg      CoordinatorConfig
	interval int64
	timeout  int64
	table    OwnerTable
	live     int    // max(table.Len(), 1): a table does not change once installed
	epoch    uint64 // table.Epoch(): a table does not change once installed
	tables   uint64 // SetTable calls so far: the table in force is the tables-th
	rules    map[string]*RuleParams
	sketched bool                // a rule of rules is gated (has a sketch)
	lastRule *RuleParams         // the rule Decide or Step looked up last (rule)
	owned    keyMap[*ownerEntry] // keycap.go
	entries  keyMap[*nodeEntry]
	down     map[string]bool
	ticket   uint64
	gen      uint64
	// taker and takerTicket name the holder and ticket of the
	// concurrency slot the decision under way takes (concurrency.go);
	// slotTickets counts the owner's own slots.
	taker       string
	takerTicket uint64
	slotTickets uint64
	// pend holds the forwarded requests from pendHead on, in ticket order
	// (tickets are consecutive, so ticket t sits at pendHead + t − the
	// first's ticket), which is also their deadline order. nextScan is
	// when Tick next looks at the entries whose wake time has come.
	pend     []pendingReq
	pendHead int
	nextScan int64
	// outs are this round's messages in the order they were started (the
	// envelopes Ready hands out: outbox.go), outIdx indexes them by
	// destination once there are more than smallOutboxes, and lastOut is
	// the one used last (-1 none): a round mostly adds to one destination
	// several times.
	outs    []Envelope
	lastOut int
	indexed bool // outIdx indexes outs (it is kept, cleared, between rounds)
	outIdx  map[string]int
	pools   itemPools // item arrays handed back by Recycle (outbox.go)
	done    []Completion
	// keys holds each rule's entry count and wake heaps (keycap.go),
	// keyList the same in the order they were made, lastKeys the one used
	// last.
	keys     map[string]*ruleKeys
	keyList  []*ruleKeys
	lastKeys *ruleKeys
	stats    Stats
	grantSeq uint64 // the last demand grant epoch issued (slack.go)
	// warmUntil ends the warm-up that follows a ring change (see Decide)
	// at the latest; handedOver[p] is the digest of the last ring for
	// which peer p said it had handed over all it owned.
	warmUntil  int64
	handoff    int64
	handedOver map[string]uint64
	// prev is the table in force before the last change of members (nil
	// before the second table), members the names of the table in force,
	// and last the latest time any call passed in (see clock).
	prev    OwnerTable
	members map[string]bool
	last    int64
	// due is Tick's list of entries to sync, back and backOwned its lists
	// of entries to queue again, spareReports the report lists of dropped
	// buckets (at most maxSpareReports) and spareNodes and spareOwned
	// dropped entries (at most maxSpareEntries each): kept for reuse.
	due          []*nodeEntry
	back         []*nodeEntry
	backOwned    []*ownerEntry
	spareReports [][]report
	spareNodes   []*nodeEntry
	spareOwned   []*ownerEntry
	// aside and asideOwned are makeRoom's scratch lists (keycap.go).
	aside      []*nodeEntry
	asideOwned []*ownerEntry
	// lastView is the state behind the last view rejection (LastViewReject),
	// drops counts the node entries dropped so far.
	lastView ViewReject
	drops    uint64
	// held are handed states of rules this node does not know yet, as
	// they arrived (held.go).
	held  []heldHandoff
	heldN map[string]int // held states per rule
	// Blind spend (blind.go): stream names this coordinator's reports,
	// blindU holds the unacknowledged blind spend per key (an identity's
	// hashID under a rule's salt), blindTo the reports per owner in the
	// order they were started (lastBlind the one used last), blindDue is
	// set when one of them has an open report and none in flight; on the
	// owner, blindHigh is the highest report charged per sender stream;
	// blindRules are the rules with a sketch, in the order SetRules had
	// them.
	stream     uint64
	blindU     map[uint64]int64
	blindTo    []*blindDest
	lastBlind  *blindDest
	blindDue   bool
	blindHigh  map[blindSender]uint64
	blindRules []*RuleParams
}

// Drops returns how many node entries the coordinator has dropped.
func (c *Coordinator) Drops() uint64 { return c.drops }

// NewCoordinator returns a coordinator with no rules and no ring.
func NewCoordinator(cfg CoordinatorConfig) *Coordinator {
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if cfg.DecideTimeout <= 0 {
		cfg.DecideTimeout = DefaultDecideTimeout
	}
	if cfg.HandoffTimeout <= 0 {
		cfg.HandoffTimeout = DefaultHandoffTimeout
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	stream := cfg.Stream
	if stream == 0 {
		stream = cfg.Incarnation
	}
	return &Coordinator{
		stream:     stream,
		handoff:    int64(cfg.HandoffTimeout),
		handedOver: map[string]uint64{},
		cfg:        cfg,
		interval:   int64(cfg.SyncInterval),
		timeout:    int64(cfg.DecideTimeout),
		rules:      map[string]*RuleParams{},
		down:       map[string]bool{},
		keys:       map[string]*ruleKeys{},
		lastOut:    -1,
		gen:        cfg.Incarnation,
		grantSeq:   cfg.Incarnation,
	}
}

// SetRules installs the rules the coordinator decides, at now (unix ns).
// An identity's state under a rule whose limit, burst, window or max delay
// changed is carried over as tokens, as on one node (docs/rules.md, "When
// a rule changes"): owner buckets, this node's views of them and its
// fallback buckets are converted at now; spend not yet acknowledged is
// still reported. A rule whose algorithm changes charges the whole tokens
// spent to a fresh owner state of the new algorithm; a rule removed drops
// its owner buckets, so that one added again starts empty.
func (c *Coordinator) SetRules(now int64, rules []RuleParams) {
	next := make(map[string]*RuleParams, len(rules))
	for i := range rules {
		r := rules[i]
		r.leased = c.cfg.Shares != nil && r.Algorithm == quota.AlgorithmGCRA && c.cfg.Shares.Leases(r.ID)
		r.plain = r.Algorithm == quota.AlgorithmGCRA && !r.leased
		r.slackN = 0
		r.nodesT, r.ownedT = nil, nil
		next[r.ID] = &r
	}
	var changed []entryKey
	c.entries.all(func(k entryKey, e *nodeEntry) {
		if r, ok := next[k.rule]; ok && r.Version != e.version {
			// The view of a GCRA bucket or a queue converts as the owner
			// converts the bucket; a window's is dropped (the next sync
			// brings it). The fallback is a GCRA bucket of the rule.
			if o := c.rules[k.rule]; o != nil && convertible(o, r) {
				if r.exact == nil && e.view != 0 {
					e.view = int64(r.convertTAT(o, bucket.TAT(e.view), now))
				} else {
					e.view = 0
				}
				e.fallback = r.gcra.Convert(o.gcra, e.fallback, now)
			} else {
				e.view = 0
			}
			e.version = r.Version
			changed = append(changed, k)
		}
	})
	c.convertOwned(next, now)
	// Queued on the wake heaps in key order, not map order: which of the
	// entries due at the same time leaves a heap first depends on the
	// order they went in, and the key cap picks its victims from there.
	slices.SortFunc(changed, cmpKey)
	for _, k := range changed {
		c.watch(c.entries.get(k))
	}
	c.retype(next, now)
	c.setSketches(c.rules, next)
	c.blindRules = c.blindRules[:0]
	for i := range rules {
		if r := next[rules[i].ID]; r.ID == rules[i].ID {
			c.setBlind(c.rules[r.ID], r, now)
			if r.bs != nil {
				c.blindRules = append(c.blindRules, r)
			}
		}
	}
	c.rules = next
	c.lastRule = nil
	c.sketched = false
	for _, r := range next { // any order: one flag
		c.sketched = c.sketched || r.sk != nil
	}
	c.takeHeld(now)
}

// Stats returns the coordinator's counters.
func (c *Coordinator) Stats() Stats {
	s := c.stats
	s.Entries, s.Owned = c.entries.len(), c.owned.len()
	s.HandoffsHeld = len(c.held)
	for _, r := range c.rules {
		if r.sk != nil {
			s.SketchBytes += r.sk.bytes()
		}
		if r.bs != nil {
			s.SketchBytes += r.bs.bytes()
		}
	}
	return s
}

func (c *Coordinator) n() int {
	if c.table == nil {
		return 1
	}
	return c.live
}

// slack is r.Slack(c.n()), computed once per rule and ring size.
func (c *Coordinator) slack(r *RuleParams) int64 {
	if n := c.n(); r.slackN != n {
		r.slackN, r.slackS = n, r.Slack(n)
	}
	return r.slackS
}

// Decide decides a request of cost tokens by identity under a shared or
// exact rule at now. It returns a decision at once, or Pending with a ticket
// whose Completion comes out of Ready once the owner answers (or the decide
// timeout passes and on_failure decides).
func (c *Coordinator) Decide(now int64, ruleID, identity string, cost int64) (Outcome, error) {
	var o Outcome
	err := c.DecideInto(&o, now, ruleID, Key{Identity: identity}, cost)
	return o, err
}

// DecideInto is Decide writing its outcome to *out (the zero Outcome with
// an error), for an adapter that keeps the outcome in place rather than
// copying it out of the call, of the identity key.Identity (see Key).
func (c *Coordinator) DecideInto(out *Outcome, now int64, ruleID string, key Key, cost int64) error {
	identity, hash := key.Identity, key.hash
	now = c.clock(now)
	r, ok := c.rule(ruleID)
	if !ok {
		*out = Outcome{}
		return fmt.Errorf("cluster: unknown rule %q", ruleID)
	}
	k := entryKey{ruleID, identity}
	owner := c.cfg.Self
	// An entry made in this ring epoch knows its owner (SetTable moves
	// every entry to the new epoch): no need to score the ring again.
	h := hash // one hash for every lookup of k
	if h == 0 {
		h = hashID(identity)
	}
	e := c.nodesOf(r).GetH(h, identity)
	var oe *ownerEntry
	looked := false // oe is this node's bucket of k, or nil for none
	scored := false // owner came from scoring the table now
	gated := false  // the gate was asked (and promoted the identity)
	if e == nil && r.sk != nil && len(c.down) == 0 {
		// A gated rule's identity with no entry here, bucket or node
		// entry, goes to the gate whoever owns it (no peer is down), so
		// the ring need not be scored unless the gate promotes it.
		oe, looked = c.ownedOf(r).GetH(h, identity), true
		if oe == nil {
			if o, ok := c.gate(now, r, identity, cost); ok {
				*out = o
				return nil
			}
			gated = true
		}
	}
	mine := true // owner is c.cfg.Self
	if e != nil && c.table != nil && e.epoch == c.epoch {
		// A node entry's owner is another node: Decide makes one only
		// then, and SetTable drops those whose owner becomes this node.
		owner, mine = e.owner, false
	} else if c.table != nil {
		// The owner of an identity whose bucket is here, found under the
		// table in force, is this node: no need to score the ring again.
		if !looked {
			oe, looked = c.ownedOf(r).GetH(h, identity), true
		}
		if oe == nil || oe.mineIn != c.tables {
			scored = true
			if o := c.table.OwnerName(identity); o != "" {
				owner = o
			}
		}
		mine = sameString(owner, c.cfg.Self)
	}
	if mine {
		if !looked {
			oe = c.ownedOf(r).GetH(h, identity)
		}
		if oe == nil || oe.warming {
			// A first request, a gated identity or a warm-up: readied
			// apart, off the common path. An identity far from its limit
			// is decided on the rule's sketch, with no bucket (blind.go).
			if oe == nil && r.blind && !c.mayWarm(now, identity) {
				if d, ok := c.blindOwn(now, r, identity, cost); ok {
					*out = Outcome{Decision: d, Source: SourceOwner}
					return nil
				}
			}
			if oe = c.ownedBucket(out, now, r, k, h, oe, scored, gated, cost); oe == nil {
				return nil
			}
		} else if scored {
			oe.mineIn = c.tables
		}
		if r.conc != nil {
			// A concurrency slot names its holder's ticket, the one
			// the holder releases it with: the owner's own are apart
			// from its forwarded requests' (which must stay
			// consecutive), above them.
			c.slotTickets++
			c.taker, c.takerTicket = c.cfg.Self, ownSlotTicket|c.slotTickets
		}
		d, _ := c.ownerStep(now, r, k, h, cost, oe)
		*out = Outcome{Decision: d, Source: SourceOwner}
		if r.conc != nil {
			out.Ticket = c.takerTicket
		}
		return nil
	}
	c.decideAsNode(out, now, r, k, h, e, owner, gated, cost)
	return nil
}

// rule returns the rule id, as c.rules[id] does; the rule used last is
// kept at hand.
func (c *Coordinator) rule(id string) (*RuleParams, bool) {
	if r := c.lastRule; r != nil && sameString(r.ID, id) {
		return r, true
	}
	r, ok := c.rules[id]
	if ok {
		c.lastRule = r
	}
	return r, ok
}

// Step processes one message from peer `from` received at now.
func (c *Coordinator) Step(now int64, from string, m *Message) {
	now = c.clock(now)
	if len(m.Handoffs) > 0 {
		c.takeHandoffs(now, m.Handoffs)
	}
	if m.HandedOver != 0 {
		c.handedOver[from] = m.HandedOver
	}
	if len(m.Blinds) > 0 {
		c.takeBlinds(now, from, m.Blinds)
	}
	for i := range m.Syncs {
		c.charge(now, from, &m.Syncs[i])
	}
	for i := range m.Decides {
		c.decideFor(now, from, &m.Decides[i])
	}
	for i := range m.Acks {
		c.ack(now, &m.Acks[i])
	}
	for i := range m.BlindAcks {
		c.blindAck(from, &m.BlindAcks[i])
	}
	for i := range m.Tracks {
		c.track(now, from, &m.Tracks[i])
	}
	for i := range m.Results {
		c.result(now, &m.Results[i])
	}
}

// Tick advances time: it sends reports whose interval passed, decides
// pending requests whose owner did not answer in time by on_failure, drops
// entries that equal no entry, and starts gated rules' sketches over at
// their period boundaries.
func (c *Coordinator) Tick(now int64) {
	now = c.clock(now)
	// Forwarded requests time out in ticket order: their deadlines are
	// their decision time plus one timeout, so the queue is in deadline
	// order (a request relayed during a warm-up, due after half a timeout,
	// times out once those ahead of it have: warmup.go).
	for c.pendHead < len(c.pend) {
		p := &c.pend[c.pendHead]
		if p.live && now < p.deadline {
			break
		}
		if p.live {
			c.expire(now, p)
		}
		c.popPending()
	}
	// The scans below look at the entries whose wake time has come
	// (keycap.go): at most four times per sync interval, so that a tick
	// with nothing due costs nothing. A sync due by the interval goes out
	// up to a quarter interval late.
	if now < c.nextScan {
		c.rollSketches(now)
		return
	}
	c.nextScan = now + max(c.interval/4, 1)
	// An entry that is due is synced first and may be dropped after; any
	// other is dropped or kept at once (a sync changes only its own entry,
	// so the order of the two does not matter).
	due := c.due[:0]
	for _, rk := range c.keyList {
		due = c.scanNodes(now, rk, due)
	}
	// due is in a deterministic order already (the heaps' pop order), which
	// is all the simulator needs: no sort.
	for _, e := range due {
		c.sync(now, e.key, e)
		if e.idle(now) {
			c.dropEntry(e)
		} else {
			c.watch(e)
		}
	}
	clear(due)
	if cap(due) <= 4096 {
		c.due = due[:0]
	} else {
		c.due = nil // a rare long list's array goes
	}
	for _, rk := range c.keyList {
		c.scanOwned(now, rk)
	}
	c.resendBlinds(now)
	c.checkBlind(now)
	c.rollSketches(now)
}

// rollSketches starts gated rules' sketches over at their period
// boundaries.
func (c *Coordinator) rollSketches(now int64) {
	if !c.sketched {
		return // no gated rule: no walk of the rules on every tick
	}
	// Each rule's sketch rolls on its own: the order does not matter.
	for _, r := range c.rules {
		if r.sk != nil {
			r.sk.roll(now)
		}
	}
}

// FlushAll queues a report of every identity's unsent spend, as a node does
// before it leaves, so that the owners charge it.
func (c *Coordinator) FlushAll(now int64) {
	now = c.clock(now)
	var due []entryKey
	c.entries.all(func(k entryKey, e *nodeEntry) {
		if e.spent > e.sent {
			due = append(due, k)
		}
	})
	slices.SortFunc(due, cmpKey)
	for _, k := range due {
		c.sync(now, k, c.entries.get(k))
	}
}

// SetPeerDown marks a peer unreachable (its circuit breaker opened) or back.
// While it is down, identities it owns are decided by on_failure, and its
// pending requests are decided so at once.
func (c *Coordinator) SetPeerDown(now int64, peer string, down bool) {
	if !down {
		delete(c.down, peer)
		return
	}
	now = c.clock(now)
	c.down[peer] = true
	// The queue is in ticket order: they are decided in that order.
	for i := c.pendHead; i < len(c.pend); i++ {
		if p := &c.pend[i]; p.live && p.owner == peer {
			c.expire(now, p)
		}
	}
	for c.pendHead < len(c.pend) && !c.pend[c.pendHead].live {
		c.popPending()
	}
}

// SetTable installs a new ring. Unconfirmed spend of identities whose owner
// changed is reported again, as a new generation, to the new owner (or
// charged here when this node is the new owner); buckets this node owned and
// no longer does are handed to their new owner.
func (c *Coordinator) SetTable(now int64, t OwnerTable) {
	now = c.clock(now)
	changed := c.table == nil || c.table.Epoch() != t.Epoch()
	c.newMembers(now, t)
	c.table = t
	c.live = max(t.Len(), 1)
	epoch := t.Epoch()
	c.epoch = epoch
	c.tables++
	var moved []entryKey
	c.entries.all(func(k entryKey, e *nodeEntry) {
		if e.epoch != epoch {
			moved = append(moved, k)
		}
	})
	slices.SortFunc(moved, cmpKey)
	for _, k := range moved {
		e := c.entries.get(k)
		if e == nil {
			continue // evicted at the key cap by an owner entry made above
		}
		owner := t.OwnerName(k.identity)
		unconf := e.spent - e.acked
		e.epoch = epoch
		if owner == e.owner {
			continue
		}
		if owner == c.cfg.Self || owner == "" {
			c.dropEntry(e)
			if r := c.rules[k.rule]; r != nil && unconf > 0 {
				hk := hashID(k.identity)
				oe := c.owned.getH(k, hk)
				if oe == nil {
					oe = c.newOwnerEntry(now, k, hk)
					c.owned.setH(k, hk, oe)
				}
				if r.exact != nil {
					r.exact.charge(oe, now, unconf)
				} else {
					r.gcra.Charge(&oe.tat, now, unconf)
				}
				c.watchOwned(oe)
			}
			continue
		}
		c.gen++
		*e = nodeEntry{key: e.key, h: e.h, rk: e.rk, heapAt: e.heapAt, owner: owner, epoch: epoch, version: e.version, gen: c.gen, spent: unconf,
			view: e.view, fallback: e.fallback, pending: e.pending}
		if unconf > 0 {
			c.sync(now, k, e)
		}
		c.watch(e)
	}
	var handed []entryKey
	c.owned.all(func(k entryKey, oe *ownerEntry) {
		o := t.OwnerName(k.identity)
		switch {
		case o != "" && o != c.cfg.Self && !oe.handed:
			handed = append(handed, k)
		case (o == "" || o == c.cfg.Self) && oe.handed:
			// Ours again: what we kept after handing it over is stale,
			// and the owner in between hands the bucket back.
			c.dropOwned(oe)
		}
	})
	slices.SortFunc(handed, cmpKey)
	for _, k := range handed {
		oe := c.owned.get(k)
		c.handOff(now, t.OwnerName(k.identity), oe)
		// Kept, not deleted, until its bucket is full again: peers whose
		// ring has not changed yet still send here, and they are decided
		// on the spent bucket, not on a fresh one (the split-ownership
		// term, bounded by this state rather than a burst).
		oe.handed = true
		oe.warming = false
	}
	c.readdressBlinds(now, t)
	c.dropDeparted(now, t)
	if changed {
		c.markHandedOver(t)
	}
}

// HasReady reports whether Ready would return anything.
func (c *Coordinator) HasReady() bool { return len(c.outs) > 0 || len(c.done) > 0 || c.blindDue }

// Add adds every counter of o to st (the shell sums its shards' with it).
func (st *Stats) Add(o *Stats) {
	st.LocalAdmits += o.LocalAdmits
	st.ViewRejects += o.ViewRejects
	st.Forwarded += o.Forwarded
	st.RemoteResults += o.RemoteResults
	st.Degraded += o.Degraded
	st.SyncsSent += o.SyncsSent
	st.AcksSent += o.AcksSent
	st.ReportsCharged += o.ReportsCharged
	st.Releases += o.Releases
	st.Entries += o.Entries
	st.Owned += o.Owned
	st.BlindAdmits += o.BlindAdmits
	st.BlindOwn += o.BlindOwn
	st.BlindCharged += o.BlindCharged
	st.BlindTracks += o.BlindTracks
	st.BlindReports += o.BlindReports
	st.SketchAdmits += o.SketchAdmits
	st.SketchPromotions += o.SketchPromotions
	st.SketchBytes += o.SketchBytes
	st.EvictedIdle += o.EvictedIdle
	st.EvictedViews += o.EvictedViews
	st.EvictedForgiven += o.EvictedForgiven
	st.OverCap += o.OverCap
	st.ForgivenTokens += o.ForgivenTokens
	st.HandoffsHeld += o.HandoffsHeld
	st.HandoffsDropped += o.HandoffsDropped
}
