package raftgroup

import (
	"errors"
	"fmt"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// This file converts the replies of the forwarding service (a proposal's
// result, a durable decision) between the core's types and leasepb; the
// log entries themselves are the core's codec (lease.EntryToPB,
// lease.EntryFromPB).

// errDurableNoDecision: a reply to a durable command carried no decision.
var errDurableNoDecision = errors.New("lease: the reply to a durable command carries no decision")

// decisionToPB and decisionFromPB convert a durable decision.
func decisionToPB(d bucket.Decision) *grouppb.Decision {
	return &grouppb.Decision{Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, ResetIn: int64(d.Reset),
		RetryAfter: int64(d.RetryAfter)}
}

func decisionFromPB(d *grouppb.Decision) bucket.Decision {
	return bucket.Decision{Allowed: d.GetAllowed(), Limit: d.GetLimit(), Remaining: d.GetRemaining(),
		Reset: time.Duration(d.GetResetIn()), RetryAfter: time.Duration(d.GetRetryAfter())}
}

// resultToPB converts a lease.Result.
func resultToPB(r lease.Result) *grouppb.Result {
	pr := &grouppb.Result{Grants: make([]*grouppb.Grant, len(r.Grants))}
	for i, g := range r.Grants {
		pr.Grants[i] = &grouppb.Grant{Rule: g.Rule, Identity: []byte(g.Identity), Epoch: g.Epoch, Share: g.Share,
			Burst: g.Burst, Lifetime: g.Lifetime, Pending: g.Pending}
	}
	return pr
}

// resultFromPB converts a wire Result; nil is an empty Result.
func resultFromPB(pr *grouppb.Result) (lease.Result, error) {
	if len(pr.GetGrants()) == 0 {
		return lease.Result{}, nil
	}
	r := lease.Result{Grants: make([]lease.Grant, 0, len(pr.GetGrants()))}
	for i, g := range pr.GetGrants() {
		if g == nil {
			return lease.Result{}, fmt.Errorf("grant %d is missing", i)
		}
		r.Grants = append(r.Grants, lease.Grant{Rule: g.GetRule(), Identity: string(g.GetIdentity()), Epoch: g.GetEpoch(),
			Share: g.GetShare(), Burst: g.GetBurst(), Lifetime: g.GetLifetime(), Pending: g.GetPending()})
	}
	return r, nil
}
