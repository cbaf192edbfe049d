package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// These tests check exact mode for fixed_window rules (docs/cluster.md, "exact":
// the identity's owner decides every admission, equal to the reference fed
// in the owner's order): the owner decides on bucket.FixedWindow's state,
// and ring changes, rule changes and refunds keep the window's count.

func fixedRule(id string, limit int64, window time.Duration) quota.Rule {
	return quota.Rule{ID: id, Mode: quota.ModeExact, Algorithm: quota.AlgorithmFixedWindow, Limit: limit, Window: window,
		Burst: limit, Accuracy: quota.DefaultAccuracy, OnFailure: quota.OnFailureLocal}
}

// decideFW asks c for one token of id under rule "fw" at now and reports
// whether it was admitted at once.
func decideFW(t *testing.T, c *Coordinator, now int64, id string) bool {
	t.Helper()
	o, err := c.Decide(now, "fw", id, 1)
	if err != nil {
		t.Fatal(err)
	}
	return !o.Pending && o.Allowed
}

// degraded sums the fail-open decisions of every node of h.
func degraded(h *harness) uint64 {
	var n uint64
	for _, c := range h.nodes {
		n += c.Stats().Degraded
	}
	return n
}

// TestFixedWindowExactAcrossNodes: a client saturating all three nodes
// (one request per node per millisecond) is admitted exactly the limit in
// every aligned window of the owner's clock, summed over the nodes, as one
// bucket.FixedWindow fed every request would admit.
func TestFixedWindowExactAcrossNodes(t *testing.T) {
	const limit, w = 25, 200 * time.Millisecond
	h := newHarness(t, 3, time.Millisecond, fixedRule("fw", limit, w))
	id := "tenant-1"
	for range 1000 { // five windows
		for _, n := range h.names {
			h.request(n, "fw", id, 1)
		}
		h.step(time.Millisecond)
	}
	for range 5 {
		h.step(time.Millisecond)
	}
	per := map[int64]int64{}
	nodes := map[string]bool{}
	for _, a := range h.admits {
		per[(a.at-t0)/int64(w)] += a.cost
		nodes[a.node] = true
	}
	if len(nodes) != 3 {
		t.Errorf("admissions came through %d nodes, want all 3", len(nodes))
	}
	for k := range int64(5) {
		if per[k] != limit {
			t.Errorf("window %d admitted %d summed over the nodes, want exactly %d", k, per[k], limit)
		}
	}
	// Requests sent in the last millisecond reach the owner in window 5.
	if len(per) > 6 || per[5] > limit {
		t.Errorf("admissions per window: %v", per)
	}
	if d := degraded(h); d != 0 {
		t.Errorf("%d degraded decisions with no fault", d)
	}
}

// TestFixedWindowRollover: the owner's window fills, rejects with the time
// until its end, and starts over at the aligned boundary.
func TestFixedWindowRollover(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, ruleParams(t, []quota.Rule{fixedRule("fw", 3, time.Second)}))
	ring, _ := NewRing(1, []Member{{Name: "a"}})
	start := t0 + int64(400*time.Millisecond)
	c.SetTable(start, ring)
	for i := range 3 {
		if !decideFW(t, c, start, "x") {
			t.Fatalf("request %d of 3 refused", i+1)
		}
	}
	o, _ := c.Decide(start, "fw", "x", 1)
	if o.Allowed || o.RetryAfter != 600*time.Millisecond || o.Limit != 3 || o.Source != SourceOwner {
		t.Fatalf("the 4th: %+v, want a rejection with RetryAfter 600ms (the window's end), limit 3", o)
	}
	if decideFW(t, c, t0+int64(time.Second)-1, "x") {
		t.Fatal("admitted 1ns before the boundary")
	}
	for i := range 3 {
		if !decideFW(t, c, t0+int64(time.Second), "x") {
			t.Fatalf("next window: request %d refused", i+1)
		}
	}
	if decideFW(t, c, t0+int64(time.Second), "x") {
		t.Fatal("next window admitted more than the limit")
	}
	// An ended window equals no entry: Tick drops it.
	c.Tick(t0 + int64(3*time.Second))
	if n := c.Stats().Owned; n != 0 {
		t.Errorf("%d owner entries after the window ended, want 0", n)
	}
}

