package raftgroup

import (
	"context"

	"github.com/weir-dev/weir/lease"
)

// Reporter sends a region's Report to the lease group and returns its
// grants. *Group (a voter) and *Client (any other node) implement it.
type Reporter interface {
	Report(ctx context.Context, r lease.Report) (lease.Result, error)
}

var (
	_ Reporter = (*Group)(nil)
	_ Reporter = (*Client)(nil)
)

// Report proposes Command{Report: &r} through the leader (Propose) and
// returns its grants.
func (g *Group) Report(ctx context.Context, r lease.Report) (lease.Result, error) {
	return g.Propose(ctx, lease.Command{Report: &r})
}
