package shell

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/cluster/peerpb"
	"google.golang.org/protobuf/proto"
)

// TestGRPCInspect: a peer's bucket read over Peer.Inspect; a peer with no
// Inspector answers an error, an unknown rule wraps ErrUnknownRule.
func TestGRPCInspect(t *testing.T) {
	start := func(name string) *GRPCTransport {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewGRPCTransport(GRPCConfig{Self: name, Listener: l,
			Handler: func(context.Context, string, *cluster.Message) (*cluster.Message, error) {
				return &cluster.Message{}, nil
			}})
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
	c := cluster.NewCoordinator(cluster.CoordinatorConfig{Self: "b"})
	c.SetRules(0, []cluster.RuleParams{inspectRule(t)})
	now := int64(time.Hour)
	c.Decide(now, "r", "x", 3)
	b.SetInspector(func(_ context.Context, from, rule, id string) (cluster.BucketState, error) {
		if from != "a" {
			t.Errorf("from %q", from)
		}
		return c.Inspect(now, rule, id)
	})
	st, err := a.Inspect(ctx, b.Addr(), "r", "x")
	if err != nil || st.Node != "b" || !st.Held || st.Remaining != 1 || st.ResetAfter != 300*time.Millisecond {
		t.Fatalf("inspect over gRPC: %+v, %v", st, err)
	}
	if _, err := a.Inspect(ctx, b.Addr(), "nope", "x"); !errors.Is(err, cluster.ErrUnknownRule) {
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
	for _, st := range []cluster.BucketState{{}, {Node: "a", Owner: "b", Known: true, Held: true, Burst: 4, Interval: time.Second, Remaining: 2,
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
