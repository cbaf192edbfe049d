package shell

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weir-dev/weir/cluster"

	"github.com/weir-dev/weir/cluster/peerpb"
)

// Inspect reports this node's BucketState of identity under ruleID now
// (see Coordinator.Inspect).
func (s *Node) Inspect(ruleID, identity string) (cluster.BucketState, error) {
	now := s.now()
	sh := &s.shards[s.shardOf(identity)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.coord.Inspect(now, ruleID, identity)
}

// Inspector answers a peer's Inspect call: the receiving node's
// BucketState (Node.Inspect). A nil Inspector answers Unimplemented.
type Inspector func(ctx context.Context, from, rule, identity string) (cluster.BucketState, error)

// encodeInspect is the reply of a BucketState.
func encodeInspect(st cluster.BucketState) *peerpb.InspectReply {
	return &peerpb.InspectReply{Node: st.Node, Owner: st.Owner, Known: st.Known, Held: st.Held, Burst: st.Burst,
		Remaining: st.Remaining, ResetAfter: int64(st.ResetAfter), Debt: st.Debt, Warming: st.Warming,
		Reporters: uint32(min(st.Reporters, maxReporters)), Unconfirmed: st.Unconfirmed, Interval: int64(st.Interval),
		Algorithm: st.Algorithm, Count: st.Count}
}

// maxReporters bounds an inspect reply's reporter count: far above any
// region's node count, and the same bound on both ends so that a reply
// survives a round trip unchanged.
const maxReporters = 1 << 16

// decodeInspect validates a peer's reply.
func decodeInspect(r *peerpb.InspectReply) (cluster.BucketState, error) {
	if e := checkName("node", r.GetNode(), cluster.MaxNodeNameBytes); e != "" {
		return cluster.BucketState{}, errors.New("inspect reply: " + e)
	}
	if o := r.GetOwner(); o != "" { // "" when the peer has no ring yet
		if e := checkName("owner", o, cluster.MaxNodeNameBytes); e != "" {
			return cluster.BucketState{}, errors.New("inspect reply: " + e)
		}
	}
	if r.GetBurst() < 0 || r.GetRemaining() < 0 || r.GetResetAfter() < 0 || r.GetDebt() < 0 || r.GetInterval() < 0 || r.GetCount() < 0 {
		return cluster.BucketState{}, errors.New("inspect reply: a negative count or duration")
	}
	if r.GetReporters() > maxReporters {
		return cluster.BucketState{}, fmt.Errorf("inspect reply: %d reporters, more than %d", r.GetReporters(), maxReporters)
	}
	return cluster.BucketState{Node: r.GetNode(), Owner: r.GetOwner(), Known: r.GetKnown(), Held: r.GetHeld(), Burst: r.GetBurst(),
		Interval: time.Duration(r.GetInterval()), Remaining: r.GetRemaining(), ResetAfter: time.Duration(r.GetResetAfter()),
		Debt: r.GetDebt(), Warming: r.GetWarming(), Reporters: int(r.GetReporters()), Unconfirmed: r.GetUnconfirmed(),
		Algorithm: r.GetAlgorithm(), Count: r.GetCount()}, nil
}
