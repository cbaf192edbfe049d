package weir

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/quota"
)

// opsPart is what the operator's view keeps on a node: recent fail-open
// events, per-identity recent counts, the canary and the lease-share
// source.
type opsPart struct {
	events eventLog
	recent *recentCounts
	canary *canary // nil without Config.Canary
	leases atomic.Pointer[leaseSource]
}

type leaseSource struct{ s leaseShareSource }

// LeaseShare is one region's share of a global rule (scope: global), as the
// lease enforcement knows it.
type LeaseShare struct {
	Rule   string `json:"rule"`
	Region string `json:"region"`
	// Rate is the share of the limit in tokens per second, Burst its
	// proportional burst.
	Rate  float64 `json:"rate_per_second"`
	Burst int64   `json:"burst"`
	// Expires is when the lease ends unless renewed (zero: unknown).
	Expires time.Time `json:"expires,omitzero"`
	// Fallback is true while the region enforces its fallback share
	// because its lease could not be renewed.
	Fallback bool `json:"fallback"`
}

// leaseShareSource reports the lease shares a node knows of: a node that
// leases its global rules sets its leases as the source (nodeShares);
// without one the page shows the global rules with no lease data.
type leaseShareSource interface {
	// LeaseShares returns the shares known now, any order. It must be
	// safe for concurrent use and quick (it is called on each poll).
	LeaseShares() []LeaseShare
}

// setLeaseShareSource sets where the page and ops.LeaseShares read lease
// shares; nil removes it.
func (n *Node) setLeaseShareSource(s leaseShareSource) {
	if s == nil {
		n.ops.leases.Store(nil)
		return
	}
	n.ops.leases.Store(&leaseSource{s})
}

// GlobalRuleLeases is one global rule with the shares known for it.
type GlobalRuleLeases struct {
	Rule   string       `json:"rule"`
	Limit  int64        `json:"limit"`
	Window string       `json:"window"`
	Shares []LeaseShare `json:"shares"`
	// Note says why Shares is empty, when it is.
	Note string `json:"note,omitempty"`
}

// leaseShares returns every global rule of the rule set in force with the
// shares the LeaseShareSource reports for it, ordered by rule and region.
func (n *Node) leaseShares() []GlobalRuleLeases {
	e := n.eng.load()
	var shares []LeaseShare
	src := n.ops.leases.Load()
	if src != nil {
		shares = src.s.LeaseShares()
	}
	out := []GlobalRuleLeases{}
	for i := range e.rules {
		r := e.rules[i].r
		if r.Scope != quota.ScopeGlobal {
			continue
		}
		g := GlobalRuleLeases{Rule: r.ID, Limit: r.Limit, Window: r.Window.String(), Shares: []LeaseShare{}}
		for _, s := range shares {
			if s.Rule == r.ID {
				g.Shares = append(g.Shares, s)
			}
		}
		sort.Slice(g.Shares, func(a, b int) bool { return g.Shares[a].Region < g.Shares[b].Region })
		if len(g.Shares) == 0 {
			g.Note = "no lease data"
			if src == nil {
				g.Note = "no lease data: this node has no lease-share source"
			}
		}
		out = append(out, g)
	}
	return out
}

// MemberView is one member of the cluster as the page shows it.
type MemberView struct {
	Name         string `json:"name"`
	Region       string `json:"region"`
	RulesVersion uint64 `json:"rules_version"`
	// Health is "self", "alive" (gossip reports it live), or "behind"
	// (alive but running an older rule version than this node).
	Health string `json:"health"`
	// InRing is true for the members of this node's region, which share
	// its buckets; RingShare is the fraction of a sample of the hash space
	// each owns.
	InRing    bool    `json:"in_ring"`
	RingShare float64 `json:"ring_share"`
}

// RuleView is one rule of the set in force, as the page lists it.
type RuleView struct {
	ID        string   `json:"id"`
	Limit     int64    `json:"limit"`
	Window    string   `json:"window"`
	Burst     int64    `json:"burst"`
	Cost      int64    `json:"cost"`
	Key       []string `json:"key"`
	Match     string   `json:"match"`
	Algorithm string   `json:"algorithm"`
	Mode      string   `json:"mode"`
	Scope     string   `json:"scope"`
	OnFailure string   `json:"on_failure"`
	Shadow    bool     `json:"shadow"`
	Durable   bool     `json:"durable"`
}

