package raftgroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
	"github.com/weir-dev/weir/quota"
)

// This file is the rule store's side of the Group: writes go through the
// leader's Raft log like Propose (forwarded from a follower), reads come
// from the local replica, or from the leader for a linearizable read.
//
// A linearizable read is served by the leader once it has applied its
// Takeover and then confirmed its leadership with raft's VerifyLeader (a
// heartbeat round to a quorum, no log entry and no disk write), not with
// Barrier (a log entry). That suffices: every entry of an earlier term is
// applied before the leader's Takeover, every write this leader
// acknowledges is applied to its replica before the acknowledgement, and a
// write acknowledged by a newer leader would need a quorum that has
// already left this leader's term, so the confirmation would fail.

// Bounds of a history read.
const (
	// DefaultHistoryLimit is how many audit entries a history read returns
	// when it names no limit.
	DefaultHistoryLimit = 100
	// MaxHistoryLimit is the most audit entries one history read returns.
	MaxHistoryLimit = 1000
)

// RuleService reads and changes the rule store. *Group (a voter) and
// *Client (any other node) implement it; AdminHandler serves it over HTTP.
type RuleService interface {
	// PutRule creates or replaces the rule r.ID on behalf of principal
	// and returns the store's version after it.
	PutRule(ctx context.Context, principal string, r quota.Rule) (uint64, error)
	// DeleteRule deletes the rule id on behalf of principal and returns
	// the store's version after it.
	DeleteRule(ctx context.Context, principal, id string) (uint64, error)
	// ReadRules returns the store's version and rules (ordered by id),
	// from the replica reached or, when linearizable, from the leader.
	ReadRules(ctx context.Context, linearizable bool) (uint64, []quota.Rule, error)
	// ReadHistory returns a page of the audit history.
	ReadHistory(ctx context.Context, q HistoryQuery) (HistoryPage, error)
}

var (
	_ RuleService = (*Group)(nil)
	_ RuleService = (*Client)(nil)
)

// HistoryQuery asks for audit entries newer than Since, oldest first, at
// most Limit of them (0 means DefaultHistoryLimit; capped at
// MaxHistoryLimit).
type HistoryQuery struct {
	Since        uint64
	Limit        int
	Linearizable bool
}

// HistoryPage is one page of the audit history.
type HistoryPage struct {
	// Version is the store's version when read; Oldest the version of the
	// oldest entry the store still keeps (0: none). Entries older than
	// Oldest have been dropped (MaxHistory).
	Version, Oldest uint64
	// Entries are oldest first; read on from the last one's Version.
	Entries []lease.AuditEntry
}

// historyLimit applies the default and the cap.
func historyLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultHistoryLimit
	case n > MaxHistoryLimit:
		return MaxHistoryLimit
	}
	return n
}

// PutRule creates or replaces the rule r.ID through the leader's Raft log
// and returns the rule store's version after it. The rule is validated
// here first (errors as RuleStore.Apply's, naming the field), and the
// whole resulting set again on every replica; see RuleStore.Apply for what
// is refused and what a put equal to the rule in force does. It retries
// like Propose, under one request id, so that a retry of a put that took
// effect is not applied twice. PutRule does not keep r.
func (g *Group) PutRule(ctx context.Context, principal string, r quota.Rule) (uint64, error) {
	return g.putRule(ctx, principal, r, "")
}

// putRule is PutRule under a caller's request id (a Client's); "" draws
// one.
func (g *Group) putRule(ctx context.Context, principal string, r quota.Rule, reqID string) (uint64, error) {
	if reqID == "" {
		reqID = newRequestID()
	}
	c := lease.RuleChange{Principal: principal, RequestID: reqID, Put: &r}
	if err := c.Validate(); err != nil {
		return 0, err
	}
	resp, err := g.propose(ctx, lease.Entry{Rule: &c})
	if err != nil {
		return 0, err
	}
	return resp.RuleVersion, nil
}

// DeleteRule deletes the rule id through the leader's Raft log and returns
// the rule store's version after it; an unknown id is refused with
// ErrRuleNotFound. It retries like Propose, under one request id, so a
// retry of a delete that took effect returns its version, not
// ErrRuleNotFound.
func (g *Group) DeleteRule(ctx context.Context, principal, id string) (uint64, error) {
	return g.deleteRule(ctx, principal, id, "")
}

