package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

func inspectRule(t *testing.T) RuleParams {
	t.Helper()
	// Accuracy 0.5: a slack pool of 5 tokens, so a node's first report of
	// 5 is within what an owner charges (Coordinator.charge).
	p, err := NewRuleParams(&quota.Rule{ID: "r", Limit: 10, Window: time.Second, Burst: 4, Mode: quota.ModeShared, Accuracy: 0.5}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCoordinatorInspect: the owner reports its bucket (remaining, time to
// full, debt once other nodes' reported spend outran it) and changes
// nothing; an unknown rule is ErrUnknownRule.
func TestCoordinatorInspect(t *testing.T) {
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, []RuleParams{inspectRule(t)})
	now := int64(time.Hour)
	st, err := c.Inspect(now, "r", "x")
	if err != nil || !st.Known || st.Held || st.Remaining != 4 || st.ResetAfter != 0 || st.Debt != 0 || st.Interval != 100*time.Millisecond {
		t.Fatalf("a fresh bucket: %+v, %v", st, err)
	}
	if c.owned.len() != 0 {
		t.Fatal("Inspect created an entry")
	}
	for range 3 {
		if o, _ := c.Decide(now, "r", "x", 1); !o.Decision.Allowed {
			t.Fatal("rejected within the burst")
		}
	}
	st, _ = c.Inspect(now, "r", "x")
	if !st.Held || st.Remaining != 1 || st.ResetAfter != 300*time.Millisecond || st.Debt != 0 {
		t.Fatalf("after 3 of 4: %+v", st)
	}
	// Another node reports 5 tokens it admitted within its slack: the
	// bucket owes 4 beyond empty.
	c.Step(now, "b", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 1, Total: 5}}})
	st, _ = c.Inspect(now, "r", "x")
	if st.Remaining != 0 || st.Debt != 4 || st.ResetAfter != 800*time.Millisecond || st.Reporters != 1 {
		t.Fatalf("after a report of 5: %+v", st)
	}
	if st2, _ := c.Inspect(now+int64(time.Second), "r", "x"); st2.Held || st2.Remaining != 4 || st2.Debt != 0 {
		t.Fatalf("a second later: %+v", st2)
	}
	if _, err := c.Inspect(now, "nope", "x"); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("unknown rule: %v", err)
	}
}