// Overview is the JSON the status page polls (GET v1/status of UIHandler).
type Overview struct {
	Node   string `json:"node"`
	Region string `json:"region"`
	// Cluster is true when the node is a member of its region's cluster
	// (Config.Cluster); false for a node on its own.
	Cluster bool         `json:"cluster"`
	At      time.Time    `json:"at"`
	Status  Status       `json:"status"`
	Behind  uint64       `json:"rules_versions_behind"`
	Members []MemberView `json:"members"`
	// RingSample is how many sample identities RingShare was measured on.
	RingSample   int                `json:"ring_sample"`
	RingEpoch    uint64             `json:"ring_epoch"`
	Rules        []RuleView         `json:"rules"`
	Counts       []RuleCounts       `json:"counts"`
	TopThrottled []Hitter           `json:"top_throttled"`
	TopShadow    []Hitter           `json:"top_shadow_rejected"`
	Events       []Event            `json:"events"`
	Dropped      uint64             `json:"events_dropped"`
	Leases       []GlobalRuleLeases `json:"leases"`
	Canary       CanaryStatus       `json:"canary"`
	Stores       []StoreStats       `json:"stores"`
	// RulesAPI is true when this node serves the authenticated rules API
	// (a lease group with admin tokens), so the page can edit rules.
	RulesAPI bool `json:"rules_api"`
}

// ringSampleSize is how many identities the ring share is measured on: the
// share's standard error is about √(p(1−p)/4096), under 1 %.
const ringSampleSize = 4096

var ringSample = sync.OnceValue(func() []string {
	ids := make([]string, ringSampleSize)
	for i := range ids {
		ids[i] = fmt.Sprintf("weir-ring-sample-%d", i)
	}
	return ids
})

// overview reports what the status page shows (see Overview).
func (n *Node) overview() Overview {
	e := n.eng.load()
	ov := Overview{Node: n.nodeName(), At: time.Unix(0, n.now()).UTC(), Status: n.Status(), Behind: n.rulesBehind(),
		Members: []MemberView{}, Rules: []RuleView{}, Counts: n.counts(), TopThrottled: n.topThrottled(),
		TopShadow: n.topShadowRejected(), Events: n.events(), Dropped: n.eventsDropped(), Leases: n.leaseShares(),
		Canary: n.canaryStatus(), Stores: n.stores.stats(), RulesAPI: n.lease != nil && n.lease.admin != nil}
	for i := range e.rules {
		r := e.rules[i].r
		rv := RuleView{ID: r.ID, Limit: r.Limit, Window: r.Window.String(), Burst: r.Burst, Cost: r.CostFor(""),
			Match: matchString(r.Match), Algorithm: string(r.Algorithm), Mode: string(r.Mode), Scope: string(r.Scope),
			OnFailure: string(r.OnFailure), Shadow: r.Shadow, Durable: r.Durable, Key: []string{}}
		for _, k := range r.Key {
			rv.Key = append(rv.Key, k.String())
		}
		ov.Rules = append(ov.Rules, rv)
	}
	if n.cluster == nil {
		ov.Region = n.cfg.Region
		ov.Members = append(ov.Members, MemberView{Name: ov.Node, Region: ov.Region, Health: "self", RulesVersion: ov.Status.RulesVersion, InRing: true, RingShare: 1})
		return ov
	}
	ov.Region, ov.Cluster = n.cluster.region, true
	ring := n.cluster.shell.Ring()
	share := map[string]float64{}
	if ring != nil && ring.Len() > 0 {
		ov.RingEpoch = ring.Epoch()
		ov.RingSample = ringSampleSize
		for _, id := range ringSample() {
			share[ring.OwnerName(id)]++
		}
	}
	inRing := map[string]bool{}
	if ring != nil {
		for _, name := range ring.Names() {
			inRing[name] = true
		}
	}
	for _, p := range n.peers() {
		mv := MemberView{Name: p.Name, Region: p.Region, RulesVersion: p.RulesVersion, Health: "alive",
			InRing: inRing[p.Name], RingShare: share[p.Name] / ringSampleSize}
		switch {
		case p.Name == ov.Node:
			mv.Health, mv.RulesVersion = "self", ov.Status.RulesVersion
		case p.RulesVersion < ov.Status.RulesVersion:
			mv.Health = "behind"
		}
		ov.Members = append(ov.Members, mv)
	}
	sort.Slice(ov.Members, func(a, b int) bool { return ov.Members[a].Name < ov.Members[b].Name })
	return ov
}

// nodeName is the node's cluster name; without a cluster Config.Name, else
// its lease voter's name, else "node".
func (n *Node) nodeName() string {
	if n.cfg.Cluster != nil {
		return n.cfg.Cluster.Name
	}
	if n.cfg.Name != "" {
		return n.cfg.Name
	}
	if n.cfg.Lease != nil && n.cfg.Lease.Voter != nil && n.cfg.Lease.Voter.Name != "" {
		return n.cfg.Lease.Voter.Name
	}
	return "node"
}
