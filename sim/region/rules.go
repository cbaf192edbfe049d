package region

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/internal/policy"
	"github.com/weir-dev/weir/sim/engine"
)

// RuleSpec is a rule that every request carries besides the run's main
// rule (Config.Rules): a GCRA cluster rule with the main rule's mode,
// accuracy, on_failure and slack scheme, and its own limit, window and
// burst. Its identity is the request's identity (Tenants 0), or the
// request's tenant: identity id-i belongs to tenant tn-(i mod Tenants).
type RuleSpec struct {
	Limit   int64
	Window  time.Duration // 0: the main rule's window
	Burst   int64         // 0: Limit
	Tenants int           // 0: the request's own identity
}

// maxRules bounds the rules of a request: the main rule and seven more.
const maxRules = 8

// RulesSyntax documents the -rules spec; -help prints it.
const RulesSyntax = `A rules spec is extra rules separated by ";", each KEY=VALUE,KEY=VALUE...
  limit=N       the rule's limit (required)
  window=D      its window (default: -window)
  burst=B       its burst (default: its limit)
  tenants=K     its identity is the request's tenant, tn-(i mod K) for identity id-i
                (default: the request's own identity)
Every request carries the main rule (-limit ...) first, then these in order, all cluster
rules with the main rule's mode, accuracy, on_failure and scheme; each node decides them
with the request policy (internal/policy): charged one by one, and a rejection refunds
the rules admitted before it.
  -rules 'limit=50'                   a second, tighter rule on the same identity
  -ids 8 -rules 'limit=150,tenants=4' a per-tenant rule over four tenants of two identities each`

// ErrRulesSpec is wrapped by every error ParseRules returns.
var ErrRulesSpec = errors.New("rules spec")

// ParseRules parses a rules spec (see RulesSyntax); "" and "none" are no
// extra rule.
func ParseRules(spec string) ([]RuleSpec, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return nil, nil
	}
	var out []RuleSpec
	for _, item := range strings.Split(spec, ";") {
		var r RuleSpec
		for _, kv := range strings.Split(strings.TrimSpace(item), ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return nil, fmt.Errorf("%w: %q: want KEY=VALUE", ErrRulesSpec, kv)
			}
			var err error
			switch k {
			case "limit":
				r.Limit, err = strconv.ParseInt(v, 10, 64)
			case "window":
				r.Window, err = time.ParseDuration(v)
			case "burst":
				r.Burst, err = strconv.ParseInt(v, 10, 64)
			case "tenants":
				r.Tenants, err = strconv.Atoi(v)
			default:
				return nil, fmt.Errorf("%w: %q: unknown key %q (limit, window, burst, tenants)", ErrRulesSpec, item, k)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %q: %s: %w", ErrRulesSpec, item, k, err)
			}
		}
		if r.Limit == 0 {
			return nil, fmt.Errorf("%w: %q: limit= is required", ErrRulesSpec, item)
		}
		out = append(out, r)
	}
	return out, nil
}

// FormatRules formats rules as ParseRules reads them.
func FormatRules(rules []RuleSpec) string {
	if len(rules) == 0 {
		return "none"
	}
	parts := make([]string, len(rules))
	for i, r := range rules {
		s := "limit=" + strconv.FormatInt(r.Limit, 10)
		if r.Window != 0 {
			s += ",window=" + r.Window.String()
		}
		if r.Burst != 0 {
			s += ",burst=" + strconv.FormatInt(r.Burst, 10)
		}
		if r.Tenants != 0 {
			s += ",tenants=" + strconv.Itoa(r.Tenants)
		}
		parts[i] = s
	}
	return strings.Join(parts, ";")
}

