package cluster

import (
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// BenchmarkOwnerDecide measures Decide on the owner of the identities (one
// node: a map access and the algorithm's step), for a gcra rule (the
// reference: the hot path that other algorithms must not slow down) and a
// fixed_window and a leaky_bucket rule in exact mode, over 1024 identities
// in turn, the clock advancing 1µs per decision. Read the ratios of one run.
func BenchmarkOwnerDecide(b *testing.B) {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "identity-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name string
		rule quota.Rule
	}{
		{"gcra", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmGCRA, Limit: 1 << 29, Window: time.Second, Burst: 1 << 20}},
		{"fixed_window", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmFixedWindow, Limit: 1 << 29, Window: time.Second, Burst: 1 << 29}},
		{"leaky_bucket", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmLeakyBucket, Limit: 1 << 29, Window: time.Second, Burst: 1 << 20, MaxDelay: time.Second}},
	} {
		b.Run(c.name, func(b *testing.B) { benchDecide(b, c.rule, ids, time.Microsecond) })
	}
}

// benchDecide times Decide on one node with no ring (it owns every
// identity) under rule r over ids in turn (a power of two of them), the
// clock advancing step per decision, after one decision of each identity;
// every decision must admit. It returns the coordinator.
func benchDecide(b *testing.B, r quota.Rule, ids []string, step time.Duration) *Coordinator {
	p, err := NewRuleParams(&r, 1)
	if err != nil {
		b.Fatal(err)
	}
	co := NewCoordinator(CoordinatorConfig{Self: "a"})
	co.SetRules([]RuleParams{p})
	now := t0
	for _, id := range ids {
		co.Decide(now, r.ID, id, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now += int64(step)
		o, _ := co.Decide(now, r.ID, ids[i&(len(ids)-1)], 1)
		if !o.Allowed {
			b.Fatalf("rejected: %+v", o)
		}
	}
	b.StopTimer()
	return co
}
