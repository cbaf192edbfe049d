package weir_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// The model test's examples: the divergences it found, each replayed as a
// fixed sequence through the same machine and reference (model_test.go),
// with the figure the issue states checked as well.

// exampleMachine is a model machine whose divergences fail t.
func exampleMachine(t *testing.T, cfg modelConfig, rules []quota.Rule) *modelMachine {
	t.Helper()
	m := newModelMachine(t, cfg, rules, 1, t.Errorf, t.Logf)
	t.Cleanup(m.close)
	return m
}

func gcraRule(id string, limit int64, window time.Duration, burst int64, key ...quota.KeySource) quota.Rule {
	return quota.Rule{ID: id, Algorithm: quota.AlgorithmGCRA, Limit: limit, Window: window, Burst: burst, Key: key}
}

var (
	keyIP    = quota.KeySource{Kind: quota.KeyIP}
	keyXUser = quota.KeySource{Kind: quota.KeyHeader, Name: "X-User"}
)

// TestModelRaiseLimitAdmits: a GCRA rule 5/min burst 5; an identity spends
// 1 token; one second later SetRules raises it to 50/min burst 5: the next
// 4 requests are all admitted (the bucket holds 4 tokens and more coming),
// by SetRules and by a rules-file reload.
func TestModelRaiseLimitAdmits(t *testing.T) {
	for _, viaFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("file=%v", viaFile), func(t *testing.T) {
			m := exampleMachine(t, modelConfig{file: viaFile}, []quota.Rule{gcraRule("api", 5, time.Minute, 5, keyIP)})
			q := modelReq{method: "GET", path: "/", ip: "192.0.2.1"}
			m.request(q)
			m.advance(time.Second)
			m.setRules([]quota.Rule{gcraRule("api", 50, time.Minute, 5, keyIP)}, viaFile)
			admitted := 0
			for range 4 {
				if m.request(q) {
					admitted++
				}
			}
			if admitted != 4 {
				t.Errorf("after the raise %d of the next 4 requests were admitted, want 4", admitted)
			}
		})
	}
}

// TestModelIdentitySourcesDoNotShare: with key [header:X-User, ip], 25
// requests carrying X-User: 198.51.100.7 from another address do not spend
// the bucket of the anonymous client whose IP is 198.51.100.7: its next
// request is admitted with its whole burst left, through Allow and through
// the middleware.
func TestModelIdentitySourcesDoNotShare(t *testing.T) {
	for _, viaHTTP := range []bool{false, true} {
		t.Run(fmt.Sprintf("middleware=%v", viaHTTP), func(t *testing.T) {
			m := exampleMachine(t, modelConfig{http: viaHTTP, overlap: true},
				[]quota.Rule{gcraRule("users", 20, time.Minute, 20, keyXUser, keyIP)})
			for range 25 {
				m.request(modelReq{method: "GET", path: "/", xUser: "198.51.100.7", ip: "203.0.113.9", viaHTTP: viaHTTP})
			}
			m.request(modelReq{method: "GET", path: "/", ip: "198.51.100.7", viaHTTP: viaHTTP})
			d := m.n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", ClientIP: "198.51.100.7"})
			if !d.Allowed || d.Results()[0].Remaining != 18 {
				t.Errorf("the anonymous client 198.51.100.7: allowed=%v remaining=%d, want admitted with 18 of 20 left",
					d.Allowed, d.Results()[0].Remaining)
			}
		})
	}
}

