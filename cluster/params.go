package cluster

import (
	"fmt"
	"math"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// ShareMode says how an owner decides an identity of a leased rule.
type ShareMode uint8

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
	// Algorithm is the rule's algorithm: quota.AlgorithmGCRA, or (exact
	// mode only) quota.AlgorithmFixedWindow, AlgorithmSlidingWindow,
	// AlgorithmSlidingLog, AlgorithmLeakyBucket or AlgorithmConcurrency.
	Algorithm quota.Algorithm
	// CountRejected is a fixed_window rule's count_rejected: its window
	// counts every request's cost, admitted or not
	// (bucket.FixedWindow.CountingRejected), so any cost goes to the owner.
	CountRejected bool
	// TrackAll keeps an entry of every identity on every node that
	// admits it, with syncs and acknowledgements of its own: no blind
	// spend (blind.go) for the identities far from their limit. Only
	// shared gcra rules spend blind; the zero value lets them.
	TrackAll bool
	gcra     bucket.GCRA
	// exact is how the owner decides a rule of an algorithm other than
	// gcra (exact.go), nil for gcra; gcra then serves only the node side's
	// arithmetic and on_failure.
	exact exactAlgo
	// conc is exact when the rule is a concurrency rule (concurrency.go),
	// else nil.
	conc *concAlgo
	// maxCost is the largest cost a request can be admitted at: the burst,
	// or any cost for a leaky queue (which admits it into an empty queue).
	maxCost int64
	// maxDelay is the leaky queue's longest wait (ns; the rule's MaxDelay,
	// else its default, quota.Rule.QueueDelay), which a handoff names with
	// the other parameters (HandoffItem).
	maxDelay int64
	sk       *countMin // this coordinator's sketch of a gated rule
	leased   bool      // decided on the owner through CoordinatorConfig.Shares
	// plain: a gcra rule that is not leased, decided on the owner by
	// gcra.Step alone (SetRules sets it): ownerStep's one test.
	plain bool
	// blind: a shared plain gcra rule with no sketch gating and TrackAll
	// unset, whose identities far from their limit are spent blind
	// (blind.go, SetRules sets it); salt tells its identities' keys in
	// Coordinator.blindU from other rules', bseed seeds blindHash (the
	// salt and CoordinatorConfig.SketchSeed), trackAt (ns) is how spent
	// (TAT − now) the owner lets a bucket get on its sketch before it
	// keeps the bucket, blindMax the largest cost admitted blind, and bs
	// the owner's TAT sketch of the identities it keeps no bucket of.
	blind    bool
	salt     uint64
	bseed    uint64
	trackAt  int64
	blindMax int64
	bs       *tatSketch
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
// exact mode, or of a fixed_window, sliding_window, sliding_log or
// leaky_bucket rule in exact mode (the burst of a window or log rule is its
// limit, the most the window holds; that of a leaky_bucket rule its queue's
// positions, MaxDelay ÷ T + 1). version is
// the rule set's version.
func NewRuleParams(r *quota.Rule, version uint64) (RuleParams, error) {
	if r.Mode != quota.ModeShared && r.Mode != quota.ModeExact {
		return RuleParams{}, fmt.Errorf("cluster: rule %q: mode %q is not decided by the coordinator", r.ID, r.Mode)
	}
	algo, burst := quota.AlgorithmGCRA, r.Burst
	var ex exactAlgo
	var maxDelay time.Duration
	switch r.Algorithm {
	case "", quota.AlgorithmGCRA, quota.AlgorithmTokenBucket:
	case quota.AlgorithmFixedWindow, quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog, quota.AlgorithmLeakyBucket,
		quota.AlgorithmConcurrency:
		if r.Mode != quota.ModeExact {
			return RuleParams{}, fmt.Errorf("cluster: rule %q: algorithm %s is decided by the coordinator in mode exact only, not %q", r.ID, r.Algorithm, r.Mode)
		}
		if r.Algorithm == quota.AlgorithmLeakyBucket {
			maxDelay = r.QueueDelay(r.Limit, r.Burst)
		}
		var err error
		if ex, burst, err = newExactAlgo(r.Algorithm, r.Limit, r.Window, maxDelay); err != nil {
			return RuleParams{}, fmt.Errorf("cluster: rule %q: %w", r.ID, err)
		}
		if fa, ok := ex.(*fixedAlgo); ok && r.CountRejected {
			fa.fw = fa.fw.CountingRejected()
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
	p := RuleParams{ID: r.ID, Version: version, Mode: r.Mode, OnFailure: r.OnFailure,
		Limit: r.Limit, Window: r.Window, Burst: burst, Accuracy: acc, Sketch: sk, Scheme: DefaultSlackScheme,
		Algorithm: algo, gcra: g, exact: ex, maxCost: burst, maxDelay: int64(maxDelay)}
	p.conc, _ = ex.(*concAlgo)
	if ex != nil {
		p.maxCost = ex.maxCost()
	}
	if fa, ok := ex.(*fixedAlgo); ok && fa.fw.CountsRejected() {
		// A rejected cost is counted too: the owner must see every cost.
		p.CountRejected, p.maxCost = true, math.MaxInt64
	}
	return p, nil
}

// Slack returns the slack sᵢ every node of a region of n live nodes holds
// without asking: under SlackFixed ⌊a·L ÷ n⌋ tokens (docs/overshoot.md: S = Σ sᵢ ≤
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

// convertible reports whether the state of rule o carries over to r by
// conversion: same algorithm, other parameters, and not decided through
// leases (whose shares are the lease group's).
func convertible(o, r *RuleParams) bool {
	return o.Algorithm == r.Algorithm && !o.leased && !r.leased
}

// sameState reports whether o and r read a stored state alike.
func sameState(o, r *RuleParams) bool {
	if o.exact != nil || r.exact != nil {
		return o.exact != nil && r.exact != nil && r.exact.same(o.exact)
	}
	return o.gcra == r.gcra
}

// convertTAT carries a gcra bucket's TAT of rule o over to r at now.
func (r *RuleParams) convertTAT(o *RuleParams, tat bucket.TAT, now int64) bucket.TAT {
	return r.gcra.Convert(o.gcra, tat, now)
}

// The ShareMode values.
const (
	// ShareEnforce decides with the share's bucket.
	ShareEnforce ShareMode = iota
	// ShareReject rejects every request the owner decides.
	ShareReject
	// ShareAdmit admits every request the owner decides.
	ShareAdmit
)
