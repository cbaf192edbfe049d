package weir

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
)

// IdentityQuery narrows an identity lookup (ops.LookupIdentity). Its zero
// value asks about every rule.
type IdentityQuery struct {
	// Method and Path, when Path is set, keep only the rules that match a
	// request with them (quota's matching, as the decision path does).
	Method, Path string
	// Key, when set, keeps only the rules whose key chain has that source
	// ("ip", "user", "header:X-Api-Key", matched case-insensitively), and
	// looks the identity up in that source's namespace: "abc" may be an
	// API key to one rule and nothing to another, and the API key "abc"
	// and the user "abc" have buckets of their own. Empty: the first
	// source of each rule's chain.
	Key string
	// Tier selects the tier's limits for rules with tiers.
	Tier string
	// Raw takes the identity as the bucket key exactly as Node.CheckKeys
	// charges it (the rls service's descriptor paths, such as
	// "api_key=abc"): a rule with no key chain is then not collapsed to
	// its one global bucket. Rules charged through CheckKeys (imported
	// Envoy limits) have no key chain, so without Raw every lookup of
	// theirs reports the "" bucket.
	Raw bool
}

// IdentityReport answers "why is this identity throttled?": every rule that
// may apply to it, with the state of its bucket and its recent verdicts.
type IdentityReport struct {
	Identity     string    `json:"identity"`
	Node         string    `json:"node"`
	At           time.Time `json:"at"`
	RulesVersion uint64    `json:"rules_version"`
	// RecentSince is how far back the recent counts reach (one to two
	// 30-second periods, or the node's age when it is younger).
	RecentSince string `json:"recent_since"`
	// Throttled lists the rules whose bucket cannot pay the rule's cost now
	// or that rejected the identity recently.
	Throttled []string       `json:"throttled"`
	Rules     []IdentityRule `json:"rules"`
}

// IdentityRule is one rule's part of an IdentityReport.
type IdentityRule struct {
	Rule   string   `json:"rule"`
	Key    []string `json:"key"`
	Match  string   `json:"match"`
	Mode   string   `json:"mode"`
	Scope  string   `json:"scope"`
	Shadow bool     `json:"shadow"`
	// Global is true for a rule keyed on [global]: every request counts
	// in one bucket, whoever sends it.
	Global bool   `json:"global"`
	Limit  int64  `json:"limit"`
	Window string `json:"window"`
	Burst  int64  `json:"burst"`
	Cost   int64  `json:"cost"`
	// Limits says where Limit and Burst come from: "rule", "override" or
	// "tier NAME".
	Limits string `json:"limits"`
	// Bucket is the identity's bucket where it is decided.
	Bucket BucketReport `json:"bucket"`
	// Allowed and Rejected are this node's recent verdicts for the
	// identity under the rule (a count-min estimate: never under the true
	// count, possibly over; see RecentSince). For a shadow rule Rejected
	// counts the would-be rejections.
	Allowed  uint64 `json:"recent_allowed"`
	Rejected uint64 `json:"recent_rejected"`
	// Verdict is a sentence for people.
	Verdict string `json:"verdict"`
}

