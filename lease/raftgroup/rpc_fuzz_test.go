package raftgroup

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/leasepb"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// FuzzLeaseRPC unmarshals hostile bytes into each request the forwarding
// service handles (kind picks Propose, ChangeRule, ReadRules, Durable or
// AddVoter) and hands it to the server's handler on a real group: the
// leader of a one-voter group, and for AddVoter a joining node that leads
// nothing (so that a decoded request cannot wedge the group by adding a
// voter that does not exist). No input may panic, fail with anything but
// a coded gRPC status, or break the lease machine's invariant.
func FuzzLeaseRPC(f *testing.F) {
	c := newCluster(f, 1, nil)
	l := c.leader()
	cfg := c.baseConfig("j1", f.TempDir())
	cfg.Join, cfg.RaftAddr = true, "127.0.0.1:0"
	j := c.start(cfg)

	add := func(kind uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(kind, b)
	}
	for _, cmd := range []lease.Command{rulesCmd, {Tick: true}, {Takeover: true},
		{Report: &lease.Report{Reporter: "eu-1", Seq: 1, Region: "eu", Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: 100}}}}} {
		pc, err := lease.EntryToPB(lease.Entry{Command: &cmd})
		if err != nil {
			f.Fatal(err)
		}
		add(0, &grouppb.ProposeRequest{From: "n2", Command: pc})
	}
	rule, err := DecodeRuleBody("login", []byte(`{"limit": 5, "window": "1m"}`))
	if err != nil {
		f.Fatal(err)
	}
	rb, err := lease.EncodeRuleJSON(rule)
	if err != nil {
		f.Fatal(err)
	}
	add(1, &grouppb.ChangeRuleRequest{From: "gw", Change: &grouppb.ChangeRuleRequest_Put{Put: &leasepb.RulePut{Principal: "alice", Rule: rb, RequestId: "r1"}}})
	add(1, &grouppb.ChangeRuleRequest{From: "gw", Change: &grouppb.ChangeRuleRequest_Delete{Delete: &leasepb.RuleDelete{Principal: "alice", Id: "login"}}})
	add(2, &grouppb.ReadRulesRequest{Linearizable: true, WithRules: true, WithHistory: true, Limit: 10})
	add(2, &grouppb.ReadRulesRequest{Linearizable: true, Forwarded: true, Since: 1 << 62, Limit: ^uint32(0)})
	add(3, &grouppb.DurableRequest{From: "gw", Decide: &leasepb.DurableDecide{Rule: "d", Limit: 10, Window: int64(time.Second),
		Burst: 10, Identity: []byte("a"), Cost: 1, RequestId: "q1"}})
	add(3, &grouppb.DurableRequest{From: "gw", Decide: &leasepb.DurableDecide{Rule: "d", Limit: -1, Window: -1, Cost: -5}})
	add(4, &grouppb.AddVoterRequest{Name: "n9", Address: "127.0.0.1:1"})
	add(4, &grouppb.AddVoterRequest{})

	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		switch kind % 5 {
		case 0:
			var req grouppb.ProposeRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			_, err = l.rpc.Propose(ctx, &req)
		case 1:
			var req grouppb.ChangeRuleRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			_, err = l.rpc.ChangeRule(ctx, &req)
		case 2:
			var req grouppb.ReadRulesRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			_, err = l.rpc.ReadRules(ctx, &req)
		case 3:
			var req grouppb.DurableRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			_, err = l.rpc.Durable(ctx, &req)
		case 4:
			var req grouppb.AddVoterRequest
			if proto.Unmarshal(b, &req) != nil {
				return
			}
			_, err = j.rpc.AddVoter(ctx, &req)
		}
		if err != nil {
			if st, ok := status.FromError(err); !ok || st.Code() == codes.Unknown {
				t.Fatalf("kind %d: an uncoded error: %v", kind%5, err)
			}
		}
		for _, g := range []*Group{l, j} {
			if err := g.FSM().Check(); err != nil {
				t.Fatalf("replica %s: %v", g.Name(), err)
			}
		}
	})
}
