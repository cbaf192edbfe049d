// Package raftgroup is the lease group's shell around the pure core of
// package lease: hashicorp/raft with raft-boltdb under a data directory, the
// gRPC forwarding service through which a follower's write reaches the
// leader, the Client of a node that is not a voter, and the rules admin
// HTTP API with its Guard. It decides nothing itself: it stamps a command
// with the leader's clock, encodes it (lease.EncodeLogEntry), proposes it,
// and its FSM decodes each committed entry and calls lease.Replica's
// ApplyEntry under a lock; it owns the goroutines (the leader loop's
// Takeover and Tick), the sockets and the clock.
//
// The loop, as a voter runs it:
//
//	g, err := raftgroup.Start(raftgroup.Config{Name: "n1", Dir: dir, RaftAddr: ..., RPCAddr: ...,
//		Voters: voters, Machine: lease.Config{Regions: regions}})
//	res, err := g.Report(ctx, lease.Report{...}) // through the leader
//	holder.Accept(sentAt, res.Grants[0])        // the region's side (lease.Holder)
//
// A node that is not a voter uses NewClient with the voters' RPC addresses;
// *Group and *Client both implement Reporter, RuleService and
// KeyedDurableService.
package raftgroup