// TestFixedWindowHandoffOnJoin: a node joins and becomes the owner; the
// previous owner hands the window over (HandoffItem.Count), so the new owner
// admits only what is left of it, then a full limit in the next window.
func TestFixedWindowHandoffOnJoin(t *testing.T) {
	h, next := joinHarness(t, fixedRule("fw", 10, time.Second))
	ids, from := movedTo(next, 1)
	id, prev := ids[0], from[0]
	for range 7 {
		if !decideFW(t, h.nodes[prev], h.now, id) {
			t.Fatal("the previous owner refused an empty window")
		}
	}
	var handed []HandoffItem
	h.observe = func(node string, rd Ready) {
		for _, env := range rd.Messages {
			handed = append(handed, env.Msg.Handoffs...)
		}
	}
	for _, n := range h.names {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	if len(handed) != 1 || handed[0].Count != 7 || handed[0].Identity != id || handed[0].Debt != int64(time.Second) {
		t.Fatalf("handoffs %+v, want one of %q with count 7 and the second left of its window", handed, id)
	}
	h.step(2 * time.Millisecond) // the handoff and the marker arrive
	got := 0
	for range 10 {
		if decideFW(t, h.nodes["node-3"], h.now, id) {
			got++
		}
	}
	if got != 3 {
		t.Errorf("the new owner admitted %d in the handed window, want the 3 left of 10", got)
	}
	h.now = t0 + int64(time.Second) + int64(5*time.Millisecond) // the next window, past the handed one's end and its delay
	got = 0
	for range 12 {
		if decideFW(t, h.nodes["node-3"], h.now, id) {
			got++
		}
	}
	if got != 10 {
		t.Errorf("next window: %d admitted, want 10", got)
	}
	if d := degraded(h); d != 0 {
		t.Errorf("%d degraded decisions with no fault", d)
	}
}

// TestFixedWindowHandoffOnLeave: a gracefully leaving owner hands its
// window to the next owner (HandoffAll), which adds it to what it counted
// meanwhile.
func TestFixedWindowHandoffOnLeave(t *testing.T) {
	rule := fixedRule("fw", 10, time.Minute)
	h := newHarness(t, 3, time.Millisecond, rule)
	id := "leaver"
	owner := h.ring.OwnerName(id)
	for range 6 {
		if !decideFW(t, h.nodes[owner], h.now, id) {
			t.Fatal("the owner refused an empty window")
		}
	}
	next := h.ringWithout(t, owner)
	heir := next.OwnerName(id)
	h.nodes[owner].HandoffAll(h.now, next)
	h.flush()
	h.cut[owner] = true
	h.step(2 * time.Millisecond)
	// The heir sees the leave only now; it counted 1 meanwhile as the
	// owner of nothing (a lagging ring still names the leaver).
	for _, n := range next.Names() {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	got := 0
	for range 10 {
		if decideFW(t, h.nodes[heir], h.now, id) {
			got++
		}
	}
	if got != 4 {
		t.Errorf("the heir admitted %d after the handoff, want the 4 left of 10", got)
	}
	st, err := h.nodes[heir].Inspect(h.now, "fw", id)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Count != 10 || st.Remaining != 0 || st.Algorithm != "fixed_window" || st.Burst != 10 || st.Interval != 0 ||
		st.ResetAfter <= 0 || st.ResetAfter > time.Minute {
		t.Errorf("inspect on the heir: %+v, want the full window of 10 held, ending within a minute", st)
	}
}

// TestFixedWindowHandoffMerge: a handed window and one counted meanwhile
// add, and the later end holds; a handed window that is over is ignored.
func TestFixedWindowHandoffMerge(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "b"})
	c.SetRules(0, ruleParams(t, []quota.Rule{fixedRule("fw", 10, time.Second)}))
	ring, _ := NewRing(1, []Member{{Name: "b"}})
	c.SetTable(t0, ring)
	for range 4 {
		if !decideFW(t, c, t0, "x") {
			t.Fatal("refused an empty window")
		}
	}
	c.Step(t0, "a", &Message{Handoffs: []HandoffItem{
		{Rule: "fw", Identity: "x", Debt: int64(1500 * time.Millisecond), Count: 5},
		{Rule: "fw", Identity: "x", Debt: 0, Count: 9}, // over: counts nothing
	}})
	if !decideFW(t, c, t0, "x") {
		t.Fatal("4 + 5 of 10: the 10th refused")
	}
	if decideFW(t, c, t0, "x") {
		t.Fatal("4 + 5 + 1 = 10, yet an 11th admitted")
	}
	// The handed window's end (1.5s) holds past this node's boundary (1s).
	if decideFW(t, c, t0+int64(1200*time.Millisecond), "x") {
		t.Error("admitted before the handed window's end")
	}
	if !decideFW(t, c, t0+int64(1500*time.Millisecond), "x") {
		t.Error("refused after the handed window's end")
	}
}

