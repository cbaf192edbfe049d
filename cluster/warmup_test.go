package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// Deterministic tests of the warm-up after a ring change (warmup.go): no
// network, a virtual clock, the harness of coordinator_test.go.

// fixedTable is an OwnerTable with owners given by hand: owner[identity],
// or def for any other identity.
type fixedTable struct {
	epoch, digest uint64
	names         []string
	owner         map[string]string
	def           string
}

func (t *fixedTable) Epoch() uint64   { return t.epoch }
func (t *fixedTable) Digest() uint64  { return t.digest }
func (t *fixedTable) Len() int        { return len(t.names) }
func (t *fixedTable) Names() []string { return t.names }
func (t *fixedTable) OwnerName(identity string) string {
	if o, ok := t.owner[identity]; ok {
		return o
	}
	return t.def
}
func (t *fixedTable) OwnerNameExcept(identity, except string) string {
	if o := t.OwnerName(identity); o != except {
		return o
	}
	for _, n := range t.names {
		if n != except {
			return n
		}
	}
	return ""
}

// thirdNode returns a member of h's first three nodes that is neither a nor b.
func thirdNode(h *harness, a, b string) string {
	for _, n := range h.names[:3] {
		if n != a && n != b {
			return n
		}
	}
	return ""
}

// TestWarmUpRelaysForwardedRequests: a node whose ring has changed forwards
// a moved identity's requests to its new owner, which has no state for it
// yet and relays them to the previous owner (whose ring lags): the previous
// owner decides them all on its one bucket and the answers go back to the
// node that asked. A fresh identity's burst is admitted whole and the next
// request is rejected; once the previous owner hands the bucket over, the
// new owner decides on it, spent.
func TestWarmUpRelaysForwardedRequests(t *testing.T) {
	h, next := joinHarness(t, gcraRule("api", quota.ModeExact, 5, time.Second, 5))
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	asker := thirdNode(h, prev, "node-3")
	for _, n := range h.names {
		if n != prev {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	if got := admitted(h, asker, id, 5); got != 5 {
		t.Fatalf("a fresh identity's burst of 5 at %s: %d admitted during the warm-up, want 5", asker, got)
	}
	if got := admitted(h, asker, id, 1); got != 0 {
		t.Fatalf("a 6th request in the same instant was admitted during the warm-up")
	}
	if st := h.nodes[prev].Stats(); st.Owned != 1 {
		t.Fatalf("the previous owner holds %d buckets, want the one it decided on", st.Owned)
	}
	h.nodes[prev].SetTable(h.now, next)
	h.flush()
	h.step(2 * time.Millisecond) // the handoff and the marker arrive
	if got := admitted(h, asker, id, 1); got != 0 {
		t.Errorf("after the handoff the new owner admitted a request of the spent bucket")
	}
	if st := h.nodes["node-3"].Stats(); st.ViewRejects != 0 || st.Degraded != 0 {
		t.Errorf("the new owner rejected %d requests itself and degraded %d", st.ViewRejects, st.Degraded)
	}
}

// TestWarmUpSpendFollowsTheIdentity: when the previous owner has already
// switched to the new ring (its handed-over marker is lost on the way, so
// the new owner still waits), it decides a relayed request on what it holds
// and sends what it admitted to the new owner as a handoff: the new owner,
// deciding for itself after the warm-up, has that spend.
func TestWarmUpSpendFollowsTheIdentity(t *testing.T) {
	h, next := joinHarness(t, gcraRule("api", quota.ModeExact, 5, time.Minute, 5))
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	h.nodes[prev].SetTable(h.now, next)
	h.nodes[prev].Ready() // its handoffs and marker are lost
	for _, n := range h.names {
		if n != prev {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	if got := admitted(h, "node-3", id, 3); got != 3 {
		t.Fatalf("%d of 3 admitted during the warm-up", got)
	}
	if oe := h.nodes[prev].owned.get(entryKey{"api", id}); oe == nil || !oe.handed {
		t.Fatalf("the previous owner decided on no bucket, or on one it does not mark handed over")
	}
	h.step(DefaultHandoffTimeout) // the marker never comes: the warm-up ends
	if got := admitted(h, "node-3", id, 5); got != 2 {
		t.Errorf("after the warm-up the new owner admitted %d of the 2 tokens left (5 − 3 admitted by the previous owner)", got)
	}
}

// TestWarmUpSameMembers: a table with the same members under a new epoch (a
// membership view announced again) starts no warm-up: a never-seen
// identity is decided at once, by its owner.
func TestWarmUpSameMembers(t *testing.T) {
	rule := gcraRule("api", quota.ModeExact, 5, time.Second, 5)
	h := newHarness(t, 3, time.Millisecond, rule)
	var members []Member
	for _, n := range h.names {
		members = append(members, Member{Name: n, Addr: n})
	}
	again, _ := NewRing(7, members)
	for _, n := range h.names {
		h.nodes[n].SetTable(h.now, again)
	}
	h.flush()
	owner := again.OwnerName("fresh")
	for range 5 {
		o, err := h.nodes[owner].Decide(h.now, "api", "fresh", 1)
		if err != nil || o.Pending || !o.Allowed {
			t.Fatalf("a re-announced ring: the owner's decision is %+v (err %v), want an admission at once", o, err)
		}
	}
}

// TestWarmUpPreviousOwnerGone: an identity whose previous owner is not in
// the new ring (it crashed; or it left, handing its buckets over first) is
// not waited for: its new owner decides at once (after a crash that is the
// owner-crash term, the lost bucket).
func TestWarmUpPreviousOwnerGone(t *testing.T) {
	rule := gcraRule("api", quota.ModeExact, 5, time.Second, 5)
	h := newHarness(t, 3, time.Millisecond, rule)
	var id string
	for i := 0; id == ""; i++ {
		if x := fmt.Sprint("gone-", i); h.ring.OwnerName(x) == "node-1" {
			id = x
		}
	}
	rest, _ := NewRing(2, []Member{{Name: "node-0", Addr: "node-0"}, {Name: "node-2", Addr: "node-2"}})
	for _, n := range []string{"node-0", "node-2"} {
		h.nodes[n].SetTable(h.now, rest)
	}
	owner := rest.OwnerName(id)
	o, err := h.nodes[owner].Decide(h.now, "api", id, 1)
	if err != nil || o.Pending || !o.Allowed {
		t.Fatalf("the new owner's decision is %+v (err %v), want an admission at once", o, err)
	}
}

// TestWarmUpNoRelayBack: two nodes whose views each give an identity to
// themselves, each having had the other as its owner before, do not relay
// its requests back and forth: the one asked by its own warm-up target
// decides on its own bucket (split ownership), and the asker gets the
// answer.
func TestWarmUpNoRelayBack(t *testing.T) {
	rule := gcraRule("api", quota.ModeExact, 5, time.Second, 5)
	h := &harness{t: t, nodes: map[string]*Coordinator{}, now: t0, oneway: int64(time.Millisecond),
		waiting: map[string]map[uint64]int64{}, cut: map[string]bool{}, names: []string{"a", "b"}}
	names := []string{"a", "b"}
	for _, n := range names {
		c := NewCoordinator(CoordinatorConfig{Self: n, SyncInterval: 20 * time.Millisecond, DecideTimeout: 50 * time.Millisecond})
		c.SetRules(t0, ruleParams(t, []quota.Rule{rule}))
		h.nodes[n] = c
		h.waiting[n] = map[uint64]int64{}
	}
	other := map[string]string{"a": "b", "b": "a"}
	for _, n := range names {
		h.nodes[n].SetTable(h.now, &fixedTable{epoch: 1, digest: 1, names: names, def: other[n]})
		h.nodes[n].SetTable(h.now, &fixedTable{epoch: 2, digest: 2, names: names, def: n})
	}
	h.flush()
	h.request("a", "api", "x", 1)
	for range 5 {
		h.step(2 * time.Millisecond)
	}
	if len(h.waiting["a"]) != 0 || len(h.admits) != 1 {
		t.Fatalf("%d waiting, %d admitted: want the request relayed once and answered", len(h.waiting["a"]), len(h.admits))
	}
	if a, b := h.nodes["a"].Stats(), h.nodes["b"].Stats(); a.Forwarded != 1 || b.Forwarded != 0 {
		t.Errorf("relays: a %d, b %d; want a's one, and none back", a.Forwarded, b.Forwarded)
	}
}

// TestWarmUpPeerDown: a request relayed to a previous owner whose breaker
// then opens is decided at once by the new owner, on its own bucket, and
// not degraded.
func TestWarmUpPeerDown(t *testing.T) {
	h, next := joinHarness(t, gcraRule("api", quota.ModeExact, 5, time.Second, 5))
	ids, from := movedTo(next, 1)
	h.cut[from[0]] = true
	for _, n := range h.names {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	h.request("node-3", "api", ids[0], 1)
	if len(h.waiting["node-3"]) != 1 {
		t.Fatal("the new owner did not relay the request")
	}
	h.nodes["node-3"].SetPeerDown(h.now, from[0], true)
	h.flush()
	if len(h.waiting["node-3"]) != 0 || len(h.admits) != 1 {
		t.Fatalf("after the breaker opened: %d waiting, %d admitted", len(h.waiting["node-3"]), len(h.admits))
	}
	if st := h.nodes["node-3"].Stats(); st.Degraded != 0 {
		t.Errorf("%d degraded decisions", st.Degraded)
	}
	if got := admitted(h, "node-3", ids[0], 1); got != 1 {
		t.Errorf("the next request waited for the down peer instead of being decided at once")
	}
}

// TestWarmUpSyncNotAcknowledged: a spend report that reaches a new owner
// during its warm-up is charged but not acknowledged (an acknowledgement of
// a fresh bucket would hand the node its slack again, one of a spent bucket
// would make it reject with tokens left); after the warm-up the node's next
// report is acknowledged with the bucket's state.
func TestWarmUpSyncNotAcknowledged(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 400, time.Minute, 20) // slack 5 on 4 nodes
	h, next := joinHarness(t, rule)
	h.trackAll()
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	asker := thirdNode(h, prev, "node-3")
	acks := 0
	h.observe = func(node string, rd Ready) {
		for _, env := range rd.Messages {
			if node == "node-3" && env.To == asker {
				acks += len(env.Msg.Acks)
			}
		}
	}
	for _, n := range h.names {
		if n != prev {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	h.flush()
	mark := len(h.admits)
	for range 3 { // half the slack: a sync goes out
		h.request(asker, "api", id, 1)
	}
	for range 10 {
		h.step(2 * time.Millisecond)
	}
	if got := len(h.admits) - mark; got != 3 {
		t.Fatalf("%d of 3 admitted within slack", got)
	}
	if acks != 0 {
		t.Fatalf("the warming owner acknowledged %d reports", acks)
	}
	e := h.nodes[asker].entries.get(entryKey{"api", id})
	if e == nil || e.acked != 0 || e.view > h.now {
		t.Fatalf("the node's entry %+v: want its spend unconfirmed and no view of a spent bucket", e)
	}
	h.nodes[prev].SetTable(h.now, next)
	h.flush()
	for range 30 { // the marker, then the next report after the sync interval
		h.step(2 * time.Millisecond)
	}
	if acks == 0 || e.acked != 3 {
		t.Errorf("after the warm-up: %d acknowledgements, %d acknowledged; want the node's 3", acks, e.acked)
	}
}

// TestCoordinatorTimeMonotone: a call with an earlier time than one before
// is taken at the later one (a time read before another call took the
// lock): a bucket never refills backwards, nor is a request decided at a
// time when the bucket was fuller.
func TestCoordinatorTimeMonotone(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(t0, ruleParams(t, []quota.Rule{gcraRule("api", quota.ModeExact, 1, time.Second, 1)}))
	ring, _ := NewRing(1, []Member{{Name: "a"}})
	c.SetTable(t0, ring)
	late := t0 + int64(10*time.Second)
	if o, _ := c.Decide(late, "api", "x", 1); !o.Allowed {
		t.Fatal("refused a full bucket")
	}
	o, _ := c.Decide(t0, "api", "x", 1)
	if o.Allowed || o.RetryAfter > time.Second {
		t.Errorf("a request stamped 10 s earlier: %+v; want it decided at the later time (rejected, retry within 1 s)", o.Decision)
	}
	if c.last != late {
		t.Errorf("the coordinator's time is %d, want the latest passed in", c.last)
	}
}
