package lease

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// This file is a region's side of the lease group for the global keys one
// node owns in its region's ring: a pure core with no clock, no goroutine
// and no I/O (the root package's global_node.go drives it). Per global
// (rule, identity) the node owns, it keeps a Holder, the parameters of the
// owner's bucket, and what the owner was asked since the last report; it
// builds one batched Report for all of them and takes the grants back.
//
// Demand. What a region was asked, tokens per window, is measured on the
// owner: its own decisions (admitted and rejected), the decisions it made
// for requests other nodes forwarded, the spend other nodes admitted
// within their slack and the requests they rejected on their view of the
// owner's bucket, both reported in syncs (cluster.SyncItem's Total and
// Rejected), all scaled from the time since the last report to the rule's
// window: the owner sees every request of its region, a sync interval
// late, so what it was asked is the region's demand. A report less than an
// interval after the last measures over an interval all the same, the rest
// of it taken from the last measurement in proportion (unless the demand
// changed, see ReportDue): at the rates of one identity, counts over a
// tenth of a second are mostly noise. While at least a quarter of what it
// was asked was rejected, the region reports at least ⌈3·share ÷ 2⌉:
// clients that back off when throttled hide part of their demand, and the
// share grows by at least half per report until the region is no longer
// throttled that much, or the allocation (max-min fair against the other
// regions' demands) stops it. A region otherwise reports what it was
// asked, so an unused share shrinks and a rejection or two in what the
// share nearly serves moves nothing.
//
// Debt. The first report that acknowledges an epoch carries how long the
// owner's bucket, at that epoch's share, needs to be out of debt (0 tokens
// or more; the envelope needs no more: its tokens are then within the
// share's burst, and the burst is proportional to the share); every later
// report acknowledging the same epoch carries what is left of that same
// debt, not the bucket's debt at its own time: a region that stays
// throttled at its new share is in debt again and again, and a debt measured
// afresh at every report would push the leader's release of the larger
// hold back at every report, so the capacity a shrunk region gave up would
// never reach the region that needs it. What the region owed when it
// started enforcing the smaller share is repaid by then; what it spends
// after is at the smaller share.
//
// Fallback. Until the first grant arrives and after a lease expires, the
// Holder's fallback applies: min(safe share, last share), which is 0 before
// any grant. Per rule, FallbackOpen admits instead and FallbackClosed
// rejects (the rule's on_failure: local, open, closed).
//
// The owner's bucket. The owner decides at the share: rate share per
// window, burst the grant's. When the parameters change (a new share or
// burst, or the rule's window), the bucket keeps its tokens, clamped to the
// new burst: on a shrink the region loses tokens
// above the new burst, on a grow it gains capacity, not tokens; tokens
// owed stay owed. A key with no share (fallback 0, open, closed) charges
// the spend other nodes report at the safe share, so that slack spent
// before the first grant is owed once it arrives.

// Fallback is what a region enforces for a global rule while it holds no
// unexpired lease.
type Fallback uint8

// The Fallback values.
const (
	// FallbackShare enforces the Holder's fallback, min(safe share, last
	// share): on_failure local.
	FallbackShare Fallback = iota
	// FallbackOpen admits everything: on_failure open.
	FallbackOpen
	// FallbackClosed rejects everything: on_failure closed.
	FallbackClosed
)

// RegionalRule is a global rule as a region enforces it.
type RegionalRule struct {
	Rule
	Fallback Fallback
}

// RegionalConfig configures a Regional. Every field is required unless
// said otherwise.
type RegionalConfig struct {
	// Reporter names this node in its reports; Region is its region.
	Reporter, Region string
	// Regions is the number of regions of the lease machine (its
	// Config.Regions); Skew is its MaxSkew (0: DefaultMaxSkew).
	Regions int
	Skew    time.Duration
	// Interval is the report interval: demand is measured over at least
	// this long, so a key reported right after it appeared is not taken
	// for a burst of its first requests over a tiny period.
	Interval time.Duration
	// FirstSeq is the sequence number of the first report less one: a
	// node restarted under the same name must start above every Seq it
	// used before (the shell uses its start time, ns).
	FirstSeq uint64
	// Gap is the least time between two reports of this node, and the
	// slot over which a key's demand is watched for a change (0: Interval
	// ÷ 10). ReportDue, the report off cycle, waits for it, so a node
	// sends at most Interval ÷ Gap reports off cycle per interval besides
	// its periodic one. Call ReportDue about every Gap.
	Gap time.Duration
}