// TestFixedWindowRuleChangeKeepsCount: a new rule version (here a lower
// limit) keeps the window's count, as a gcra rule keeps its TAT.
func TestFixedWindowRuleChangeKeepsCount(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, ruleParams(t, []quota.Rule{fixedRule("fw", 10, time.Second)}))
	ring, _ := NewRing(1, []Member{{Name: "a"}})
	c.SetTable(t0, ring)
	for range 6 {
		if !decideFW(t, c, t0, "x") {
			t.Fatal("refused an empty window")
		}
	}
	r := fixedRule("fw", 8, time.Second)
	p, err := NewRuleParams(&r, 2)
	if err != nil {
		t.Fatal(err)
	}
	c.SetRules(0, []RuleParams{p})
	got := 0
	for range 5 {
		if decideFW(t, c, t0+1, "x") {
			got++
		}
	}
	if got != 2 {
		t.Errorf("after the change to 8: %d admitted, want the 2 left after 6", got)
	}
}

// TestFixedWindowRefund: the owner gives back a refunded admission while
// its window lasts, never into a later window.
func TestFixedWindowRefund(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, ruleParams(t, []quota.Rule{fixedRule("fw", 2, time.Second)}))
	ring, _ := NewRing(1, []Member{{Name: "a"}})
	c.SetTable(t0, ring)
	decideFW(t, c, t0, "x")
	decideFW(t, c, t0, "x")
	c.Refund(t0, "fw", "x", 1, SourceOwner)
	if !decideFW(t, c, t0, "x") {
		t.Fatal("the refunded token was not given back")
	}
	if decideFW(t, c, t0, "x") {
		t.Fatal("a refund gave back more than it took")
	}
	next := t0 + int64(time.Second)
	c.Refund(next, "fw", "x", 2, SourceOwner) // the window is over: nothing
	for range 2 {
		decideFW(t, c, next, "x")
	}
	if decideFW(t, c, next, "x") {
		t.Error("a refund after the window's end raised the next window's limit")
	}
}

// TestFixedWindowChargedSpend: spend a node reports (admitted before its
// rule became exact) is charged to the window, over the limit if need be.
func TestFixedWindowChargedSpend(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, ruleParams(t, []quota.Rule{fixedRule("fw", 10, time.Second)}))
	ring, _ := NewRing(1, []Member{{Name: "a"}, {Name: "b"}})
	c.SetTable(t0, ring)
	id := ""
	for i := 0; id == ""; i++ {
		if s := strings.Repeat("k", i+1); ring.OwnerName(s) == "a" {
			id = s
		}
	}
	c.Step(t0, "b", &Message{Syncs: []SyncItem{{Rule: "fw", Identity: id, Gen: 1, Total: 12}}})
	st, _ := c.Inspect(t0, "fw", id)
	if st.Count != 12 || st.Debt != 2 || st.Remaining != 0 {
		t.Fatalf("after a report of 12: %+v, want count 12, debt 2", st)
	}
	if decideFW(t, c, t0, id) {
		t.Error("admitted in a window charged over its limit")
	}
	if !decideFW(t, c, t0+int64(time.Second), id) {
		t.Error("the next window starts empty, yet refused")
	}
}

// TestNewRuleParamsAlgorithms: the coordinator takes gcra rules in shared
// or exact mode and the other algorithms but concurrency in exact mode;
// anything else is an error naming the rule.
func TestNewRuleParamsAlgorithms(t *testing.T) {
	ok := []quota.Rule{gcraRule("g", quota.ModeShared, 10, time.Second, 5), fixedRule("f", 10, time.Second),
		leakyRule("l", 10, time.Second, 300*time.Millisecond), concRule("c", 5, time.Minute)}
	for i := range ok {
		p, err := NewRuleParams(&ok[i], 1)
		if err != nil {
			t.Errorf("%s: %v", ok[i].ID, err)
		}
		if ok[i].Algorithm == quota.AlgorithmFixedWindow {
			if _, fixed := p.exact.(*fixedAlgo); p.Burst != 10 || !fixed || p.Algorithm != quota.AlgorithmFixedWindow {
				t.Errorf("fixed window params %+v: want burst = limit, fixed", p)
			}
		}
		if ok[i].Algorithm == quota.AlgorithmConcurrency {
			if p.conc == nil || p.exact != p.conc || p.Burst != 5 || p.maxCost != 5 || p.conc.hold != int64(time.Minute) {
				t.Errorf("concurrency params %+v: want 5 slots held at most the window", p)
			}
		}
		if ok[i].Algorithm == quota.AlgorithmLeakyBucket {
			if lk, leaky := p.exact.(*leakyAlgo); p.Burst != 4 || !leaky || p.gcra.Interval() != lk.lk.Interval() {
				t.Errorf("leaky params %+v: want burst = 4 positions, leaky, gcra's interval = the queue's", p)
			}
		}
	}
	shared := fixedRule("fw-shared", 10, time.Second)
	shared.Mode = quota.ModeShared
	sliding := fixedRule("sliding", 10, time.Second)
	sliding.Algorithm, sliding.Mode = quota.AlgorithmSlidingWindow, quota.ModeShared
	concurrency := fixedRule("concurrency", 10, time.Second)
	concurrency.Algorithm, concurrency.Mode = quota.AlgorithmConcurrency, quota.ModeShared
	leakyShared := leakyRule("leaky-shared", 10, time.Second, time.Second)
	leakyShared.Mode = quota.ModeShared
	for _, r := range []quota.Rule{shared, sliding, concurrency, leakyShared} {
		if _, err := NewRuleParams(&r, 1); err == nil || !strings.Contains(err.Error(), r.ID) {
			t.Errorf("%s: error %v, want one naming the rule", r.ID, err)
		}
	}
}

