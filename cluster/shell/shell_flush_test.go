package shell

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/quota"
)

// TestFlushSendsWhatRepliesReady: what stepping a Flush's replies readies is
// sent, not dropped. Node c answers nothing until the test is done, so b
// always has an exchange in flight and its forwarded decision for an
// identity a owns waits in its outbox (the linger backstop is an hour
// away, the first tick two seconds): the only way it can leave is in b's
// reply to a's Flush. a, stepping
// that reply inside Flush, decides it as the owner, and its result must
// reach b, whose caller then gets a remote admission; the Node dropped it
// before, and the caller got a degraded decision at its decide timeout.
func TestFlushSendsWhatRepliesReady(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("three nodes", testFlushSendsWhatRepliesReady)
}

func testFlushSendsWhatRepliesReady(t *testing.T) {
	rules := []quota.Rule{gcraRule("s", quota.ModeShared, 1000, time.Second, 100), gcraRule("e", quota.ModeExact, 1000, time.Second, 100)}
	names := []string{"gw-a", "gw-b", "gw-c"}
	shells := map[string]*Node{}
	release := make(chan struct{}) // c answers once it is closed
	var members []cluster.Member
	var trs []*GRPCTransport
	for _, name := range names {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		slow := name == "gw-c"
		tr, err := NewGRPCTransport(GRPCConfig{Self: name, Listener: ln,
			Handler: func(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
				if slow {
					select { // keeps every exchange with c in flight
					case <-release:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				return shells[name].Handle(ctx, from, m)
			}})
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
		sh, err := New(Config{
			Coordinator: cluster.CoordinatorConfig{Self: name, DecideTimeout: time.Second, SyncInterval: time.Hour},
			Transport:   tr, CallTimeout: 20 * time.Second, Linger: time.Hour, Shards: 1,
			// The ticker flushes too: its first tick comes long after the
			// exchanges below (and expires a decision the bug strands).
			TickInterval: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		shells[name] = sh
		members = append(members, cluster.Member{Name: name, Addr: tr.Addr()})
	}
	t.Cleanup(func() {
		for i, name := range names {
			shells[name].Close()
			trs[i].Close()
		}
	})
	var released bool
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(free) // runs first: c answers, so the shells can close
	ring, err := cluster.NewRing(1, members)
	if err != nil {
		t.Fatal(err)
	}
	params := ruleParams(t, rules)
	for _, sh := range shells {
		sh.SetRules(params)
		sh.SetRing(ring)
	}
	ownedBy := func(owner string) string {
		for i := 0; ; i++ {
			if id := fmt.Sprint("id-", i); ring.OwnerName(id) == owner {
				return id
			}
		}
	}
	x, y, z := ownedBy("gw-a"), ownedBy("gw-b"), ownedBy("gw-c")
	a, b := shells["gw-a"], shells["gw-b"]
	ctx := context.Background()

	// b's exchange with c: in flight until the end.
	slowDone := decideAsync(t, b, "e", z)
	// Only exchanges with c are in flight, on a and on b, and c's own have
	// returned (the ring's first exchanges), so that nothing returning
	// collects what b queues next, and no reply of b's (nor anything b's
	// handler sends on) but its reply to a's Flush can carry it.
	onlyC := func(sh *Node) bool {
		sh.lkMu.Lock()
		defer sh.lkMu.Unlock()
		return sh.lk.InFlight(sh.lk.Peer("gw-c")) && sh.lk.Busy() == 1
	}
	idle := func(sh *Node) bool {
		sh.lkMu.Lock()
		defer sh.lkMu.Unlock()
		return sh.lk.Busy() == 0
	}
	c := shells["gw-c"]
	waitFor(t, func() bool { return onlyC(a) && onlyC(b) && idle(c) })
	// b's decision for x now waits in its outbox: an exchange is in flight.
	xDone := decideAsync(t, b, "e", x)
	waitFor(t, func() bool {
		st, _, _ := b.Stats()
		return st.Forwarded >= 2
	})
	sh := &b.shards[0]
	sh.mu.Lock()
	queued := sh.coord.Queued()
	sh.mu.Unlock()
	if queued == 0 {
		t.Fatalf("b's decision for %s left at once: nothing for a's Flush to carry back", x)
	}
	// a admits y within its slack (unreported: the sync interval is an
	// hour), then flushes: one exchange to y's owner b.
	if o, err := a.Decide(ctx, "s", y, 1); err != nil || !o.Allowed || o.Source != cluster.SourceSlack {
		t.Fatalf("a's admission of %s: %+v, %v", y, o, err)
	}
	a.Flush()

	if o := <-xDone; !o.Allowed || o.Degraded || o.Source != cluster.SourceRemote {
		t.Errorf("b's decision for %s: %+v, want a remote admission by its owner", x, o)
	}
	free()
	if o := <-slowDone; !o.Allowed || o.Degraded {
		t.Errorf("b's decision for %s (owner c): %+v", z, o)
	}
	for _, name := range names {
		if st, _, failed := shells[name].Stats(); st.Degraded != 0 || failed != 0 {
			t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", name, st.Degraded, failed)
		}
	}
}

// waitFor polls cond for up to ten seconds.
// decideAsync decides one token of identity under rule on sh in a
// goroutine of its own and hands the outcome to the channel it returns.
func decideAsync(t *testing.T, sh *Node, rule, identity string) <-chan cluster.Outcome {
	done := make(chan cluster.Outcome, 1)
	go func() {
		o, err := sh.Decide(context.Background(), rule, identity, 1)
		if err != nil {
			t.Error(err)
		}
		done <- o
	}()
	return done
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
