package shell

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/weir-dev/weir/cluster"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/cluster/peerpb"
)

// FuzzInspectRequest: any bytes as an Inspect request, handed to the Peer
// server's handler over a real owner's Coordinator.Inspect: never a panic;
// a malformed request is InvalidArgument and counted; an unknown rule
// NotFound; whatever is answered encodes a state that decodes again.
// (FuzzDecodeInspect covers the reply, FuzzDecodeBatch Exchange and
// Stream: with this every message the Peer server decodes is fuzzed.)
func FuzzInspectRequest(f *testing.F) {
	tr := newGRPC(f, "a", echo(new(atomic.Int64)))
	own := ownerOnly(f, 1000)
	mustDecideTB(f, own, t0, "alice", 3)
	tr.SetInspector(func(_ context.Context, _, rule, identity string) (cluster.BucketState, error) {
		return own.Inspect(t0, rule, identity)
	})
	srv := peerServer{t: tr}
	for _, req := range []*peerpb.InspectRequest{
		{From: "b", Rule: "r", Identity: []byte("alice")},
		{From: "b", Rule: "r"},
		{From: "", Rule: "", Identity: []byte{0xff}},
		{From: "b", Rule: "nope", Identity: []byte("x")},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req peerpb.InspectRequest
		if proto.Unmarshal(raw, &req) != nil {
			return
		}
		before := tr.Malformed()
		rep, err := srv.Inspect(context.Background(), &req)
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument:
				if tr.Malformed() != before+1 {
					t.Fatalf("a malformed request not counted: %v", err)
				}
			case codes.NotFound:
			default:
				t.Fatalf("error %v", err)
			}
			return
		}
		if _, err := decodeInspect(rep); err != nil {
			t.Fatalf("the reply does not decode: %v", err)
		}
	})
}

// mustDecideTB is mustDecide for a testing.TB.
func mustDecideTB(tb testing.TB, c *cluster.Coordinator, now int64, id string, cost int64) {
	tb.Helper()
	if _, err := c.Decide(now, "r", id, cost); err != nil {
		tb.Fatal(err)
	}
}