// TestModelKeyCapHotIdentity: a rule 5/15m burst 5, Config.MaxKeys 5 000,
// 300 000 rotating identities interleaved with a hot identity that tries
// 3 000 times (one try per 100 rotating requests, 1 ms apart): the hot
// identity is admitted at most what the reference admits plus one
// (docs/security.md: at the cap a full bucket goes first, else the least
// indebted one; the hot identity is the most indebted).
func TestModelKeyCapHotIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("300 000 requests")
	}
	clk := newFakeClock()
	rule := gcraRule("login", 5, 15*time.Minute, 5, keyIP)
	n, err := weir.New(weir.Config{Rules: []quota.Rule{rule}, Clock: clk.Now, MaxKeys: 5000, HashSeed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	rr := refRule{r: rule}
	hot := freshState(rr.params("", ""), clk.Now().UnixNano(), 0)
	var got, want int
	for i := range 300_000 {
		clk.Advance(time.Millisecond)
		ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", ClientIP: ip})
		if i%100 == 0 {
			if n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", ClientIP: "192.0.2.66"}).Allowed {
				got++
			}
			if hot.decide(clk.Now().UnixNano(), 1, true).allowed {
				want++
			}
		}
	}
	t.Logf("hot identity admitted %d times, the reference %d", got, want)
	if got > want+1 {
		t.Errorf("the hot identity was admitted %d times under the key cap; the reference admits %d, so at most %d", got, want, want+1)
	}
}

// TestModelOverrideInheritsTier: docs/rules.md says an override's limit or
// burst left out inherits from the next level, the tier's, else the
// rule's (quota.Rule.LimitsFor does so). A fixed_window rule of 5 per
// minute with a tier gold of 2 and an override for key-gold that sets only
// a burst: key-gold in tier gold gets the tier's limit, 2 per minute, so
// its third request in the minute is rejected.
func TestModelOverrideInheritsTier(t *testing.T) {
	rule := quota.Rule{ID: "plan", Algorithm: quota.AlgorithmFixedWindow, Limit: 5, Window: time.Minute,
		Key:       []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}},
		Tiers:     []quota.Tier{{Name: "gold", Limit: 2}},
		Overrides: []quota.Override{{Identity: "key-gold", Burst: 3}}}
	if l, _ := rule.LimitsFor("key-gold", "gold"); l != 2 {
		t.Fatalf("quota: LimitsFor(key-gold, gold) limit %d, want the tier's 2", l)
	}
	m := exampleMachine(t, modelConfig{}, []quota.Rule{rule})
	admitted := 0
	for range 3 {
		if m.request(modelReq{method: "GET", path: "/", apiKey: "key-gold", tier: "gold"}) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("key-gold in tier gold was admitted %d times in a minute, want the tier's limit 2", admitted)
	}
}

// TestModelPenaltyReaddedStartsEmpty: a penalty removed and added again
// starts empty (docs/rules.md, rule changes). A gcra rule 1/min with a
// penalty boxing after one rejection for 10 minutes: the identity spends
// its token, is rejected and boxed; the penalty is removed, then added
// back; a minute later the bucket has its token again and the identity,
// whose box went with the removed penalty, is admitted.
func TestModelPenaltyReaddedStartsEmpty(t *testing.T) {
	rule := gcraRule("otp", 1, time.Minute, 1, keyIP)
	boxed := rule
	boxed.Penalty = &quota.Penalty{After: 1, Within: time.Minute, Base: 10 * time.Minute, Max: 10 * time.Minute}
	m := exampleMachine(t, modelConfig{}, []quota.Rule{boxed})
	q := modelReq{method: "GET", path: "/", ip: "192.0.2.1"}
	m.request(q)
	m.request(q) // rejected: boxed for 10 minutes
	m.setRules([]quota.Rule{rule}, false)
	m.setRules([]quota.Rule{boxed}, false)
	m.advance(time.Minute)
	if !m.request(q) {
		t.Error("the identity is still boxed by a penalty that was removed and added again")
	}
}

// TestModelRuleReaddedStartsEmpty: a rule removed and added again is a new
// incarnation and starts empty (docs/rules.md, rule changes).
func TestModelRuleReaddedStartsEmpty(t *testing.T) {
	rule := gcraRule("api", 1, time.Hour, 1, keyIP)
	other := gcraRule("other", 1, time.Hour, 1, keyIP)
	m := exampleMachine(t, modelConfig{}, []quota.Rule{rule})
	q := modelReq{method: "GET", path: "/", ip: "192.0.2.1"}
	m.request(q)
	m.setRules([]quota.Rule{other}, false)
	m.setRules([]quota.Rule{rule}, false)
	if !m.request(modelReq{method: "GET", path: "/", ip: "192.0.2.9"}) || !m.request(q) {
		t.Error("a re-added rule kept the spend of its earlier incarnation")
	}
}

