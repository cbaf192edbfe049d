package weir

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/internal/policy"
	"github.com/weir-dev/weir/quota"
)

// engine is one rule set compiled for deciding: immutable, swapped whole on
// every reload, so a decision sees one consistent version.
type engine struct {
	set   *quota.Set
	rules []crule
	needs inputs // the request attributes some rule reads
}

type engineHolder struct{ p atomic.Pointer[engine] }

func (h *engineHolder) load() *engine   { return h.p.Load() }
func (h *engineHolder) store(e *engine) { h.p.Store(e) }

// crule is one compiled rule.
type crule struct {
	r          *quota.Rule
	salt       uint64    // mixed with the identity hash so rules never share a key
	hist       *ruleHist // the rule's generations: what its entries' tags mean
	keys       keyForm   // per key-chain source: the namespaces of keyFormatNamespaced (keys.go)
	base       limitSpec
	overrides  []map[string]*overrideSpec // by key-chain source: identity → its override's limits; nil without overrides
	tiers      map[string]*limitSpec
	tierIdx    map[string]int // a tier's position in r.Tiers
	penalty    *bucket.Penalty
	penaltyRec *bucket.PenaltyRecorder
	stats      *ruleStats
	// durable: the rule is decided through the lease group (durable: true
	// and a node with Config.Lease; New refuses a durable rule without it).
	durable bool
}

// limitSpec is a rule's limits for one class of identity (the rule itself,
// an override, a tier) and the limiter enforcing them.
type limitSpec struct {
	cid    string // the coordinator's rule id when the cluster decides it
	lim    limiter
	p      *params  // what lim's entries depend on
	rel    releaser // lim as a releaser, nil for algorithms that hold nothing
	limit  int64
	burst  int64
	window time.Duration
}

// overrideSpec is an override's limits under no tier (or one the rule does
// not name) and under each of the rule's tiers: a field the override
// leaves out is the tier's. Each has its own limiter, as entries record the
// tier they were written under (rulegen.go).
type overrideSpec struct {
	limitSpec
	tiers []*limitSpec // by the tier's position in the rule's Tiers; nil without tiers
}

// install compiles set and makes it the one in force. It costs O(rules),
// whatever the number of live keys: entries are converted to changed rules
// lazily (rulegen.go).
func (n *Node) install(set *quota.Set) {
	h := &n.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	now := n.now()
	e := &engine{set: set, rules: make([]crule, set.Len())}
	for i := range e.rules {
		r := set.Rule(i)
		c := &e.rules[i]
		c.r = r
		if r.Shadow && slices.Contains(r.EnforceRegions, n.region()) {
			// Shadowed elsewhere, enforced in this node's region.
			c.r.Shadow = false
		}
		for _, k := range r.Key {
			e.needs.ip = e.needs.ip || k.Kind == quota.KeyIP
			e.needs.user = e.needs.user || k.Kind == quota.KeyUser
		}
		e.needs.tier = e.needs.tier || len(r.Tiers) > 0
		c.stats = n.statsFor(r.ID)
		// NewSet validated the rule, so building its limiters cannot fail;
		// a failure here is a bug in the validation, reported loudly.
		spec := func(what string, limit, burst int64) *limitSpec {
			s, err := n.stores.spec(r, limit, burst)
			if err != nil {
				panic(fmt.Sprintf("weir: rule %q%s passed validation but does not compile: %v", r.ID, what, err))
			}
			return &s
		}
		c.base = *spec("", r.Limit, r.Burst)
		if len(r.Overrides) > 0 {
			c.overrides = make([]map[string]*overrideSpec, max(1, len(r.Key)))
			for _, o := range r.Overrides {
				src := c.sourceIndex(o.Source)
				if src < 0 {
					panic(fmt.Sprintf("weir: rule %q override %q: source %v passed validation but is not in the key chain", r.ID, o.Identity, o.Source))
				}
				if c.overrides[src] == nil {
					c.overrides[src] = make(map[string]*overrideSpec)
				}
				l, b := r.LimitsForSource(o.Source, o.Identity, "")
				ov := &overrideSpec{limitSpec: *spec(" override "+o.Identity, l, b)}
				if len(r.Tiers) > 0 {
					ov.tiers = make([]*limitSpec, len(r.Tiers))
					for i, t := range r.Tiers {
						l, b := r.LimitsForSource(o.Source, o.Identity, t.Name)
						ov.tiers[i] = spec(" override "+o.Identity+" tier "+t.Name, l, b)
					}
				}
				c.overrides[src][o.Identity] = ov
			}
		}
		if len(r.Tiers) > 0 {
			c.tiers = make(map[string]*limitSpec, len(r.Tiers))
			c.tierIdx = make(map[string]int, len(r.Tiers))
			for i, t := range r.Tiers {
				l, b := r.LimitsFor("", t.Name)
				c.tiers[t.Name] = spec(" tier "+t.Name, l, b)
				c.tierIdx[t.Name] = i
			}
		}
		n.bindHistory(c, now)
		n.compileKeys(c) // from the salt of the incarnation bindHistory bound
		if r.Penalty != nil {
			p, err := bucket.NewPenalty(bucket.PenaltyConfig{Threshold: r.Penalty.After, Window: r.Penalty.Within, Base: r.Penalty.Base, Max: r.Penalty.Max})
			if err != nil {
				panic(fmt.Sprintf("weir: rule %q penalty does not compile: %v", r.ID, err))
			}
			c.penalty = &p
			rec := p.Recorder()
			c.penaltyRec = &rec
		}
	}
	n.hist.installed(e, n.stores)
	n.globalRules(e)
	n.clusterRules(e)
	for i := range e.rules {
		if c := &e.rules[i]; c.r.Durable && c.r.Algorithm == quota.AlgorithmGCRA && n.lease != nil {
			// The lease group decides it, not the ring: clusterRules
			// skipped it; no spec of it goes to the coordinator.
			c.durable = true
			c.base.cid = ""
			for _, m := range c.overrides {
				for _, o := range m {
					o.cid = ""
					for _, s := range o.tiers {
						s.cid = ""
					}
				}
			}
			for _, s := range c.tiers {
				s.cid = ""
			}
		}
	}
	n.eng.store(e)
}

