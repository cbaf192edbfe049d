package region

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// TestRulesRefundOnOneNode: on one node every rule's owner is the node
// itself, so every refund is exact. A request carries a rule of 100/s and
// then one of 50/s on the same identity, offered 300/s: the second rejects
// most requests, and each of those gives the first its token back (the
// policy's refund), so the first rule never runs dry and never rejects,
// and what it kept is exactly what was admitted: a request rule 2 rejected
// charged nothing net on rule 1.
func TestRulesRefundOnOneNode(t *testing.T) {
	res, err := Run(Config{Nodes: 1, Limit: 100, Rules: []RuleSpec{{Limit: 50}}, Duration: 10 * time.Second, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("violations: %v", res.Violations)
	}
	r1, r2 := res.Rules[0], res.Rules[1]
	switch {
	case r2.Rejects < res.Requests/2:
		t.Fatalf("rule 2 rejected %d of %d requests: the scenario does not exercise refunds", r2.Rejects, res.Requests)
	case r1.Rejects != 0:
		t.Fatalf("rule 1 rejected %d requests: its refunds did not come back", r1.Rejects)
	case r1.Refunded != r2.Rejects || r1.Kept != 0:
		t.Fatalf("rule 1 refunded %d tokens and kept %d for %d requests rule 2 rejected", r1.Refunded, r1.Kept, r2.Rejects)
	case r1.Stood != res.Admitted || r2.Stood != res.Admitted:
		t.Fatalf("charges that stood %d and %d, admitted %d: a rejected request left a net charge", r1.Stood, r2.Stood, res.Admitted)
	case res.Admitted != res.RefAdmitted:
		t.Fatalf("admitted %d, the policy over exact buckets %d", res.Admitted, res.RefAdmitted)
	}
}

// TestRulesRefundsReachOwners: in a region whose owners stay up, a
// refund that the non-owner cannot give back itself (a remote owner's
// admission, slack spend already reported) reaches the owner, so that
// rule 1's charges that stood are the requests admitted, in exact mode and
// in shared mode (docs/overshoot.md, "Several rules on a request"). In
// shared mode blind spend whose report has left its node is kept (its
// owner charged it to a sketch, which gives nothing back): a few tokens,
// each one charge that stood beyond the admitted.
func TestRulesRefundsReachOwners(t *testing.T) {
	for _, cfg := range []Config{
		{Nodes: 3, Mode: quota.ModeExact, Limit: 100, IDs: 4, Rules: []RuleSpec{{Limit: 150, Tenants: 2}}, Duration: 5 * time.Second, Seed: 5},
		{Nodes: 3, Limit: 100, Traffic: TrafficSaturate, Rules: []RuleSpec{{Limit: 50}}, Duration: 5 * time.Second, Seed: 5},
	} {
		res, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !res.OK() {
			t.Fatalf("%s: violations: %v", cfg.Mode, res.Violations)
		}
		r1, r2 := res.Rules[0], res.Rules[1]
		switch {
		case r2.Rejects < res.Requests/4:
			t.Fatalf("%s: rule 2 rejected %d of %d requests: the scenario does not exercise refunds", cfg.Mode, r2.Rejects, res.Requests)
		case r1.Refunded+r1.Kept != r2.Rejects*res.Config.Cost || (cfg.Mode == quota.ModeExact && r1.Kept != 0) || r1.Kept*100 > r1.Refunded:
			t.Fatalf("%s: rule 1 refunded %d tokens and kept %d for %d requests rule 2 rejected", cfg.Mode, r1.Refunded, r1.Kept, r2.Rejects)
		case r1.Stood != res.Admitted+r1.Kept/res.Config.Cost:
			t.Fatalf("%s: rule 1's charges that stood %d, admitted %d, kept %d", cfg.Mode, r1.Stood, res.Admitted, r1.Kept)
		}
		t.Logf("%s: refunded %d, kept %d", cfg.Mode, r1.Refunded, r1.Kept)
	}
}

// TestRulesRegion runs a per-identity rule and a per-tenant rule (their
// owners differ, so the second rule's answer is a round trip after the
// first's charge) in a region of three exact-mode nodes, with an owner
// crash and restart: refunds are given after a wait (a refund term above
// zero), and every rule's envelope holds on its own, each with its
// terms and its refund term.
func TestRulesRegion(t *testing.T) {
	faults, err := ParseFaults("crash:n1@3s,restart:n1@6s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Nodes: 3, Mode: quota.ModeExact, Limit: 100, IDs: 4, Rules: []RuleSpec{{Limit: 150, Tenants: 2}},
		Faults: faults, Duration: 10 * time.Second, Seed: 5}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("violations: %v", res.Violations)
	}
	r1, r2 := res.Rules[0], res.Rules[1]
	if r1.Refunded == 0 || r1.RefundTerm <= 0 || r1.RefundLag <= 0 {
		t.Fatalf("rule 1: refunded %d, refund term %g, lag %v: no refund after a wait", r1.Refunded, r1.RefundTerm, r1.RefundLag)
	}
	// Every token rule 1 admitted for a request rule 2 rejected is
	// refunded or kept by the coordinator, never lost from the count.
	if r1.Refunded+r1.Kept > r2.Rejects*res.Config.Cost {
		t.Fatalf("rule 1 refunded %d and kept %d tokens, rule 2 rejected %d requests", r1.Refunded, r1.Kept, r2.Rejects)
	}
	for _, x := range res.Rules {
		if x.Excess > x.Bound+eps || x.ExcessClean > float64(x.S)+eps {
			t.Fatalf("rule %s: excess %g (fault-free %g) above %g (S %d)", x.ID, x.Excess, x.ExcessClean, x.Bound, x.S)
		}
	}
	// The same seed prints the same bytes.
	again, _ := Run(cfg)
	var a, b bytes.Buffer
	res.Summary(&a)
	again.Summary(&b)
	if a.String() != b.String() {
		t.Fatalf("two runs differ:\n%s\n---\n%s", a.String(), b.String())
	}
	if !strings.Contains(a.String(), "refund term") || !strings.Contains(a.String(), "sim2") {
		t.Fatalf("summary lacks the per-rule tables:\n%s", a.String())
	}
}