// withDefaults returns r with its zero values filled in from the main
// rule of c.
func (r RuleSpec) withDefaults(c *Config) RuleSpec {
	if r.Window == 0 {
		r.Window = c.Window
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	return r
}

// validateRules checks the extra rules of c (with defaults).
func (c *Config) validateRules() error {
	if len(c.Rules) == 0 {
		return nil
	}
	switch {
	case len(c.Rules) > maxRules-1:
		return fmt.Errorf("rules: %d extra rules, at most %d", len(c.Rules), maxRules-1)
	case c.Sketch > 0:
		return fmt.Errorf("rules: sketch gating is simulated with one rule only")
	case c.KeyCap > 0:
		return fmt.Errorf("rules: the key cap is simulated with one rule only")
	}
	for i, r := range c.Rules {
		r = r.withDefaults(c)
		switch {
		case r.Limit < 1:
			return fmt.Errorf("rule %d: limit %d: want >= 1", i+2, r.Limit)
		case r.Window <= 0:
			return fmt.Errorf("rule %d: window %v: want > 0", i+2, r.Window)
		case r.Burst < 1:
			return fmt.Errorf("rule %d: burst %d: want >= 1", i+2, r.Burst)
		case c.Cost > r.Burst:
			return fmt.Errorf("rule %d: cost %d is above its burst %d", i+2, c.Cost, r.Burst)
		case r.Tenants < 0 || r.Tenants > c.IDs:
			return fmt.Errorf("rule %d: tenants %d: want 0 (the identity) or 1..ids (%d)", i+2, r.Tenants, c.IDs)
		}
		if _, err := paramsFor(c, ruleName(i+1), r); err != nil {
			return fmt.Errorf("rule %d: %w", i+2, err)
		}
	}
	return nil
}

// ruleName is the ID of rule k of a request: the main rule's, then "sim2",
// "sim3", ...
func ruleName(k int) string {
	if k == 0 {
		return ruleID
	}
	return ruleID + strconv.Itoa(k+1)
}

// ruleRun is one rule of a multi-rule run: its parameters, its
// identities, its reference bucket, the envelope's figures derived for it
// alone and its own checker, and what the policy did with it.
type ruleRun struct {
	id      string
	spec    RuleSpec // with defaults
	params  cluster.RuleParams
	names   *idNames // its identities
	tenants int      // 0: identity i is the request's identity i
	ref     bucket.GCRA
	refTAT  []bucket.TAT
	chk     *checker
	// The envelope's figures for this rule (deriveTerms of a run of it
	// alone).
	sClean, sFault, sView int64
	terms                 []Term
	windows               []segment
	// What the policy did: Take steps charged and rejected; tokens
	// refunded, and tokens the policy refunded that the coordinator kept
	// (refundRule); Report steps (not charged: an earlier rule rejected);
	// charges that stood (admitted, not given back), by source; on_failure
	// decisions.
	takes, rejects, reports         int64
	refunded, kept, stood, degStood int64
	bySource                        [cluster.NumSources]int64
	degraded                        int64
	maxLag                          int64 // the longest time from a charge to its refund
	lateRefunds                     int64 // tokens given back after their ask's deadline (refunds.go)
	refunds                         []refundSpans
	refundTerm                      float64 // the largest refund term of one identity
	refundID                        int
}

// refundSpans holds one identity's recent refunded charges, for the
// refund term (refundTerm).
type refundSpans struct {
	spans []refundSpan
	best  float64
}

// refundSpan is a charge of cost at from, given back at to; cover is the
// cost of the refunded charges made at or before from and given back after
// it.
type refundSpan struct {
	from, to    int64
	cost, cover float64
}

// identity returns the index of this rule's identity for request
// identity i.
func (rr *ruleRun) identity(i int32) int32 {
	if rr.tenants > 0 {
		return i % int32(rr.tenants)
	}
	return i
}

// paramsFor returns the coordinator's rule id with spec r, the main
// rule's other settings.
func paramsFor(c *Config, id string, r RuleSpec) (cluster.RuleParams, error) {
	d := *c
	d.Limit, d.Window, d.Burst, d.Sketch = r.Limit, r.Window, r.Burst, 0
	return bucketForID(d, id)
}

// setupRules builds the rules of a multi-rule run: rule 0 is the main
// rule, its figures the region's own; each extra rule gets the envelope's
// figures of a run of it alone and a checker of its own.
func (rg *Region) setupRules() {
	c := &rg.cfg
	rg.multi = true
	main := RuleSpec{Limit: c.Limit, Window: c.Window, Burst: c.Burst}
	rg.rules = []*ruleRun{{id: ruleID, spec: main, params: rg.params, names: rg.ids, ref: rg.ref, refTAT: rg.refTAT,
		chk: rg.chk, sClean: rg.sClean, sFault: rg.sFault, sView: rg.sView, terms: rg.terms, windows: rg.windows}}
	for i, spec := range c.Rules {
		spec = spec.withDefaults(c)
		rr := &ruleRun{id: ruleName(i + 1), spec: spec, names: rg.ids, tenants: spec.Tenants}
		rr.params, _ = paramsFor(c, rr.id, spec)
		if spec.Tenants > 0 {
			rr.names = newIDNamesPrefix("tn-", spec.Tenants)
		}
		rr.ref, _ = bucket.NewGCRA(spec.Limit, spec.Window, spec.Burst)
		rr.refTAT = make([]bucket.TAT, len(rr.names.names))
		// The envelope's terms of this rule are those of a run of it
		// alone: deriveTerms reads only the config and the rule.
		alone := *c
		alone.Limit, alone.Window, alone.Burst = spec.Limit, spec.Window, spec.Burst
		t := &Region{cfg: alone, params: rr.params}
		t.deriveTerms()
		rr.sClean, rr.sFault, rr.sView, rr.terms, rr.windows = t.sClean, t.sFault, t.sView, t.terms, t.windows
		rr.chk = newChecker(len(rr.names.names), alone.rate()/1e9, cleanSegments(rr.windows, rg.end-T0), int64(c.Duration), false)
		rg.rules = append(rg.rules, rr)
	}
	for _, rr := range rg.rules {
		rg.allParams = append(rg.allParams, rr.params)
		rg.policyRules = append(rg.policyRules, policy.Rule{Kind: policy.Cluster})
		rr.refunds = make([]refundSpans, len(rr.names.names))
		rr.chk.refundTerm = make([]float64, len(rr.names.names))
		rr.refundID = -1
	}
}

// refPolicy decides a request of identity ident on the reference buckets
// with the request policy, and reports whether it is admitted: the
// reference of a multi-rule run is the policy over exact buckets fed in
// arrival order.
func (rg *Region) refPolicy(ident int32, now, cost int64) bool {
	var rq policy.Request
	rules := rg.policyRules
	rq.Start(rules)
	for {
		st := rq.Next(rules)
		switch st.Action {
		case policy.Done:
			return rq.Allowed()
		case policy.Take:
			rr := rg.rules[st.I]
			rq.Result(rr.ref.Allow(&rr.refTAT[rr.identity(ident)], now, cost).Allowed())
		case policy.Refund:
			rr := rg.rules[st.I]
			rr.refTAT[rr.identity(ident)] -= bucket.TAT(cost * rr.ref.Interval().Nanoseconds())
		}
	}
}

// ruleReq is one request of a multi-rule run in progress at a node: the
// request policy's state, kept while a rule's decision waits for its
// owner, and what each rule's charge was.
type ruleReq struct {
	rq      policy.Request
	ident   int32
	await   int8 // the rule whose Take waits for its owner
	live    bool
	cost    int64
	charges [maxRules]charge
}

// charge is what a Take of one rule of a request gave: admitted at at
// (virtual time; the owner's decision time for a remote admission) by src;
// refunded if the policy gave it back and the coordinator could.
type charge struct {
	at                                          int64
	src                                         cluster.Source
	taken, admitted, refunded, degraded, sketch bool
	asked                                       bool // its refund was asked of the owner: held (refunds.go)
}

// requestRules is a client request for identity ident carrying every rule
// of the run, decided step by step by the request policy.
func (n *node) requestRules(ident int, cost int64) {
	var slot int32
	if k := len(n.freeReqs); k > 0 {
		slot = n.freeReqs[k-1]
		n.freeReqs = n.freeReqs[:k-1]
	} else {
		slot = int32(len(n.reqs))
		n.reqs = append(n.reqs, ruleReq{})
	}
	r := &n.reqs[slot]
	*r = ruleReq{ident: int32(ident), cost: cost, live: true}
	r.rq.Start(n.rg.policyRules)
	n.advance(slot)
}

// advance runs request slot's policy until it waits for an owner's answer
// or is decided. A Take whose answer is pending leaves the policy's state
// in the slot; the completion continues it (continueRules).
func (n *node) advance(slot int32) {
	rg := n.rg
	for {
		r := &n.reqs[slot]
		st := r.rq.Next(rg.policyRules)
		switch st.Action {
		case policy.Done:
			n.endRules(slot, r.rq.Allowed())
			return
		case policy.Take:
			if !n.takeRule(slot, st.I) {
				return // pending: its completion continues the request
			}
		case policy.Refund:
			n.refundRule(r, st.I)
		case policy.Report:
			rg.rules[st.I].reports++
		}
	}
}

// takeRule charges rule k of request slot, as request does for the only
// rule of a one-rule run, and feeds the policy the answer; false when the
// answer is pending at the owner.
func (n *node) takeRule(slot int32, k int) bool {
	rg := n.rg
	rr := rg.rules[k]
	r := &n.reqs[slot]
	id := rr.identity(r.ident)
	rr.takes++
	var o cluster.Outcome
	if err := n.coord.DecideInto(&o, n.now(), rr.id, rr.names.keys[id], r.cost); err != nil {
		panic(err) // every rule of the run is installed
	}
	if o.Pending {
		n.waits.add(o.Ticket, -(slot + 1), r.cost)
		r.await = int8(k)
	} else {
		n.noteCharge(r, k, rg.sim.Now(), &o)
		r.rq.Result(o.Allowed)
	}
	if o.Pending || n.coord.HasReady() {
		// A flush here hands out other requests' completions: their
		// policies continue after this event (continueRules), not inside
		// the flush.
		switch n.lk.Decided(o.Pending, true, n.coord.Queued()) {
		case cluster.NudgeFlush:
			n.flush()
		case cluster.NudgeLinger:
			n.linger()
		}
	}
	return !o.Pending
}

// noteCharge records what rule k's decision of r was.
func (n *node) noteCharge(r *ruleReq, k int, at int64, o *cluster.Outcome) {
	rr := n.rg.rules[k]
	r.charges[k] = charge{at: at, src: o.Source, taken: true, admitted: o.Allowed, degraded: o.Degraded,
		sketch: o.Source == cluster.SourceSketch}
	if o.Degraded {
		n.rg.degraded++
		rr.degraded++
	}
	if !o.Allowed {
		rr.rejects++
	}
}

// refundRule gives back rule k's admission of r (Coordinator.Refund, as
// the gateway's Node does). The coordinator gives back here what this node
// holds: an owner's charge, or slack spend not yet reported; the node's own
// state, read before and after (Coordinator.Inspect, which changes
// nothing), tells whether it did. A remote owner's admission, or slack
// spend already reported, is asked of the owner: the charge is held until
// the owner gives it back or no longer can (refunds.go). A charge the
// coordinator kept (a sketch's) stood.
func (n *node) refundRule(r *ruleReq, k int) {
	rg := n.rg
	rr := rg.rules[k]
	ch := &r.charges[k]
	id := rr.identity(r.ident)
	name := rr.names.names[id]
	var before cluster.BucketState
	if ch.src == cluster.SourceOwner || ch.src == cluster.SourceSlack {
		before, _ = n.coord.Inspect(n.now(), rr.id, name)
	}
	rng, asked := n.coord.Refund(n.now(), rr.id, name, r.cost, ch.src)
	if asked {
		// The owner gives it back when the sync carrying it arrives
		// (refunds.go): it leaves as a decision's messages do.
		ch.asked = true
		rg.asked(k, r, ch, rng)
		if n.coord.HasReady() {
			switch n.lk.Decided(false, true, n.coord.Queued()) {
			case cluster.NudgeFlush:
				n.flush()
			case cluster.NudgeLinger:
				n.linger()
			}
		}
		return
	}
	given := false
	switch ch.src {
	case cluster.SourceOwner:
		after, _ := n.coord.Inspect(n.now(), rr.id, name)
		// A full bucket (nothing to wait for) has refilled past the
		// charge: giving back changes nothing, the charge is spent.
		given = before.ResetAfter == 0 || after.ResetAfter < before.ResetAfter
	case cluster.SourceSlack:
		after, _ := n.coord.Inspect(n.now(), rr.id, name)
		given = after.Unconfirmed == before.Unconfirmed-r.cost
	}
	if !given {
		rr.kept += r.cost
		return
	}
	ch.refunded = true
	rr.refunded += r.cost
	vnow := rg.sim.Now()
	rr.maxLag = max(rr.maxLag, vnow-ch.at)
	rr.noteRefund(id, ch.at, vnow, r.cost, vnow-rg.t0-rg.horizon)
}

// noteRefund adds a charge at from given back at to (virtual times) to
// identity id's refund term: the most tokens of charges made by an
// instant and given back after it, over every instant (check.go's
// refundTerm). Spans given back before old are dropped: every later
// charge lies after old.
func (rr *ruleRun) noteRefund(id int32, from, to, cost, old int64) {
	rs := &rr.refunds[id]
	keep := rs.spans[:0]
	for _, s := range rs.spans {
		if s.to-T0 >= old {
			keep = append(keep, s)
		}
	}
	rs.spans = keep
	x := refundSpan{from: from, to: to, cost: float64(cost)}
	if to > from {
		x.cover = x.cost
	}
	for i := range rs.spans {
		s := &rs.spans[i]
		if s.from <= from && from < s.to {
			x.cover += s.cost
		}
		if from <= s.from && s.from < to && s.from < s.to {
			s.cover += x.cost
			rs.best = max(rs.best, s.cover)
		}
	}
	rs.best = max(rs.best, x.cover)
	rs.spans = append(rs.spans, x)
	rr.chk.refundTerm[id] = rs.best
	if rs.best > rr.refundTerm {
		rr.refundTerm, rr.refundID = rs.best, int(id)
	}
}

// continueRules feeds the completion of request slot's pending Take to
// its policy, after the event that handed it out (a flush, whose Ready the
// request's next steps would overwrite).
func (n *node) continueRules(slot int32, at int64, o *cluster.Outcome) {
	r := &n.reqs[slot]
	n.noteCharge(r, int(r.await), at, o)
	n.conts = append(n.conts, slot)
	if !n.contSet {
		n.contSet = true
		n.rg.sim.At(n.rg.sim.Now(), n.contEv)
	}
}

// nodeCont continues the requests whose pending Take a flush completed.
type nodeCont struct {
	n   *node
	inc uint64
}

func (c *nodeCont) Fire(*engine.Sim) {
	n := c.n
	if !n.up || n.inc != c.inc {
		return
	}
	n.contSet = false
	conts := n.conts
	n.conts = nil
	for _, slot := range conts {
		r := &n.reqs[slot]
		r.rq.Result(r.charges[r.await].admitted)
		n.advance(slot)
	}
	if n.conts == nil {
		n.conts = conts[:0]
	}
}

// endRules ends request slot: each rule's charge that stood (admitted, not
// given back) is an admission of that rule, at the time it was made, for
// its checks; the request counts as admitted if the policy admitted it.
func (n *node) endRules(slot int32, allowed bool) {
	rg := n.rg
	r := &n.reqs[slot]
	last := int64(-1)
	for k, rr := range rg.rules {
		ch := &r.charges[k]
		if !ch.taken || !ch.admitted || ch.refunded || ch.asked {
			continue
		}
		rr.stand(rg, rr.identity(r.ident), r.cost, ch)
		last = max(last, ch.at)
	}
	if allowed && last >= 0 {
		rg.admitted += r.cost
		rg.series.cluster[(last-rg.t0)/rg.series.bin] += r.cost
	}
	r.live = false
	n.freeReqs = append(n.freeReqs, slot)
}

// dropRules ends the node's requests in progress, at a crash or at the end
// of the run: their charges that stood are admissions of their rules (the
// owners hold them), the requests are not admitted.
func (n *node) dropRules() {
	for slot := range n.reqs {
		if n.reqs[slot].live {
			n.endRules(int32(slot), false)
		}
	}
	n.reqs, n.freeReqs, n.conts, n.contSet = nil, nil, nil, false
}

// ruleResults returns the per-rule figures of a multi-rule run.
func (rg *Region) ruleResults() []RuleResult {
	var out []RuleResult
	for _, rr := range rg.rules {
		ch := rr.chk
		x := RuleResult{ID: rr.id, Spec: rr.spec, Takes: rr.takes, Rejects: rr.rejects, Reports: rr.reports,
			Refunded: rr.refunded, Kept: rr.kept, Stood: rr.stood, BySource: rr.bySource, Degraded: rr.degraded,
			DegradedStood: rr.degStood, RefundTerm: rr.refundTerm, RefundLag: time.Duration(rr.maxLag), LateRefunds: rr.lateRefunds,
			S: rr.sClean, SFault: rr.sFault,
			Excess: ch.worstAcc - float64(rr.spec.Burst), ExcessAll: ch.worstAll - float64(rr.spec.Burst),
			ExcessClean: ch.worstClean - float64(rr.spec.Burst), ExcessRaw: ch.worstAccRaw - float64(rr.spec.Burst)}
		if rr.tenants > 0 {
			x.Identity = "tn-(i mod " + strconv.Itoa(rr.tenants) + ")"
		} else {
			x.Identity = "id-i"
		}
		x.Bound = float64(rr.sClean)
		if len(rr.terms) > 0 {
			x.Bound = float64(rr.sFault)
			for _, t := range rr.terms {
				x.Bound += t.Tokens
			}
		}
		if i := ch.worstAccID; i >= 0 && i < len(rr.names.names) {
			x.WorstID = rr.names.names[i]
		}
		if rr.refundID >= 0 {
			x.RefundID = rr.names.names[rr.refundID]
		}
		out = append(out, x)
	}
	return out
}

// RuleResult is what a multi-rule run measured for one of its rules. Its
// admissions are its charges that stood: admitted and not given back (a
// refunded charge admitted nothing). Each identity's excess is scored
// beyond its refund term (check.go).
type RuleResult struct {
	ID       string
	Spec     RuleSpec // with defaults
	Identity string   // what its identity is: id-i, or tn-(i mod K)
	// Takes are its charges and Rejects those it rejected; Reports the
	// requests it was not charged for (an earlier rule rejected them).
	Takes, Rejects, Reports int64
	// Refunded is the tokens given back; Kept the tokens the policy gave
	// back that were not (a sketch's admission, a refund asked of the
	// owner that it did not give back in time); Stood the tokens admitted
	// and not given back, BySource split by how they were decided.
	Refunded, Kept, Stood int64
	BySource              [cluster.NumSources]int64
	// Degraded counts its on_failure decisions, DegradedStood their tokens
	// that stood.
	Degraded, DegradedStood int64
	// RefundTerm is the largest refund term of one identity (RefundID):
	// the most tokens of its charges made by an instant and given back
	// after it. RefundLag is the longest time from a charge to its refund.
	RefundTerm float64
	RefundID   string
	RefundLag  time.Duration
	// LateRefunds is the tokens an owner gave back after the simulator
	// counted their charges as stood (refunds.go): a simulator error,
	// reported as a violation.
	LateRefunds int64
	// S and SFault are the rule's S figures; Bound its upper bound on the
	// excess beyond the refund term (S, or SFault plus the fault terms).
	S, SFault int64
	Bound     float64
	// Excess is the worst excess over B + r·Δ + the identity's refund term
	// of its accounted admissions (WorstID), ExcessAll of all of them,
	// ExcessClean in fault-free intervals; ExcessRaw the worst accounted
	// excess over B + r·Δ alone.
	Excess, ExcessAll, ExcessClean, ExcessRaw float64
	WorstID                                   string
}

// checkRules adds the violations of the extra rules' envelopes (rule 0's
// are the run's own checks).
func (r *Result) checkRules() {
	for _, x := range r.Rules {
		if x.LateRefunds > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("rule %s: %d tokens given back after their charges were counted as stood (the ask's deadline is too short)",
				x.ID, x.LateRefunds))
		}
	}
	for _, x := range r.Rules[min(1, len(r.Rules)):] {
		if x.Excess > x.Bound+eps {
			r.Violations = append(r.Violations, fmt.Sprintf("rule %s: upper envelope: excess %.3f over B + r·Δ + refund term (%s) above the bound %.3f",
				x.ID, x.Excess, x.WorstID, x.Bound))
		}
		if x.ExcessAll > x.Bound+float64(x.DegradedStood)+eps {
			r.Violations = append(r.Violations, fmt.Sprintf("rule %s: upper envelope: excess %.3f (all admissions) above the bound %.3f + %d degraded",
				x.ID, x.ExcessAll, x.Bound, x.DegradedStood))
		}
		if x.ExcessClean > float64(x.S)+eps {
			r.Violations = append(r.Violations, fmt.Sprintf("rule %s: upper envelope: excess %.3f in a fault-free interval above S = %d", x.ID, x.ExcessClean, x.S))
		}
	}
}