// specFor returns the limits that apply to identity, yielded by source src
// of the key chain (0 for the first), under tier: an override matches
// within its source's namespace only.
func (c *crule) specFor(identity string, src int, tier string) *limitSpec {
	if c.overrides != nil && src < len(c.overrides) {
		if o, ok := c.overrides[src][identity]; ok {
			if i, ok := c.tierIdx[tier]; ok && tier != "" {
				return o.tiers[i]
			}
			return &o.limitSpec
		}
	}
	if c.tiers != nil && tier != "" {
		if s, ok := c.tiers[tier]; ok {
			return s
		}
	}
	return &c.base
}

// identity walks the rule's key chain: the first source with a value wins,
// and its position in the chain is the identity's namespace (keys.go). A
// chain that yields nothing, or a global rule, counts under "" (source 0):
// no source yields an empty value, so that bucket is every caller's.
func (c *crule) identity(req *Request) (string, int) {
	for i, k := range c.r.Key {
		switch k.Kind {
		case quota.KeyHeader:
			if v := req.Header[k.Name]; len(v) > 0 && v[0] != "" {
				return v[0], i
			}
		case quota.KeyUser:
			if req.User != "" {
				return req.User, i
			}
		case quota.KeyIP:
			if ip := req.clientIP(); ip != "" {
				return ip, i
			}
		case quota.KeyGlobal:
			return "", 0
		}
	}
	return "", 0
}

// pending is one rule's part of a request while it is being decided.
type pending struct {
	order int            // position among the request's rules
	src   cluster.Source // how a cluster rule decided, for a refund
	// source is the identity's position in the rule's key chain, format
	// the key format it was keyed under (keys.go).
	source uint8
	format uint32
	c      *crule
	spec   *limitSpec
	id     string // the identity as its source yielded it (decisions, events and lists show it)
	wid    string // the identity the cluster's owner and the lease group count it under (keys.go); id unless namespaced
	idh    uint64 // n.hasher.Sum(wid): the cluster's Shell picks its shard by it
	key    uint64
	cost   int64
	// slot is the concurrency slot that the identity's owner holds for
	// this request (a cluster-decided concurrency rule's admission), nil
	// for none.
	slot *clusterSlot
}

