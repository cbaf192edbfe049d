package weir

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/quota"
)

// This file is the thin shell around lease.Regional (lease/regional.go): a
// node that is in a region's cluster and connected to the lease group
// enforces its `scope: global` rules at its region's share. On the owner
// of an identity the coordinator decides at the share (through the Shares
// hook this type implements); every RefreshInterval (and soon after a new
// identity appears) one batched Report of every global identity this node
// owns goes to the lease group, bounded by the node's context and a
// timeout, and the grants come back into the Holders. A report that fails
// changes nothing: the leases expire into their fallback by themselves, and
// no request ever waits for the lease group. docs/global.md has the whole
// story and the envelope.

// globalPart is a node's region-side lease manager.
type globalPart struct {
	mu  sync.Mutex // guards reg
	reg *lease.Regional

	rep     raftgroup.Reporter
	self    string
	events  *eventLog // the node's, for fallback events on the status page
	regions int       // the lease machine's regions: a node's slack is a ÷ regions of the limit's (slackAccuracy)
	every   time.Duration
	timeout time.Duration
	ring    func() *cluster.Ring // nil until the cluster runs
	now     func() int64
	skew    int64 // the machine's skew margin, ns: a lease ends at send + lifetime − skew
	log     *slog.Logger

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
	ctx  context.Context

	reports, failures atomic.Uint64
	lastLog           atomic.Int64
}

var _ cluster.Shares = (*globalPart)(nil)

// startGlobal builds the region-side lease manager when the node is both in
// a cluster and connected to the lease group, and its region is one the
// lease machine knows. It does not start reporting: runGlobal does, once
// the cluster runs.
func (n *Node) startGlobal() {
	lp, cc := n.lease, n.cfg.Cluster
	if lp == nil || cc == nil {
		return
	}
	lc := n.cfg.Lease
	mc := lc.Machine
	if lc.Voter != nil {
		mc = lc.Voter.Machine
	}
	if !slices.Contains(mc.Regions, cc.Region) {
		n.log.Error("global rules are not leased: this node's region is not among the lease machine's regions (Config.Lease.Machine.Regions for a client); they are enforced per region at the full limit",
			"region", cc.Region, "regions", mc.Regions)
		return
	}
	life := mc.LeaseDuration
	if life <= 0 {
		life = lease.DefaultLeaseDuration
	}
	every := lc.RefreshInterval
	if every <= 0 {
		every = life / 5
	}
	reg, err := lease.NewRegional(lease.RegionalConfig{Reporter: cc.Name, Region: cc.Region, Regions: len(mc.Regions),
		Skew: mc.MaxSkew, Interval: every, FirstSeq: uint64(n.now())})
	if err != nil {
		n.log.Error("global rules are not leased", "err", err)
		return
	}
	skew := mc.MaxSkew
	if skew <= 0 {
		skew = lease.DefaultMaxSkew
	}
	gp := &globalPart{reg: reg, self: cc.Name, regions: len(mc.Regions), events: &n.ops.events, every: every, timeout: every, now: n.now,
		skew: int64(skew), log: n.log, kick: make(chan struct{}, 1), done: make(chan struct{}), ctx: lp.ctx}
	if lp.group != nil {
		gp.rep = lp.group
	} else {
		gp.rep = lp.client
	}
	n.global = gp
}

// shares is the coordinator's Shares hook: nil (an untyped nil interface)
// when global rules are not leased.
func (n *Node) shares() cluster.Shares {
	if n.global == nil {
		return nil
	}
	return n.global
}

// runGlobal starts the report loop once the cluster runs.
func (n *Node) runGlobal() {
	gp := n.global
	if gp == nil || n.cluster == nil {
		return
	}
	gp.ring = n.cluster.shell.Ring
	gp.wg.Add(1)
	go n.reportLoop()
	if n.ops.leases.Load() == nil {
		n.setLeaseShareSource(nodeShares{n})
	}
}

// nodeShares is the status page's leaseShareSource of a node that leases
// global rules: its own region's shares of the identities it owns (the
// owners of other identities, and other regions, report theirs on their
// own pages).
type nodeShares struct{ n *Node }

// LeaseShares implements leaseShareSource: per global rule, the sum of the
// shares this node holds, as a rate, and whether any of its identities is
// on the fallback.
func (s nodeShares) LeaseShares() []LeaseShare {
	st := s.n.globalStatus()
	if !st.Leasing {
		return nil
	}
	windows := map[string]time.Duration{}
	e := s.n.eng.load()
	for i := range e.rules {
		windows[e.rules[i].r.ID] = e.rules[i].r.Window
	}
	out := make([]LeaseShare, 0, len(st.Rules))
	for _, r := range st.Rules {
		if r.Leased == 0 && r.Fallback == 0 {
			continue
		}
		ls := LeaseShare{Rule: r.Rule, Region: s.n.region(), Fallback: r.Fallback > 0}
		if w := windows[r.Rule]; w > 0 {
			ls.Rate = float64(r.Share) / w.Seconds()
		}
		out = append(out, ls)
	}
	return out
}