// Mode is how the owner decides one identity of a global rule at a given
// time (the coordinator's ShareMode, in the lease package's terms).
type Mode uint8

// The Mode values.
const (
	// ModeEnforce decides with the share's bucket.
	ModeEnforce Mode = iota
	// ModeReject rejects.
	ModeReject
	// ModeAdmit admits.
	ModeAdmit
)

// params are the parameters an owner's bucket is in: the share and burst
// it was built from (share 0: the safe-share bucket of a key with no
// share), the rule's window it was built under, and the GCRA.
type params struct {
	share, burst int64
	window       time.Duration
	g            bucket.GCRA
}

type regKey struct {
	holder  Holder
	p       params     // of the owner's TAT
	tat     bucket.TAT // the owner's, after the last decision
	asked   int64      // tokens asked since from
	refused int64      // of which rejected
	from    int64      // start of the demand measured: the last report of the key, or a change of demand
	acked   uint64     // the epoch the last report acknowledged
	repaid  int64      // when the debt owed at that acknowledgement (or cap) is repaid
	seen    int64      // last decision or sync
	born    int64      // when the key was added

	// Off cycle (ReportDue).
	reported    bool   // reported at least once
	due         bool   // to report off cycle: new, a smaller grant to acknowledge, a changed rule or demand
	slotAt      int64  // start of the slot demand is watched over
	slotAsked   int64  // tokens asked in the slot
	slotRefused int64  // of which rejected
	lastReq     int64  // the last Observe
	gapLast     int64  // the time between the last two Observes
	gapCur      int64  // the longest before it since the last periodic report
	gapPrev     int64  // the same over the interval before
	demand      int64  // the last demand reported
	pending     int64  // the last grant's Pending
	changed     bool   // watch saw the demand change: measured from the slot that showed it
	ackNext     int64  // a shrink in a reply to a report sent before then waits for the periodic report
	refusedAt   int64  // the last rejection
	capSeq      uint64 // the first report that carried the cap in force (Holder.Capped)

	// The measurement the last report closed (tokens asked, of which
	// rejected, over period ns): a report whose own period is shorter
	// than an interval is measured over an interval, the rest of it from
	// this one (see item).
	prevAsked, prevRefused, prevPeriod int64
}

type regRule struct {
	RegionalRule
	zero params // the safe-share bucket
}

// Regional is a node's side of the global leases of its region. It is not
// safe for concurrent use.
type Regional struct {
	cfg    RegionalConfig
	skew   int64
	rules  map[string]*regRule
	keys   map[key]*regKey
	seq    uint64
	gap    int64
	last   int64 // when the last report was built (0: never)
	urgent bool  // a key was added: report soon
}

// NewRegional returns a Regional with no rules.
func NewRegional(cfg RegionalConfig) (*Regional, error) {
	switch {
	case cfg.Reporter == "":
		return nil, errors.New("lease: RegionalConfig.Reporter: required")
	case cfg.Region == "":
		return nil, errors.New("lease: RegionalConfig.Region: required")
	case cfg.Regions < 1:
		return nil, fmt.Errorf("lease: RegionalConfig.Regions: at least 1, got %d", cfg.Regions)
	case cfg.Interval <= 0:
		return nil, fmt.Errorf("lease: RegionalConfig.Interval: must be positive, got %v", cfg.Interval)
	case cfg.Skew < 0:
		return nil, fmt.Errorf("lease: RegionalConfig.Skew: negative (%v)", cfg.Skew)
	case cfg.Gap < 0 || cfg.Gap > cfg.Interval:
		return nil, fmt.Errorf("lease: RegionalConfig.Gap: want 0 to Interval %v, got %v", cfg.Interval, cfg.Gap)
	}
	if cfg.Gap == 0 {
		cfg.Gap = max(cfg.Interval/10, time.Millisecond)
	}
	if cfg.Skew == 0 {
		cfg.Skew = DefaultMaxSkew
	}
	return &Regional{cfg: cfg, skew: int64(cfg.Skew), gap: int64(cfg.Gap), rules: map[string]*regRule{}, keys: map[key]*regKey{}, seq: cfg.FirstSeq}, nil
}

