package cluster

import (
	"fmt"
	"math"
	"slices"

	"github.com/weir-dev/weir/quota"
)

// This file is demand-following slack (SlackDemand): the pure grant protocol
// that lets the nodes that spend hold more of a shared rule's slack than the
// nodes that do not, without ever breaking the Σ sᵢ ≤ a·L of docs/overshoot.md.
//
// Per (rule, identity) the region's pool is P = ⌊a·L⌋ tokens. Every
// non-owner node holds a base b = ⌊P ÷ (2·(N−1))⌋ implicitly (no message),
// as with fixed slack. The rest, G = P − (N−1)·b, is handed out by the owner
// as grants: extra slack that rides on acknowledgements, sized in
// proportion to each node's recent demand (the spend its reports show plus
// the requests it forwarded). The rules that keep the sum bounded:
//
//   - A grant has an epoch, drawn from an owner-wide counter that starts at
//     the owner's incarnation, so a restarted owner's grants supersede the
//     old ones. A node adopts a grant only with a higher epoch than it has
//     seen for its entry (a fence: a late acknowledgement cannot bring an
//     older, larger grant back), and every report it sends carries the
//     epoch it adopted and the extra it uses now.
//   - The owner reserves, per node, the largest extra the node may be
//     using: the extra it reported under the latest epoch it confirmed,
//     and, while a newer grant is on its way, that grant too. It issues a
//     grant only when the node confirmed the previous one (one in flight),
//     and never more than G minus the other nodes' reservations. So
//     Σ reservations ≤ G always, and Σ sᵢ ≤ (N−1)·b + G = P.
//   - Capacity returns to the pool only through a report: a node that
//     confirms a smaller grant (or that its grant expired, extra 0) reports
//     its spend in that same report, which the owner charges on receipt, so
//     the spend made under the larger grant is charged before any other
//     node can be granted the difference. No timer on the owner releases
//     anything: lost messages can only keep capacity reserved longer, never
//     hand it out twice, and no decision depends on a sender's clock.
//   - A node's grant lapses after GrantLifetime without a renewal (every
//     acknowledgement of the same epoch renews it, counted on the node's
//     own clock from receipt). A node that goes idle thus falls back to its
//     base and says so in one report, retried every sync interval until the
//     owner acknowledges it; after that the node may drop its entry.
//   - An owner keeps a bucket that still has reservations (it does not drop
//     it when full), and a ring change starts every grant over: the node's
//     entry moves to a new generation with no grant, and the new owner
//     starts with no reservations.
//
// Split ownership (two owners while views converge, or after an owner
// crash) lets every node hold a grant from a different owner: the fault term
// uses at most P per node then (RuleParams.MaxSlack), instead of the even
// share of fixed slack.

// SlackScheme says how a shared rule's slack is spread over the nodes of a
// region.
type SlackScheme uint8

const (
	// SlackFixed gives every node ⌊a·L ÷ N⌋ tokens, whatever its traffic.
	SlackFixed SlackScheme = iota
	// SlackDemand gives every non-owner a base of ⌊P ÷ (2·(N−1))⌋ and
	// hands the rest of the pool P = ⌊a·L⌋ to the nodes that spend, in
	// proportion to their demand (slack.go).
	SlackDemand
)

// DefaultSlackScheme is the scheme NewRuleParams gives a rule. The choice
// and the measurements behind it are in docs/overshoot.md ("Fixed or
// demand-following slack").
const DefaultSlackScheme = SlackFixed

// GrantLifetime returns how long a node may use a demand grant after the
// last acknowledgement that granted or renewed it, for a sync interval:
// four intervals, so that a node that spends renews it many times over and
// an idle one gives it back soon.
func GrantLifetime(syncInterval int64) int64 { return 4 * syncInterval }

// String returns "fixed" or "demand".
func (s SlackScheme) String() string {
	switch s {
	case SlackFixed:
		return "fixed"
	case SlackDemand:
		return "demand"
	}
	return fmt.Sprintf("SlackScheme(%d)", uint8(s))
}

