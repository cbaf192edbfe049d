package cluster

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// decideAPI asks node of h for one token of id under rule "api" and reports
// whether it was admitted at once.
func decideAPI(t *testing.T, h *harness, node, id string) bool {
	t.Helper()
	o, err := h.nodes[node].Decide(h.now, "api", id, 1)
	if err != nil {
		t.Fatal(err)
	}
	return !o.Pending && o.Allowed
}

// setAll installs rule on every node of h at h.now, as version v.
func setAll(t *testing.T, h *harness, names []string, rule quota.Rule, v uint64) {
	t.Helper()
	p, err := NewRuleParams(&rule, v)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		h.nodes[n].SetRules(h.now, []RuleParams{p})
	}
}

// TestRaiseConvertsOwnerBucket: a shared rule of 5/min burst 5, one token
// spent, raised a second later to 50/min burst 5: the owner's bucket holds
// its 4 tokens under the new rule, so the next 4 requests are admitted
// (read as a time under the new interval, the old TAT would admit none),
// and the 5th finds the bucket empty.
func TestRaiseConvertsOwnerBucket(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, gcraRule("api", quota.ModeShared, 5, time.Minute, 5))
	id := "raised"
	owner := h.ring.OwnerName(id)
	if !decideAPI(t, h, owner, id) {
		t.Fatal("the owner refused a full bucket")
	}
	h.step(time.Second)
	setAll(t, h, h.names, gcraRule("api", quota.ModeShared, 50, time.Minute, 5), 2)
	got := 0
	for range 4 {
		if decideAPI(t, h, owner, id) {
			got++
		}
	}
	if got != 4 {
		t.Fatalf("%d of the next 4 admitted after the raise, want 4", got)
	}
	if decideAPI(t, h, owner, id) {
		t.Fatal("a 5th request admitted: the raise granted more than the 4 tokens held")
	}
}

// TestLowerClampsOwnerBucket: a full bucket of burst 5 lowered to burst 2
// holds 2 tokens: 2 admitted, then none.
func TestLowerClampsOwnerBucket(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, gcraRule("api", quota.ModeShared, 5, time.Minute, 5))
	id := "lowered"
	owner := h.ring.OwnerName(id)
	if !decideAPI(t, h, owner, id) {
		t.Fatal("the owner refused a full bucket")
	}
	setAll(t, h, h.names, gcraRule("api", quota.ModeShared, 5, time.Minute, 2), 2)
	got := 0
	for range 5 {
		if decideAPI(t, h, owner, id) {
			got++
		}
	}
	if got != 2 {
		t.Fatalf("%d admitted after lowering the burst to 2 with 4 tokens held, want 2", got)
	}
}

// TestHandoffConvertsOldRuleState: an owner that still has the old rule
// (5/min burst 5, one token spent) hands the bucket over on leaving to an
// heir that already has the raised rule (50/min burst 5): the heir converts
// the handed state, and admits the 4 tokens held, then no more.
func TestHandoffConvertsOldRuleState(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, gcraRule("api", quota.ModeShared, 5, time.Minute, 5))
	id := "handed"
	h.trackAll() // a bucket handed over: blind state is not (docs/overshoot.md)
	owner := h.ring.OwnerName(id)
	if !decideAPI(t, h, owner, id) {
		t.Fatal("the owner refused a full bucket")
	}
	next := h.ringWithout(t, owner)
	heir := next.OwnerName(id)
	setAll(t, h, next.Names(), gcraRule("api", quota.ModeShared, 50, time.Minute, 5), 2)
	h.nodes[owner].HandoffAll(h.now, next)
	h.flush()
	h.cut[owner] = true
	h.step(2 * time.Millisecond)
	for _, n := range next.Names() {
		h.nodes[n].SetTable(h.now, next)
	}
	h.flush()
	got := 0
	for range 5 {
		if decideAPI(t, h, heir, id) {
			got++
		}
	}
	if got != 4 {
		t.Fatalf("the heir admitted %d after taking the old rule's bucket with 4 tokens held, want 4", got)
	}
}

// TestFixedWindowRaiseCarriesCount: an exact fixed_window rule of 5 per
// minute, 3 counted, raised to 10 per minute: the window keeps its count,
// so 7 more are admitted in it.
func TestFixedWindowRaiseCarriesCount(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, fixedRule("fw", 5, time.Minute))
	id := "counted"
	owner := h.ring.OwnerName(id)
	for range 3 {
		if !decideFW(t, h.nodes[owner], h.now, id) {
			t.Fatal("the owner refused an open window")
		}
	}
	p, err := NewRuleParams(new(fixedRule("fw", 10, time.Minute)), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range h.names {
		h.nodes[n].SetRules(h.now, []RuleParams{p})
	}
	got := 0
	for range 10 {
		if decideFW(t, h.nodes[owner], h.now, id) {
			got++
		}
	}
	if got != 7 {
		t.Fatalf("%d admitted in the window after raising 5 to 10 with 3 counted, want 7", got)
	}
}

// TestAlgorithmChangeCarriesSpend: an exact gcra rule of 10/min burst 10,
// 3 spent, changed to a fixed_window of 10 per minute: the 3 whole tokens
// spent are charged to the window, so 7 more are admitted in it.
func TestAlgorithmChangeCarriesSpend(t *testing.T) {
	h := newHarness(t, 3, time.Millisecond, gcraRule("fw", quota.ModeExact, 10, time.Minute, 10))
	id := "retyped"
	owner := h.ring.OwnerName(id)
	for range 3 {
		if !decideFW(t, h.nodes[owner], h.now, id) {
			t.Fatal("the owner refused a full bucket")
		}
	}
	p, err := NewRuleParams(new(fixedRule("fw", 10, time.Minute)), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range h.names {
		h.nodes[n].SetRules(h.now, []RuleParams{p})
	}
	got := 0
	for range 10 {
		if decideFW(t, h.nodes[owner], h.now, id) {
			got++
		}
	}
	if got != 7 {
		t.Fatalf("%d admitted after changing gcra to fixed_window with 3 spent, want 7", got)
	}
}

// TestRemovedRuleReaddedStartsEmpty: a rule removed by one SetRules and
// added again by the next is a new incarnation: its identities start with
// a full bucket.
func TestRemovedRuleReaddedStartsEmpty(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 5, time.Minute, 5)
	h := newHarness(t, 3, time.Millisecond, rule)
	id := "readded"
	owner := h.ring.OwnerName(id)
	for range 5 {
		if !decideAPI(t, h, owner, id) {
			t.Fatal("the owner refused a full bucket")
		}
	}
	for _, n := range h.names {
		h.nodes[n].SetRules(h.now, nil)
	}
	setAll(t, h, h.names, rule, 3)
	got := 0
	for range 5 {
		if decideAPI(t, h, owner, id) {
			got++
		}
	}
	if got != 5 {
		t.Fatalf("%d of a burst of 5 admitted by a re-added rule, want 5 (a new incarnation starts empty)", got)
	}
}
