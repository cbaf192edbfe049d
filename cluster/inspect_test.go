package cluster

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/cluster/peerpb"
	"github.com/weir-dev/weir/quota"
)

func inspectRule(t *testing.T) RuleParams {
	t.Helper()
	// Accuracy 0.5: a slack pool of 5 tokens, so a node's first report of
	// 5 is within what an owner charges (Coordinator.charge).
	p, err := NewRuleParams(&quota.Rule{ID: "r", Limit: 10, Window: time.Second, Burst: 4, Mode: quota.ModeShared, Accuracy: 0.5}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCoordinatorInspect: the owner reports its bucket (remaining, time to
// full, debt once other nodes' reported spend outran it) and changes
// nothing; an unknown rule is ErrUnknownRule.
func TestCoordinatorInspect(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, []RuleParams{inspectRule(t)})
	now := int64(time.Hour)
	st, err := c.Inspect(now, "r", "x")
	if err != nil || !st.Known || st.Held || st.Remaining != 4 || st.ResetAfter != 0 || st.Debt != 0 || st.Interval != 100*time.Millisecond {
		t.Fatalf("a fresh bucket: %+v, %v", st, err)
	}
	if c.owned.len() != 0 {
		t.Fatal("Inspect created an entry")
	}
	for range 3 {
		if o, _ := c.Decide(now, "r", "x", 1); !o.Decision.Allowed {
			t.Fatal("rejected within the burst")
		}
	}
	st, _ = c.Inspect(now, "r", "x")
	if !st.Held || st.Remaining != 1 || st.ResetAfter != 300*time.Millisecond || st.Debt != 0 {
		t.Fatalf("after 3 of 4: %+v", st)
	}
	// Another node reports 5 tokens it admitted within its slack: the
	// bucket owes 4 beyond empty.
	c.Step(now, "b", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 1, Total: 5}}})
	st, _ = c.Inspect(now, "r", "x")
	if st.Remaining != 0 || st.Debt != 4 || st.ResetAfter != 800*time.Millisecond || st.Reporters != 1 {
		t.Fatalf("after a report of 5: %+v", st)
	}
	if st2, _ := c.Inspect(now+int64(time.Second), "r", "x"); st2.Held || st2.Remaining != 4 || st2.Debt != 0 {
		t.Fatalf("a second later: %+v", st2)
	}
	if _, err := c.Inspect(now, "nope", "x"); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("unknown rule: %v", err)
	}
}

// TestGRPCInspect: a peer's bucket read over Peer.Inspect; a peer with no
// Inspector answers an error, an unknown rule wraps ErrUnknownRule.
func TestGRPCInspect(t *testing.T) {
	start := func(name string) *GRPCTransport {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewGRPCTransport(GRPCConfig{Self: name, Listener: l,
			Handler: func(context.Context, string, *Message) (*Message, error) { return &Message{}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	a, b := start("a"), start("b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Inspect(ctx, b.Addr(), "r", "x"); err == nil {
		t.Fatal("a peer with no Inspector answered")
	}
	c := NewCoordinator(CoordinatorConfig{Self: "b"})
	c.SetRules(0, []RuleParams{inspectRule(t)})
	now := int64(time.Hour)
	c.Decide(now, "r", "x", 3)
	b.SetInspector(func(_ context.Context, from, rule, id string) (BucketState, error) {
		if from != "a" {
			t.Errorf("from %q", from)
		}
		return c.Inspect(now, rule, id)
	})
	st, err := a.Inspect(ctx, b.Addr(), "r", "x")
	if err != nil || st.Node != "b" || !st.Held || st.Remaining != 1 || st.ResetAfter != 300*time.Millisecond {
		t.Fatalf("inspect over gRPC: %+v, %v", st, err)
	}
	if _, err := a.Inspect(ctx, b.Addr(), "nope", "x"); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("unknown rule over gRPC: %v", err)
	}
	if _, err := a.Inspect(ctx, b.Addr(), "", "x"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("an empty rule id: %v", err)
	}
}

// FuzzDecodeInspect: any bytes as an Inspect reply decode to a valid
// BucketState or an error, never a panic, and a decoded state re-encodes
// to the same state.
func FuzzDecodeInspect(f *testing.F) {
	for _, st := range []BucketState{{}, {Node: "a", Owner: "b", Known: true, Held: true, Burst: 4, Interval: time.Second, Remaining: 2,
		ResetAfter: time.Second, Debt: 3, Warming: true, Reporters: 2, Unconfirmed: 1},
		{Node: "a", Owner: "a", Known: true, Held: true, Algorithm: "fixed_window", Burst: 10, Remaining: 3, Count: 7, ResetAfter: time.Minute}} {
		b, err := proto.Marshal(encodeInspect(st))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r peerpb.InspectReply
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		st, err := decodeInspect(&r)
		if err != nil {
			return
		}
		if st.Remaining < 0 || st.Debt < 0 || st.ResetAfter < 0 || st.Burst < 0 {
			t.Fatalf("decoded a negative figure: %+v", st)
		}
		again, err := decodeInspect(encodeInspect(st))
		if err != nil || again != st {
			t.Fatalf("round trip: %+v -> %+v, %v", st, again, err)
		}
	})
}