// ParseSlackScheme parses "fixed" or "demand".
func ParseSlackScheme(s string) (SlackScheme, error) {
	switch s {
	case "fixed":
		return SlackFixed, nil
	case "demand":
		return SlackDemand, nil
	}
	return 0, fmt.Errorf("cluster: slack scheme %q: want fixed or demand", s)
}

// Pool returns P = ⌊a·L⌋, the region's slack for a shared rule (0 for an
// exact one).
func (p *RuleParams) Pool() int64 {
	if p.Mode != quota.ModeShared {
		return 0
	}
	return int64(math.Floor(p.Accuracy * float64(p.Limit)))
}

// Grantable returns G, what an owner in a region of n live nodes may grant
// on top of the bases under SlackDemand: P − (n−1)·Slack(n). It is 0 under
// SlackFixed.
func (p *RuleParams) Grantable(n int) int64 {
	if p.Scheme != SlackDemand || n < 2 {
		return 0
	}
	return max(p.Pool()-int64(n-1)*p.Slack(n), 0)
}

// MaxSlack returns the most one node of a region of n live nodes may hold:
// Slack(n) under SlackFixed, Slack(n) + Grantable(n) under SlackDemand.
func (p *RuleParams) MaxSlack(n int) int64 { return p.Slack(n) + p.Grantable(n) }

// RegionSlack returns S, the most the non-owners of a region of n live
// nodes that agree on the owner may hold together: (n−1)·Slack(n) under
// SlackFixed, (n−1)·Slack(n) + Grantable(n) ≤ P under SlackDemand.
func (p *RuleParams) RegionSlack(n int) int64 {
	if n < 2 {
		return 0
	}
	return int64(n-1)*p.Slack(n) + p.Grantable(n)
}

// grantState is an owner's record of its grants to one node for one
// generation of the node's entry.
type grantState struct {
	epoch     uint64 // the latest grant issued (0: none)
	extra     int64  // its size; once confirmed, what the node reported
	confirmed uint64 // the highest epoch the node reported using
	using     int64  // the extra it reported under confirmed
	// demand is the node's recent demand in tokens, decayed exponentially
	// from demandAt (owner clock) with the time constant demandTau.
	demand   float64
	demandAt int64
	// decided is the demand the node forwarded since its last report.
	decided int64
}

// reserved is the most extra slack the node may be using.
func (g *grantState) reserved() int64 {
	if g.confirmed == g.epoch {
		return g.using
	}
	return max(g.using, g.extra)
}

// demandAt returns the node's decayed demand at now.
func (g *grantState) demandNow(now, tau int64) float64 {
	if g.demand == 0 || now <= g.demandAt {
		return g.demand
	}
	return g.demand * math.Exp(-float64(now-g.demandAt)/float64(tau))
}

// addDemand adds tokens of demand at now.
func (g *grantState) addDemand(now, tau int64, tokens int64) {
	g.demand = g.demandNow(now, tau) + float64(tokens)
	g.demandAt = max(g.demandAt, now)
}

// demandTau is the time constant of the owner's demand estimate.
func (c *Coordinator) demandTau() int64 { return 4 * c.interval }

// reserving reports whether any node may still use a grant of oe.
func (oe *ownerEntry) reserving() bool {
	for i := range oe.reports {
		if oe.reports[i].grant.reserved() > 0 {
			return true
		}
	}
	return false
}

