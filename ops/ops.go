// Package ops is the operator's view of a weir.Node: the status page, the
// admin report, the identity lookup, the rules API's handler, and the
// figures behind them (decision counts per rule, the top throttled
// identities, fail-open events, the canary, the global leases, the
// cluster's members). A gateway decides with weir.Node; the people who run
// it look through ops.
//
// Every function takes the node and reads it as it is now; all are safe for
// concurrent use. The handlers name identities: mount them where only
// operators reach them, or on a node with admin tokens
// (weir.LeaseConfig.AdminTokens), which they then require
// (docs/security.md).
package ops

import (
	"context"
	"net/http"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/nodeops"
)

// view is what ops reads of a node (package weir's opsView satisfies it).
type view interface {
	Counts() []weir.RuleCounts
	Events() []weir.Event
	EventsDropped() uint64
	Canary() weir.CanaryStatus
	TopThrottled() []weir.Hitter
	TopShadowRejected() []weir.Hitter
	Overview() weir.Overview
	GlobalStatus() weir.GlobalStatus
	LeaseShares() []weir.GlobalRuleLeases
	Peers() []weir.Peer
	Members() []string
	GossipAddr() string
	StoreStats() []weir.StoreStats
	RulesAdminHandler() http.Handler
	AdminUnauthorized() uint64
	Guard(h http.Handler) http.Handler
	LookupIdentity(ctx context.Context, id string, q weir.IdentityQuery) (weir.IdentityReport, error)
}

func of(n *weir.Node) view { return nodeops.Of(n).(view) }

// Counts returns the node's decision counts per rule since it started.
func Counts(n *weir.Node) []weir.RuleCounts { return of(n).Counts() }

// Events returns the node's recent fail-open and fallback events, oldest
// first (at most weir.EventsKept of them).
func Events(n *weir.Node) []weir.Event { return of(n).Events() }

// EventsDropped is how many events the node did not keep because many
// cores recorded them at the same instant (the counters stay exact).
func EventsDropped(n *weir.Node) uint64 { return of(n).EventsDropped() }

// Canary reports the node's enforcement canary (weir.Config.Canary);
// Enabled is false without one.
func Canary(n *weir.Node) weir.CanaryStatus { return of(n).Canary() }

// TopThrottled returns the identities the node rejected most recently, per
// rule, highest first.
func TopThrottled(n *weir.Node) []weir.Hitter { return of(n).TopThrottled() }

// TopShadowRejected returns the identities that the node's shadow rules
// would have rejected most recently, highest first.
func TopShadowRejected(n *weir.Node) []weir.Hitter { return of(n).TopShadowRejected() }

// Overview reports what the status page shows (see weir.Overview).
func Overview(n *weir.Node) weir.Overview { return of(n).Overview() }

// GlobalStatus reports the node's global (scope: global) leases
// (docs/global.md).
func GlobalStatus(n *weir.Node) weir.GlobalStatus { return of(n).GlobalStatus() }

// LeaseShares returns every global rule of the rule set in force with the
// region shares the node knows of, ordered by rule and region.
func LeaseShares(n *weir.Node) []weir.GlobalRuleLeases { return of(n).LeaseShares() }

// Peers returns every live member of the node's cluster (all regions),
// sorted by name, with the rule-set version each one runs; nil without a
// cluster.
func Peers(n *weir.Node) []weir.Peer { return of(n).Peers() }

// Members returns the names of the live members of the node's region as
// its ring sees them; nil without a cluster.
func Members(n *weir.Node) []string { return of(n).Members() }

// GossipAddr returns the memberlist address other nodes join the node's
// cluster at ("" without a cluster): with ClusterConfig.GossipAddr on port
// 0, the port the node was given.
func GossipAddr(n *weir.Node) string { return of(n).GossipAddr() }

// StoreStats returns the sizes of the node's key stores, one per
// algorithm.
func StoreStats(n *weir.Node) []weir.StoreStats { return of(n).StoreStats() }

// AdminUnauthorized is the number of requests the node's admin door
// refused (RulesAdminHandler, AdminHandler and IdentityHandler together):
// zero on a node without weir.LeaseConfig.AdminTokens.
func AdminUnauthorized(n *weir.Node) uint64 { return of(n).AdminUnauthorized() }

// LookupIdentity reports, for one identity, every rule that may apply to
// it with its bucket on the node that decides it and the node's recent
// verdicts (see weir.IdentityReport). For a shared or exact rule in a
// cluster the owner is asked over the peer transport (an Inspect call
// bounded by ctx); an unreachable owner is reported in the bucket's Error.
// Nothing is charged. An error wraps weir.ErrBadQuery.
func LookupIdentity(ctx context.Context, n *weir.Node, id string, q weir.IdentityQuery) (weir.IdentityReport, error) {
	return of(n).LookupIdentity(ctx, id, q)
}