// SetRules installs the global rules. Keys of a rule that is gone are
// dropped; keys of a rule whose limit, burst, window or largest cost
// changed keep their leases (the leader counts them until the region
// acknowledges new shares, which the next report, sent soon, brings) with
// safe shares from the new rule. A share is tokens per the rule's window,
// and the leader counts the shares it granted against the new rule's limit
// per its new window, so after a window change a key enforces the same
// share per the new window; its owner's bucket is converted at its next
// decision, keeping its tokens (Share). A rule whose GCRA cannot be built
// is refused.
func (r *Regional) SetRules(rules []RegionalRule) error {
	next := make(map[string]*regRule, len(rules))
	for _, rr := range rules {
		if _, dup := next[rr.ID]; dup {
			return fmt.Errorf("lease: global rule %q appears twice", rr.ID)
		}
		safe := rr.Limit / int64(r.cfg.Regions)
		zl := max(safe, 1)
		g, err := bucket.NewGCRA(zl, rr.Window, burst(rr.Rule, zl))
		if err != nil {
			return fmt.Errorf("lease: global rule %q: %w", rr.ID, err)
		}
		next[rr.ID] = &regRule{RegionalRule: rr, zero: params{window: rr.Window, g: g}}
	}
	for kk, k := range r.keys {
		old, nw := r.rules[kk.rule], next[kk.rule]
		switch {
		case nw == nil || old == nil:
			delete(r.keys, kk)
		case old.Rule != nw.Rule:
			k.holder.SetRule(nw.Rule, r.cfg.Regions)
			k.due = true
			r.urgent = true
		}
	}
	r.rules = next
	return nil
}

// Leases reports whether rule is a global rule installed here.
func (r *Regional) Leases(rule string) bool { return r.rules[rule] != nil }

// Share returns how the owner decides identity under rule at now, and the
// bucket it charges with, rewriting *tat when the bucket's parameters
// changed since the last call (see the file comment). It starts tracking
// the key when it is new (then Urgent reports true). ok is false for a
// rule not installed.
func (r *Regional) Share(now int64, rule, identity string, tat *bucket.TAT) (g bucket.GCRA, mode Mode, ok bool) {
	rr := r.rules[rule]
	if rr == nil {
		return bucket.GCRA{}, ModeAdmit, false
	}
	k := r.key(rr, rule, identity, now)
	p, mode := r.target(rr, k, now)
	if p != k.p {
		*tat = rescale(*tat, now, k.p.g, p.g)
		k.p = p
	}
	return p.g, mode, true
}

// Expired reports whether the key of rule and identity enforces its
// fallback because a lease it held expired (not merely because no grant
// arrived yet).
func (r *Regional) Expired(now int64, rule, identity string) bool {
	k := r.keys[key{rule, identity}]
	if k == nil || !k.holder.Granted() {
		return false
	}
	_, _, fb := k.holder.At(now)
	return fb
}

// Lease returns the share and burst the key of rule and identity enforces
// at now (its Holder's At: tokens per window) and whether that is the
// fallback; ok is false for a key not tracked (never decided here, or
// dropped by Report), which holds nothing.
func (r *Regional) Lease(now int64, rule, identity string) (share, burst int64, fallback, ok bool) {
	k := r.keys[key{rule, identity}]
	if k == nil {
		return 0, 0, false, false
	}
	share, burst, fallback = k.holder.At(now)
	return share, burst, fallback, true
}

// Observe records what the owner was asked for a key (cost tokens, allowed
// or not) and its bucket's TAT after it.
func (r *Regional) Observe(now int64, rule, identity string, cost int64, allowed bool, tat bucket.TAT) {
	rr := r.rules[rule]
	if rr == nil {
		return
	}
	k := r.key(rr, rule, identity, now)
	k.asked += cost
	k.slotAsked += cost
	if !allowed {
		k.refused += cost
		k.slotRefused += cost
		k.refusedAt = now
	}
	// How bursty the key's demand is: gaps longer than two intervals are
	// idleness, not the spacing of bursts. The latest gap counts once
	// another Observe follows it: the one that ends a key's demand (to a
	// sync's charge just after the last request) is not its spacing.
	k.gapCur = max(k.gapCur, k.gapLast)
	k.gapLast = 0
	if gap := now - k.lastReq; k.lastReq != 0 && gap <= 2*int64(r.cfg.Interval) {
		k.gapLast = gap
	}
	k.tat, k.seen, k.lastReq = tat, now, now
}