// BucketReport is one bucket's state.
type BucketReport struct {
	// Where says which bucket decides: "owner" (the cluster's owner of the
	// identity, Node names it), "local" (this node alone: a local rule, or
	// no cluster), "lease group" (a durable rule; not read here, since a
	// read would cost a Raft commit).
	Where string `json:"where"`
	Node  string `json:"node,omitempty"`
	// Known is false when no state could be read (Error says why).
	Known     bool  `json:"known"`
	Remaining int64 `json:"remaining"`
	Burst     int64 `json:"burst"`
	Full      bool  `json:"full"`
	Locked    bool  `json:"locked_out,omitempty"`
	Warming   bool  `json:"warming,omitempty"`
	Debt      int64 `json:"debt"`
	Reporters int   `json:"reporters,omitempty"`
	// ResetAfterMS is how long until the bucket is full again (the TAT
	// counted from now); RetryAfterMS how long until one request of the
	// rule's cost fits (0: it fits now; -1: it never can).
	ResetAfterMS int64 `json:"reset_after_ms"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	// Unconfirmed is what this node admitted within its slack and the
	// owner has not acknowledged yet (shared rules, when this node is not
	// the owner).
	Unconfirmed int64  `json:"unconfirmed,omitempty"`
	Error       string `json:"error,omitempty"`
}

// ErrBadQuery is wrapped by LookupIdentity's error for a query it cannot
// answer (an identity longer than Config.MaxIdentityBytes).
var ErrBadQuery = errors.New("weir: bad identity query")

// lookupIdentity reports, for one identity, every rule that may apply to
// it with its bucket on the node that decides it and this node's recent
// verdicts (see IdentityReport). For a shared or exact rule in a cluster
// the owner is asked over the peer transport (an Inspect call bounded by
// ctx); an unreachable owner is reported in the bucket's Error. Nothing is
// charged.
func (n *Node) lookupIdentity(ctx context.Context, id string, q IdentityQuery) (IdentityReport, error) {
	if len(id) > n.maxID {
		return IdentityReport{}, fmt.Errorf("%w: identity of %d bytes, the cap is %d", ErrBadQuery, len(id), n.maxID)
	}
	e := n.eng.load()
	now := n.now()
	rep := IdentityReport{Identity: id, Node: n.nodeName(), At: time.Unix(0, now).UTC(), RulesVersion: e.set.Version(),
		Throttled: []string{}, Rules: []IdentityRule{}}
	var matched []int
	if q.Path != "" {
		method := q.Method
		if method == "" {
			method = http.MethodGet
		}
		matched = e.set.Match(method, CleanPath(q.Path), nil)
	}
	var since time.Duration
	format := n.keyFormat.Load()
	for i := range e.rules {
		c := &e.rules[i]
		if q.Path != "" && !slices.Contains(matched, i) {
			continue
		}
		src := 0 // the identity's namespace: the first source unless q.Key names one
		if q.Key != "" {
			if src = keyIndex(c.r.Key, q.Key); src < 0 {
				continue
			}
		}
		global := (isGlobal(c.r.Key) || c.r.Key[src].Kind == quota.KeyGlobal) && !q.Raw
		bid := id
		if global {
			bid, src = "", 0 // one bucket for everyone
		}
		spec := c.specFor(bid, src, q.Tier)
		cost := c.r.CostFor(q.Method)
		ir := IdentityRule{Rule: c.r.ID, Match: matchString(c.r.Match), Mode: string(c.r.Mode), Scope: string(c.r.Scope),
			Shadow: c.r.Shadow, Global: global, Limit: spec.limit, Window: spec.window.String(), Burst: spec.burst,
			Cost: cost, Limits: limitsSource(c, spec)}
		for _, k := range c.r.Key {
			ir.Key = append(ir.Key, k.String())
		}
		if len(ir.Key) == 0 {
			ir.Key = []string{"global"}
		}
		p := newPending(0, c, spec, bid, n.hasher.Sum(bid), cost)
		p.format, p.source = format, uint8(src)
		if namespaced(format, src, bid) {
			n.namespace(&p, src)
		}
		ir.Bucket = n.bucketReport(ctx, &p, now)
		var a, r uint64
		a, r, since = n.ops.recent.estimate(p.key, now)
		ir.Allowed, ir.Rejected = a, r
		ir.Verdict = verdict(&ir)
		if !c.r.Shadow && (ir.Rejected > 0 || (ir.Bucket.Known && ir.Bucket.RetryAfterMS != 0)) {
			rep.Throttled = append(rep.Throttled, c.r.ID)
		}
		rep.Rules = append(rep.Rules, ir)
	}
	if since == 0 { // no rule applies: what the counts would reach
		since = min(2*recentPeriod, time.Duration(now-n.ops.recent.started))
	}
	rep.RecentSince = roundSince(since).String()
	return rep, nil
}

// roundSince rounds how far back the recent counts reach for display: to
// the second, or to a tenth of one on a node younger than 10 seconds.
func roundSince(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// bucketReport reads p's bucket where it is decided.
func (n *Node) bucketReport(ctx context.Context, p *pending, now int64) BucketReport {
	br := BucketReport{Where: "local", Node: n.nodeName(), Burst: p.spec.burst}
	if bd, locked := n.locked(p, now); locked {
		br.Locked = true
		br.RetryAfterMS = durMS(bd.RetryAfter)
	}
	switch {
	case p.c.durable:
		br.Where, br.Node = "lease group", ""
		br.Error = "a durable rule's bucket lives in the lease group; reading it would cost a Raft commit, so it is not shown"
		return br
	case p.spec.cid != "" && n.cluster != nil:
		return n.clusterBucket(ctx, p, br)
	}
	// The state as it stands (a look at cost 0), and whether one request
	// of the rule's cost would pass now (a look at that cost).
	st := p.spec.lim.peek(p.key, p.ident(), now, 0)
	br.Known = true
	br.Remaining = st.Remaining
	br.ResetAfterMS = durMS(st.Reset)
	br.Full = st.Reset <= 0
	if bd := p.spec.lim.peek(p.key, p.ident(), now, p.cost); !br.Locked && !bd.Allowed {
		br.RetryAfterMS = max(durMS(bd.RetryAfter), 1)
		if bd.RetryAfter == bucket.Never {
			br.RetryAfterMS = -1
		}
	}
	return br
}

// clusterBucket asks the identity's owner for its bucket (itself when it is
// the owner) and adds this node's unconfirmed spend.
func (n *Node) clusterBucket(ctx context.Context, p *pending, br BucketReport) BucketReport {
	sh := n.cluster.shell
	br.Where = "owner"
	self, err := sh.Inspect(p.spec.cid, p.wid)
	if err != nil {
		br.Error = err.Error()
		return br
	}
	br.Unconfirmed = self.Unconfirmed
	st := self
	if self.Owner != "" && self.Owner != self.Node {
		br.Node = self.Owner
		addr := ""
		if ring := sh.Ring(); ring != nil {
			if m, ok := ring.Owner(p.wid); ok && m.Name == self.Owner {
				addr = m.Addr
			}
		}
		if addr == "" {
			br.Error = "the owner " + self.Owner + " has no known address"
			return br
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if st, err = n.cluster.tr.Inspect(ctx, addr, p.spec.cid, p.wid); err != nil {
			br.Error = "asking the owner " + self.Owner + ": " + err.Error()
			return br
		}
	}
	br.Node = st.Node
	br.Known = st.Known
	br.Remaining, br.Debt, br.Warming, br.Reporters = st.Remaining, st.Debt, st.Warming, st.Reporters
	br.ResetAfterMS = durMS(st.ResetAfter)
	br.Full = st.ResetAfter <= 0
	if !br.Locked {
		switch {
		case p.cost > st.Burst:
			br.RetryAfterMS = -1
		case st.Remaining < p.cost && st.Interval > 0:
			// The bucket pays cost again once TAT − now ≤ (Burst − cost)·T.
			wait := st.ResetAfter - time.Duration(st.Burst-p.cost)*st.Interval
			br.RetryAfterMS = max(durMS(wait), 1)
		case st.Remaining < p.cost:
			// A fixed window (Interval 0): nothing comes back before
			// it ends.
			br.RetryAfterMS = max(durMS(st.ResetAfter), 1)
		}
	}
	return br
}

// inspectPeer answers a peer's Inspect call with this node's coordinator.
func (n *Node) inspectPeer(_ context.Context, _, rule, identity string) (cluster.BucketState, error) {
	return n.cluster.shell.Inspect(rule, identity)
}

func durMS(d time.Duration) int64 {
	if d == bucket.Never {
		return -1
	}
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func verdict(ir *IdentityRule) string {
	b := &ir.Bucket
	var s strings.Builder
	switch {
	case !b.Known && b.Error != "":
		s.WriteString("bucket state unknown (" + b.Error + ")")
	case b.Locked:
		fmt.Fprintf(&s, "locked out by the rule's penalty for %dms more", b.RetryAfterMS)
	case b.RetryAfterMS < 0:
		fmt.Fprintf(&s, "a request of cost %d can never pass: the burst is %d", ir.Cost, ir.Burst)
	case b.RetryAfterMS > 0:
		fmt.Fprintf(&s, "throttled now: %d of %d tokens left", b.Remaining, ir.Burst)
		if b.Debt > 0 {
			fmt.Fprintf(&s, ", %d tokens in debt (spend other nodes admitted)", b.Debt)
		}
		fmt.Fprintf(&s, "; a request of cost %d fits again in %dms", ir.Cost, b.RetryAfterMS)
	case b.Full:
		s.WriteString("not throttled: the bucket is full")
	default:
		fmt.Fprintf(&s, "not throttled now: %d of %d tokens left, full again in %dms", b.Remaining, ir.Burst, b.ResetAfterMS)
	}
	if ir.Rejected > 0 {
		fmt.Fprintf(&s, "; rejected about %d and admitted about %d recently on this node", ir.Rejected, ir.Allowed)
	}
	if ir.Shadow {
		s.WriteString(" (shadow rule: it never rejects, it only counts)")
	}
	if ir.Global {
		s.WriteString(" (global key: one bucket for every caller)")
	}
	return s.String()
}

// keyIndex returns the position in ks of the source want names ("ip",
// "header:X-Api-Key", or a bare header name), or -1.
func keyIndex(ks []quota.KeySource, want string) int {
	for i, k := range ks {
		if strings.EqualFold(k.String(), want) || (k.Kind == quota.KeyHeader && strings.EqualFold(want, k.Name)) {
			return i
		}
	}
	return -1
}

func isGlobal(ks []quota.KeySource) bool {
	return len(ks) == 0 || ks[0].Kind == quota.KeyGlobal
}

func limitsSource(c *crule, spec *limitSpec) string {
	if spec == &c.base {
		return "rule"
	}
	for name, s := range c.tiers {
		if s == spec {
			return "tier " + name
		}
	}
	return "override"
}

func matchString(m quota.Match) string {
	var parts []string
	if m.Path != "" {
		parts = append(parts, "path "+m.Path)
	}
	if m.Prefix != "" {
		parts = append(parts, "prefix "+m.Prefix)
	}
	if m.Pattern != "" {
		parts = append(parts, "pattern "+m.Pattern)
	}
	if len(m.Methods) > 0 {
		parts = append(parts, "methods "+strings.Join(m.Methods, ","))
	}
	if len(parts) == 0 {
		return "every request"
	}
	return strings.Join(parts, "; ")
}