// TestFixedWindowForwardedResult: a forwarded decision carries the
// window's limit, remaining and reset, and no view (Debt 0), so the node's
// entry goes once nothing is pending.
func TestFixedWindowForwardedResult(t *testing.T) {
	h := newHarness(t, 2, time.Millisecond, fixedRule("fw", 4, time.Second))
	id := "fwd"
	owner := h.ring.OwnerName(id)
	other := h.names[0]
	if other == owner {
		other = h.names[1]
	}
	var got []Outcome
	h.complete = func(_ string, c Completion, _ int64) { got = append(got, c.Outcome) }
	h.request(other, "fw", id, 3)
	h.request(other, "fw", id, 2)
	for range 3 {
		h.step(time.Millisecond)
	}
	if len(got) != 2 {
		t.Fatalf("%d completions, want 2", len(got))
	}
	if o := got[0]; !o.Allowed || o.Limit != 4 || o.Remaining != 1 || o.Source != SourceRemote {
		t.Errorf("first: %+v, want allowed, limit 4, remaining 1", o)
	}
	if o := got[1]; o.Allowed || o.RetryAfter <= 0 || o.RetryAfter > time.Second || o.RetryAfter == bucket.Never {
		t.Errorf("second: %+v, want a rejection until the window's end", o)
	}
	h.step(time.Duration(h.nodes[other].interval))
	if n := h.nodes[other].Stats().Entries; n != 0 {
		t.Errorf("the forwarding node keeps %d entries, want 0", n)
	}
	if d := degraded(h); d != 0 {
		t.Errorf("%d degraded decisions with no fault", d)
	}
}

// TestAlgorithmChangeCarriesWholeSpend: an algorithm change (gcra to
// fixed_window and back) charges the whole tokens spent to the new
// algorithm's state, read as that algorithm's (a gcra TAT is never read
// as a window's end); a rule that keeps its algorithm keeps its bucket.
func TestAlgorithmChangeCarriesWholeSpend(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	g := gcraRule("fw", quota.ModeExact, 10, time.Hour, 10)
	keep := gcraRule("keep", quota.ModeExact, 10, time.Hour, 10)
	c.SetRules(t0, ruleParams(t, []quota.Rule{g, keep}))
	ring, _ := NewRing(1, []Member{{Name: "a"}})
	c.SetTable(t0, ring)
	for range 10 {
		decideFW(t, c, t0, "x")
		c.Decide(t0, "keep", "x", 1)
	}
	if decideFW(t, c, t0, "x") {
		t.Fatal("the spent gcra bucket admitted")
	}
	c.SetRules(t0, ruleParams(t, []quota.Rule{fixedRule("fw", 10, time.Hour), keep}))
	if decideFW(t, c, t0, "x") {
		t.Error("the 10 tokens spent under gcra were not charged to the fixed window")
	}
	if o, _ := c.Decide(t0, "keep", "x", 1); o.Allowed {
		t.Error("a rule that kept its algorithm lost its bucket")
	}
	c.SetRules(t0, ruleParams(t, []quota.Rule{g, keep}))
	if decideFW(t, c, t0, "x") {
		t.Error("the window's count was not charged to the gcra bucket")
	}
	// A fresh identity of the changed rule has its whole burst.
	for i := range 10 {
		if !decideFW(t, c, t0, "y") {
			t.Fatalf("a fresh identity refused at its request %d", i)
		}
	}
}

// ringWithout is the harness's ring less the member gone (at epoch 2): the
// ring a graceful leaver hands over to.
func (h *harness) ringWithout(t *testing.T, gone string) *Ring {
	t.Helper()
	var rest []Member
	for _, n := range h.names {
		if n != gone {
			rest = append(rest, Member{Name: n, Addr: n})
		}
	}
	next, err := NewRing(2, rest)
	if err != nil {
		t.Fatal(err)
	}
	return next
}
