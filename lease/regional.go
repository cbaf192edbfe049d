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
// for requests other nodes forwarded, and the spend other nodes admitted
// within their slack and reported in syncs, all scaled from the time since
// the last report to the rule's window. A non-owner rejects locally, unseen
// by the owner, only when its view of the owner's bucket says the owner
// would reject too; the owner then rejects its own and forwarded requests
// as well, so a throttled region always shows rejections on its owner.
// While it does (any rejection since the last report), the region reports
// max(observed, share + rejected, ⌈3·share ÷ 2⌉): its share grows by at least
// half per report until it is no longer throttled, or the allocation (max-min
// fair against the other regions' demands) stops it. A region that is not
// throttled reports what it observed, so an unused share shrinks.
//
// Debt. The first report that acknowledges an epoch carries how long the
// owner's bucket, at that epoch's share, needs to be full again; every
// later report acknowledging the same epoch carries what is left of that
// same debt, not the bucket's debt at its own time: a region that stays
// throttled at its new share never has a full bucket, and a debt measured
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
	asked   int64      // tokens asked since the last report
	refused int64      // of which rejected
	acked   uint64     // the epoch the last report acknowledged
	repaid  int64      // when the debt owed at that acknowledgement is repaid
	seen    int64      // last decision or sync
	born    int64      // when the key was added
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
	}
	if cfg.Skew == 0 {
		cfg.Skew = DefaultMaxSkew
	}
	return &Regional{cfg: cfg, skew: int64(cfg.Skew), rules: map[string]*regRule{}, keys: map[key]*regKey{}, seq: cfg.FirstSeq}, nil
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
	if !allowed {
		k.refused += cost
	}
	k.tat, k.seen = tat, now
}

func (r *Regional) key(rr *regRule, rule, identity string, now int64) *regKey {
	kk := key{rule, identity}
	k := r.keys[kk]
	if k == nil {
		k = &regKey{holder: NewHolder(rr.Rule, r.cfg.Regions, r.skew), p: rr.zero, seen: now, born: now}
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

// Urgent reports whether a key was added since the last report: the shell
// then reports soon rather than at its interval, since a new key holds no
// lease and enforces its fallback until its first grant arrives.
func (r *Regional) Urgent() bool { return r.urgent }

// Keys returns the number of keys tracked.
func (r *Regional) Keys() int { return len(r.keys) }

// Report builds the report of every tracked key that owns says this node
// owns, at now, with the next sequence number; ok is false when there is
// nothing to report. Keys this node no longer owns are dropped (their new
// owner reports them; the lease is the region's). A key whose demand was 0
// since the last report and whose share of 0 was acknowledged is dropped
// too: the region has given it up.
func (r *Regional) Report(now int64, owns func(identity string) bool) (Report, bool) {
	since := r.last
	r.last, r.urgent = now, false
	keys := make([]key, 0, len(r.keys))
	for kk := range r.keys {
		keys = append(keys, kk)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	rep := Report{Reporter: r.cfg.Reporter, Region: r.cfg.Region}
	for _, kk := range keys {
		k := r.keys[kk]
		if owns != nil && !owns(kk.identity) {
			delete(r.keys, kk)
			continue
		}
		rr := r.rules[kk.rule]
		share, _, _ := k.holder.At(now)
		if k.holder.Granted() && k.asked == 0 && share == 0 && k.acked == k.holder.Epoch() {
			delete(r.keys, kk)
			continue
		}
		d := demand(rr.Rule, k, share, max(now-max(since, k.born), int64(r.cfg.Interval)))
		if ep := k.holder.Epoch(); ep != k.acked {
			// The first acknowledgement of an epoch carries what the
			// bucket owes then, at the new share; later ones the rest of
			// that same debt (see Debt below).
			p, _ := r.target(rr, k, now)
			k.repaid = int64(rescale(k.tat, now, k.p.g, p.g))
			k.acked = ep
		}
		rep.Items = append(rep.Items, ReportItem{Rule: kk.rule, Identity: kk.identity, Demand: d,
			AckEpoch: k.acked, Debt: max(k.repaid-now, 0)})
		k.asked, k.refused = 0, 0
	}
	if len(rep.Items) == 0 {
		return Report{}, false
	}
	r.seq++
	rep.Seq = r.seq
	return rep, true
}

// demand is a key's demand, tokens per window: what it was asked over the
// period (> 0, ns), scaled to the window and rounded up, raised while it
// was throttled (see the file comment).
func demand(rule Rule, k *regKey, share, period int64) int64 {
	w := int64(rule.Window)
	scale := func(x int64) int64 {
		if x == 0 {
			return 0
		}
		v := float64(x) * float64(w) / float64(period)
		if v >= float64(math.MaxInt64/2) {
			return math.MaxInt64 / 2
		}
		return int64(math.Ceil(v))
	}
	d := scale(k.asked)
	if k.refused > 0 {
		d = max(d, share+scale(k.refused), (3*share+1)/2)
	}
	return d
}

// Accept takes the grants that answer rep, sent at sentAt (this node's
// clock, before the first attempt), and returns how many a Holder took.
// Grants for keys no longer tracked are ignored, and so are older epochs
// (the Holder's fencing).
func (r *Regional) Accept(sentAt int64, res Result) (accepted int) {
	for _, g := range res.Grants {
		if k := r.keys[key{g.Rule, g.Identity}]; k != nil && k.holder.Accept(sentAt, g) {
			accepted++
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
