package cluster

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// These tests check exact mode for sliding_window and sliding_log rules:
// the owner decides on bucket.SlidingWindow's or bucket.SlidingLog's own
// state, and a ring change hands that state over with its alignment and
// its entries.

func windowRule(id string, algo quota.Algorithm, limit int64, window time.Duration) quota.Rule {
	r := fixedRule(id, limit, window)
	r.Algorithm = algo
	return r
}

// decideOne asks c for one token of id under rule at now and reports
// whether it was admitted at once.
func decideOne(t *testing.T, c *Coordinator, now int64, rule, id string) bool {
	t.Helper()
	o, err := c.Decide(now, rule, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	return !o.Pending && o.Allowed
}

// TestWindowAlgorithmsExactAcrossNodes: a client saturating all three nodes
// (one request per node per millisecond) is admitted, summed over the
// nodes, what one bucket fed every admission in the owner's order admits:
// replayed into bucket.SlidingWindow or bucket.SlidingLog at the owner's
// decision times, every admission passes, so the region never admits more
// than the algorithm allows; and it admits the limit in every window, so
// it never admits less.
func TestWindowAlgorithmsExactAcrossNodes(t *testing.T) {
	const limit, w = 25, 200 * time.Millisecond
	for _, algo := range []quota.Algorithm{quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog} {
		t.Run(string(algo), func(t *testing.T) {
			h := newHarness(t, 3, time.Millisecond, windowRule("sw", algo, limit, w))
			id := "tenant-1"
			for range 1000 { // five windows
				for _, n := range h.names {
					h.request(n, "sw", id, 1)
				}
				h.step(time.Millisecond)
			}
			for range 5 {
				h.step(time.Millisecond)
			}
			var replay func(now int64) bool
			switch algo {
			case quota.AlgorithmSlidingWindow:
				sw, _ := bucket.NewSlidingWindow(limit, w)
				var st bucket.SlidingState
				replay = func(now int64) bool { return sw.Step(&st, now, 1).Allowed }
			default:
				l, _ := bucket.NewSlidingLog(limit, w)
				var st bucket.SlidingLogState
				replay = func(now int64) bool { return l.Step(&st, now, 1).Allowed }
			}
			per := map[int64]int64{}
			nodes := map[string]bool{}
			for i, a := range h.admits {
				if !replay(a.at) {
					t.Fatalf("admission %d at %v (node %s) is one the reference bucket refuses", i, time.Duration(a.at-t0), a.node)
				}
				per[(a.at-t0)/int64(w)] += a.cost
				nodes[a.node] = true
			}
			if len(nodes) != 3 {
				t.Errorf("admissions came through %d nodes, want all 3", len(nodes))
			}
			for k := range int64(5) {
				// A sliding log under saturation refills as its oldest
				// admissions leave: the limit per window. The counter
				// admits Limit − ⌈Prev·(W−e)/W⌉ more as e grows: at least
				// the limit less one per window under a steady load.
				if per[k] < limit-1 || per[k] > limit {
					t.Errorf("window %d admitted %d summed over the nodes, want %d (or one less)", k, per[k], limit)
				}
			}
			if d := degraded(h); d != 0 {
				t.Errorf("%d degraded decisions with no fault", d)
			}
		})
	}
}

// TestWindowAlgorithmsHandoffOnJoin: when a node joins and becomes an
// identity's owner, the previous owner hands over the window or the log;
// the new owner admits only what is left, and the handed state keeps its
// alignment (the counter's next window weighs the handed count) or its
// entries (the log frees them when each leaves the window).
func TestWindowAlgorithmsHandoffOnJoin(t *testing.T) {
	for _, algo := range []quota.Algorithm{quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog} {
		t.Run(string(algo), func(t *testing.T) {
			h, next := joinHarness(t, windowRule("sw", algo, 10, time.Second))
			ids, from := movedTo(next, 1)
			id, prev := ids[0], from[0]
			for i := range 7 {
				// Admissions 0-3 at t0, 4-6 100 ms later.
				at := h.now
				if i >= 4 {
					at += int64(100 * time.Millisecond)
				}
				if !decideOne(t, h.nodes[prev], at, "sw", id) {
					t.Fatal("the previous owner refused an empty window")
				}
			}
			h.now += int64(100 * time.Millisecond)
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
			if len(handed) != 1 || handed[0].Identity != id || handed[0].Algorithm != algo {
				t.Fatalf("handoffs %+v, want one of %q", handed, id)
			}
			switch algo {
			case quota.AlgorithmSlidingWindow:
				if hd := handed[0]; hd.Count != 7 || hd.Prev != 0 || hd.Span != int64(time.Second) || hd.Debt != int64(900*time.Millisecond) {
					t.Fatalf("handoff %+v, want count 7 in a window of 1s ending in 900ms", hd)
				}
			default:
				want := []LogItem{{Age: int64(100 * time.Millisecond), Cost: 4}, {Age: 0, Cost: 3}}
				if hd := handed[0]; len(hd.Log) != 2 || hd.Log[0] != want[0] || hd.Log[1] != want[1] || hd.Debt != int64(time.Second) {
					t.Fatalf("handoff %+v, want the log %v", hd, want)
				}
			}
			h.step(2 * time.Millisecond) // the handoff and the marker arrive
			heir := h.nodes["node-3"]
			got := 0
			for range 10 {
				if decideOne(t, heir, h.now, "sw", id) {
					got++
				}
			}
			if got != 3 {
				t.Errorf("the new owner admitted %d in the handed window, want the 3 left of 10", got)
			}
			// The handed state arrived 2 ms after it was sent and is held
			// that much longer: the counter's windows end at t0 + 1.002 s
			// and t0 + 2.002 s, the log's entries are at t0 + 2 ms (4) and
			// t0 + 102 ms (3, and the heir's 3).
			//
			// The counter half way through the next window: the 10 of the
			// handed window weigh ⌈10·(1 − 0.498)⌉ = 6, so 4 are left. The
			// log at t0 + 1.05 s: the 4 of t0 + 2 ms have left the window,
			// the 6 of t0 + 102 ms have not, so 4 are left.
			h.now = t0 + int64(1500*time.Millisecond)
			if algo == quota.AlgorithmSlidingLog {
				h.now = t0 + int64(1050*time.Millisecond)
			}
			got = 0
			for range 12 {
				if decideOne(t, heir, h.now, "sw", id) {
					got++
				}
			}
			if got != 4 {
				t.Errorf("at %v: %d admitted, want 4", time.Duration(h.now-t0), got)
			}
			if d := degraded(h); d != 0 {
				t.Errorf("%d degraded decisions with no fault", d)
			}
		})
	}
}

// TestWindowAlgorithmsHandoffOnLeave: a gracefully leaving owner hands its
// state to the next owner (HandoffAll); Inspect on the heir shows it.
func TestWindowAlgorithmsHandoffOnLeave(t *testing.T) {
	for _, algo := range []quota.Algorithm{quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog} {
		t.Run(string(algo), func(t *testing.T) {
			h := newHarness(t, 3, time.Millisecond, windowRule("sw", algo, 10, time.Minute))
			id := "leaver"
			owner := h.ring.OwnerName(id)
			for range 6 {
				if !decideOne(t, h.nodes[owner], h.now, "sw", id) {
					t.Fatal("the owner refused an empty window")
				}
			}
			next := h.ringWithout(t, owner)
			heir := next.OwnerName(id)
			h.nodes[owner].HandoffAll(h.now, next)
			h.flush()
			h.cut[owner] = true
			h.step(2 * time.Millisecond)
			for _, n := range next.Names() {
				h.nodes[n].SetTable(h.now, next)
			}
			h.flush()
			got := 0
			for range 10 {
				if decideOne(t, h.nodes[heir], h.now, "sw", id) {
					got++
				}
			}
			if got != 4 {
				t.Errorf("the heir admitted %d after the handoff, want the 4 left of 10", got)
			}
			st, err := h.nodes[heir].Inspect(h.now, "sw", id)
			if err != nil {
				t.Fatal(err)
			}
			if !st.Held || st.Count != 10 || st.Remaining != 0 || st.Algorithm != string(algo) || st.Burst != 10 ||
				st.ResetAfter <= 0 || st.ResetAfter > 2*time.Minute {
				t.Errorf("inspect on the heir: %+v, want the 10 held", st)
			}
		})
	}
}

// TestWindowAlgorithmsHandoffMerge: a handed state and one counted
// meanwhile add; a handed state that is over is ignored.
func TestWindowAlgorithmsHandoffMerge(t *testing.T) {
	for _, algo := range []quota.Algorithm{quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog} {
		t.Run(string(algo), func(t *testing.T) {
			c := NewCoordinator(CoordinatorConfig{Self: "b"})
			c.SetRules(0, ruleParams(t, []quota.Rule{windowRule("sw", algo, 10, time.Second)}))
			ring, _ := NewRing(1, []Member{{Name: "b"}})
			c.SetTable(t0, ring)
			for range 4 {
				if !decideOne(t, c, t0, "sw", "x") {
					t.Fatal("refused an empty window")
				}
			}
			in := HandoffItem{Rule: "sw", Identity: "x", Debt: int64(time.Second), Count: 5, Span: int64(time.Second)}
			over := HandoffItem{Rule: "sw", Identity: "x", Debt: -int64(3 * time.Second), Count: 9, Span: int64(time.Second)}
			if algo == quota.AlgorithmSlidingLog {
				in = HandoffItem{Rule: "sw", Identity: "x", Debt: int64(time.Second), Log: []LogItem{{Age: 0, Cost: 5}}}
				over = HandoffItem{Rule: "sw", Identity: "x", Debt: 0, Log: []LogItem{{Age: int64(time.Second), Cost: 9}}}
			}
			c.Step(t0, "a", &Message{Handoffs: []HandoffItem{in, over}})
			if !decideOne(t, c, t0, "sw", "x") {
				t.Fatal("4 + 5 of 10: the 10th refused")
			}
			if decideOne(t, c, t0, "sw", "x") {
				t.Fatal("4 + 5 + 1 = 10, yet an 11th admitted")
			}
		})
	}
}

// TestWindowAlgorithmsRefundAndRuleChange: the owner's own charge is given
// back (Refund after another rule refused the request), and a new rule
// version keeps what the state counts.
func TestWindowAlgorithmsRefundAndRuleChange(t *testing.T) {
	for _, algo := range []quota.Algorithm{quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog} {
		t.Run(string(algo), func(t *testing.T) {
			c := NewCoordinator(CoordinatorConfig{Self: "a"})
			c.SetRules(0, ruleParams(t, []quota.Rule{windowRule("sw", algo, 10, time.Second)}))
			ring, _ := NewRing(1, []Member{{Name: "a"}})
			c.SetTable(t0, ring)
			for range 10 {
				if !decideOne(t, c, t0, "sw", "x") {
					t.Fatal("refused an empty window")
				}
			}
			if decideOne(t, c, t0, "sw", "x") {
				t.Fatal("an 11th admitted")
			}
			c.Refund(t0, "sw", "x", 2, SourceOwner)
			for i := range 3 {
				if got, want := decideOne(t, c, t0, "sw", "x"), i < 2; got != want {
					t.Fatalf("after a refund of 2, request %d: admitted %v, want %v", i, got, want)
				}
			}
			lower := windowRule("sw", algo, 6, time.Second)
			p, err := NewRuleParams(&lower, 2)
			if err != nil {
				t.Fatal(err)
			}
			c.SetRules(t0, []RuleParams{p})
			st, err := c.Inspect(t0, "sw", "x")
			if err != nil {
				t.Fatal(err)
			}
			if st.Count != 10 || st.Remaining != 0 || st.Burst != 6 {
				t.Errorf("after lowering the limit to 6: %+v, want the 10 still counted", st)
			}
		})
	}
}
