package raftgroup

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
)

// TestClientReport: a node that is not a voter reports through
// Client.Report, listing a follower first: the client follows the leader,
// gets its region's first lease, and a retry of the same report (same Seq)
// is applied once and returns the same lease.
func TestClientReport(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	rule := lease.Rule{ID: "world", Limit: 900, Window: time.Second, Burst: 90, MaxCost: 1}
	if _, err := leader.Propose(ctx, lease.Command{Rules: []lease.Rule{rule}}); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, g := range c.live() {
		if g != leader {
			addrs = append(addrs, g.RPCAddr())
		}
	}
	addrs = append(addrs, leader.RPCAddr())
	cl, err := NewClient(ClientConfig{Voters: addrs, Name: "gw-eu-1", Timeout: waitBound})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rep := lease.Report{Reporter: "gw-eu-1", Seq: 7, Region: "eu",
		Items: []lease.ReportItem{{Rule: "world", Identity: "c1", Demand: 500}}}
	res, err := cl.Report(ctx, rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Grants) != 1 || res.Grants[0].Epoch == 0 || res.Grants[0].Share != 500 || res.Grants[0].Lifetime <= 0 {
		t.Fatalf("first grants %+v, want a lease of 500", res.Grants)
	}
	again, err := cl.Report(ctx, rep)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(again.Grants, res.Grants, func(a, b lease.Grant) bool {
		return a.Epoch == b.Epoch && a.Share == b.Share && a.Burst == b.Burst
	}) {
		t.Fatalf("a retry changed the lease: %+v then %+v", res.Grants, again.Grants)
	}
	if err := leader.FSM().Check(); err != nil {
		t.Fatal(err)
	}
	// A report naming a rule the machine does not hold is refused, not
	// retried until the deadline.
	bad := lease.Report{Reporter: "gw-eu-1", Seq: 8, Region: "eu", Items: []lease.ReportItem{{Rule: "nope", Identity: "c1", Demand: 1}}}
	if _, err := cl.Report(ctx, bad); err == nil || ctx.Err() != nil {
		t.Fatalf("a report of an unknown rule: err %v (ctx %v)", err, ctx.Err())
	}
}