func (r *Regional) key(rr *regRule, rule, identity string, now int64) *regKey {
	kk := key{rule, identity}
	k := r.keys[kk]
	if k == nil {
		k = &regKey{holder: NewHolder(rr.Rule, r.cfg.Regions, r.skew), p: rr.zero, seen: now, born: now, from: now,
			slotAt: now, due: true}
		r.keys[kk] = k
		r.urgent = true
	}
	return k
}

// target is the bucket the owner should decide k with at now, and how.
func (r *Regional) target(rr *regRule, k *regKey, now int64) (params, Mode) {
	share, b, fallback := k.holder.At(now)
	if fallback {
		switch rr.Fallback {
		case FallbackOpen:
			return rr.zero, ModeAdmit
		case FallbackClosed:
			return rr.zero, ModeReject
		}
	}
	if share <= 0 {
		return rr.zero, ModeReject
	}
	if k.p.share == share && k.p.burst == b && k.p.window == rr.Window {
		return k.p, ModeEnforce
	}
	g, err := bucket.NewGCRA(share, rr.Window, max(b, 1))
	if err != nil {
		// A share the leader granted always builds (share ≤ L, which
		// built): refuse rather than enforce something else.
		return rr.zero, ModeReject
	}
	return params{share: share, burst: b, window: rr.Window, g: g}, ModeEnforce
}

// rescale rewrites a TAT kept at from's parameters into to's: the tokens
// available (negative when owed) are kept, clamped to to's burst. Rounding
// goes toward fewer tokens.
func rescale(tat bucket.TAT, now int64, from, to bucket.GCRA) bucket.TAT {
	ft, tt := from.Interval().Nanoseconds(), to.Interval().Nanoseconds()
	if ft == tt && from.Burst() == to.Burst() {
		return tat
	}
	debt := max(int64(tat)-now, 0)
	avail := float64(from.Burst()) - float64(debt)/float64(ft) // tokens, < 0 when owed
	avail = min(avail, float64(to.Burst()))
	nd := math.Ceil((float64(to.Burst()) - avail) * float64(tt))
	if nd <= 0 {
		return bucket.TAT(now)
	}
	if nd > math.MaxInt64/4 {
		nd = math.MaxInt64 / 4
	}
	return bucket.TAT(now + int64(nd))
}

// Urgent reports whether a key was added (or a rule changed) since the
// last report: the shell then calls ReportDue soon rather than at its next
// tick, since a new key holds no lease and enforces its fallback until its
// first grant arrives.
func (r *Regional) Urgent() bool { return r.urgent }

// Gap returns RegionalConfig.Gap: the least time between two reports, and
// how often the shell should call ReportDue.
func (r *Regional) Gap() time.Duration { return time.Duration(r.gap) }

// Keys returns the number of keys tracked.
func (r *Regional) Keys() int { return len(r.keys) }

