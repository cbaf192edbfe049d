package weir

import (
	"context"
	"net/http"

	"github.com/weir-dev/weir/internal/nodeops"
	"github.com/weir-dev/weir/lease/raftgroup"
)

// opsView is what package ops reads of a node, handed over through
// internal/nodeops: the operator's views live in ops and take a *Node, but
// they read the node through this value, not through exported methods of
// Node.
type opsView struct{ n *Node }

func init() {
	nodeops.Register(func(node any) any { return opsView{node.(*Node)} })
}

func (v opsView) Counts() []RuleCounts              { return v.n.counts() }
func (v opsView) Events() []Event                   { return v.n.events() }
func (v opsView) EventsDropped() uint64             { return v.n.eventsDropped() }
func (v opsView) Canary() CanaryStatus              { return v.n.canaryStatus() }
func (v opsView) TopThrottled() []Hitter            { return v.n.topThrottled() }
func (v opsView) TopShadowRejected() []Hitter       { return v.n.topShadowRejected() }
func (v opsView) Overview() Overview                { return v.n.overview() }
func (v opsView) GlobalStatus() GlobalStatus        { return v.n.globalStatus() }
func (v opsView) LeaseShares() []GlobalRuleLeases   { return v.n.leaseShares() }
func (v opsView) Peers() []Peer                     { return v.n.peers() }
func (v opsView) Members() []string                 { return v.n.members() }
func (v opsView) GossipAddr() string                { return v.n.gossipAddr() }
func (v opsView) StoreStats() []StoreStats          { return v.n.stores.stats() }
func (v opsView) RulesAdminHandler() http.Handler   { return v.n.rulesAdminHandler() }
func (v opsView) AdminUnauthorized() uint64         { return v.n.adminUnauthorized() }
func (v opsView) Guard(h http.Handler) http.Handler { return v.n.guard(h) }
func (v opsView) LeaseGroup() *raftgroup.Group      { return v.n.leaseGroup() }
func (v opsView) LookupIdentity(ctx context.Context, id string, q IdentityQuery) (IdentityReport, error) {
	return v.n.lookupIdentity(ctx, id, q)
}
