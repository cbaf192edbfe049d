package raftgroup

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// This file is the durable store's side of the Group and the Client: a
// durable decision is one entry of the leader's Raft log (forwarded from a
// follower, or from a client through any voter), so it is linearizable by
// construction: every decision sees every decision committed before it, on
// whichever node it was asked.

// DurableService decides requests of durable rules through the lease group.
// *Group (a voter) and *Client (any other node) implement it.
type DurableService interface {
	// Durable decides a request of cost tokens for identity under rule
	// through the leader's Raft log and returns the decision.
	Durable(ctx context.Context, rule lease.DurableRule, identity string, cost int64) (bucket.Decision, error)
}

var (
	_ DurableService = (*Group)(nil)
	_ DurableService = (*Client)(nil)
)

// Durable decides a request of cost tokens (at least 1) for identity under
// the durable rule through the leader's Raft log (DurableStore.Apply, at
// the leader's clock) and returns the decision: an admission is charged,
// committed on a quorum and survives any node's crash. It retries like
// Propose, under one request id drawn before the first attempt, so a retry
// after a lost reply (a leader change, a forward that timed out) is
// answered from the first application and never charged twice. A malformed
// command (bad rule parameters, cost < 1, an identity over
// MaxDurableIdentityBytes) is refused with ErrBadCommand before any round
// trip. When Durable fails, the decision may or may not have been applied;
// a caller that treats a failure as a rejection never admits too much.
func (g *Group) Durable(ctx context.Context, rule lease.DurableRule, identity string, cost int64) (bucket.Decision, error) {
	return g.durable(ctx, lease.DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: identity, Cost: cost})
}

// durable applies c (with its request id) through the leader.
func (g *Group) durable(ctx context.Context, c lease.DurableCommand) (bucket.Decision, error) {
	if err := c.Check(); err != nil {
		return bucket.Decision{}, err
	}
	resp, err := g.propose(ctx, lease.Entry{Durable: &c})
	if err != nil {
		return bucket.Decision{}, err
	}
	return resp.Durable, nil
}

// Durable implements grouppb.LeaseGroupServer: the receiver decides through
// Group.durable, which forwards to the leader when it does not lead.
func (s *rpcServer) Durable(ctx context.Context, req *grouppb.DurableRequest) (*grouppb.ProposeReply, error) {
	c, err := lease.DurableFromPB(0, req.GetDecide())
	if err != nil {
		s.g.malformed.Add(1)
		return &grouppb.ProposeReply{Code: grouppb.Code_BAD_COMMAND, Message: fmt.Sprintf("%v: %v", lease.ErrBadCommand, err)}, nil
	}
	d, err := s.g.durable(ctx, c)
	return proposeReply(lease.ApplyResponse{Durable: d}, err), nil
}

// Durable implements DurableService through a voter, which forwards to the
// leader. Every attempt, on any voter, carries the same request id, so a
// decision retried after a lost reply is charged once.
func (c *Client) Durable(ctx context.Context, rule lease.DurableRule, identity string, cost int64) (bucket.Decision, error) {
	return c.durableCommand(ctx, lease.DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: identity, Cost: cost})
}

// durableCommand sends cmd (with its request id) to a voter.
func (c *Client) durableCommand(ctx context.Context, cmd lease.DurableCommand) (bucket.Decision, error) {
	if err := cmd.Check(); err != nil {
		return bucket.Decision{}, err
	}
	req := &grouppb.DurableRequest{From: c.cfg.Name, Decide: lease.DurableToPB(cmd)}
	var d bucket.Decision
	err := c.do(ctx, "durable decision", func(ctx context.Context, cc *grpc.ClientConn, addr string) (bool, error) {
		rep, err := grouppb.NewLeaseGroupClient(cc).Durable(ctx, req)
		if err != nil {
			return callRetryable(ctx, err), fmt.Errorf("lease: voter %s: %w", addr, err)
		}
		if rep.GetCode() == grouppb.Code_OK && rep.GetDurable() == nil {
			return false, fmt.Errorf("voter %s: %w", addr, errDurableNoDecision)
		}
		resp, retry, err := replyResponse("voter "+addr, rep)
		d = resp.Durable
		return retry, err
	})
	return d, err
}

// KeyedDurableService is a DurableService that names a bucket's identity
// under both key formats, so that the store can carry spend across the
// switch. *Group and *Client implement it.
type KeyedDurableService interface {
	DurableService
	// DurableKeyed is Durable for the identity key names.
	DurableKeyed(ctx context.Context, rule lease.DurableRule, key lease.DurableKey, cost int64) (bucket.Decision, error)
}

var (
	_ KeyedDurableService = (*Group)(nil)
	_ KeyedDurableService = (*Client)(nil)
)

// DurableKeyed is Durable for the identity key names (DurableKey).
func (g *Group) DurableKeyed(ctx context.Context, rule lease.DurableRule, key lease.DurableKey, cost int64) (bucket.Decision, error) {
	return g.durable(ctx, lease.DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: key.Identity,
		Legacy: key.Legacy, KeyFormat: key.KeyFormat, Cost: cost})
}

// DurableKeyed is Client.Durable for the identity key names (DurableKey).
func (c *Client) DurableKeyed(ctx context.Context, rule lease.DurableRule, key lease.DurableKey, cost int64) (bucket.Decision, error) {
	return c.durableCommand(ctx, lease.DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: key.Identity,
		Legacy: key.Legacy, KeyFormat: key.KeyFormat, Cost: cost})
}