// ident returns p's identity as its rule's variants are picked by.
func (p *pending) ident() ident { return ident{p.id, int(p.source)} }

// newPending returns rule c's part of a request of identity id under spec
// with format 1's key (namespace moves it to its namespace), idh being
// n.hasher.Sum(id): the identity is hashed once, for its key and for the
// cluster's shard. (The caller hashes, so that this inlines on the decision
// path.)
func newPending(order int, c *crule, spec *limitSpec, id string, idh uint64, cost int64) pending {
	return pending{order: order, c: c, spec: spec, id: id, wid: id, idh: idh, key: bucket.Mix(c.salt, idh), cost: cost}
}

// prefetch starts loading what deciding p will read first at random (a
// gated rule's sketch counters and the reject cache's entry in the
// cluster's Shell, and the recent counts' cells it adds to after), so that
// those cache misses overlap the rest of the request's preparation (the
// clock read) instead of stalling the decision. It changes nothing.
func (n *Node) prefetch(p *pending) {
	if p.spec.cid != "" {
		n.cluster.shell.Prefetch(p.idh, p.spec.cid, p.wid)
	}
	n.ops.recent.prefetch(p.key)
}

// remote reports whether p is decided over the network (by the identity's
// owner in the ring, or by the lease group for a durable rule), so that it
// cannot be looked at without a charge.
func (p *pending) remote() bool { return p.spec.cid != "" || p.c.durable }

// latencySampleMask samples one decision in 64 for the latency histogram.
const latencySampleMask = 63

// Allow decides one request against every rule that applies to it. All
// enforced rules must pass; when several apply, a request that one of them
// rejects charges none of the node-local ones. Shadow rules are charged as
// if enforced when the request is admitted, and never reject. Rules decided
// by the cluster (mode shared or exact with Config.Cluster set) cost no
// network call while a node's slack lasts; a request beyond it waits for
// the identity's owner, bounded by the decide timeout and by ctx. Durable
// rules cost one Raft commit of the lease group each, bounded by
// Config.Lease.DurableTimeout and by ctx (docs/durable.md). Allow is safe
// for concurrent use.
func (n *Node) Allow(ctx context.Context, req Request) (d Decision) {
	n.decide(ctx, &req, &d)
	return d
}

// decide is Allow deciding req into d, which is zero.
func (n *Node) decide(ctx context.Context, req *Request, d *Decision) {
	sampled := rand.Uint32()&latencySampleMask == 0
	var t0 time.Time
	if sampled {
		t0 = time.Now()
	}
	n.allow(ctx, req, d)
	d.finish()
	if sampled {
		n.metrics.observeLatency(time.Since(t0))
	}
}

// allow decides req into d, which is zero.
func (n *Node) allow(ctx context.Context, req *Request, d *Decision) {
	e := n.eng.load()
	d.Allowed, d.limiting = true, -1
	var mbuf [16]int
	idx := e.set.Match(req.Method, req.Path, mbuf[:0])
	if len(idx) == 0 {
		return // no rule applies: no clock read either
	}
	now := n.now()
	d.now = now
	d.At = time.Unix(0, now)
	format := n.keyFormat.Load()

	var pbuf [inlineResults]pending
	var rbuf [inlineResults]policy.Rule
	ps, rules := pbuf[:0], rbuf[:0]
	for _, i := range idx {
		c := &e.rules[i]
		id, src := c.identity(req)
		if len(id) > n.maxID {
			d.Allowed = false
			d.Err = fmt.Errorf("%w: rule %s: %d bytes, the cap is %d", ErrIdentityTooLong, c.r.ID, len(id), n.maxID)
			return
		}
		cost := req.Cost
		if cost <= 0 {
			cost = c.r.CostFor(req.Method)
		}
		ps = append(ps, newPending(len(ps), c, c.specFor(id, src, req.Tier), id, n.hasher.Sum(id), cost))
		ps[len(ps)-1].format, ps[len(ps)-1].source = format, uint8(src)
		if namespaced(format, src, id) {
			n.namespace(&ps[len(ps)-1], src)
		}
		n.prefetch(&ps[len(ps)-1])
		rules = append(rules, policy.Rule{Kind: ps[len(ps)-1].kind(), Shadow: c.r.Shadow})
	}
	n.decideRules(ctx, d, ps, rules, now)
}

