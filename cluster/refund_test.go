package cluster

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// refundSetup returns a 3-node harness with rule r, an identity, its owner
// and another node.
func refundSetup(t *testing.T, mode quota.Mode) (h *harness, id, owner, other string) {
	t.Helper()
	h = newHarness(t, 3, time.Millisecond, gcraRule("r", mode, 600, time.Second, 10))
	h.trackAll()
	id = "refund-me"
	owner = h.ring.OwnerName(id)
	for _, n := range h.names {
		if n != owner {
			other = n
			break
		}
	}
	return h, id, owner, other
}

// ownerTAT returns the owner's bucket of id, ahead of now in ns.
func ownerTAT(h *harness, owner, id string) int64 {
	oe := h.nodes[owner].owned.get(entryKey{"r", id})
	if oe == nil {
		return 0
	}
	return max(int64(oe.tat)-h.now, 0)
}

// TestRefundOfRemoteAdmissionReachesOwner: in exact mode a non-owner's
// admissions are the owner's decisions; their refund travels to the owner
// in the next batch, which gives the tokens back on its bucket once: a
// retried or reordered batch gives nothing more, and a report without the
// refund fields (an older node's) changes nothing.
func TestRefundOfRemoteAdmissionReachesOwner(t *testing.T) {
	h, id, owner, other := refundSetup(t, quota.ModeExact)
	oc, nc := h.nodes[owner], h.nodes[other]
	var given []RefundRange
	oc.cfg.OnRefund = func(r RefundRange) { given = append(given, r) }
	var syncs []Message // what the other node sent its owner carrying refunds
	h.observe = func(node string, rd Ready) {
		for _, env := range rd.Messages {
			if node == other && env.To == owner && len(env.Msg.Syncs) > 0 {
				syncs = append(syncs, cloneMsg(env.Msg))
			}
		}
	}
	h.complete = func(node string, c Completion, cost int64) {
		if !c.Outcome.Allowed || c.Outcome.Source != SourceRemote {
			t.Fatalf("forwarded request: %+v", c.Outcome)
		}
	}
	for range 6 {
		h.request(other, "r", id, 1)
	}
	h.flush()
	h.step(time.Millisecond) // the owner decides
	h.step(time.Millisecond) // the results are back
	if len(h.waiting[other]) != 0 {
		t.Fatal("results not back")
	}
	tpn := oc.rules["r"].gcra.Interval().Nanoseconds()
	charged := ownerTAT(h, owner, id)
	if charged < 5*tpn {
		t.Fatalf("owner's bucket %d ns ahead, want about 6 tokens (%d ns)", charged, 6*tpn)
	}
	// Two requests another rule then rejected.
	for i := range 2 {
		rg, ok := nc.Refund(h.now, "r", id, 1, SourceRemote)
		if !ok || rg.From != int64(i) || rg.To != int64(i+1) || rg.Node != other {
			t.Fatalf("refund %d: %+v %v, want asked of the owner, (%d, %d]", i, rg, ok, i, i+1)
		}
	}
	h.flush()
	if ownerTAT(h, owner, id) != charged {
		t.Fatal("the owner gave back before the batch reached it")
	}
	h.step(time.Millisecond) // the sync reaches the owner
	after := ownerTAT(h, owner, id)
	if want := charged - int64(time.Millisecond) - 2*tpn; after != want {
		t.Fatalf("owner's bucket %d ns ahead after the refunds, want %d (2 tokens back)", after, want)
	}
	if sumRanges(given) != 2 || given[len(given)-1].To != 2 {
		t.Fatalf("OnRefund saw %+v, want (0, 2] given back", given)
	}
	h.step(time.Millisecond) // the acknowledgement is back
	e := nc.entries.get(entryKey{"r", id})
	if e.refundBase != 2 || e.refunded != 2 {
		t.Fatalf("node's refunds %d, settled %d: want 2 and 2", e.refunded, e.refundBase)
	}
	if len(syncs) == 0 {
		t.Fatal("no sync carried the refunds")
	}
	// The same batches again (a retry), and the first again after them (a
	// reordered copy): nothing more is given back.
	after = ownerTAT(h, owner, id)
	for _, m := range append(syncs, syncs[0]) {
		oc.Step(h.now, other, &m)
	}
	if got := ownerTAT(h, owner, id); got != after {
		t.Fatalf("a retried batch gave back again: %d ns ahead, want %d", got, after)
	}
	// A report without the fields, as an older node sends it.
	old := Message{Syncs: []SyncItem{{Rule: "r", Identity: id, Gen: e.gen, Total: e.spent}}}
	oc.Step(h.now, other, &old)
	if got := ownerTAT(h, owner, id); got != after {
		t.Fatalf("an old-format report changed the bucket: %d ns ahead, want %d", got, after)
	}
	if sumRanges(given) != 2 {
		t.Fatalf("OnRefund saw %+v, want (0, 2] given back once", given)
	}
}

