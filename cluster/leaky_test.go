package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// Exact mode for leaky_bucket rules: the owner keeps the identity's queue
// (bucket.Leaky's departure time in its entry) and every decision, local or
// forwarded, carries the delay the owner assigned, so the requests it
// admits leave spaced by T however the traffic is spread over the nodes.

func leakyRule(id string, limit int64, window, maxDelay time.Duration) quota.Rule {
	return quota.Rule{ID: id, Mode: quota.ModeExact, Algorithm: quota.AlgorithmLeakyBucket, Limit: limit, Window: window,
		Burst: limit, MaxDelay: maxDelay, Accuracy: quota.DefaultAccuracy, OnFailure: quota.OnFailureLocal}
}

// TestLeakyExactAcrossNodes: three nodes send one identity's requests; the
// owner's queue spaces every admitted request (owner decision time plus its
// delay) at least T = 100ms apart, holds none longer than MaxDelay, and
// admits one per T over the run.
func TestLeakyExactAcrossNodes(t *testing.T) {
	const T = 100 * time.Millisecond
	h := newHarness(t, 3, time.Millisecond, leakyRule("lk", 10, time.Second, 500*time.Millisecond))
	var leaves []int64 // owner decision time + delay of every admission
	pend := map[string]map[uint64]bool{}
	for _, n := range h.names {
		pend[n] = map[uint64]bool{}
	}
	h.complete = func(node string, c Completion, _ int64) {
		if c.Outcome.Degraded {
			t.Errorf("%s: a degraded decision with no fault", node)
		}
		if c.Outcome.Allowed {
			leaves = append(leaves, h.now-h.oneway+int64(c.Outcome.Delay))
		}
	}
	id := "queue"
	for step := range 2000 { // 2s
		if step%10 == 0 { // each node asks every 10ms
			for _, n := range h.names {
				o, err := h.nodes[n].Decide(h.now, "lk", id, 1)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case o.Pending:
					h.waiting[n][o.Ticket] = 1
				case o.Allowed:
					leaves = append(leaves, h.now+int64(o.Delay))
				}
			}
		}
		h.step(time.Millisecond)
	}
	for range 5 {
		h.step(time.Millisecond)
	}
	slices.Sort(leaves)
	for i := 1; i < len(leaves); i++ {
		if gap := leaves[i] - leaves[i-1]; gap < int64(T) {
			t.Fatalf("admissions %d and %d leave %v apart, less than T = %v", i-1, i, time.Duration(gap), T)
		}
	}
	// 2s of offered load at 300/s: the queue is full throughout, so one
	// leaves per T from the first, plus the queue's 6 positions.
	if n := len(leaves); n < 20 || n > 20+6 {
		t.Errorf("%d admitted in 2s at one per %v (plus a queue of 6)", n, T)
	}
	if d := degraded(h); d != 0 {
		t.Errorf("%d degraded decisions with no fault", d)
	}
}

// TestLeakyHandoffCarriesQueue: a gracefully leaving owner hands the queue
// over; the heir's next admission waits behind it.
func TestLeakyHandoffCarriesQueue(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, leakyRule("lk", 10, time.Second, time.Second))
	id := "leaving-queue"
	owner := h.ring.OwnerName(id)
	for range 5 {
		if o, _ := h.nodes[owner].Decide(h.now, "lk", id, 1); !o.Allowed {
			t.Fatal("the owner refused a queue with room")
		}
	}
	next := h.ringWithout(t, owner)
	h.nodes[owner].HandoffAll(h.now, next)
	h.flush()
	h.cut[owner] = true
	h.step(2 * time.Millisecond)
	for _, n := range next.Names() {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	heir := h.nodes[next.OwnerName(id)]
	o, _ := heir.Decide(h.now, "lk", id, 1)
	// 5 queued at 100ms each: the handed 500ms count from when the handoff
	// arrived (late by its delay: held longer, never shorter).
	if want := 500 * time.Millisecond; !o.Allowed || o.Delay != want {
		t.Errorf("the heir's first decision %+v, want admitted with delay %v (behind the handed queue)", o, want)
	}
	st, err := heir.Inspect(h.now, "lk", id)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Algorithm != "leaky_bucket" || st.Interval != 100*time.Millisecond || st.ResetAfter != 600*time.Millisecond ||
		st.Burst != 11 || st.Remaining != 5 {
		t.Errorf("inspect on the heir: %+v, want the queue of 6 held, draining in 600ms, 5 of 11 positions of 100ms left", st)
	}
}

// TestLeakyForwardedDelay: a forwarded admission carries the owner's delay
// back to the asking node.
func TestLeakyForwardedDelay(t *testing.T) {
	h := newHarness(t, 2, time.Millisecond, leakyRule("lk", 10, time.Second, time.Second))
	id := "fwd-queue"
	owner := h.ring.OwnerName(id)
	other := h.names[0]
	if other == owner {
		other = h.names[1]
	}
	var got []Outcome
	h.complete = func(_ string, c Completion, _ int64) { got = append(got, c.Outcome) }
	for range 3 {
		h.request(other, "lk", id, 1)
	}
	for range 3 {
		h.step(time.Millisecond)
	}
	if len(got) != 3 {
		t.Fatalf("%d completions, want 3", len(got))
	}
	for i, o := range got {
		if want := time.Duration(i) * 100 * time.Millisecond; !o.Allowed || o.Delay != want || o.Source != SourceRemote {
			t.Errorf("request %d: %+v, want admitted with delay %v", i, o, want)
		}
	}
}
