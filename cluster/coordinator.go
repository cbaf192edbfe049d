package cluster

import (
	"cmp"
	"fmt"
	"math"
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
// The mechanism is DESIGN.md's "shared" mode, rule by rule:
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
// takes fixed_window and leaky_bucket rules: their owner entry holds the
// window or the queue instead of a TAT (see ownerEntry) and is decided by
// bucket's step of that algorithm, handed over on ring changes like a TAT.

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

// ShareMode says how an owner decides an identity of a leased rule.
type ShareMode uint8

// The ShareMode values.
const (
	// ShareEnforce decides with the share's bucket.
	ShareEnforce ShareMode = iota
	// ShareReject rejects every request the owner decides.
	ShareReject
	// ShareAdmit admits every request the owner decides.
	ShareAdmit
)

// RuleParams is what the coordinator needs of a rule. Build it with
// NewRuleParams.
type RuleParams struct {
	ID        string
	Version   uint64
	Mode      quota.Mode
	OnFailure quota.OnFailure
	Limit     int64
	Window    time.Duration
	Burst     int64
	Accuracy  float64
	// Sketch is the rule's sketch gating; the zero value is none.
	Sketch SketchParams
	// Scheme is how the rule's slack is spread over the nodes (shared
	// rules only); NewRuleParams sets DefaultSlackScheme.
	Scheme SlackScheme
	// Algorithm is the rule's algorithm: quota.AlgorithmGCRA, or
	// quota.AlgorithmFixedWindow or quota.AlgorithmLeakyBucket (exact mode
	// only).
	Algorithm quota.Algorithm
	gcra      bucket.GCRA
	// fixed is true for a fixed_window rule: the owner decides with fw on
	// the window its entry holds (ownerEntry.count), not with gcra, which
	// then serves only the node side's arithmetic and on_failure.
	fixed bool
	fw    bucket.FixedWindow
	// leaky is true for a leaky_bucket rule: the owner decides with lk on
	// the queue's departure time, which its entry holds in tat. Its
	// spacing T equals gcra's (both ⌈window ÷ limit⌉), so gcra's Charge
	// and the handoff's debt arithmetic apply to the departure unchanged.
	leaky bool
	lk    bucket.Leaky
	// maxDelay is the leaky queue's longest wait (ns; the rule's MaxDelay,
	// else its default, quota.Rule.QueueDelay), which a handoff names with
	// the other parameters (HandoffItem).
	maxDelay int64
	sk       *countMin // this coordinator's sketch of a gated rule
	leased   bool      // decided on the owner through CoordinatorConfig.Shares
	// plain: a gcra rule that is not leased, decided on the owner by
	// gcra.Step alone (SetRules sets it): ownerStep's one test.
	plain bool
	// slackN and slackS cache Slack(slackN) for Coordinator.slack (0: none).
	slackN int
	slackS int64
	// nodesT and ownedT are this rule's tables in the coordinator's
	// entries and owned (nil: not looked up yet), so that a lookup of a
	// rule at hand goes straight to them (Coordinator.nodesOf, ownedOf).
	nodesT *strTable[*nodeEntry]
	ownedT *strTable[*ownerEntry]
}

// NewRuleParams builds the coordinator's view of a gcra rule in shared or
// exact mode, or of a fixed_window or leaky_bucket rule in exact mode (the
// burst of a fixed_window rule is its limit, the window's capacity; that of
// a leaky_bucket rule its queue's positions, MaxDelay ÷ T + 1). version is
// the rule set's version.
func NewRuleParams(r *quota.Rule, version uint64) (RuleParams, error) {
	if r.Mode != quota.ModeShared && r.Mode != quota.ModeExact {
		return RuleParams{}, fmt.Errorf("cluster: rule %q: mode %q is not decided by the coordinator", r.ID, r.Mode)
	}
	algo, burst := quota.AlgorithmGCRA, r.Burst
	var fw bucket.FixedWindow
	var lk bucket.Leaky
	var maxDelay time.Duration
	switch r.Algorithm {
	case "", quota.AlgorithmGCRA, quota.AlgorithmTokenBucket:
	case quota.AlgorithmFixedWindow, quota.AlgorithmLeakyBucket:
		if r.Mode != quota.ModeExact {
			return RuleParams{}, fmt.Errorf("cluster: rule %q: algorithm %s is decided by the coordinator in mode exact only, not %q", r.ID, r.Algorithm, r.Mode)
		}
		var err error
		if r.Algorithm == quota.AlgorithmFixedWindow {
			fw, err = bucket.NewFixedWindow(r.Limit, r.Window)
			burst = r.Limit
		} else {
			maxDelay = r.QueueDelay(r.Limit, r.Burst)
			lk, err = bucket.NewLeaky(r.Limit, r.Window, maxDelay)
			burst = lk.Limit()
		}
		if err != nil {
			return RuleParams{}, fmt.Errorf("cluster: rule %q: %w", r.ID, err)
		}
		algo = r.Algorithm
	default:
		return RuleParams{}, fmt.Errorf("cluster: rule %q: algorithm %q is not decided by the coordinator", r.ID, r.Algorithm)
	}
	g, err := bucket.NewGCRA(r.Limit, r.Window, burst)
	if err != nil {
		return RuleParams{}, fmt.Errorf("cluster: rule %q: %w", r.ID, err)
	}
	acc := r.Accuracy
	if acc == 0 {
		acc = quota.DefaultAccuracy
	}
	var sk SketchParams
	if r.Sketch != nil {
		if sk, err = newSketchParams(r); err != nil {
			return RuleParams{}, fmt.Errorf("cluster: rule %q: %w", r.ID, err)
		}
	}
	return RuleParams{ID: r.ID, Version: version, Mode: r.Mode, OnFailure: r.OnFailure,
		Limit: r.Limit, Window: r.Window, Burst: burst, Accuracy: acc, Sketch: sk, Scheme: DefaultSlackScheme,
		Algorithm: algo, gcra: g, fixed: algo == quota.AlgorithmFixedWindow, fw: fw, leaky: algo == quota.AlgorithmLeakyBucket, lk: lk,
		maxDelay: int64(maxDelay)}, nil
}

// Slack returns the slack sᵢ every node of a region of n live nodes holds
// without asking: under SlackFixed ⌊a·L ÷ n⌋ tokens (DESIGN.md: S = Σ sᵢ ≤
// a·L); under SlackDemand the base ⌊P ÷ (2·(n−1))⌋ with P = ⌊a·L⌋ (P when n
// is 1), to which the owner's grants add (slack.go). It is 0 for exact
// rules. A slack under one token is 0: every admission beyond it then waits
// for the owner (or, under SlackDemand, for a grant).
func (p *RuleParams) Slack(n int) int64 {
	if p.Mode != quota.ModeShared || n <= 0 {
		return 0
	}
	if p.Scheme == SlackDemand {
		if n == 1 {
			return p.Pool()
		}
		return p.Pool() / int64(2*(n-1))
	}
	return int64(math.Floor(p.Accuracy * float64(p.Limit) / float64(n)))
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

// Source says how a decision was made.
type Source uint8

const (
	// SourceOwner: this node owns the identity and decided on its bucket.
	SourceOwner Source = iota
	// SourceSlack: admitted locally within this node's slack.
	SourceSlack
	// SourceView: rejected locally because the view of the owner's bucket
	// says the owner would reject it.
	SourceView
	// SourceRemote: decided by the owner over the network.
	SourceRemote
	// SourceFailure: the owner was unreachable and the rule's on_failure
	// decided (Outcome.Degraded is true).
	SourceFailure
	// SourceSketch: admitted locally through a gated rule's sketch, with
	// no entry and no report to the owner (sketch.go).
	SourceSketch
)

// NumSources is the number of Source values (0 to NumSources−1): size
// arrays indexed by Source with it, so that a new Source cannot overflow
// them.
const NumSources = int(SourceSketch) + 1

// Outcome is the coordinator's answer to Decide.
type Outcome struct {
	// Decision is the decision, when Pending is false.
	bucket.Decision
	// Pending is true when the request went to its owner: the decision
	// arrives later as a Completion with Ticket.
	Pending bool
	Ticket  uint64
	// Source says how the decision was made; Degraded is true when the
	// owner could not be reached and on_failure decided.
	Source   Source
	Degraded bool
}

// Completion is the late decision of a pending request.
type Completion struct {
	Ticket  uint64
	Outcome Outcome
}

// Message is everything one node sends another in one batch. Durations are
// nanoseconds measured on the sender; no field is a point in the sender's
// clock.
type Message struct {
	// Epoch is the sender's ring epoch.
	Epoch   uint64
	Syncs   []SyncItem
	Decides []DecideItem
	Acks    []AckItem
	Results []ResultItem
	// Handoffs carry owner state to a new owner after a ring change.
	Handoffs []HandoffItem
	// HandedOver, when not 0, is the digest of the sender's ring
	// (OwnerTable.Digest): the sender has handed over every bucket it
	// owned that this ring assigns to another member. It follows the
	// message's handoffs.
	HandedOver uint64
}

// Empty reports whether m carries nothing.
func (m *Message) Empty() bool {
	return len(m.Decides) == 0 && len(m.Results) == 0 && len(m.Syncs) == 0 && len(m.Acks) == 0 &&
		len(m.Handoffs) == 0 && m.HandedOver == 0
}

// Items returns the number of items of all kinds in m.
func (m *Message) Items() int {
	return len(m.Syncs) + len(m.Decides) + len(m.Acks) + len(m.Results) + len(m.Handoffs)
}

// Split returns m cut into messages of at most n items each (m itself when
// it fits), in order: handoffs, then syncs, decides, acks and results, so
// that a receiver stepping them in order sees an identity's handed-over
// state before the reports that follow it.
func (m *Message) Split(n int) []Message {
	if n <= 0 || m.Items() <= n {
		return []Message{*m}
	}
	var out []Message
	cur := Message{Epoch: m.Epoch}
	room := n
	next := func() {
		out = append(out, cur)
		cur, room = Message{Epoch: m.Epoch}, n
	}
	take := func(k int) int {
		if room == 0 {
			next()
		}
		t := min(k, room)
		room -= t
		return t
	}
	for rest := m.Handoffs; len(rest) > 0; {
		t := take(len(rest))
		cur.Handoffs, rest = append(cur.Handoffs, rest[:t]...), rest[t:]
	}
	for rest := m.Syncs; len(rest) > 0; {
		t := take(len(rest))
		cur.Syncs, rest = append(cur.Syncs, rest[:t]...), rest[t:]
	}
	for rest := m.Decides; len(rest) > 0; {
		t := take(len(rest))
		cur.Decides, rest = append(cur.Decides, rest[:t]...), rest[t:]
	}
	for rest := m.Acks; len(rest) > 0; {
		t := take(len(rest))
		cur.Acks, rest = append(cur.Acks, rest[:t]...), rest[t:]
	}
	for rest := m.Results; len(rest) > 0; {
		t := take(len(rest))
		cur.Results, rest = append(cur.Results, rest[:t]...), rest[t:]
	}
	if cur.Items() > 0 {
		out = append(out, cur)
	}
	out[len(out)-1].HandedOver = m.HandedOver
	return out
}

// SyncItem reports a node's cumulative spend on an identity under a rule,
// for one generation of the node's entry.
type SyncItem struct {
	Rule     string
	Identity string
	Gen      uint64
	Total    int64
	// GrantEpoch is the highest demand grant epoch the node adopted for
	// this generation (0: none) and Grant the extra slack it uses under it
	// now (0 once lapsed): demand-following slack only (slack.go).
	GrantEpoch uint64
	Grant      int64
}

// AckItem acknowledges a SyncItem: the highest Total the owner has charged
// for (Rule, Identity, Gen), and the owner's bucket after it as Debt
// (TAT − now in ns; ≤ 0 when full). Under demand-following slack it also
// carries the owner's latest grant to the node for the generation:
// GrantEpoch, and Grant, the extra slack beyond the base (slack.go).
type AckItem struct {
	Rule       string
	Identity   string
	Gen        uint64
	Total      int64
	Debt       int64
	GrantEpoch uint64
	Grant      int64
}

// DecideItem asks the owner to decide a request. (DecideInto writes every
// field of a new item in place: a field added here must be written there.)
type DecideItem struct {
	Ticket   uint64
	Rule     string
	Identity string
	Cost     int64
	// h is Identity's hashID when this process's Decide made the item
	// (0: not known): a receiver in the same process (the simulator, an
	// in-memory transport) then need not hash it again. hashID's seed is
	// one per process, so the value is good for every coordinator here;
	// it never goes on the wire (wire.go builds items without it).
	h uint64
}

// ResultItem is the owner's decision of a DecideItem, with its bucket after
// it as Debt. Delay (ns, leaky_bucket rules only) is how long the asking
// node holds the admitted request: counted from when it receives the
// result, so the owner's spacing holds up to the spread of one-way delays
// between the nodes. (decideFor writes every field of a new item in place:
// a field added here must be written there.)
type ResultItem struct {
	Ticket     uint64
	Allowed    bool
	Remaining  int64
	Reset      int64
	RetryAfter int64
	Debt       int64
	Delay      int64
}

// HandoffItem hands an identity's bucket (as Debt) to its new owner: for a
// leaky_bucket rule Debt is the time until its queue drains (the handed
// queue is appended to the new owner's, as debts add); for a fixed_window
// rule the time until the window ends (ns), and Count the tokens counted
// in it. Count is 0 for the other algorithms.
//
// Algorithm, Limit, Window, Burst and MaxDelay are the parameters of the
// rule the state was written under: a new owner whose rule has changed
// since converts the state to its rule as SetRules converts its own
// buckets (an algorithm changed: the identity starts over). Limit 0 means
// unknown: the state is read under the new owner's rule as it is.
type HandoffItem struct {
	Rule      string
	Identity  string
	Debt      int64
	Count     int64
	Algorithm quota.Algorithm
	Limit     int64
	Window    int64 // ns
	Burst     int64
	MaxDelay  int64 // ns
}

// Envelope is a message and its destination.
type Envelope struct {
	To  string
	Msg Message
}

// Ready is what the adapter must do after a round of calls: send Messages
// and hand out Completions.
type Ready struct {
	Messages    []Envelope
	Completions []Completion
}

type entryKey struct{ rule, identity string }

// ownerEntry is an identity's bucket on its owner, with the last report of
// every node's current generation.
//
// For a fixed_window rule the entry is the window instead: tat holds the
// window's End and count its Count (bucket.FixedState); for a leaky_bucket
// rule tat is the queue's bucket.Departure. Either way tat is when the
// entry equals no entry (a full bucket, an ended window, a drained queue),
// which is all the wake heaps and the key cap read of it (keycap.go).
type ownerEntry struct {
	key      entryKey
	h        uint64    // hashID(key.identity)
	rk       *ruleKeys // its rule's keys (keycap.go)
	heapAt   int64     // the earliest time it is queued at in rk.owners (never: not queued)
	tat      bucket.TAT
	count    int64 // fixed_window rules: the tokens counted in the window ending at tat
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
}

// tableID returns oe's identity, its key in its strTable.
func (oe *ownerEntry) tableID() string { return oe.key.identity }

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
}

// tableID returns e's identity, its key in its strTable.
func (e *nodeEntry) tableID() string { return e.key.identity }

// idle reports whether e equals no entry at now and may be dropped: its
// spend is acknowledged, nothing is pending, and its view of the owner's
// bucket, its fallback bucket and its grant are spent out.
func (e *nodeEntry) idle(now int64) bool {
	return e.spent == e.acked && e.pending == 0 && e.view <= now && int64(e.fallback) <= now && e.grant.idle()
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
	Entries, Owned                                               int
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
	return &Coordinator{
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
				if !r.fixed && e.view != 0 {
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
	c.rules = next
	c.lastRule = nil
	c.sketched = false
	for _, r := range next { // any order: one flag
		c.sketched = c.sketched || r.sk != nil
	}
}

// convertible reports whether the state of rule o carries over to r by
// conversion: same algorithm, other parameters, and not decided through
// leases (whose shares are the lease group's).
func convertible(o, r *RuleParams) bool {
	return o.Algorithm == r.Algorithm && !o.leased && !r.leased
}

// sameState reports whether o and r read a stored state alike.
func sameState(o, r *RuleParams) bool {
	return o.gcra == r.gcra && o.fw == r.fw && o.lk == r.lk
}

// convertTAT carries a TAT (a GCRA bucket's, or a leaky queue's departure)
// of rule o over to r at now.
func (r *RuleParams) convertTAT(o *RuleParams, tat bucket.TAT, now int64) bucket.TAT {
	if r.leaky {
		return bucket.TAT(r.lk.Convert(o.lk, bucket.Departure(tat), now))
	}
	return r.gcra.Convert(o.gcra, tat, now)
}

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
			ids, _ := t.appendAll(nil, nil)
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
		if r.fixed {
			oe.setFixed(r.fw.Convert(o.fw, oe.fixedState(), now))
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
// its share's: across an algorithm change it starts over.
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
		if r == nil || o.leased || r.leased {
			c.dropOwned(oe)
			continue
		}
		spent := o.spentOwned(oe, now)
		switch {
		case r.fixed:
			oe.setFixed(r.fw.Booked(spent, now))
		case r.leaky:
			oe.tat, oe.count = bucket.TAT(r.lk.Booked(spent, now)), 0
		default:
			oe.tat, oe.count = r.gcra.Booked(spent, now), 0
		}
		c.watchOwned(oe)
	}
}

// spentOwned returns the whole tokens oe had spent under rule o at now.
func (o *RuleParams) spentOwned(oe *ownerEntry, now int64) int64 {
	switch {
	case o.fixed:
		return o.fw.Spent(oe.fixedState(), now)
	case o.leaky:
		return o.lk.Spent(bucket.Departure(oe.tat), now)
	}
	return o.gcra.Spent(oe.tat, now)
}

// Stats returns the coordinator's counters.
func (c *Coordinator) Stats() Stats {
	s := c.stats
	s.Entries, s.Owned = c.entries.len(), c.owned.len()
	for _, r := range c.rules {
		if r.sk != nil {
			s.SketchBytes += r.sk.bytes()
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

// nodesOf returns r's table of node entries, as c.entries.of(r.ID, true)
// does: the tables of a keyMap stay once made.
func (c *Coordinator) nodesOf(r *RuleParams) *strTable[*nodeEntry] {
	if r.nodesT == nil {
		r.nodesT = c.entries.of(r.ID, true)
	}
	return r.nodesT
}

// ownedOf returns r's table of owner entries, as c.owned.of(r.ID, true)
// does.
func (c *Coordinator) ownedOf(r *RuleParams) *strTable[*ownerEntry] {
	if r.ownedT == nil {
		r.ownedT = c.owned.of(r.ID, true)
	}
	return r.ownedT
}

// Decide decides a request of cost tokens by identity under a shared or
// exact rule at now. It returns a decision at once, or Pending with a ticket
// whose Completion comes out of Ready once the owner answers (or the decide
// timeout passes and on_failure decides).
func (c *Coordinator) Decide(now int64, ruleID, identity string, cost int64) (Outcome, error) {
	var o Outcome
	err := c.DecideInto(&o, now, ruleID, identity, 0, cost)
	return o, err
}

// DecideInto is Decide writing its outcome to *out (the zero Outcome with
// an error), for an adapter that keeps the outcome in place rather than
// copying it out of the call. hash is TableHash(identity), or 0 to have
// it computed here; any other value makes the decision wrong.
func (c *Coordinator) DecideInto(out *Outcome, now int64, ruleID, identity string, hash uint64, cost int64) error {
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
	e := c.nodesOf(r).getH(h, identity)
	var oe *ownerEntry
	looked := false // oe is this node's bucket of k, or nil for none
	scored := false // owner came from scoring the table now
	gated := false  // the gate was asked (and promoted the identity)
	if e == nil && r.sk != nil && len(c.down) == 0 {
		// A gated rule's identity with no entry here, bucket or node
		// entry, goes to the gate whoever owns it (no peer is down), so
		// the ring need not be scored unless the gate promotes it.
		oe, looked = c.ownedOf(r).getH(h, identity), true
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
			oe, looked = c.ownedOf(r).getH(h, identity), true
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
			oe = c.ownedOf(r).getH(h, identity)
		}
		if r.sk != nil && oe == nil && !gated {
			if o, ok := c.gate(now, r, identity, cost); ok {
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
		d, _ := c.ownerStep(now, r, k, h, cost, oe)
		*out = Outcome{Decision: d, Source: SourceOwner}
		return nil
	}
	down := len(c.down) > 0 && c.down[owner]
	if e == nil {
		if r.sk != nil && !down && !gated {
			if o, ok := c.gate(now, r, identity, cost); ok {
				*out = o
				return nil
			}
		}
		e = c.entry(now, k, h, r, owner)
	}
	if down {
		o := c.failure(now, r, e, cost)
		c.watch(e)
		*out = o
		return nil
	}
	t := r.gcra.Interval().Nanoseconds()
	tau := t * r.Burst
	unconf := e.spent - e.acked
	// The view: the owner's state as last seen plus this node's
	// unconfirmed spend, which the owner has not charged yet.
	v := max(e.view, now) + (unconf+cost)*t
	if cost > r.Burst && !r.leaky { // a leaky bucket admits any cost into an empty queue
		c.watch(e)
		*out = Outcome{Decision: bucket.Decision{Limit: r.Burst, RetryAfter: bucket.Never}, Source: SourceView}
		return nil
	}
	// Exact rules skip the view: the owner decides every request, so that
	// exact equals the reference bucket fed in the owner's order (the view,
	// built from receive times, is late by up to a one-way delay and would
	// reject a request the owner could still admit).
	if v-now > tau && r.Mode != quota.ModeExact {
		c.stats.ViewRejects++
		c.watch(e)
		c.lastView = ViewReject{Rule: ruleID, Identity: identity, Cost: cost, View: e.view, Unconfirmed: unconf, Interval: t, Tau: tau, Burst: r.Burst}
		*out = Outcome{Source: SourceView, Decision: bucket.Decision{
			Limit:      r.Burst,
			Remaining:  max((tau-(v-cost*t-now))/t, 0),
			Reset:      time.Duration(v - cost*t - now),
			RetryAfter: time.Duration(v - now - tau),
		}}
		return nil
	}
	s := c.slack(r)
	if r.Scheme == SlackDemand {
		s += e.grant.extraAt(now)
	}
	if unconf+cost <= s {
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
		return nil
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
	it.Ticket, it.Cost = c.ticket, cost
	it.Rule, it.Identity, it.h = ruleID, identity, h
	c.stats.Forwarded++
	*out = Outcome{Pending: true, Ticket: c.ticket, Source: SourceRemote}
	return nil
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
	if r.plain {
		d = r.gcra.Step(&oe.tat, now, cost)
	} else {
		d = c.otherStep(now, r, k, oe, cost)
	}
	c.watchOwned(oe)
	return d, oe
}

// otherStep is ownerStep's decision for a rule that is not plain gcra: a
// fixed_window rule's window, a leaky_bucket rule's queue, or a leased
// rule's share.
func (c *Coordinator) otherStep(now int64, r *RuleParams, k entryKey, oe *ownerEntry, cost int64) bucket.Decision {
	switch {
	case r.fixed:
		// The window: bucket.FixedWindow's own step on the entry's state.
		st := oe.fixedState()
		d := r.fw.Step(&st, now, cost)
		oe.setFixed(st)
		return d
	case r.leaky:
		// The queue: its departure time is the entry's tat.
		return r.lk.Step((*bucket.Departure)(&oe.tat), now, cost)
	case r.leased:
		return c.shareStep(now, r, k, oe, cost)
	}
	return r.gcra.Step(&oe.tat, now, cost)
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
	oe := c.ownedOf(r).getH(h, k.identity)
	if oe == nil {
		oe = c.newOwnerEntry(now, k, h)
		if now < c.warmUntil && c.table != nil {
			if from := c.prevOwner(k.identity); from != "" && c.handedOver[from] != c.table.Digest() {
				oe.warming, oe.from = true, from
			}
		}
		c.owned.setH(k, h, oe)
	}
	return oe
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

// sync queues a cumulative report of k's spend to its owner.
func (c *Coordinator) sync(now int64, k entryKey, e *nodeEntry) {
	m := c.outbox(e.owner)
	m.Syncs = appendItem(m.Syncs, &c.pools.syncs, SyncItem{Rule: k.rule, Identity: k.identity, Gen: e.gen, Total: e.spent,
		GrantEpoch: e.grant.epoch, Grant: e.grant.extra})
	e.grant.repEpoch, e.grant.repExtra = e.grant.epoch, e.grant.extra
	e.sent = e.spent
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

// Step processes one message from peer `from` received at now.
func (c *Coordinator) Step(now int64, from string, m *Message) {
	now = c.clock(now)
	if len(m.Handoffs) > 0 {
		c.takeHandoffs(now, m.Handoffs)
	}
	if m.HandedOver != 0 {
		c.handedOver[from] = m.HandedOver
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
	for i := range m.Results {
		c.result(now, &m.Results[i])
	}
}

// takeHandoffs is Step taking the buckets a previous owner handed over.
func (c *Coordinator) takeHandoffs(now int64, hs []HandoffItem) {
	for _, h := range hs {
		k := entryKey{h.Rule, h.Identity}
		hk := hashID(k.identity)
		r := c.rules[h.Rule]
		keep := r == nil || convertHandoff(now, r, &h)
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
		case r != nil && r.fixed:
			mergeFixed(now, oe, h)
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
	if r.fixed {
		st := r.fw.Convert(o.fw, bucket.FixedState{End: now + max(h.Debt, 0), Count: h.Count}, now)
		h.Debt, h.Count = st.End-now, st.Count
		if st.Idle(now) {
			h.Debt, h.Count = 0, 0
		}
		return true
	}
	h.Debt = int64(r.convertTAT(&o, bucket.TAT(now+max(h.Debt, 0)), now)) - now
	return true
}

// mergeFixed merges a handed-over window into oe's under a fixed_window
// rule. The old owner's window ends h.Debt from now on this node's clock
// (late by the message's delay: held longer, never shorter); after it this
// node's own aligned windows resume (bucket.FixedWindow rolls an ended
// window to the one containing now). When both are live the counts add and
// the later end holds: what either admitted counts until both windows are
// over, so a join or a graceful leave never gives a fresh window.
func mergeFixed(now int64, oe *ownerEntry, h HandoffItem) {
	in := bucket.FixedState{End: now + max(h.Debt, 0), Count: max(h.Count, 0)}
	cur := oe.fixedState()
	switch {
	case in.Idle(now):
	case cur.Idle(now):
		cur = in
	default:
		cur.End, cur.Count = max(cur.End, in.End), cur.Count+in.Count
	}
	oe.setFixed(cur)
}

// chargeOwned charges spent tokens a node reported to this node's bucket of
// k: at the rule's rate, or at the region's share for a leased rule
// (CoordinatorConfig.Shares), which also observes it as demand.
func (c *Coordinator) chargeOwned(now int64, r *RuleParams, k entryKey, oe *ownerEntry, spent int64) {
	if r.fixed {
		chargeFixed(now, r, oe, spent)
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

// chargeFixed charges spent tokens to oe's window under the fixed_window
// rule r unconditionally (the count may pass the limit, as a GCRA bucket
// goes into debt). An exact rule's nodes admit nothing on their own, so this
// is only reached by spend a node admitted before its rule became exact.
func chargeFixed(now int64, r *RuleParams, oe *ownerEntry, spent int64) {
	if spent <= 0 {
		return
	}
	st := oe.fixedState()
	// The window in force at now, as bucket.FixedWindow rolls it: a peek
	// reports its end; another end than the state's is a new window.
	if end := now + int64(r.fw.Peek(st, now).Reset); end != st.End || st.Count <= 0 {
		st = bucket.FixedState{End: end}
	}
	st.Count += spent
	oe.setFixed(st)
}

// ownerDebt is what an owner tells a node of oe's state after a decision
// or a charge: the bucket's TAT minus now. The nodes of a fixed_window or
// leaky_bucket rule keep no view of it (exact mode: the owner decides every
// request), so it is 0 there and their entries go once nothing is pending.
func ownerDebt(now int64, r *RuleParams, oe *ownerEntry) int64 {
	if r.fixed || r.leaky {
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
		p.gen, p.total = s.Gen, 0
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
	total := p.total
	if s.Gen < p.gen {
		total = s.Total // a stale generation: acknowledge as is, charge nothing
	}
	if c.warming(now, oe) {
		// The bucket's state is still on its way: an acknowledgement of a
		// fresh bucket would let the node spend its slack again at every
		// round trip, and one of a spent bucket would have it reject with
		// tokens left. Charged, not acknowledged: the node's spend stays
		// unconfirmed, beyond its slack it asks (and the previous owner
		// decides), and it reports again after the sync interval.
		return
	}
	debt := ownerDebt(now, r, oe)
	a := AckItem{Rule: s.Rule, Identity: s.Identity, Gen: s.Gen, Total: total, Debt: debt}
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
	var bd bucket.Decision
	var debt int64
	if r, ok := c.rule(d.Rule); ok {
		k := entryKey{d.Rule, d.Identity}
		h := d.h // made by Decide in this process, or 0
		if h == 0 {
			h = hashID(k.identity)
		}
		oe := c.ownedOf(r).getH(h, k.identity)
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

// ack is a node receiving an acknowledgement.
func (c *Coordinator) ack(now int64, a *AckItem) {
	e := c.entries.get(entryKey{a.Rule, a.Identity})
	if e == nil || a.Gen != e.gen || a.Total < e.acked {
		return // stale: another generation, or older than what we know
	}
	e.acked = min(a.Total, e.spent)
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

// Refund gives back cost tokens that Decide admitted for a request the
// caller then did not let through (another rule rejected it). Only what can
// be given back exactly is: an owner's own charge, or spend within this
// node's slack not yet reported. A remote owner's admission is not given
// back (conservative: it costs tokens, never admits too many), nor is a
// sketch's (its counters are shared by colliding identities, so lowering
// them could undercount another).
func (c *Coordinator) Refund(now int64, ruleID, identity string, cost int64, src Source) {
	now = c.clock(now)
	r, ok := c.rules[ruleID]
	if !ok || cost <= 0 {
		return
	}
	k := entryKey{ruleID, identity}
	switch src {
	case SourceOwner:
		if oe := c.owned.get(k); oe != nil {
			if r.fixed {
				// Only while the window it was counted in lasts.
				if int64(oe.tat) > now {
					oe.count = max(oe.count-cost, 0)
				}
				return
			}
			oe.tat -= bucket.TAT(cost * r.gcra.Interval().Nanoseconds())
			c.watchOwned(oe)
		}
	case SourceSlack:
		if e := c.entries.get(k); e != nil && e.spent-cost >= e.sent {
			e.spent -= cost
			c.watch(e)
		}
	}
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
		}
	}
	c.markHandedOver(next)
	c.FlushAll(now)
}

// handOff queues oe's state for its new owner `to`: its debt (the TAT, a
// window's end or a queue's departure, from now) and a window's count. A
// bucket that is full again (tat ≤ now) equals no entry: nothing to send.
func (c *Coordinator) handOff(now int64, to string, oe *ownerEntry) {
	if int64(oe.tat) <= now {
		return
	}
	h := HandoffItem{Rule: oe.key.rule, Identity: oe.key.identity, Debt: int64(oe.tat) - now, Count: oe.count}
	if r := c.rules[oe.key.rule]; r != nil {
		h.Algorithm, h.Limit, h.Window, h.Burst, h.MaxDelay = r.Algorithm, r.Limit, int64(r.Window), r.Burst, r.maxDelay
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
				if r.fixed {
					chargeFixed(now, r, oe, unconf)
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
	if changed {
		c.markHandedOver(t)
	}
}

// HasReady reports whether Ready would return anything.
func (c *Coordinator) HasReady() bool { return len(c.outs) > 0 || len(c.done) > 0 }

// OwnerName returns the name of identity's owner, "" on an empty ring. It
// makes *Ring an OwnerTable.
func (r *Ring) OwnerName(identity string) string {
	m, ok := r.Owner(identity)
	if !ok {
		return ""
	}
	return m.Name
}

var _ OwnerTable = (*Ring)(nil)
