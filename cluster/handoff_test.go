package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// joinHarness is a 3-node harness with a fourth node started on a ring of
// itself, as a joining gateway starts, and the 4-member ring it will join;
// every node has rules (the shared rule "api" when none are given).
func joinHarness(t *testing.T, rules ...quota.Rule) (*harness, *Ring) {
	if len(rules) == 0 {
		rules = []quota.Rule{gcraRule("api", quota.ModeShared, 10, time.Second, 10)}
	}
	h := newHarness(t, 3, time.Millisecond, rules...)
	c := NewCoordinator(CoordinatorConfig{Self: "node-3", SyncInterval: 20 * time.Millisecond, DecideTimeout: 50 * time.Millisecond})
	c.SetRules(0, ruleParams(t, rules))
	self, _ := NewRing(0, []Member{{Name: "node-3"}})
	c.SetTable(h.now, self)
	h.nodes["node-3"] = c
	h.names = append(h.names, "node-3")
	h.waiting["node-3"] = map[uint64]int64{}
	var members []Member
	for _, n := range h.names {
		members = append(members, Member{Name: n, Addr: n})
	}
	next, err := NewRing(2, members)
	if err != nil {
		t.Fatal(err)
	}
	return h, next
}

// movedTo returns n identities that next gives to node-3, with the owner
// each had before it joined.
func movedTo(next *Ring, n int) (ids, from []string) {
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprint("moved-", i)
		if next.OwnerName(id) == "node-3" {
			ids = append(ids, id)
			from = append(from, next.OwnerNameExcept(id, "node-3"))
		}
	}
	return ids, from
}

// admitted sends n requests of one token for id at node, lets the network
// carry what they need for up to 20 ms, and returns how many were admitted.
func admitted(h *harness, node, id string, n int) int {
	mark := len(h.admits)
	for range n {
		h.request(node, "api", id, 1)
	}
	for range 10 {
		h.step(2 * time.Millisecond)
	}
	return len(h.admits) - mark
}

