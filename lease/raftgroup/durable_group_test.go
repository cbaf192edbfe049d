package raftgroup

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
)

// decideAll asks for account's trial from every caller at once, several
// times each, and returns how many were admitted.
func decideAll(t *testing.T, callers []DurableService, account string, each int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i, svc := range callers {
		for j := range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), waitBound)
				defer cancel()
				d, err := svc.Durable(ctx, trialRule, account, 1)
				if err != nil {
					t.Errorf("caller %d, try %d: %v", i, j, err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	return admitted.Load()
}

// callers returns every live voter and a client of them.
func (c *cluster) callers(t *testing.T) []DurableService {
	var out []DurableService
	var addrs []string
	for _, g := range c.live() {
		out = append(out, g)
		addrs = append(addrs, g.RPCAddr())
	}
	cl, err := NewClient(ClientConfig{Voters: addrs, Name: "test-client", Timeout: waitBound})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return append(out, cl)
}

// TestDurableGroupTrial: "one free trial per account" (1 per 30 days,
// burst 1) decided through a 3-voter group from every voter and a client
// at once: exactly one admitted per account. Killing the leader, and then
// stopping and restarting every voter, never hands out a second one: the
// bucket lives in the replicated log.
func TestDurableGroupTrial(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.leader()
	callers := c.callers(t)
	for _, acct := range []string{"acct-1", "acct-2"} {
		if n := decideAll(t, callers, acct, 5); n != 1 {
			t.Fatalf("%s: %d trials admitted of %d concurrent requests, want exactly 1", acct, n, 5*len(callers))
		}
	}
	c.converge()
	for _, g := range c.live() {
		if n, _ := g.FSM().DurableLen(); n != 2 {
			t.Fatalf("replica %s holds %d durable buckets, want 2", g.Name(), n)
		}
	}

	l := c.leader()
	c.stop(l.Name())
	if nl := c.leader(); nl == l {
		t.Fatal("the stopped node still leads")
	}
	callers = c.callers(t)
	if n := decideAll(t, callers, "acct-1", 3); n != 0 {
		t.Fatalf("after the leader's death: %d more trials for acct-1", n)
	}
	if n := decideAll(t, callers, "acct-3", 3); n != 1 {
		t.Fatalf("after the leader's death: %d trials for a new account, want 1", n)
	}
	c.restart(l.Name())
	c.converge()

	for _, n := range c.names {
		c.stop(n)
	}
	for _, n := range c.names {
		c.restart(n)
	}
	c.leader()
	callers = c.callers(t)
	for _, acct := range []string{"acct-1", "acct-2", "acct-3"} {
		if n := decideAll(t, callers, acct, 2); n != 0 {
			t.Fatalf("after restarting every voter: %d more trials for %s", n, acct)
		}
	}
	if n := decideAll(t, callers, "acct-4", 2); n != 1 {
		t.Fatalf("after restarting every voter: %d trials for a new account, want 1", n)
	}
	if got := c.live()[0].Malformed(); got != 0 {
		t.Fatalf("%d malformed forwarded commands", got)
	}
}

// TestDurableGroupRetry: a retried command (same request id), sent
// through different voters, is charged once and answered with the first
// decision, also after a snapshot and a restart of the node that answers.
func TestDurableGroupRetry(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader()
	f := c.follower(l)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	r := lease.DurableRule{ID: "otp", Limit: 5, Window: 15 * time.Minute, Burst: 5}
	cmd := lease.DurableCommand{RequestID: "the-request", Rule: r, Identity: "user", Cost: 1}
	first, err := f.durable(ctx, cmd)
	if err != nil || !first.Allowed || first.Remaining != 4 {
		t.Fatalf("first: %+v, %v", first, err)
	}
	c.converge()
	if err := f.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.stop(f.Name())
	f = c.restart(f.Name())
	for _, g := range []*Group{l, f, l} {
		d, err := g.durable(ctx, cmd)
		if err != nil || d != first {
			t.Fatalf("retry through %s: %+v, %v; want %+v", g.Name(), d, err, first)
		}
	}
	d, err := l.Durable(ctx, r, "user", 1)
	if err != nil || d.Remaining != 3 {
		t.Fatalf("a new request: %+v, %v; want charged (3 left)", d, err)
	}
}

// TestDurableGroupNoQuorum: with two of three voters gone, a durable
// decision fails within its ctx (it is never decided without a quorum).
func TestDurableGroupNoQuorum(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader()
	f := c.follower(l)
	for _, g := range c.live() {
		if g != f {
			c.stop(g.Name())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if d, err := f.Durable(ctx, trialRule, "acct", 1); err == nil {
		t.Fatalf("a decision without a quorum: %+v", d)
	}
}

// TestDurableGroupRuleChange: a durable rule's change carries each
// bucket's spend over as tokens, through a 3-voter group: 5/min burst 5
// with 1 token spent, raised to 50/min, admits the next 4 (the 4 tokens
// held); lowered to 2/h burst 2, admits 2 of the next 5 (clamped to the new
// burst). A follower restarted from a snapshot taken after the change holds
// the same buckets and decides the same.
func TestDurableGroupRuleChange(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader()
	f := c.follower(l)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	decide := func(g *Group, r lease.DurableRule, identity string, n int) int {
		t.Helper()
		got := 0
		for range n {
			d, err := g.Durable(ctx, r, identity, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				got++
			}
		}
		return got
	}
	r := lease.DurableRule{ID: "otp", Limit: 5, Window: time.Minute, Burst: 5}
	if decide(l, r, "raise", 1) != 1 || decide(f, r, "lower", 1) != 1 {
		t.Fatal("first request refused")
	}
	raised := r
	raised.Limit = 50
	if got := decide(f, raised, "raise", 4); got != 4 {
		t.Fatalf("raised to 50/min: %d of the next 4 admitted, want 4", got)
	}
	lowered := lease.DurableRule{ID: "otp", Limit: 2, Window: time.Hour, Burst: 2}
	if got := decide(l, lowered, "lower", 5); got != 2 {
		t.Fatalf("lowered to 2/h burst 2: %d of the next 5 admitted, want 2", got)
	}
	c.converge()
	if err := f.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.stop(f.Name())
	f = c.restart(f.Name())
	c.converge()
	if got := decide(f, lowered, "lower", 2); got != 0 {
		t.Fatalf("after a restart from a snapshot: %d more admitted at 2/h, want 0", got)
	}
}
