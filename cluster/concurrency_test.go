package cluster

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// These tests check concurrency rules in mode exact: the identity's owner
// holds the region's slots, a release frees its slot wherever the slot
// went, and a slot is freed without its release when it lapses or when its
// holder leaves the ring.

func concRule(id string, limit int64, hold time.Duration) quota.Rule {
	return windowRule(id, quota.AlgorithmConcurrency, limit, hold)
}

// held is one admitted acquisition of the tests' clients.
type held struct {
	node   string
	ticket uint64
	until  int64 // when the client releases it
}

// concClients drives a concurrency rule's harness: acquisitions from every
// node, each released by its client some time after its admission, with the
// region's slots in flight (admitted and not yet released) counted at every
// admission.
type concClients struct {
	h        *harness
	rule, id string
	rnd      *rand.Rand
	inFlight []held
	most     int // the most slots in flight at an admission
	admitted int
}

func newConcClients(h *harness, rule, id string) *concClients {
	cc := &concClients{h: h, rule: rule, id: id, rnd: rand.New(rand.NewPCG(1, 2))}
	h.complete = func(node string, c Completion, _ int64) {
		if c.Outcome.Allowed {
			cc.admit(node, c.Ticket)
		}
	}
	return cc
}

func (cc *concClients) admit(node string, ticket uint64) {
	if ticket == 0 {
		cc.h.t.Fatalf("%s: an admission with no ticket", node)
	}
	hold := time.Duration(1+cc.rnd.IntN(20)) * time.Millisecond
	cc.inFlight = append(cc.inFlight, held{node: node, ticket: ticket, until: cc.h.now + int64(hold)})
	cc.admitted++
	cc.most = max(cc.most, len(cc.inFlight))
}

// request asks node for one slot.
func (cc *concClients) request(node string) {
	o, err := cc.h.nodes[node].Decide(cc.h.now, cc.rule, cc.id, 1)
	if err != nil {
		cc.h.t.Fatal(err)
	}
	if o.Pending {
		cc.h.waiting[node][o.Ticket] = 1
		return
	}
	if o.Allowed {
		cc.admit(node, o.Ticket)
	}
}

// acquire asks node for n slots and lets the network answer.
func (cc *concClients) acquire(node string, n int) {
	for range n {
		cc.request(node)
	}
	for range 5 {
		cc.h.step(time.Millisecond)
	}
}

// firstOther returns the first of names that is not name.
func firstOther(names []string, name string) string {
	for _, n := range names {
		if n != name {
			return n
		}
	}
	return ""
}

// releaseDue releases the slots whose requests ended by now.
func (cc *concClients) releaseDue() {
	rest := cc.inFlight[:0]
	for _, s := range cc.inFlight {
		if s.until <= cc.h.now {
			cc.h.nodes[s.node].Release(cc.h.now, cc.rule, cc.id, s.ticket, 1)
			continue
		}
		rest = append(rest, s)
	}
	cc.inFlight = rest
}

// owned returns the slots the owner of id holds for it.
func ownedSlots(c *Coordinator, rule, id string) int64 {
	oe := c.owned.get(entryKey{rule, id})
	if oe == nil {
		return 0
	}
	return c.rules[rule].conc.spent(oe, c.clock(0))
}

// TestConcurrencyExactAcrossNodes: clients on three nodes keep asking for
// slots of one identity and release each 1–20 ms after its admission; the
// region never has more than the limit in flight, and it keeps them in use
// (a slot released is taken again).
func TestConcurrencyExactAcrossNodes(t *testing.T) {
	const limit = 5
	h := newHarness(t, 3, time.Millisecond, concRule("conc", limit, time.Minute))
	cc := newConcClients(h, "conc", "tenant-1")
	for range 2000 { // 2 s
		cc.releaseDue()
		for _, n := range h.names {
			cc.request(n)
		}
		h.step(time.Millisecond)
		if len(cc.inFlight) > limit {
			t.Fatalf("at %v: %d slots in flight, limit %d", time.Duration(h.now-t0), len(cc.inFlight), limit)
		}
	}
	if cc.most != limit {
		t.Errorf("at most %d in flight, want the limit %d reached", cc.most, limit)
	}
	// Each slot is held 10.5 ms on average plus a round trip to free and
	// take again: 5 slots over 2 s admit several hundred.
	if cc.admitted < 400 {
		t.Errorf("%d admitted over 2 s, want the slots reused (>= 400)", cc.admitted)
	}
	for range 30 {
		cc.h.now += int64(time.Millisecond)
		cc.releaseDue()
		h.step(time.Millisecond)
	}
	owner := h.ring.OwnerName("tenant-1")
	if got := ownedSlots(h.nodes[owner], "conc", "tenant-1"); got != 0 {
		t.Errorf("the owner holds %d slots after every release, want 0", got)
	}
	if d := degraded(h); d != 0 {
		t.Errorf("%d degraded decisions with no fault", d)
	}
}

