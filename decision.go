package weir

import (
	"net/http"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/clientip"
)

// Request is what Node.Allow needs to know about one request. The middleware
// fills it from an *http.Request; other callers (gRPC, queues) fill it
// themselves.
type Request struct {
	// Method and Path select the rules that apply (see quota.Match).
	Method string
	Path   string
	// Header supplies the values of header key sources (key: [header:X-API-Key]).
	Header http.Header
	// User is the identity for "user" key sources; empty when anonymous.
	User string
	// ClientIP is the identity for "ip" key sources, already resolved
	// through trusted proxies.
	ClientIP string
	// Tier selects a rule's tier limits; empty means none.
	Tier string
	// Cost overrides every rule's cost when positive; zero means the rule's
	// own cost for Method.
	Cost int64

	// ipFrom, when set, is the HTTP request whose client IP (through ipRes's
	// trusted proxies) is ClientIP, resolved when a key chain first reaches
	// an ip source: the middleware's requests resolve it only when a rule
	// counts by it.
	ipFrom *http.Request
	ipRes  *clientip.Resolver
}

// clientIP returns ClientIP, resolving it first if it is still pending.
func (req *Request) clientIP() string {
	if req.ipFrom != nil {
		req.ClientIP, req.ipFrom = resolveIP(req.ipRes, req.ipFrom), nil
	}
	return req.ClientIP
}

// RuleResult is the outcome of one rule for one request.
type RuleResult struct {
	// Rule is the rule's id.
	Rule string
	// Identity is the key the rule counted the request under ("" for a
	// global rule or a request with no identity for the rule).
	Identity string
	// Limit per Window, and Burst, after per-identity overrides and tiers.
	Limit  int64
	Window time.Duration
	Burst  int64
	// Cost is what the request cost under this rule.
	Cost int64
	// Allowed is false when this rule rejects the request. Shadow rules are
	// always Allowed; their would-be rejection shows in ShadowRejected.
	Allowed bool
	// Shadow is true for a rule in shadow mode; ShadowRejected when it would
	// have rejected.
	Shadow         bool
	ShadowRejected bool
	// Locked is true when the rejection comes from the rule's penalty box.
	Locked bool
	// Degraded is true when the identity's owner could not be reached and
	// the rule's on_failure decided (local, open or closed).
	Degraded bool
	// Remaining, Reset, RetryAfter and Delay are the algorithm's figures (see
	// bucket.Decision). Reset counts from the decision's time; RetryAfter is
	// bucket.Never when the cost can never fit.
	Remaining  int64
	Reset      time.Duration
	RetryAfter time.Duration
	Delay      time.Duration

	// releasing bookkeeping for concurrency rules.
	release releaser
	slot    *clusterSlot // a concurrency slot its owner holds (cluster_node.go)
	key     uint64
	order   int32
	charged bool
}

// inlineResults is how many rule results a Decision holds without allocating.
const inlineResults = 3

// Decision is the outcome of Node.Allow for every rule that applies to a
// request. All must pass. Keep it by value; its methods take a pointer.
type Decision struct {
	// Allowed is true when every enforced rule admitted the request.
	Allowed bool
	// Err is set when the request could not be evaluated (for example
	// ErrIdentityTooLong); Allowed is then false and nothing was charged.
	Err error
	// Delay is how long the caller must hold the request before forwarding
	// it (leaky-bucket rules smooth their output this way); zero otherwise.
	Delay time.Duration
	// At is the decision's time; Reset and RetryAfter count from it. It is
	// zero when no rule applied.
	At time.Time
	// Degraded is true when some rule was decided by its on_failure policy
	// because the identity's owner could not be reached. Such decisions are
	// counted (weir_fail_open_total) and the upstream can see them through
	// FromContext.
	Degraded bool

	limiting int
	n        int
	inline   [inlineResults]RuleResult
	more     []RuleResult
	done     bool // Done has run
	now      int64
}

// Results returns the outcome of every rule that applied, in rule order.
// The slice aliases d; copy it to keep it beyond d's life.
func (d *Decision) Results() []RuleResult {
	if d.more != nil {
		return d.more
	}
	return d.inline[:d.n]
}

// Limiting returns the most restrictive rule's result: among rejecting
// rules the one whose RetryAfter is longest, otherwise the one with the
// fewest Remaining. ok is false when no rule applied.
func (d *Decision) Limiting() (r RuleResult, ok bool) {
	if d.limiting < 0 {
		return RuleResult{}, false
	}
	return d.Results()[d.limiting], true
}

// RetryAfter is how long the client should wait before retrying: the
// longest RetryAfter among the rejecting rules, zero when Allowed, and
// bucket.Never when some rejecting rule can never pass this cost.
func (d *Decision) RetryAfter() time.Duration {
	var ra time.Duration
	for _, r := range d.Results() {
		if !r.Allowed && r.RetryAfter > ra {
			ra = r.RetryAfter
		}
	}
	return ra
}

// Done releases what the request holds (the in-flight slots of concurrency
// rules). Call it when the request ends; calling it again, or on a Decision
// with no concurrency rule, does nothing. The middleware calls it for you.
func (d *Decision) Done() {
	if d.done {
		return
	}
	d.done = true
	for i := range d.Results() {
		r := &d.Results()[i]
		if r.charged && r.Allowed && !r.ShadowRejected {
			if r.release != nil {
				r.release.release(r.key, d.now, r.Cost)
			}
			r.slot.release()
		}
	}
}

// finish puts the results in rule order (shadow rules are decided after the
// enforced ones) and picks the most restrictive.
func (d *Decision) finish() {
	rs := d.Results()
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].order < rs[j-1].order; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
	d.limiting = -1
	for i := range rs {
		if d.limiting < 0 || moreRestrictive(&rs[i], &rs[d.limiting]) {
			d.limiting = i
		}
	}
}

// next appends a zero result and returns it for filling in place.
func (d *Decision) next() *RuleResult {
	if d.more == nil && d.n < inlineResults {
		d.n++
		return &d.inline[d.n-1]
	}
	if d.more == nil {
		d.more = make([]RuleResult, d.n, d.n*2+2)
		copy(d.more, d.inline[:d.n])
	}
	d.more = append(d.more, RuleResult{})
	d.n++
	return &d.more[len(d.more)-1]
}

// moreRestrictive reports whether a should be reported instead of b.
func moreRestrictive(a, b *RuleResult) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Reset > b.Reset
}

// CheckResult is the outcome of Node.Check for one rule and one key.
type CheckResult struct {
	// Allowed is true when the rule admitted the cost (always for shadow
	// rules; see ShadowRejected).
	Allowed        bool
	ShadowRejected bool
	// Remaining is what could still pass now.
	Remaining int64
	// ResetAt is when the key's state is back to full.
	ResetAt time.Time
	// RetryAfter is zero when allowed, else how long until this cost would
	// fit (bucket.Never when it never can).
	RetryAfter time.Duration
	// Limit, Window and Burst are the limits applied to key.
	Limit  int64
	Window time.Duration
	Burst  int64
}

var _ = bucket.Never