// TestRefundTerm: the refund term is the most tokens of refunded charges
// made by one instant and given back after it.
func TestRefundTerm(t *testing.T) {
	rr := &ruleRun{refunds: make([]refundSpans, 1), chk: &checker{refundTerm: make([]float64, 1)}}
	add := func(from, to int64) { rr.noteRefund(0, T0+from, T0+to, 1, -1) }
	add(2, 4)  // inside the next one
	add(0, 10) // covers 2: two at once
	add(5, 15) // covers 5 with (0, 10): two
	add(7, 7)  // given back at once: nothing outstanding
	if rr.refundTerm != 2 {
		t.Fatalf("refund term %g, want 2", rr.refundTerm)
	}
	add(6, 16) // at 6: (0, 10), (5, 15) and itself
	if rr.refundTerm != 3 {
		t.Fatalf("refund term %g, want 3", rr.refundTerm)
	}
}

// TestParseRules: the spec round-trips, and bad specs name the problem.
func TestParseRules(t *testing.T) {
	rs, err := ParseRules("limit=50; limit=150,window=2s,burst=20,tenants=4")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[1] != (RuleSpec{Limit: 150, Window: 2 * time.Second, Burst: 20, Tenants: 4}) {
		t.Fatalf("parsed %+v", rs)
	}
	if got := FormatRules(rs); got != "limit=50;limit=150,window=2s,burst=20,tenants=4" {
		t.Fatalf("formatted %q", got)
	}
	for spec, want := range map[string]string{
		"limit":              "want KEY=VALUE",
		"window=1s":          "limit= is required",
		"limit=5,colour=red": `unknown key "colour"`,
		"limit=x":            "limit",
	} {
		if _, err := ParseRules(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", spec, err, want)
		}
	}
	for _, c := range []Config{
		{Rules: []RuleSpec{{Limit: 10, Tenants: 2}}},           // more tenants than identities
		{Rules: []RuleSpec{{Limit: 10}}, Sketch: 4},            // gating with several rules
		{Rules: []RuleSpec{{Limit: 10, Burst: 1}}, Cost: 2},    // cost above a rule's burst
		{Rules: make([]RuleSpec, maxRules), Limit: 10, IDs: 1}, // too many
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c.Rules)
		}
	}
}