// decideRules carries out the multi-rule policy of a request
// (internal/policy: look before charging, cluster rules first with
// refunds, durable rules last, shadow rules after) on its rules' stores,
// reporting every rule into d.
func (n *Node) decideRules(ctx context.Context, d *Decision, ps []pending, rules []policy.Rule, now int64) {
	if policy.Single(rules) {
		n.record(ctx, d, &ps[0], now)
		return
	}
	var rq policy.Request
	rq.Start(rules)
	// The look that rejected: ReportLook reports it as it was.
	var looked bucket.Decision
	var lookLocked bool
	for {
		st := rq.Next(rules)
		if st.Action == policy.Done {
			return
		}
		p := &ps[st.I]
		switch st.Action {
		case policy.Look:
			looked, lookLocked = n.peek(p, now)
			rq.Result(looked.Allowed)
		case policy.Take:
			rq.Result(n.record(ctx, d, p, now))
		case policy.Refund:
			n.refundCluster(p)
		case policy.Report:
			n.reportUncharged(d, p, now)
		case policy.ReportLook:
			n.report(d, p, looked, lookLocked, now, false, false)
		}
	}
}

// kind returns how p's rule is decided, for the policy.
func (p *pending) kind() policy.Kind {
	switch {
	case p.c.durable:
		return policy.Durable
	case p.spec.cid != "":
		return policy.Cluster
	}
	return policy.Local
}

// peek evaluates p without charging anything. A cluster rule cannot be
// looked at without asking its owner, nor a durable rule without a Raft
// commit: it reports this node's fallback bucket as it stands.
func (n *Node) peek(p *pending, now int64) (bucket.Decision, bool) {
	if bd, locked := n.locked(p, now); locked {
		return bd, true
	}
	if p.remote() {
		bd := p.spec.lim.peek(p.key, p.ident(), now, 0)
		bd.Allowed, bd.RetryAfter = true, 0
		return bd, false
	}
	return p.spec.lim.peek(p.key, p.ident(), now, p.cost), false
}

// locked reports whether p's identity sits in the rule's penalty box, with
// the box's decision (RetryAfter until the lockout ends).
func (n *Node) locked(p *pending, now int64) (bucket.Decision, bool) {
	if p.c.penalty == nil {
		return bucket.Decision{}, false
	}
	bd := n.stores.penalty.Apply(p.c.hist.penaltyKey(p.key), now, p.c.penalty, 0)
	return bd, !bd.Allowed
}

// reportUncharged reports rule p of a request that another rule rejected:
// nothing is charged; a rule that would have rejected too says so, one that
// would have passed reports its state as it stands.
func (n *Node) reportUncharged(d *Decision, p *pending, now int64) {
	bd, locked := n.peek(p, now)
	if bd.Allowed && !p.remote() { // a remote rule's peek is already the state as it stands
		bd = p.spec.lim.peek(p.key, p.ident(), now, 0)
		bd.Allowed = true
	}
	n.report(d, p, bd, locked, now, false, false)
}

// record charges p, reports the outcome into d and returns whether p's
// rule admitted.
func (n *Node) record(ctx context.Context, d *Decision, p *pending, now int64) bool {
	var bd bucket.Decision
	locked, degraded := false, false
	switch bd, locked = n.locked(p, now); {
	case locked:
	case p.c.durable:
		bd, degraded = n.decideDurable(ctx, p)
	case p.spec.cid != "":
		bd, degraded = n.decideCluster(ctx, p, now)
	default:
		bd = p.spec.lim.take(p.key, p.ident(), now, p.cost)
	}
	n.report(d, p, bd, locked, now, true, degraded)
	return bd.Allowed
}

