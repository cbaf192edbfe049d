package cluster

import (
	"errors"
	"fmt"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// BucketState is one identity's bucket under one rule as one node knows it:
// on the identity's owner, the bucket that decides; on another node, what
// that node admitted on its own and has not had acknowledged. It answers
// an operator's "why is this identity throttled?" and changes nothing.
type BucketState struct {
	// Node is the member that reported the state; Owner is whom its ring
	// names as the identity's owner ("" with no ring).
	Node, Owner string
	// Known is false when the node decides no rule of that id (it is not
	// a shared or exact rule, or the node's rule set differs).
	Known bool
	// Held is true when Node is the owner and holds a bucket for the
	// identity; false on the owner means the bucket is full (the same as
	// no entry). For an identity of a shared gcra rule that the owner
	// decides on its sketch (blind spend: docs/overshoot.md), the bucket
	// is the sketch's estimate, which is never below the identity's own,
	// and Held says whether it is spent at all.
	Held bool
	// Algorithm is the rule's: quota.AlgorithmGCRA ("gcra"),
	// quota.AlgorithmFixedWindow ("fixed_window"),
	// quota.AlgorithmSlidingWindow ("sliding_window"),
	// quota.AlgorithmSlidingLog ("sliding_log") or
	// quota.AlgorithmLeakyBucket ("leaky_bucket") or
	// quota.AlgorithmConcurrency ("concurrency": Count is the slots in
	// flight, ResetAfter when the last of them lapses).
	Algorithm string
	// Burst is the bucket's capacity in tokens and Interval the time one
	// token takes to come back (the rule's window ÷ limit). For a
	// fixed_window rule Burst is the limit per window and Interval is 0:
	// nothing comes back before the window ends (ResetAfter). For a
	// leaky_bucket rule Burst is the queue's positions and Interval its
	// spacing; ResetAfter is when the queue drains.
	Burst    int64
	Interval time.Duration
	// Count is, on the owner, for a fixed_window rule the tokens counted
	// in the current window, for a sliding_window rule the estimate of the
	// tokens in the last window, for a sliding_log rule the tokens logged
	// in it (Burst − Remaining, or more when spend from before the rule
	// became exact was charged); 0 for the other algorithms.
	Count int64
	// Remaining is what a request could spend now; ResetAfter is how long
	// until the bucket is full again (the TAT counted from now).
	Remaining  int64
	ResetAfter time.Duration
	// Debt is what the bucket owes beyond empty, in tokens, rounded up:
	// spend other nodes admitted within their slack and reported after the
	// bucket ran dry. It is paid back by refill, never capped.
	Debt int64
	// Warming is true while the owner, new after a ring change, waits for
	// the previous owner's handoff and admits only within slack.
	Warming bool
	// Reporters is how many nodes' spend reports the owner keeps for it.
	Reporters int
	// Unconfirmed is, on a node that is not the owner, what it admitted
	// within its slack and the owner has not acknowledged yet (with an
	// entry of the identity, or as blind spend without one).
	Unconfirmed int64
}

// Inspect reports k's bucket under ruleID at now as this coordinator knows
// it (see BucketState). It changes nothing: no entry is created, nothing is
// charged, synced or expired. An unknown rule is an error.
func (c *Coordinator) Inspect(now int64, ruleID, identity string) (BucketState, error) {
	st := BucketState{Node: c.cfg.Self}
	if c.table != nil {
		st.Owner = c.table.OwnerName(identity)
	}
	r, ok := c.rules[ruleID]
	if !ok {
		return st, fmt.Errorf("%w %q", ErrUnknownRule, ruleID)
	}
	st.Known = true
	st.Algorithm = string(r.Algorithm)
	k := entryKey{ruleID, identity}
	// The owner's entry, when this node decides the identity, and this
	// node's own entry: what every algorithm reports the same way.
	var oe *ownerEntry
	if st.Owner == "" || st.Owner == c.cfg.Self {
		if oe = c.owned.get(k); oe != nil {
			st.Reporters = len(oe.reports)
			st.Warming = oe.warming && now < c.warmUntil && (c.table == nil || c.handedOver[oe.from] != c.table.Digest())
		}
	}
	e := c.entries.get(k)
	if e != nil {
		st.Unconfirmed = e.spent - e.acked
	}
	if r.blind {
		st.Unconfirmed += c.blindSpend(r, identity)
		if oe == nil && (st.Owner == "" || st.Owner == c.cfg.Self) {
			// Decided on the sketch: its estimate stands for the bucket.
			var idx tatSlots
			r.bs.slots(r.blindHash(identity), &idx)
			oe = &ownerEntry{tat: bucket.TAT(r.bs.estimate(&idx))}
		}
	}
	switch {
	case r.exact != nil:
		// The owner's state; elsewhere a node keeps none (exact mode:
		// every request goes to the owner), so it shows an empty one.
		st.Burst = r.Burst
		r.exact.inspect(oe, now, &st)
	default:
		// Not the owner: this node's view of the owner's bucket.
		inspectGCRA(now, r, oe, e != nil && st.Owner != c.cfg.Self, e, &st)
	}
	return st, nil
}

// inspectGCRA fills st for a gcra rule: the owner's bucket, or on another
// node its view of the owner's bucket plus its own unconfirmed spend (what
// it decides on without asking).
func inspectGCRA(now int64, r *RuleParams, oe *ownerEntry, viewed bool, e *nodeEntry, st *BucketState) {
	t := r.gcra.Interval().Nanoseconds()
	st.Burst, st.Interval = r.Burst, time.Duration(t)
	tau := t * r.Burst
	tat := now // a full bucket
	if oe != nil {
		st.Held = !oe.tat.Idle(now)
		tat = max(int64(oe.tat), now)
	}
	if viewed {
		tat = max(e.view, now) + st.Unconfirmed*t
	}
	used := tat - now
	st.ResetAfter = time.Duration(used)
	if free := tau - used; free > 0 {
		st.Remaining = free / t
	}
	if over := used - tau; over > 0 {
		st.Debt = (over + t - 1) / t
	}
}

// ErrUnknownRule wraps an Inspect answer for a rule the peer does not
// decide.
var ErrUnknownRule = errors.New("cluster: unknown rule")