// TestJoinWaitsForHandoff: a joining node owns its share at once; until the
// previous owner has handed a moved identity's bucket over and said so, it
// has the previous owner decide the identity's requests on the bucket that
// owner holds (a spent bucket stays spent, a fresh one admits its burst in
// full); after the handoff it decides them itself, on the state handed over
// (what the previous owner admitted meanwhile included).
func TestJoinWaitsForHandoff(t *testing.T) {
	h, next := joinHarness(t)
	ids, from := movedTo(next, 2)
	spent, fresh := ids[0], ids[1]
	// The previous owner spends spent's whole burst.
	if got := admitted(h, from[0], spent, 10); got != 10 {
		t.Fatalf("the previous owner admitted %d of a full bucket's 10", got)
	}
	// Every node but the previous owners sees the join.
	lagging := map[string]bool{from[0]: true, from[1]: true}
	for _, n := range h.names {
		if !lagging[n] {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	if got := admitted(h, "node-3", spent, 10); got != 0 {
		t.Fatalf("before the handoff the new owner admitted %d of a spent bucket", got)
	}
	if got := admitted(h, "node-3", fresh, 10); got != 10 {
		t.Fatalf("before the handoff the new owner admitted %d of a fresh identity's burst of 10, want all", got)
	}
	if st := h.nodes["node-3"].Stats(); st.ViewRejects != 0 {
		t.Errorf("the new owner rejected %d requests itself while waiting for the handoff", st.ViewRejects)
	}
	for n := range lagging {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	h.step(2 * time.Millisecond) // handoffs and markers arrive
	for _, id := range ids {
		if oe := h.nodes["node-3"].owned.get(entryKey{"api", id}); oe == nil || oe.warming {
			t.Fatalf("%s: after the marker the new owner still waits (or holds no bucket)", id)
		}
		if got := admitted(h, "node-3", id, 1); got != 0 {
			t.Errorf("%s: after the handoff the new owner admitted a request the handed bucket cannot pay", id)
		}
	}
}

// TestJoinHandoffTimeout: when a previous owner does not answer (it crashed
// and membership has not noticed, or its messages are lost), the new owner
// decides a relayed request itself after half the decide timeout, on its
// own bucket, whose warm-up ends: the stated owner-crash term, not an
// outage and not a rejection.
func TestJoinHandoffTimeout(t *testing.T) {
	h, next := joinHarness(t)
	ids, from := movedTo(next, 1)
	h.cut[from[0]] = true
	for _, n := range h.names {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	h.step(10 * time.Millisecond)
	h.request("node-3", "api", ids[0], 1)
	if len(h.waiting["node-3"]) != 1 {
		t.Fatal("the new owner did not ask the previous owner")
	}
	h.step(20 * time.Millisecond) // before half the decide timeout (25 ms)
	if len(h.waiting["node-3"]) != 1 {
		t.Fatal("the relayed request was decided before its timeout")
	}
	h.step(10 * time.Millisecond)
	if len(h.waiting["node-3"]) != 0 || len(h.admits) != 1 {
		t.Fatalf("after the relay's timeout: %d waiting, %d admitted; want the new owner's own admission", len(h.waiting["node-3"]), len(h.admits))
	}
	if got := admitted(h, "node-3", ids[0], 9); got != 9 {
		t.Errorf("after the timeout the new owner admitted %d of the 9 tokens left, want all at once", got)
	}
	if st := h.nodes["node-3"].Stats(); st.Degraded != 0 {
		t.Errorf("%d decisions degraded", st.Degraded)
	}
}

// TestHandoffAddsToChargesMadeMeanwhile: spend the new owner charged before
// the handoff arrived and the handed-over debt add up; neither hides the
// other.
func TestHandoffAddsToChargesMadeMeanwhile(t *testing.T) {
	rule := gcraRule("api", quota.ModeExact, 100, time.Second, 10)
	c := NewCoordinator(CoordinatorConfig{Self: "b"})
	c.SetRules(0, ruleParams(t, []quota.Rule{rule}))
	ring, _ := NewRing(1, []Member{{Name: "b"}})
	c.SetTable(t0, ring)
	for range 4 {
		if o, _ := c.Decide(t0, "api", "x", 1); !o.Allowed {
			t.Fatal("refused a full bucket")
		}
	}
	// The old owner hands over 6 tokens of debt (60ms at 100/s).
	c.Step(t0, "a", &Message{Handoffs: []HandoffItem{{Rule: "api", Identity: "x", Debt: int64(60 * time.Millisecond)}}})
	if o, _ := c.Decide(t0, "api", "x", 1); o.Allowed {
		t.Errorf("4 charged here + 6 handed over = the burst of 10, yet one more was admitted")
	}
}

// TestSyncDuringWarmUpKeepsTheBucketShut: while a new owner waits for the
// previous owner's handoff, a node's sync must not come back acknowledged
// against a fresh bucket, or the node could spend its slack again at every
// round trip: the region admits at most the slacks until the state arrives,
// and after it the spent bucket refuses.
func TestSyncDuringWarmUpKeepsTheBucketShut(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 400, time.Minute, 20) // slack 5 on 4 nodes
	h := newHarness(t, 3, time.Millisecond, rule)
	c := NewCoordinator(CoordinatorConfig{Self: "node-3", SyncInterval: 20 * time.Millisecond, DecideTimeout: 50 * time.Millisecond})
	c.SetRules(0, ruleParams(t, []quota.Rule{rule}))
	self, _ := NewRing(0, []Member{{Name: "node-3"}})
	c.SetTable(h.now, self)
	h.nodes["node-3"] = c
	h.names = append(h.names, "node-3")
	h.waiting["node-3"] = map[uint64]int64{}
	var members []Member
	for _, n := range h.names {
		members = append(members, Member{Name: n, Addr: n})
	}
	next, _ := NewRing(2, members)
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	// The previous owner's bucket is spent.
	for range 20 {
		h.request(prev, "api", id, 1)
	}
	var other string
	for _, n := range h.names[:3] {
		if n != prev {
			other = n
			break
		}
	}
	for _, n := range h.names {
		if n != prev {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	before := len(h.admits)
	for range 30 {
		h.request(other, "api", id, 1)
		h.step(time.Millisecond)
	}
	slack := ruleParams(t, []quota.Rule{rule})[0].Slack(4)
	if got := int64(len(h.admits) - before); got > 2*slack {
		t.Fatalf("during the warm-up the region admitted %d, more than the two slacks (%d)", got, 2*slack)
	}
	h.nodes[prev].SetTable(h.now, next)
	h.flush()
	h.step(5 * time.Millisecond)
	h.step(30 * time.Millisecond) // the view refreshes on the next sync
	mark := len(h.admits)
	for range 10 {
		h.request(other, "api", id, 1)
		h.step(time.Millisecond)
	}
	if got := len(h.admits) - mark; got > 0 {
		t.Errorf("after the handoff of a spent bucket %d more were admitted", got)
	}
}

// TestLaggingPeerDecidedOnHandedBucket: a peer whose ring has not changed
// yet still forwards to the old owner; the old owner decides on the bucket
// it handed over, not on a fresh one.
func TestLaggingPeerDecidedOnHandedBucket(t *testing.T) {
	h, next := joinHarness(t, gcraRule("api", quota.ModeExact, 10, time.Minute, 5))
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	for range 5 {
		h.request(prev, "api", id, 1)
	}
	var lagging string
	for _, n := range h.names[:3] {
		if n != prev {
			lagging = n
			break
		}
	}
	// Everyone but the lagging node sees the join.
	for _, n := range h.names {
		if n != lagging {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	// Past the new owners' warm-up too: membership on a LAN can take
	// longer than that to reach every node.
	h.step(DefaultHandoffTimeout + 10*time.Millisecond)
	mark := len(h.admits)
	for range 5 {
		h.request(lagging, "api", id, 1) // forwarded to prev, the owner in its ring
	}
	for range 4 {
		h.step(2 * time.Millisecond)
	}
	if len(h.waiting[lagging]) != 0 {
		t.Fatalf("%d forwarded requests still wait", len(h.waiting[lagging]))
	}
	if got := len(h.admits) - mark; got != 0 {
		t.Errorf("the old owner admitted %d for a lagging peer on a fresh bucket; its handed bucket was spent", got)
	}
}

// TestHandoffAllOnce: a leaving node that sees the ring without itself
// after HandoffAll (memberlist's leave reaching its own view) hands nothing
// again: the new owner would count the state twice.
func TestHandoffAllOnce(t *testing.T) {
	for _, rule := range []quota.Rule{gcraRule("api", quota.ModeExact, 10, time.Minute, 10), fixedRule("api", 10, time.Minute),
		windowRule("api", quota.AlgorithmSlidingLog, 10, time.Minute)} {
		t.Run(string(rule.Algorithm), func(t *testing.T) {
			h := newHarness(t, 3, time.Millisecond, rule)
			id := "leaver"
			owner := h.ring.OwnerName(id)
			for range 6 {
				if !decideOne(t, h.nodes[owner], h.now, "api", id) {
					t.Fatal("the owner refused")
				}
			}
			handoffs := 0
			h.observe = func(node string, rd Ready) {
				for _, env := range rd.Messages {
					if node == owner {
						handoffs += len(env.Msg.Handoffs)
					}
				}
			}
			next := h.ringWithout(t, owner)
			h.nodes[owner].HandoffAll(h.now, next)
			h.flush()
			h.nodes[owner].SetTable(h.now, next)
			h.flush()
			if handoffs != 1 {
				t.Errorf("the leaver sent %d handoffs of its one identity, want 1", handoffs)
			}
		})
	}
}