// ruleLabel is how the summary names a rule's parameters.
func (x *RuleResult) ruleLabel() string {
	return fmt.Sprintf("%d/%v burst %d", x.Spec.Limit, x.Spec.Window, x.Spec.Burst)
}

// summarizeRuleList writes the header line of a multi-rule run: its rules
// in the order the policy charges them.
func (r *Result) summarizeRuleList(w io.Writer) {
	parts := make([]string, len(r.Rules))
	for i := range r.Rules {
		x := &r.Rules[i]
		parts[i] = fmt.Sprintf("%s %s on %s", x.ID, x.ruleLabel(), x.Identity)
	}
	fmt.Fprintf(w, "rules (every request, in this order, by the request policy): %s\n", strings.Join(parts, "; "))
}

// summarizeRules writes the per-rule tables of a multi-rule run: what the
// policy did with each rule, and each rule's envelope.
func (r *Result) summarizeRules(w io.Writer) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "rule\tcharged\trejected\tnot charged\trefunded\tkept\tstood\tby owner/slack/remote/on_failure\t\n")
	for i := range r.Rules {
		x := &r.Rules[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d/%d/%d\t\n", x.ID, x.Takes, x.Rejects, x.Reports, x.Refunded, x.Kept, x.Stood,
			x.BySource[cluster.SourceOwner], x.BySource[cluster.SourceSlack], x.BySource[cluster.SourceRemote], x.BySource[cluster.SourceFailure])
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "rule\tworst excess (identity)\tbound\tfault-free\tS\trefund term (identity)\tcharge to refund\texcess over B + r·Δ alone\tok\t\n")
	for i := range r.Rules {
		x := &r.Rules[i]
		ok := "yes"
		if x.Excess > x.Bound+eps || x.ExcessAll > x.Bound+float64(x.DegradedStood)+eps || x.ExcessClean > float64(x.S)+eps {
			ok = "NO"
		}
		worst, refund := "", ""
		if x.WorstID != "" {
			worst = " (" + x.WorstID + ")"
		}
		if x.RefundID != "" {
			refund = " (" + x.RefundID + ")"
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%d\t%s%s\t%v\t%s\t%s\t\n", x.ID, fmtTok(x.Excess), worst, fmtTok(x.Bound), fmtTok(x.ExcessClean), x.S,
			fmtTok(x.RefundTerm), refund, x.RefundLag, fmtTok(x.ExcessRaw), ok)
	}
	tw.Flush()
	fmt.Fprintln(w, "  stood: admitted and not refunded (the excess counts these, beyond each identity's refund term)")
	fmt.Fprintln(w, "  kept: refunds not given back (a sketch's admission; a refund asked of the owner that did not reach it in time)")
}