// deleteRule is DeleteRule under a caller's request id; "" draws one.
func (g *Group) deleteRule(ctx context.Context, principal, id, reqID string) (uint64, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: DeleteRule with an empty id", lease.ErrBadCommand)
	}
	if reqID == "" {
		reqID = newRequestID()
	}
	c := lease.RuleChange{Principal: principal, RequestID: reqID, Delete: id}
	if err := c.Check(); err != nil {
		return 0, err
	}
	resp, err := g.propose(ctx, lease.Entry{Rule: &c})
	if err != nil {
		return 0, err
	}
	return resp.RuleVersion, nil
}

// newRequestID draws a request id: 16 random bytes, hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Rules returns the local replica's rule store version and rules (ordered
// by id, normalised). A follower's replica may lag the leader's by the
// entries in flight; ReadRules(ctx, true) reads the leader's.
func (g *Group) Rules() (uint64, []quota.Rule) {
	v := g.fsm.ReadRules(true, false, 0, 0)
	return v.Version, v.Rules
}

// History returns every audit entry the local replica keeps newer than
// sinceVersion, oldest first.
func (g *Group) History(sinceVersion uint64) []lease.AuditEntry {
	return g.fsm.ReadRules(false, true, sinceVersion, 0).History
}

// ReadRules implements RuleService: the local replica's rules, or, when
// linearizable, the leader's after it confirmed its leadership (forwarded
// when this node does not lead; retried like Propose while there is no
// leader).
func (g *Group) ReadRules(ctx context.Context, linearizable bool) (uint64, []quota.Rule, error) {
	v, err := g.read(ctx, readQuery{linearizable: linearizable, rules: true})
	return v.Version, v.Rules, err
}

// ReadHistory implements RuleService, from the local replica or, when
// q.Linearizable, from the leader.
func (g *Group) ReadHistory(ctx context.Context, q HistoryQuery) (HistoryPage, error) {
	v, err := g.read(ctx, readQuery{linearizable: q.Linearizable, history: true, since: q.Since, limit: q.Limit})
	if err != nil {
		return HistoryPage{}, err
	}
	return HistoryPage{Version: v.Version, Oldest: v.Oldest, Entries: v.History}, nil
}

// readQuery is one read of the rule store.
type readQuery struct {
	linearizable   bool
	rules, history bool
	since          uint64
	limit          int
}

func (q readQuery) toPB(forwarded bool) *grouppb.ReadRulesRequest {
	return &grouppb.ReadRulesRequest{Linearizable: q.linearizable, WithRules: q.rules, WithHistory: q.history,
		Since: q.since, Limit: uint32(min(max(q.limit, 0), MaxHistoryLimit)), Forwarded: forwarded}
}

// read serves q from the local replica or through the leader.
func (g *Group) read(ctx context.Context, q readQuery) (lease.RuleView, error) {
	if !q.linearizable {
		return g.readLocal(q), nil
	}
	var v lease.RuleView
	err := g.retry(ctx, "linearizable read", func(ctx context.Context) (bool, error) {
		var err error
		var retry bool
		if l := g.lead(); l != nil {
			v, retry, err = g.readLeader(ctx, l, q)
			return retry, err
		}
		name, rpcAddr, err := g.leaderRPC()
		if err != nil {
			return true, err
		}
		v, retry, err = g.forwardRead(ctx, name, rpcAddr, q)
		return retry, err
	})
	return v, err
}

// readLeader serves a linearizable read on this leader: once its Takeover
// is applied and VerifyLeader confirms it still leads (see the top of the
// file).
func (g *Group) readLeader(ctx context.Context, l *leadership, q readQuery) (lease.RuleView, bool, error) {
	if retry, err := g.waitReady(ctx, l); err != nil {
		return lease.RuleView{}, retry, err
	}
	// VerifyLeader's future is not answered if Raft shuts down while the
	// request waits in its queue: wait for it beside ctx and Close.
	f := g.raft.VerifyLeader()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	select {
	case err := <-errc:
		if err != nil {
			return lease.RuleView{}, raftRetryable(err), g.raftError(err)
		}
	case <-ctx.Done():
		return lease.RuleView{}, true, fmt.Errorf("lease: confirming leadership: %w", ctx.Err())
	case <-g.done:
		return lease.RuleView{}, false, ErrClosed
	}
	return g.readLocal(q), false, nil
}

func (g *Group) readLocal(q readQuery) lease.RuleView {
	return g.fsm.ReadRules(q.rules, q.history, q.since, historyLimit(q.limit))
}
