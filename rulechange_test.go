package weir_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
)

// ruleChangeYAML is a one-rule set on /x keyed by user, with extra fields.
func ruleChangeYAML(extra string) string {
	return "rules:\n  - id: r\n    match: {prefix: /x}\n    key: [user]\n    mode: local\n" + extra
}

// ruleNode is a node on a fake clock with ruleChangeYAML(extra).
func ruleNode(t *testing.T, extra string) (*weir.Node, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	return newNode(t, weir.Config{Rules: parseRules(t, ruleChangeYAML(extra)), Clock: clk.Now}), clk
}

// setRules installs ruleChangeYAML(extra) on n.
func setRules(t *testing.T, n *weir.Node, extra string) {
	t.Helper()
	if err := n.SetRules(parseRules(t, ruleChangeYAML(extra))); err != nil {
		t.Fatalf("SetRules: %v", err)
	}
}

// admit sends k requests of user (tier) to /x and counts the admitted ones.
func admit(n *weir.Node, user, tier string, k int) int {
	got := 0
	for range k {
		if n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/x", User: user, Tier: tier}).Allowed {
			got++
		}
	}
	return got
}

// The reproduction: 5/min burst 5, one token spent, raised a second later to
// 50/min burst 5. The bucket holds 4 + 11/12 tokens when the rule changes,
// so the next 4 requests pass (and a fifth does not: it would need 5).
func TestRaiseLimitAdmits(t *testing.T) {
	n, clk := ruleNode(t, "    limit: 5\n    window: 1m\n    burst: 5\n")
	if admit(n, "u", "", 1) != 1 {
		t.Fatal("first request rejected")
	}
	clk.Advance(time.Second)
	setRules(t, n, "    limit: 50\n    window: 1m\n    burst: 5\n")
	if got := admit(n, "u", "", 4); got != 4 {
		t.Fatalf("after raising 5/min to 50/min with 1 of 5 spent: %d of the next 4 admitted, want 4", got)
	}
	if admit(n, "u", "", 1) != 0 {
		t.Fatal("a fifth request passed: more than the tokens held")
	}
}

