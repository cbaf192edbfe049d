package shell

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
)

// t0 is the tests' epoch: a time well after 1970, as a node's clock reads.
const t0 = int64(1_800_000_000) * int64(time.Second)

// gcraRule is a GCRA rule of limit per window with burst, in mode.
func gcraRule(id string, mode quota.Mode, limit int64, window time.Duration, burst int64) quota.Rule {
	return quota.Rule{ID: id, Mode: mode, Algorithm: quota.AlgorithmGCRA, Limit: limit, Window: window, Burst: burst,
		Accuracy: quota.DefaultAccuracy, OnFailure: quota.OnFailureLocal}
}

// gatedRule is a shared gcraRule gated by the sketch sk.
func gatedRule(id string, limit int64, window time.Duration, burst int64, sk *quota.Sketch) quota.Rule {
	r := gcraRule(id, quota.ModeShared, limit, window, burst)
	r.Sketch = sk
	return r
}

// ruleParams builds the coordinator's view of rules at version 1.
func ruleParams(t testing.TB, rules []quota.Rule) []cluster.RuleParams {
	t.Helper()
	var params []cluster.RuleParams
	for i := range rules {
		p, err := cluster.NewRuleParams(&rules[i], 1)
		if err != nil {
			t.Fatal(err)
		}
		params = append(params, p)
	}
	return params
}

// inspectRule is a shared rule "r" of 10/s, burst 4, accuracy 0.5.
func inspectRule(t testing.TB) cluster.RuleParams {
	t.Helper()
	return ruleParams(t, []quota.Rule{{ID: "r", Limit: 10, Window: time.Second, Burst: 4, Mode: quota.ModeShared, Accuracy: 0.5}})[0]
}

// ownerOnly returns a coordinator alone in its ring (it owns every
// identity) with a key cap, deciding rule "r": 10 a second, burst 10.
func ownerOnly(t testing.TB, maxKeys int) *cluster.Coordinator {
	t.Helper()
	c := cluster.NewCoordinator(cluster.CoordinatorConfig{Self: "a", MaxKeys: maxKeys})
	c.SetRules(0, ruleParams(t, []quota.Rule{gcraRule("r", quota.ModeShared, 10, time.Second, 10)}))
	ring, err := cluster.NewRing(1, []cluster.Member{{Name: "a", Addr: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetTable(t0, ring)
	return c
}