// TestConcurrencyLapses: a slot whose release never comes (the client hung,
// the message was lost) is freed one window after it was taken.
func TestConcurrencyLapses(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, concRule("conc", 2, time.Second))
	id := "tenant-1"
	owner := h.ring.OwnerName(id)
	for range 2 {
		if !decideOne(t, h.nodes[owner], h.now, "conc", id) {
			t.Fatal("a free slot was refused")
		}
	}
	if decideOne(t, h.nodes[owner], h.now, "conc", id) {
		t.Fatal("a third slot of 2 was admitted")
	}
	h.now += int64(time.Second) - 1
	if decideOne(t, h.nodes[owner], h.now, "conc", id) {
		t.Fatal("a slot lapsed before its window")
	}
	h.now++
	if !decideOne(t, h.nodes[owner], h.now, "conc", id) {
		t.Fatal("the slots did not lapse one window after they were taken")
	}
}

// TestConcurrencyHolderLeaves: the slots of a node that leaves the ring (a
// crash) are freed on the owner when its ring drops the node.
func TestConcurrencyHolderLeaves(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, concRule("conc", 3, time.Hour))
	id := "tenant-1"
	owner := h.ring.OwnerName(id)
	other := firstOther(h.names, owner)
	cc := newConcClients(h, "conc", id)
	cc.acquire(other, 3)
	if cc.admitted != 3 {
		t.Fatalf("%d of 3 admitted", cc.admitted)
	}
	if decideOne(t, h.nodes[owner], h.now, "conc", id) {
		t.Fatal("the owner admitted past the limit")
	}
	next := h.ringWithout(t, other)
	h.nodes[owner].SetTable(h.now, next)
	if got := ownedSlots(h.nodes[owner], "conc", id); got != 0 {
		t.Fatalf("the owner holds %d slots of the departed node, want 0", got)
	}
	if !decideOne(t, h.nodes[owner], h.now, "conc", id) {
		t.Fatal("a slot freed by the departure was refused")
	}
}

// TestConcurrencyHandoff: a joining owner receives the slots in flight with
// their holders; a release after the handoff frees its slot there, and one
// that overtakes the handoff is kept until the slot arrives.
func TestConcurrencyHandoff(t *testing.T) {
	h, next := joinHarness(t, concRule("conc", 4, time.Hour))
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	other := firstOther(h.names[:3], prev)
	cc := newConcClients(h, "conc", id)
	cc.acquire(other, 3)
	if cc.admitted != 3 || ownedSlots(h.nodes[prev], "conc", id) != 3 {
		t.Fatalf("%d admitted, the owner holds %d, want 3 and 3", cc.admitted, ownedSlots(h.nodes[prev], "conc", id))
	}
	// Every node but the previous owner takes the new ring first, so that
	// the first release reaches node-3 before the handoff that carries its
	// slot: node-3 keeps it as a tombstone.
	for _, n := range h.names {
		if n != prev {
			h.nodes[n].SetTable(h.now, next)
		}
	}
	first := cc.inFlight[0]
	h.nodes[other].Release(h.now, "conc", id, first.ticket, 1)
	for range 3 {
		h.step(time.Millisecond)
	}
	if st := h.nodes["node-3"].owned.get(entryKey{"conc", id}); st == nil || len(st.ext.conc.freed) != 1 {
		t.Fatalf("node-3 kept no tombstone of the release that overtook the handoff: %+v", st)
	}
	h.nodes[prev].SetTable(h.now, next)
	for range 3 {
		h.step(time.Millisecond)
	}
	if got := ownedSlots(h.nodes["node-3"], "conc", id); got != 2 {
		t.Fatalf("the new owner holds %d slots, want the 2 not released", got)
	}
	second := cc.inFlight[1]
	h.nodes[other].Release(h.now, "conc", id, second.ticket, 1)
	for range 3 {
		h.step(time.Millisecond)
	}
	if got := ownedSlots(h.nodes["node-3"], "conc", id); got != 1 {
		t.Fatalf("after a release sent to the new owner it holds %d slots, want 1", got)
	}
	got := 0
	for range 5 {
		if decideOne(t, h.nodes["node-3"], h.now, "conc", id) {
			got++
		}
	}
	if got != 3 {
		t.Errorf("the new owner admitted %d, want the 3 free of 4", got)
	}
}