// stopGlobal stops the report loop (before the lease connection closes).
func (n *Node) stopGlobal() {
	gp := n.global
	if gp == nil || gp.ring == nil {
		return
	}
	select {
	case <-gp.done:
	default:
		close(gp.done)
	}
	gp.wg.Wait()
}

// globalRules installs a rule set's global rules in the manager (before the
// coordinator gets them, which asks Leases). A global rule is leased when
// the cluster decides it (gcra, mode shared or exact, not durable); a
// global rule in mode local is enforced per node, as before.
func (n *Node) globalRules(e *engine) {
	gp := n.global
	if gp == nil {
		return
	}
	var rules []lease.RegionalRule
	for i := range e.rules {
		r := e.rules[i].r
		if r.Scope != quota.ScopeGlobal || r.Algorithm != quota.AlgorithmGCRA || r.Durable ||
			(r.Mode != quota.ModeShared && r.Mode != quota.ModeExact) {
			continue
		}
		maxCost := r.CostFor("")
		for _, c := range r.CostByMethod {
			maxCost = max(maxCost, c)
		}
		fb := lease.FallbackShare
		switch r.OnFailure {
		case quota.OnFailureOpen:
			fb = lease.FallbackOpen
		case quota.OnFailureClosed:
			fb = lease.FallbackClosed
		}
		rules = append(rules, lease.RegionalRule{Fallback: fb,
			Rule: lease.Rule{ID: r.ID, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MaxCost: maxCost}})
	}
	gp.mu.Lock()
	err := gp.reg.SetRules(rules)
	gp.mu.Unlock()
	if err != nil {
		n.log.Error("global rules not leased; the previous ones stay", "err", err)
	}
}

// slackAccuracy is the accuracy the coordinator's slack of a leased global
// rule is computed with: the rule's a ÷ regions, so that a node of a region
// of N holds ⌊a·L ÷ (R·N)⌋ and all regions' nodes together Σᵣ Nᵣ·sᵣ ≤ a·L:
// the in-region slack comes out of the global limit once, not once per
// region (docs/global.md, the envelope). The owner decides at the region's
// share either way.
func (gp *globalPart) slackAccuracy(a float64) float64 {
	if a == 0 {
		a = quota.DefaultAccuracy
	}
	return a / float64(max(gp.regions, 1))
}

// Leases implements cluster.Shares.
func (gp *globalPart) Leases(rule string) bool {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	return gp.reg.Leases(rule)
}

// Share implements cluster.Shares.
func (gp *globalPart) Share(now int64, rule, identity string, tat *bucket.TAT) (bucket.GCRA, cluster.ShareMode) {
	gp.mu.Lock()
	g, mode, ok := gp.reg.Share(now, rule, identity, tat)
	urgent := gp.reg.Urgent()
	expired := ok && gp.reg.Expired(now, rule, identity)
	gp.mu.Unlock()
	if expired && gp.events != nil {
		// For the status page; weir_global_fallback counts identities.
		gp.events.add(now, EventFallback, rule, "lease expired: the region enforces its fallback", identity)
	}
	if urgent {
		select {
		case gp.kick <- struct{}{}:
		default:
		}
	}
	switch {
	case !ok || mode == lease.ModeAdmit:
		return g, cluster.ShareAdmit
	case mode == lease.ModeReject:
		return g, cluster.ShareReject
	}
	return g, cluster.ShareEnforce
}

// Observe implements cluster.Shares.
func (gp *globalPart) Observe(now int64, rule, identity string, cost int64, allowed bool, tat bucket.TAT) {
	gp.mu.Lock()
	gp.reg.Observe(now, rule, identity, cost, allowed, tat)
	gp.mu.Unlock()
}

// reportLoop reports every RefreshInterval (every global identity this
// node owns), and off cycle, at most once per Regional's gap, the
// identities whose demand or lease changed (lease.Regional.ReportDue
// decides which): it asks every gap, and soon after a new identity appears.
func (n *Node) reportLoop() {
	gp := n.global
	defer gp.wg.Done()
	t := time.NewTicker(gp.every)
	defer t.Stop()
	gp.mu.Lock()
	gap := gp.reg.Gap()
	gp.mu.Unlock()
	poll := time.NewTicker(gap)
	defer poll.Stop()
	var last time.Time
	for {
		offCycle := true
		select {
		case <-gp.done:
			return
		case <-gp.ctx.Done():
			return
		case <-t.C:
			offCycle = false
		case <-poll.C:
		case <-gp.kick:
			if wait := gap - time.Since(last); wait > 0 {
				pause := time.NewTimer(wait)
				select {
				case <-gp.done:
					pause.Stop()
					return
				case <-pause.C:
				}
			}
		}
		if n.reportOnce(offCycle) {
			last = time.Now()
		}
	}
}