// regrant is the owner's side of a report from node i of oe under a
// demand rule: record the grant the node says it uses, then, if it
// confirmed the latest grant, issue a new one when its share of the demand
// changed. The grant goes out in the acknowledgement.
//
// spent is the new spend the report charged. A grant grows only for a node
// that shows demand in this report (new spend, or requests it forwarded
// since its last report): a report that only says a grant lapsed gets none,
// so an idle node is not handed capacity it will not use.
func (c *Coordinator) regrant(now int64, r *RuleParams, oe *ownerEntry, i int, s SyncItem, spent int64) {
	g := &oe.reports[i].grant
	tau := c.demandTau()
	g.addDemand(now, tau, spent)
	active := spent > 0 || g.decided > 0
	g.decided = 0
	switch {
	case s.GrantEpoch > g.confirmed:
		g.confirmed, g.using = s.GrantEpoch, s.Grant
	case s.GrantEpoch == g.confirmed && s.Grant < g.using:
		// Within one epoch a node only ever drops its extra (expiry);
		// a larger value is an older report overtaken.
		g.using = s.Grant
	}
	if g.confirmed > g.epoch {
		// Not ours (a report from before this owner restarted, which
		// has no record): take it as confirmed so that a new grant
		// supersedes it.
		g.epoch, g.extra = g.confirmed, g.using
	}
	if g.confirmed != g.epoch {
		return // a grant is on its way: one at a time
	}
	g.extra = g.using
	n := c.n()
	pool := r.Grantable(n)
	var total, mine float64
	var others int64
	for j := range oe.reports {
		d := oe.reports[j].grant.demandNow(now, tau)
		total += d
		if j == i {
			mine = d
		} else {
			others += oe.reports[j].grant.reserved()
		}
	}
	target := int64(0)
	if total > 0 && pool > 0 {
		target = int64(math.Floor(float64(pool) * mine / total))
	}
	want := max(min(target, pool-others), 0)
	if want == g.extra || (want > g.extra && !active) {
		return
	}
	c.grantSeq++
	g.epoch, g.extra = c.grantSeq, want
}

// nodeGrant is what a non-owner knows of its demand grant.
type nodeGrant struct {
	epoch uint64 // highest epoch adopted (0: none)
	extra int64  // extra slack in use (0 once lapsed)
	until int64  // this node's clock: the grant lapses here
	// repEpoch and repExtra are what the last report carried; settled is
	// true once the owner acknowledged the grant as it stands (a lapsed
	// grant's release).
	repEpoch uint64
	repExtra int64
	settled  bool
}

// lapse ends the grant at now if its lifetime is over.
func (g *nodeGrant) lapse(now int64) {
	if g.extra > 0 && now >= g.until {
		g.extra, g.settled = 0, false
	}
}

// extraAt returns the extra slack usable at now.
func (g *nodeGrant) extraAt(now int64) int64 {
	g.lapse(now)
	return g.extra
}

// unreported reports whether the owner has not yet been told the grant as
// it stands, or has not acknowledged a lapse.
func (g *nodeGrant) unreported() bool {
	return g.epoch != g.repEpoch || g.extra != g.repExtra || (g.epoch > 0 && g.extra == 0 && !g.settled)
}

// idle reports whether the entry may be dropped as far as the grant goes.
func (g *nodeGrant) idle() bool { return g.epoch == 0 || (g.extra == 0 && g.settled) }

// onAck takes the grant fields of an acknowledgement at now.
func (g *nodeGrant) onAck(now, life int64, a AckItem) {
	switch {
	case a.GrantEpoch > g.epoch:
		g.epoch, g.extra, g.until, g.settled = a.GrantEpoch, a.Grant, now+life, false
	case a.GrantEpoch == g.epoch && g.epoch > 0:
		if g.extra > 0 && a.Grant == g.extra {
			g.until = now + life // renewed
		}
		if g.extra == 0 && a.Grant == 0 && g.repEpoch == g.epoch && g.repExtra == 0 {
			g.settled = true // the owner recorded the release
		}
	}
}

// noteDemand counts cost tokens that node `from` forwarded for oe's
// identity as its demand: a node whose slack is too small to admit locally
// shows its demand only through the requests it forwards.
func (c *Coordinator) noteDemand(now int64, oe *ownerEntry, from string, cost int64) {
	if oe == nil || from == c.cfg.Self {
		return
	}
	i := slices.IndexFunc(oe.reports, func(p report) bool { return p.node == from })
	if i < 0 {
		oe.reports = append(oe.reports, report{node: from})
		i = len(oe.reports) - 1
	}
	g := &oe.reports[i].grant
	g.addDemand(now, c.demandTau(), cost)
	g.decided += cost
}