// TestModelLeakyOverrideBurstQueues: a leaky_bucket rule without max_delay
// takes its default from the identity's own limit and burst (docs/rules.md,
// Rule.QueueDelay). 1 per second with the default burst queues nothing;
// an override for key-gold of burst 2 queues one request a second.
func TestModelLeakyOverrideBurstQueues(t *testing.T) {
	rule := quota.Rule{ID: "smooth", Algorithm: quota.AlgorithmLeakyBucket, Limit: 1, Window: time.Second,
		Key:       []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}},
		Overrides: []quota.Override{{Identity: "key-gold", Burst: 2}}}
	m := exampleMachine(t, modelConfig{}, []quota.Rule{rule})
	for _, tc := range []struct {
		key  string
		want int
	}{{"key-gold", 2}, {"key-free", 1}} {
		admitted := 0
		for range 3 {
			if m.request(modelReq{method: "GET", path: "/", apiKey: tc.key}) {
				admitted++
			}
		}
		if admitted != tc.want {
			t.Errorf("%s: %d of 3 requests at one instant admitted, want %d", tc.key, admitted, tc.want)
		}
	}
}

// TestModelLockedRequestKeepsTier: a request turned away by the penalty box
// does not reach the bucket, so it does not move the identity to its tier
// (docs/rules.md, overrides and tiers). A global gcra bucket of 4 per 15
// minutes, burst 2, with a tier gold of 2 per 15 minutes and a penalty
// after 2 rejections: two requests spend the burst, a third is rejected, a
// gold one is rejected and boxes the identity, an untiered one is locked
// out. The bucket is still gold's when, 4 minutes later, an untiered
// request comes: gold refilled 240/450 of a token, which is less than one
// token under the rule too, so it is rejected.
func TestModelLockedRequestKeepsTier(t *testing.T) {
	rule := gcraRule("plan", 4, 15*time.Minute, 2, quota.KeySource{Kind: quota.KeyGlobal})
	rule.Tiers = []quota.Tier{{Name: "gold", Limit: 2}}
	rule.Penalty = &quota.Penalty{After: 2, Within: 10 * time.Second, Base: time.Second, Max: time.Second}
	m := exampleMachine(t, modelConfig{}, []quota.Rule{rule})
	q := modelReq{method: "GET", path: "/", ip: "192.0.2.1"}
	gold := q
	gold.tier = "gold"
	got := []bool{m.request(q), m.request(q), m.request(q), m.request(gold), m.request(q)}
	m.advance(4 * time.Minute)
	got = append(got, m.request(q))
	if want := []bool{true, true, false, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("admissions %v, want %v", got, want)
	}
}

// TestModelSlidingLogSpentCarries: a sliding_log's tokens in view carry to
// a new algorithm whole, even above a lowered limit (docs/rules.md,
// algorithm). 2 tokens logged under 2 per second, the limit lowered to 1,
// the rule changed to gcra 60 per second: the bucket has 58 tokens, so the
// next request leaves 57.
func TestModelSlidingLogSpentCarries(t *testing.T) {
	rule := quota.Rule{ID: "api", Algorithm: quota.AlgorithmSlidingLog, Limit: 2, Window: time.Second, Key: []quota.KeySource{keyIP}}
	m := exampleMachine(t, modelConfig{}, []quota.Rule{rule})
	q := modelReq{method: "GET", path: "/", ip: "192.0.2.1"}
	two := q
	two.cost = 2
	m.request(two)
	rule.Limit = 1
	m.setRules([]quota.Rule{rule}, false)
	m.setRules([]quota.Rule{gcraRule("api", 60, time.Second, 60, keyIP)}, false)
	d := m.n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/", ClientIP: "192.0.2.1"})
	if !d.Allowed || d.Results()[0].Remaining != 57 {
		t.Errorf("after the change: allowed=%v remaining=%d, want admitted with 57 left", d.Allowed, d.Results()[0].Remaining)
	}
}