// reportOnce sends one report, periodic (every global identity this node
// owns) or off cycle (those due), and takes the grants. It reports whether
// a report was sent.
func (n *Node) reportOnce(offCycle bool) bool {
	gp := n.global
	ring := gp.ring()
	owns := func(identity string) bool {
		if ring == nil {
			return true
		}
		m, ok := ring.Owner(identity)
		return !ok || m.Name == gp.self
	}
	sentAt := gp.now()
	gp.mu.Lock()
	var rep lease.Report
	var ok bool
	if offCycle {
		rep, ok = gp.reg.ReportDue(sentAt, owns)
	} else {
		rep, ok = gp.reg.Report(sentAt, owns)
	}
	gp.mu.Unlock()
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(gp.ctx, gp.timeout)
	res, err := gp.rep.Report(ctx, rep)
	cancel()
	if err != nil {
		gp.failures.Add(1)
		if last := gp.lastLog.Load(); sentAt-last >= int64(time.Second) && gp.lastLog.CompareAndSwap(last, sentAt) {
			n.log.Warn("lease group: report failed; leases expire into their fallback unless a later report succeeds",
				"items", len(rep.Items), "err", err)
		}
		return true
	}
	gp.reports.Add(1)
	gp.mu.Lock()
	gp.reg.Accept(rep.Seq, sentAt, res)
	gp.mu.Unlock()
	gp.logGrants(rep, sentAt, res)
	return true
}

// logGrants writes, at debug level, each item of the report rep (its
// demand, the epoch it acknowledges, its debt and cap) and each lease of res
// as this region holds it: the reporter (this node) and sequence number of the report rep it
// answers, sent when the report left, at when the region took the lease,
// and until when it stops using it (send time + lifetime − skew); unix ns.
// The voters log the same grant, under the same reporter and sequence
// number, with the leader's expiry ("lease granted", raftgroup); the
// process fault harness checks the one against the other.
func (gp *globalPart) logGrants(rep lease.Report, sentAt int64, res lease.Result) {
	if !gp.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	at := gp.now()
	for _, it := range rep.Items {
		gp.log.Debug("lease report", "region", rep.Region, "reporter", rep.Reporter, "seq", rep.Seq,
			"rule", it.Rule, "identity", it.Identity, "demand", it.Demand, "ack_epoch", it.AckEpoch,
			"debt", it.Debt, "capped", it.Capped, "cap", it.Cap, "sent", sentAt)
	}
	for _, g := range res.Grants {
		if g.Epoch == 0 {
			continue
		}
		gp.log.Debug("lease accepted", "region", rep.Region, "reporter", rep.Reporter, "seq", rep.Seq,
			"rule", g.Rule, "identity", g.Identity, "epoch", g.Epoch, "share", g.Share, "pending", g.Pending,
			"sent", sentAt, "at", at, "until", sentAt+g.Lifetime-gp.skew)
	}
}

// GlobalStatus is the state of a node's global (scope: global) rules.
type GlobalStatus struct {
	// Leasing is false when the node does not lease global rules (no
	// cluster, no lease group, or a region the lease machine does not
	// know): they are then enforced per region at the full limit.
	Leasing bool `json:"leasing"`
	// Rules is each leased rule's keys on lease and on fallback and the
	// share held, for the identities this node owns.
	Rules []lease.RuleStatus `json:"rules,omitempty"`
	// Reports and ReportFailures count this node's reports to the lease
	// group.
	Reports        uint64 `json:"reports"`
	ReportFailures uint64 `json:"report_failures"`
}

// globalStatus reports the node's global leases (docs/global.md).
func (n *Node) globalStatus() GlobalStatus {
	gp := n.global
	if gp == nil {
		return GlobalStatus{}
	}
	now := n.now()
	// Only what this node owns now: a node that lost an identity in a
	// ring change keeps its holder until its next report drops it, and a
	// region's status summed over its nodes must not count it twice.
	var owns func(string) bool
	if gp.ring != nil {
		if ring := gp.ring(); ring != nil {
			owns = func(identity string) bool {
				m, ok := ring.Owner(identity)
				return !ok || m.Name == gp.self
			}
		}
	}
	gp.mu.Lock()
	rules := gp.reg.Status(now, owns)
	gp.mu.Unlock()
	return GlobalStatus{Leasing: true, Rules: rules, Reports: gp.reports.Load(), ReportFailures: gp.failures.Load()}
}