// sortedKeys returns the keys in (rule, identity) order.
func (r *Regional) sortedKeys() []key {
	keys := make([]key, 0, len(r.keys))
	for kk := range r.keys {
		keys = append(keys, kk)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	return keys
}

// Report builds the periodic report: every tracked key that owns says
// this node owns, at now, with the next sequence number; ok is false when
// there is nothing to report. Keys this node no longer owns are dropped
// (their new owner reports them; the lease is the region's). A key whose
// demand was 0 since the last report and whose share of 0 was acknowledged
// is dropped too: the region has given it up.
func (r *Regional) Report(now int64, owns func(identity string) bool) (Report, bool) {
	return r.build(now, owns, false)
}

// ReportDue builds the report off cycle, of the keys whose demand or lease
// changed materially, at now; ok is false when none did, or when the last
// report (periodic or not) was built less than Gap ago. The shell calls it
// about every Gap, and soon after Urgent. A key is due when:
//
//   - it is new (no report carried it yet), or its rule changed;
//   - it accepted a grant smaller than the share it enforced: the report
//     acknowledges it at once, so the leader can hand the difference on;
//   - it is throttled (a rejection in the last two gaps) and the leader's
//     last grant said at least 5 % of L more is pending (Grant.Pending):
//     the report collects capacity as soon as another region frees it;
//   - it is throttled and asked over its last slot for more than twice
//     what its last report said, and at least 8 of the rule's largest
//     costs: the leader learns of the new demand;
//   - it had no request for a slot, or used at most a quarter of its share
//     over its last slot (slots long enough that the share would have
//     admitted at least 8 of the rule's largest costs): the region gives
//     capacity back, capping itself at twice what it used (Holder.Cap;
//     ReportItem.Capped) before the report leaves, so the leader can hand
//     the rest on when the report arrives, without a grant and an
//     acknowledgement travelling first.
//
// A slot lasts at least Gap and twice the longest time between two of the
// key's requests over the last two intervals (two intervals for a key
// younger than that): the pauses of bursty demand are not taken for a
// fall. A key that changed is measured from the slot
// that showed the change, so the demand it reports is the new one, not an
// average with the old; other keys report at least their last demand.
func (r *Regional) ReportDue(now int64, owns func(identity string) bool) (Report, bool) {
	if r.last != 0 && now-r.last < r.gap {
		return Report{}, false
	}
	return r.build(now, owns, true)
}

// build builds a report at now: of every key (periodic), or of the keys due
// (off cycle).
func (r *Regional) build(now int64, owns func(identity string) bool, offCycle bool) (Report, bool) {
	rep := Report{Reporter: r.cfg.Reporter, Region: r.cfg.Region}
	seq := r.seq + 1
	for _, kk := range r.sortedKeys() {
		k := r.keys[kk]
		if owns != nil && !owns(kk.identity) {
			delete(r.keys, kk)
			continue
		}
		rr := r.rules[kk.rule]
		due := r.watch(rr, k, now, seq)
		if !offCycle {
			k.gapPrev, k.gapCur = k.gapCur, 0
		}
		if offCycle && !due {
			continue
		}
		share, _, _ := k.holder.At(now)
		_, capped := k.holder.Capped()
		if !offCycle && k.holder.Granted() && k.asked == 0 && share == 0 && k.acked == k.holder.Epoch() && !capped {
			delete(r.keys, kk)
			continue
		}
		rep.Items = append(rep.Items, r.item(rr, kk, k, now, seq, offCycle))
	}
	if offCycle && len(rep.Items) == 0 {
		return Report{}, false
	}
	r.last, r.urgent = now, false
	if len(rep.Items) == 0 {
		return Report{}, false
	}
	r.seq = seq
	rep.Seq = seq
	return rep, true
}

// watch closes k's demand slot when it is long enough and says whether k
// is due off cycle (see ReportDue); seq is the report being built, the one
// that carries a cap set here first.
func (r *Regional) watch(rr *regRule, k *regKey, now int64, seq uint64) bool {
	due := k.due || !k.reported
	if now-k.refusedAt < 2*r.gap && k.pending > 0 && 20*k.pending >= rr.Limit {
		// Throttled, and the leader has more for it (at least 5 % of
		// L, not a token of rounding) once another region frees it:
		// ask at every gap.
		due = true
	}
	// A slot spans at least a gap and twice the longest spacing of the
	// key's requests lately, so the pauses of bursty demand are not
	// taken for a fall of demand, nor its bursts for a rise.
	need := max(r.gap, 2*max(k.gapCur, k.gapPrev))
	// To give back, a key too young to know its spacing needs a pause
	// of two intervals: a shorter one may be a bursty key's.
	needBack := need
	if now-k.born < 2*int64(r.cfg.Interval) {
		needBack = max(need, 2*int64(r.cfg.Interval))
	}
	share, _, fallback := k.holder.At(now)
	w := int64(rr.Window)
	// Enough tokens at the share over d to judge its use.
	enough := func(d int64) bool { return float64(share)*float64(d)/float64(w) >= float64(8*rr.MaxCost) }
	if idle := now - k.lastReq; k.reported && !fallback && share > 0 && idle >= needBack && enough(idle) {
		// No request for that long: the demand stopped here (moved
		// away), whatever the slot's start still holds.
		k.slotAt, k.slotAsked, k.slotRefused = k.lastReq, 0, 0
		return r.giveBack(rr, k, now, seq, 0) || due
	}
	period := now - k.slotAt
	if period < need {
		return due
	}
	// Tokens the slot's demand comes to per window.
	used := ceilScale(k.slotAsked, w, period)
	closed := true
	switch {
	case k.slotRefused > 0:
		if k.reported && used > 2*k.demand && k.slotAsked >= 8*rr.MaxCost {
			due = true
			k.restart()
		}
	case fallback || share <= 0:
	case !enough(period) && period < max(need, int64(r.cfg.Interval)):
		// Too few tokens at the share to judge yet: watch longer.
		closed = false
	case 4*used <= share && k.reported && period >= needBack:
		due = r.giveBack(rr, k, now, seq, 2*used) || due
	}
	if closed {
		k.slotAt, k.slotAsked, k.slotRefused = now, 0, 0
	}
	return due
}

// giveBack caps k at c (tokens per window) for the report seq being built,
// when that is below the share it enforces, and reports whether it did.
func (r *Regional) giveBack(rr *regRule, k *regKey, now int64, seq uint64, c int64) bool {
	share, _, _ := k.holder.At(now)
	if c >= share {
		return false
	}
	k.holder.Cap(c, burst(rr.Rule, c))
	k.capSeq = seq
	// What the bucket owes at the cap is repaid before the leader hands
	// the rest on.
	p, _ := r.target(rr, k, now)
	k.repaid = max(k.repaid, outOfDebt(rescale(k.tat, now, k.p.g, p.g), p.g))
	k.restart()
	return true
}

// restart measures k's demand from its current slot on: its demand
// changed, and an average with the old one would hide it.
func (k *regKey) restart() {
	k.asked, k.refused, k.from = k.slotAsked, k.slotRefused, k.slotAt
	k.changed = true
}

// item is k's report item at now; it starts k's next measurement.
func (r *Regional) item(rr *regRule, kk key, k *regKey, now int64, seq uint64, offCycle bool) ReportItem {
	share, _, _ := k.holder.At(now)
	// A key's first report measures over at least a whole interval, so
	// its first few requests are not taken for a burst; later ones over
	// at least a slot.
	least := r.gap
	if !k.reported {
		least = int64(r.cfg.Interval)
	}
	asked, refused, period := k.asked, k.refused, max(now-k.from, least)
	if iv := int64(r.cfg.Interval); !k.changed && k.prevPeriod > 0 && now-k.from < iv {
		// Counts over less than an interval are mostly noise at the
		// rates global identities see (6 requests a second over 100 ms
		// are 0.6 on average): the last measurement makes up the rest of
		// an interval, in proportion. A change of demand (changed)
		// measures the new demand alone.
		take := min(iv-(now-k.from), k.prevPeriod)
		asked += mulDiv(k.prevAsked, take, k.prevPeriod)
		refused += mulDiv(k.prevRefused, take, k.prevPeriod)
		period = now - k.from + take
	}
	d := demand(rr.Rule, asked, refused, share, period)
	// Off cycle, a key whose demand did not change (an acknowledgement, or
	// a throttled key asking for pending capacity) measures over a period
	// that may be too short for its demand (the pause between two bursts):
	// it reports at least its last demand, and keeps measuring toward the
	// next report. A change (changed, from watch) reports the new demand.
	keep := offCycle && k.reported && !k.changed
	if keep {
		d = max(d, k.demand)
	}
	if ep := k.holder.Epoch(); ep != k.acked {
		// The first acknowledgement of an epoch carries what the
		// bucket owes then, at the new share; later ones the rest of
		// that same debt (see Debt below).
		p, _ := r.target(rr, k, now)
		k.repaid = outOfDebt(rescale(k.tat, now, k.p.g, p.g), p.g)
		k.acked = ep
	}
	it := ReportItem{Rule: kk.rule, Identity: kk.identity, Demand: d, AckEpoch: k.acked, Debt: max(k.repaid-now, 0)}
	if c, ok := k.holder.Capped(); ok && k.capSeq == seq {
		// Only the report that sets a cap carries it (see
		// ReportItem.Capped).
		it.Capped, it.Cap = true, c
	}
	if !keep {
		k.prevAsked, k.prevRefused, k.prevPeriod = asked, refused, period
		k.asked, k.refused, k.from = 0, 0, now
	}
	k.reported, k.due, k.changed, k.demand = true, false, false, d
	return it
}

// outOfDebt is when a bucket at g with TAT tat holds no debt any more (0
// tokens or more): its burst's worth before it is full again.
func outOfDebt(tat bucket.TAT, g bucket.GCRA) int64 {
	return int64(tat) - g.Burst()*int64(g.Interval())
}

// ceilScale is x tokens over period ns as tokens per window w, rounded up.
func ceilScale(x, w, period int64) int64 {
	if x == 0 {
		return 0
	}
	v := float64(x) * float64(w) / float64(period)
	if v >= float64(math.MaxInt64/2) {
		return math.MaxInt64 / 2
	}
	return int64(math.Ceil(v))
}

// demand is a key's demand, tokens per window: what it was asked over the
// period (> 0, ns), asked tokens of which refused were rejected, scaled to
// the window and rounded up. The owner sees every request of its region
// (the others' rejections come in their syncs), so that is the demand;
// only when at least a quarter of it was rejected is it raised to at
// least half as much again as the share: clients that back off when
// throttled (Retry-After) hide part of theirs, and the share grows by at
// least half per report until the region is no longer throttled that
// much, or the allocation stops it (see the file comment).
func demand(rule Rule, asked, refused, share, period int64) int64 {
	d := ceilScale(asked, int64(rule.Window), period)
	if refused > 0 && 4*refused >= asked {
		d = max(d, (3*share+1)/2)
	}
	return d
}

// mulDiv is x·a ÷ b rounded down, for 0 ≤ a ≤ b, b > 0, without
// overflow.
func mulDiv(x, a, b int64) int64 {
	return int64(float64(x) * float64(a) / float64(b))
}

// Accept takes the grants that answer the report numbered seq, sent at
// sentAt (this node's clock, before the first attempt), and returns how
// many a Holder took. Grants for keys no longer tracked are ignored, and so
// are older epochs (the Holder's fencing). A grant that answers the report
// that carried a key's cap, or a later one, lifts the cap: the leader made
// it knowing of the cap. A grant smaller than the share the key enforced
// by at least an eighth makes the key due off cycle (ReportDue acknowledges
// it at once), at most once an interval.
func (r *Regional) Accept(seq uint64, sentAt int64, res Result) (accepted int) {
	for _, g := range res.Grants {
		k := r.keys[key{g.Rule, g.Identity}]
		rr := r.rules[g.Rule]
		if k == nil || rr == nil {
			continue
		}
		was, _, _ := k.holder.At(sentAt)
		wasEpoch := k.holder.Epoch()
		if g.Epoch >= wasEpoch {
			// Also a grant of no lease yet (epoch 0): the capacity the
			// key waits for may be pending.
			k.pending = g.Pending
		}
		if !k.holder.Accept(sentAt, g) {
			continue
		}
		accepted++
		if _, capped := k.holder.Capped(); capped && seq >= k.capSeq {
			k.holder.Uncap()
		}
		if wasEpoch != 0 && g.Epoch != wasEpoch && 8*(was-g.Share) >= max(was, 8*rr.MaxCost) && sentAt >= k.ackNext {
			// A material shrink (an eighth of the share, at least the
			// largest cost), acknowledged off cycle at most once an
			// interval: the shrinks the noise of other regions' demand
			// makes wait for the periodic report.
			k.due, k.ackNext = true, sentAt+int64(r.cfg.Interval)
		}
	}
	return accepted
}

// RuleStatus is one global rule's state on this node.
type RuleStatus struct {
	Rule string `json:"rule"`
	// Leased counts the keys enforcing an unexpired lease; Fallback those
	// enforcing the fallback (no lease yet, or expired).
	Leased   int `json:"leased"`
	Fallback int `json:"fallback"`
	// Share is the sum of the shares held by the leased keys, tokens per
	// window.
	Share int64 `json:"share"`
}

// Status returns every installed rule's state at now, ordered by rule,
// counting the identities owns accepts (every one when owns is nil).
func (r *Regional) Status(now int64, owns func(identity string) bool) []RuleStatus {
	ids := make([]string, 0, len(r.rules))
	for id := range r.rules {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	idx := make(map[string]int, len(ids))
	out := make([]RuleStatus, len(ids))
	for i, id := range ids {
		idx[id] = i
		out[i].Rule = id
	}
	for kk, k := range r.keys {
		if owns != nil && !owns(kk.identity) {
			continue
		}
		s := &out[idx[kk.rule]]
		share, _, fb := k.holder.At(now)
		if fb {
			s.Fallback++
		} else {
			s.Leased++
			s.Share += share
		}
	}
	return out
}