func sumRanges(rs []RefundRange) int64 {
	var n int64
	for _, r := range rs {
		n += r.To - r.From
	}
	return n
}

// cloneMsg copies m's syncs (the harness's arrays are recycled).
func cloneMsg(m Message) Message {
	m.Syncs = append([]SyncItem(nil), m.Syncs...)
	m.Decides, m.Acks, m.Results, m.Handoffs = nil, nil, nil, nil
	return m
}

// TestRefundOfReportedSlackReachesOwner: in shared mode a node's slack
// spend already reported is charged on the owner: its refund goes there
// too, in the next sync.
func TestRefundOfReportedSlackReachesOwner(t *testing.T) {
	h, id, owner, other := refundSetup(t, quota.ModeShared)
	nc := h.nodes[other]
	o, _ := nc.Decide(h.now, "r", id, 1)
	if o.Source != SourceSlack || !o.Allowed {
		t.Fatalf("the setup needs a slack admission, got %+v", o)
	}
	e := nc.entries.get(entryKey{"r", id})
	nc.FlushAll(h.now) // reported
	h.flush()
	h.step(time.Millisecond)
	h.step(time.Millisecond)
	if e.sent != e.spent || e.acked != e.spent {
		t.Fatalf("spend %d, sent %d, acked %d: want it reported and acknowledged", e.spent, e.sent, e.acked)
	}
	charged := ownerTAT(h, owner, id)
	if charged == 0 {
		t.Fatal("the owner's bucket is full: the report was not charged")
	}
	if _, ok := nc.Refund(h.now, "r", id, 1, SourceSlack); !ok {
		t.Fatal("reported slack spend was not asked of the owner")
	}
	h.flush()
	h.step(time.Millisecond)
	if got := ownerTAT(h, owner, id); got >= charged {
		t.Fatalf("owner's bucket %d ns ahead after the refund, was %d: nothing given back", got, charged)
	}
}

// TestRefundWithoutOwnerRecord: an owner with no record of a node's
// generation (its bucket dropped full, or evicted) gives back only the
// refunds the report says are not settled, not the generation's history;
// and never more than it charged: a full bucket stays full.
func TestRefundWithoutOwnerRecord(t *testing.T) {
	rule := gcraRule("r", quota.ModeShared, 600, time.Second, 10)
	c := NewCoordinator(CoordinatorConfig{Self: "owner"})
	p, _ := NewRuleParams(&rule, 1)
	c.SetRules(0, []RuleParams{p})
	tpn := p.gcra.Interval().Nanoseconds()
	now := t0
	for range 8 {
		c.Decide(now, "r", "x", 1) // the owner's own admissions: 8 tokens of debt
	}
	c.Step(now, "n1", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 7, Total: 0, Refunded: 40, RefundBase: 37}}})
	oe := c.owned.get(entryKey{"r", "x"})
	if got, want := int64(oe.tat)-now, 5*tpn; got != want {
		t.Fatalf("bucket %d ns ahead, want %d: 3 unsettled tokens back of 8", got, want)
	}
	c.Step(now, "n1", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 7, Total: 0, Refunded: 60, RefundBase: 40}}})
	if got := int64(oe.tat); got != now {
		t.Fatalf("bucket %d ns ahead of now, want full (a refund never fills past full)", got-now)
	}
}

// TestRefundGivenUp: refunds the owner never acknowledges (an owner that
// does not know the fields, or one cut off) are resent with the syncs, then
// given up after a decide timeout.
func TestRefundGivenUp(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, gcraRule("r", quota.ModeExact, 60, time.Second, 10))
	id := "refund-me"
	owner := h.ring.OwnerName(id)
	other := h.names[0]
	if other == owner {
		other = h.names[1]
	}
	nc := h.nodes[other]
	for range 6 {
		h.request(other, "r", id, 1)
	}
	h.flush()
	h.step(time.Millisecond)
	h.step(time.Millisecond)
	h.cut[owner] = true // the owner hears nothing more
	if _, ok := nc.Refund(h.now, "r", id, 1, SourceRemote); !ok {
		t.Fatal("remote admission's refund not asked of the owner")
	}
	e := nc.entries.get(entryKey{"r", id})
	sent := nc.Stats().SyncsSent
	for range 8 {
		h.step(10 * time.Millisecond)
	}
	if e.dead {
		t.Fatal("entry dropped while its view of the owner's bucket is spent")
	}
	if e.refundBase != e.refunded {
		t.Fatalf("refunds %d, settled %d after 80 ms: want given up", e.refunded, e.refundBase)
	}
	if nc.Stats().SyncsSent <= sent {
		t.Fatal("the unsettled refund was not resent")
	}
}