// The same through a rules file reload.
func TestRaiseLimitAdmitsReload(t *testing.T) {
	clk := newFakeClock()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write := func(limit int) {
		if err := os.WriteFile(path, []byte(ruleChangeYAML(fmt.Sprintf("    limit: %d\n    window: 1m\n    burst: 5\n", limit))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(5)
	n := newNode(t, weir.Config{RulesFile: path, Clock: clk.Now, ReloadPoll: 10 * time.Millisecond})
	if admit(n, "u", "", 1) != 1 {
		t.Fatal("first request rejected")
	}
	clk.Advance(time.Second)
	v := n.Rules().Version()
	write(50)
	for deadline := time.Now().Add(10 * time.Second); n.Rules().Version() == v; {
		if time.Now().After(deadline) {
			t.Fatal("the rules file was not reloaded within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := admit(n, "u", "", 4); got != 4 {
		t.Fatalf("after the reload: %d of 4 admitted, want 4", got)
	}
}

// A lowered burst clamps the tokens held: 10 burst 10 with 2 spent holds 8;
// lowered to burst 3 it holds 3.
func TestLowerBurstClamps(t *testing.T) {
	n, clk := ruleNode(t, "    limit: 10\n    window: 1h\n    burst: 10\n")
	admit(n, "u", "", 2)
	clk.Advance(time.Millisecond)
	setRules(t, n, "    limit: 10\n    window: 1h\n    burst: 3\n")
	if got := admit(n, "u", "", 5); got != 3 {
		t.Fatalf("lowered to burst 3 with 8 held: %d admitted, want 3", got)
	}
	// A lowered limit with the same burst keeps the spend, refilled slower.
	n2, clk2 := ruleNode(t, "    limit: 60\n    window: 1m\n    burst: 4\n")
	admit(n2, "u", "", 4)
	setRules(t, n2, "    limit: 6\n    window: 1m\n    burst: 4\n")
	clk2.Advance(9 * time.Second) // one token earns back in 10s now
	if got := admit(n2, "u", "", 1); got != 0 {
		t.Fatal("a token earned back at the old rate after the limit was lowered")
	}
	clk2.Advance(time.Second)
	if got := admit(n2, "u", "", 2); got != 1 {
		t.Fatalf("after 10s at 6/min: %d admitted, want 1", got)
	}
}

// Several changes before the next decision: the lazy conversion equals
// converting at each change and letting time run under each rule.
func TestRuleChangeChain(t *testing.T) {
	type step struct {
		limit, burst int64
		after        time.Duration
	}
	steps := []step{{5, 5, 0}, {50, 8, time.Second}, {2, 6, time.Second}, {6, 8, 2 * time.Second}}
	n, clk := ruleNode(t, "    limit: 5\n    window: 1m\n    burst: 5\n")
	admit(n, "u", "", 4)
	// The reference: a bucket converted eagerly at each change.
	t0 := clk.Now().UnixNano()
	g, _ := bucket.NewGCRA(5, time.Minute, 5)
	var tat bucket.TAT
	for range 4 {
		g.Step(&tat, t0, 1)
	}
	for _, s := range steps[1:] {
		clk.Advance(s.after)
		setRules(t, n, fmt.Sprintf("    limit: %d\n    window: 1m\n    burst: %d\n", s.limit, s.burst))
		ng, _ := bucket.NewGCRA(s.limit, time.Minute, s.burst)
		tat = ng.Convert(g, tat, clk.Now().UnixNano())
		g = ng
	}
	clk.Advance(time.Second)
	now := clk.Now().UnixNano()
	want := 0
	for range 40 {
		if g.Step(&tat, now, 1).Allowed {
			want++
		}
	}
	if got := admit(n, "u", "", 40); got != want {
		t.Fatalf("after a chain of changes: %d admitted, the eager reference %d", got, want)
	}
	if want == 0 || want == 8 {
		t.Fatalf("the chain does not test anything: reference admits %d", want)
	}
}

// A fixed window keeps its start and count when its length changes; a
// lowered limit applies to the count.
func TestFixedWindowChange(t *testing.T) {
	fixed := "    algorithm: fixed_window\n    limit: %d\n    window: %s\n"
	n, clk := ruleNode(t, fmt.Sprintf(fixed, 10, "1m"))
	clk.Advance(10 * time.Second) // the clock starts on a minute boundary
	admit(n, "u", "", 4)
	setRules(t, n, fmt.Sprintf(fixed, 10, "2m"))
	clk.Advance(55 * time.Second) // 1:05 into the window, which now ends at 2:00
	if got := admit(n, "u", "", 10); got != 6 {
		t.Fatalf("lengthened window: %d admitted, want the 6 left of 10", got)
	}
	setRules(t, n, fmt.Sprintf(fixed, 5, "2m"))
	if got := admit(n, "u", "", 1); got != 0 {
		t.Fatal("a count of 10 under a lowered limit of 5 admitted")
	}
	// Shortened so that the window has ended: a fresh window.
	setRules(t, n, fmt.Sprintf(fixed, 5, "1m"))
	if got := admit(n, "u", "", 6); got != 5 {
		t.Fatalf("window shortened to have ended: %d admitted, want a fresh 5", got)
	}
}

// A sliding window's counts carry over a change of length.
func TestSlidingWindowChange(t *testing.T) {
	sliding := "    algorithm: sliding_window\n    limit: %d\n    window: %s\n"
	n, clk := ruleNode(t, fmt.Sprintf(sliding, 10, "1m"))
	clk.Advance(10 * time.Second)
	admit(n, "u", "", 7)
	setRules(t, n, fmt.Sprintf(sliding, 10, "2m"))
	if got := admit(n, "u", "", 10); got != 3 {
		t.Fatalf("lengthened sliding window: %d admitted, want 3", got)
	}
	// The same log for a sliding log, whose lowered limit counts the log.
	n2, _ := ruleNode(t, fmt.Sprintf("    algorithm: sliding_log\n    limit: %d\n    window: %s\n", 10, "1m"))
	admit(n2, "u", "", 6)
	setRules(t, n2, fmt.Sprintf("    algorithm: sliding_log\n    limit: %d\n    window: %s\n", 8, "30s"))
	if got := admit(n2, "u", "", 5); got != 2 {
		t.Fatalf("sliding log lowered to 8 with 6 logged: %d admitted, want 2", got)
	}
}

// An algorithm change charges the whole tokens spent to the new algorithm.
func TestAlgorithmChange(t *testing.T) {
	n, clk := ruleNode(t, "    limit: 10\n    window: 1h\n    burst: 10\n")
	admit(n, "u", "", 4)
	clk.Advance(time.Second)
	setRules(t, n, "    algorithm: fixed_window\n    limit: 10\n    window: 1h\n")
	if got := admit(n, "u", "", 10); got != 6 {
		t.Fatalf("gcra with 4 spent to fixed_window 10: %d admitted, want 6", got)
	}
	clk.Advance(time.Second)
	setRules(t, n, "    algorithm: sliding_log\n    limit: 12\n    window: 1h\n")
	if got := admit(n, "u", "", 10); got != 2 {
		t.Fatalf("fixed window with 10 counted to sliding_log 12: %d admitted, want 2", got)
	}
	clk.Advance(time.Second)
	setRules(t, n, "    limit: 10\n    window: 1h\n    burst: 20\n")
	if got := admit(n, "u", "", 20); got != 8 {
		t.Fatalf("sliding log with 12 logged to gcra burst 20: %d admitted, want 8", got)
	}
	// To and from concurrency starts over.
	setRules(t, n, "    algorithm: concurrency\n    limit: 2\n    window: 1h\n")
	if got := admit(n, "u", "", 2); got != 2 {
		t.Fatalf("to concurrency: %d admitted, want 2 (it starts over)", got)
	}
}

// An identity that gets an override carries its spend to it, and back when
// the override is removed; one that moves tier carries it too.
func TestOverrideAndTierChange(t *testing.T) {
	base := "    limit: 10\n    window: 1h\n    burst: 10\n"
	n, clk := ruleNode(t, base)
	admit(n, "acme", "", 6)
	clk.Advance(time.Millisecond)
	setRules(t, n, base+"    overrides: [{identity: acme, limit: 20, burst: 20}]\n")
	// 4 held + 10 of raised burst.
	if got := admit(n, "acme", "", 10); got != 10 {
		t.Fatalf("override added: %d of 10 admitted", got)
	}
	setRules(t, n, base)
	// 4 held, within the rule's burst of 10.
	if got := admit(n, "acme", "", 10); got != 4 {
		t.Fatalf("override removed: %d admitted, want 4", got)
	}
	tiers := base + "    tiers: [{name: gold, limit: 10, burst: 30}]\n"
	setRules(t, n, tiers)
	// The same identity now sends gold requests: 0 held + 20 of the tier's burst.
	if got := admit(n, "acme", "gold", 25); got != 20 {
		t.Fatalf("moved to tier gold: %d admitted, want 20", got)
	}
	if got := admit(n, "acme", "", 1); got != 0 {
		t.Fatal("moving back from the tier forgave the tier's spend")
	}
}

// A rule removed and added again starts fresh; so does its penalty box.
func TestRuleReAddStartsFresh(t *testing.T) {
	rule := "    limit: 3\n    window: 1h\n    burst: 3\n"
	n, _ := ruleNode(t, rule)
	admit(n, "u", "", 3)
	if err := n.SetRules(nil); err != nil {
		t.Fatal(err)
	}
	setRules(t, n, rule)
	if got := admit(n, "u", "", 4); got != 3 {
		t.Fatalf("re-added rule: %d admitted, want a fresh 3", got)
	}
	pen := "    penalty: {after: 2, within: 1h, base: 1h, max: 2h}\n"
	setRules(t, n, rule+pen)
	admit(n, "u", "", 2) // rejected twice: locked out
	if d := n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/x", User: "u"}); !d.Results()[0].Locked {
		t.Fatal("no lockout after 2 rejections")
	}
	setRules(t, n, rule)
	setRules(t, n, rule+pen)
	if d := n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/x", User: "u"}); d.Results()[0].Locked {
		t.Fatal("a penalty removed and added again kept its lockout")
	}
}

// A rule tightened while its bucket is spent is seen so by the look a
// request of several rules takes before charging: the bucket that would
// have refilled under the old rule is converted, rejects, and the other
// rule is not charged. (Two gcra rules of 1/s; r0 becomes 1/10s at the
// instant both were spent; a second later r0 rejects and r1 keeps its
// token.)
func TestTightenedRuleLooksSpent(t *testing.T) {
	y := func(w0 string) string {
		return "rules:\n  - id: r0\n    key: [user]\n    mode: local\n    limit: 1\n    window: " + w0 +
			"\n  - id: r1\n    key: [user]\n    mode: local\n    limit: 1\n    window: 1s\n"
	}
	clk := newFakeClock()
	n := newNode(t, weir.Config{Rules: parseRules(t, y("1s")), Clock: clk.Now})
	req := weir.Request{Method: "GET", Path: "/", User: "u"}
	if !n.Allow(context.Background(), req).Allowed {
		t.Fatal("first request rejected")
	}
	if err := n.SetRules(parseRules(t, y("10s"))); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	d := n.Allow(context.Background(), req)
	if d.Allowed {
		t.Fatal("admitted a second after r0 was tightened to 1/10s with its token spent")
	}
	for _, r := range d.Results() {
		if r.Rule == "r1" && r.Remaining != 1 {
			t.Errorf("r1 reports %d remaining, want 1: it was charged for a request r0 rejected", r.Remaining)
		}
	}
}

// A rule with thousands of overrides of distinct limits, and tiers, loads
// and decides each identity under its own limits, and a change of one
// override converts only what changed. (Entries record the generation and
// tier they were written under, not one tag per override: the tags of a
// rule do not run out with its overrides.)
func TestManyOverrides(t *testing.T) {
	rules := func(extra int) string {
		var b strings.Builder
		b.WriteString("    limit: 5\n    window: 1m\n    tiers:\n      - {name: gold, limit: 50}\n    overrides:\n")
		for i := range 5000 {
			fmt.Fprintf(&b, "      - {identity: u%d, limit: %d, burst: %d}\n", i, 10+i+extra, 10+i+extra)
		}
		return b.String()
	}
	n, clk := ruleNode(t, rules(0))
	if got := admit(n, "u3", "", 20); got != 13 {
		t.Errorf("u3 (override 13/min burst 13): %d of 20 admitted, want 13", got)
	}
	if got := admit(n, "u4", "gold", 20); got != 14 {
		t.Errorf("u4 in tier gold: %d of 20 admitted, want 14 (its override's limit)", got)
	}
	clk.Advance(time.Second)
	setRules(t, n, rules(1))
	// 13 spent less 13/60 earned back in the second, under 14/min burst
	// 14: 1.2 tokens.
	if got := admit(n, "u3", "", 20); got != 1 {
		t.Errorf("u3, its override raised from 13 to 14 a second after spending 13: %d admitted, want 1", got)
	}
}