// report turns one rule's bucket decision into the request's result. A
// rejection is always counted (and fed to the penalty box and the
// heavy-hitter sketches); an admission only when it was charged, so a rule
// that a request passed but another rule rejected counts nothing.
func (n *Node) report(d *Decision, p *pending, bd bucket.Decision, locked bool, now int64, charged, degraded bool) {
	c := p.c
	r := d.next()
	r.Rule = c.r.ID
	r.Identity = p.id
	r.Limit, r.Window, r.Burst, r.Cost = p.spec.limit, p.spec.window, p.spec.burst, p.cost
	r.Allowed, r.Shadow, r.Locked = bd.Allowed, c.r.Shadow, locked
	r.Remaining, r.Reset, r.RetryAfter, r.Delay = bd.Remaining, bd.Reset, bd.RetryAfter, bd.Delay
	r.release, r.key, r.order, r.charged = p.spec.rel, p.key, int32(p.order), charged
	if p.spec.cid != "" && p.spec.rel != nil {
		// A cluster-decided concurrency rule: the slot is the owner's, or,
		// decided by on_failure, this node's own (local) or none.
		r.release, r.slot = nil, p.slot
		if p.src == cluster.SourceFailure && p.c.r.OnFailure == quota.OnFailureLocal {
			r.release = p.spec.rel
		}
	}
	if degraded {
		r.Degraded, d.Degraded = true, true
		n.ops.events.add(now, EventFailOpen, c.r.ID, failOpenReason(c.durable, c.r.OnFailure), p.id)
		if c.durable {
			n.noteDurableDegraded(c, p, now)
		} else {
			n.noteDegraded(c, p, now)
		}
	}
	stripe := p.key
	switch {
	case bd.Allowed:
		if charged {
			c.stats.allowed.add(stripe)
			n.ops.recent.add(p.key, now, false)
		}
	case c.r.Shadow:
		r.Allowed = true
		r.ShadowRejected = true
		c.stats.shadow.add(stripe)
		n.ops.recent.add(p.key, now, true) // a would-be rejection
		n.addHitter(n.shadowed, now, p)
	default:
		d.Allowed = false
		c.stats.rejected.add(stripe)
		n.ops.recent.add(p.key, now, true)
		n.addHitter(n.throttled, now, p)
		if c.penalty != nil && !locked {
			if bl := n.stores.penalty.Apply(p.c.hist.penaltyKey(p.key), now, c.penaltyRec, 1); !bl.Allowed {
				c.stats.lockouts.add(stripe)
			}
		}
	}
	if r.Allowed && !r.Shadow && r.Delay > d.Delay {
		d.Delay = r.Delay
	}
}

// Check charges cost to key under one rule, the way a gateway asks "may this
// key spend cost now?" outside HTTP. cost <= 0 means the rule's cost. It
// returns ErrUnknownRule for an id not in the rule set in force, and
// ErrIdentityTooLong for an oversized key.
func (n *Node) Check(ctx context.Context, key, ruleID string, cost int64) (CheckResult, error) {
	e := n.eng.load()
	i, ok := e.set.Lookup(ruleID)
	if !ok {
		return CheckResult{}, fmt.Errorf("%w: %q (rule set version %d)", ErrUnknownRule, ruleID, e.set.Version())
	}
	if len(key) > n.maxID {
		return CheckResult{}, fmt.Errorf("%w: %d bytes, the cap is %d", ErrIdentityTooLong, len(key), n.maxID)
	}
	c := &e.rules[i]
	if cost <= 0 {
		cost = c.r.Cost
	}
	p := n.pendingFor(0, c, key, 0, "", n.keyFormat.Load(), cost)
	n.prefetch(&p)
	now := n.now()
	d := Decision{Allowed: true, limiting: -1, now: now}
	n.record(ctx, &d, &p, now)
	r := d.Results()[0]
	if r.charged && r.Allowed && !r.ShadowRejected {
		// Check has no request end to release at; a concurrency slot taken
		// here is released at once, so Check only tells whether one is free.
		if r.release != nil {
			r.release.release(p.key, now, cost)
		}
		r.slot.release()
	}
	return CheckResult{
		Allowed:        r.Allowed,
		ShadowRejected: r.ShadowRejected,
		Remaining:      r.Remaining,
		ResetAt:        time.Unix(0, now).Add(r.Reset),
		RetryAfter:     r.RetryAfter,
		Limit:          r.Limit,
		Window:         r.Window,
		Burst:          r.Burst,
	}, nil
}
