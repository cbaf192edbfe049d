package raftgroup_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
)

// A one-voter lease group on loopback: it bootstraps, becomes leader,
// proposes its Takeover, and then serves a rule set and a region's report.
// The region gets its lease; it may grow past its safe share (⌊1000 ÷ 3⌋)
// only by what the other regions' implicit leases leave free until they
// acknowledge smaller ones.
func ExampleStart() {
	dir, err := os.MkdirTemp("", "lease-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	g, err := raftgroup.Start(raftgroup.Config{
		Name: "n1", Dir: dir, RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		// One voter; its empty address means the one RaftAddr bound.
		Voters:  []raftgroup.Voter{{Name: "n1"}},
		Machine: lease.Config{Regions: []string{"ap", "eu", "us"}},
		// Short timeouts for loopback (elections in tens of milliseconds).
		HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
		LeaderLeaseTimeout: 25 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rule := lease.Rule{ID: "global", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 5}
	if _, err := g.Propose(ctx, lease.Command{Rules: []lease.Rule{rule}}); err != nil {
		panic(err)
	}
	res, err := g.Propose(ctx, lease.Command{Report: &lease.Report{Reporter: "eu-node-1", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "global", Identity: "customer-x", Demand: 600}}}})
	if err != nil {
		panic(err)
	}
	gr := res.Grants[0]
	fmt.Printf("eu leases %d/min (burst %d) of %s for %s, epoch %d\n", gr.Share, gr.Burst, gr.Rule, gr.Identity, gr.Epoch)
	// Output: eu leases 600/min (burst 60) of global for customer-x, epoch 1
}
