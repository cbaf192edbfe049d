package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// demandHarness is the in-process harness of coordinator_test.go with every
// rule switched to demand-following slack.
func demandHarness(t *testing.T, n int, oneway time.Duration, rules ...quota.Rule) *harness {
	h := newHarness(t, n, oneway, rules...)
	params := ruleParams(t, rules)
	for i := range params {
		params[i].Scheme = SlackDemand
	}
	for _, name := range h.names {
		h.nodes[name].SetRules(0, params)
	}
	return h
}

// checkPool asserts slack.go's invariant for one identity at this instant:
// the owner's reservations stay within G, and the slack the non-owners may
// use (base + grant), and so their unconfirmed spend, within P = ⌊a·L⌋
// (docs/overshoot.md: Σ sᵢ ≤ a·L always).
func checkPool(t *testing.T, h *harness, p *RuleParams, identity string) (grants map[string]int64) {
	t.Helper()
	owner := h.ring.OwnerName(identity)
	n := len(h.names)
	k := entryKey{p.ID, identity}
	var reserved int64
	if oe := h.nodes[owner].owned.get(k); oe != nil {
		for _, r := range oe.reports {
			reserved += r.grant.reserved()
		}
	}
	if reserved > p.Grantable(n) {
		t.Fatalf("owner reserves %d, above G = %d", reserved, p.Grantable(n))
	}
	grants = map[string]int64{}
	var slack, unconf int64
	for _, name := range h.names {
		if name == owner {
			continue
		}
		s := p.Slack(n)
		if e := h.nodes[name].entries.get(k); e != nil {
			s += e.grant.extraAt(h.now)
			grants[name] = e.grant.extra
			unconf += e.spent - e.acked
		}
		slack += s
	}
	if slack > p.Pool() || unconf > p.Pool() {
		t.Fatalf("non-owners may use %d tokens of slack and hold %d unconfirmed, above P = %d", slack, unconf, p.Pool())
	}
	return grants
}

// TestDemandSlackFollowsTheBusyNode: under 80/15/5 traffic from three
// non-owners the busiest gets most of the pool, the pool is never
// over-committed, the envelope B + r·Δ + P holds, and once traffic stops
// every grant is given back and both sides drop the identity.
func TestDemandSlackFollowsTheBusyNode(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1000, time.Second, 100)
	h := demandHarness(t, 5, 300*time.Microsecond, rule)
	p := h.nodes[h.names[0]].rules["api"]
	const id = "user:busy"
	owner := h.ring.OwnerName(id)
	var senders []string
	for _, name := range h.names {
		if name != owner {
			senders = append(senders, name)
		}
	}
	w := newSmoothRR([]int{80, 15, 5})
	step := 330 * time.Microsecond // about 3 000 requests a second: 3× the rate
	var busiest int64
	for i := range 9000 {
		h.request(senders[w.next()], "api", id, 1)
		h.flush()
		h.step(step)
		g := checkPool(t, h, p, id)
		if i > 3000 {
			busiest = max(busiest, g[senders[0]])
			if g[senders[2]] > g[senders[0]] && g[senders[0]] > 0 {
				t.Fatalf("the 5 %% node holds a larger grant (%d) than the 80 %% node (%d)", g[senders[2]], g[senders[0]])
			}
		}
	}
	if busiest < p.Grantable(5)/2 {
		t.Errorf("the busiest node's grant peaked at %d of G = %d", busiest, p.Grantable(5))
	}
	if up := upperExcess(h.admits, float64(rule.Limit)/float64(rule.Window)); up > float64(rule.Burst+p.Pool())+1e-6 {
		t.Errorf("excess over r·Δ %.2f, above B + P = %d", up, rule.Burst+p.Pool())
	}
	// Idle: grants lapse, are reported, and both sides forget the identity.
	for range 2000 {
		h.step(time.Millisecond)
		checkPool(t, h, p, id)
	}
	k := entryKey{"api", id}
	for _, name := range h.names {
		if e := h.nodes[name].entries.get(k); e != nil {
			t.Errorf("%s still holds an entry after 2s idle: grant %+v", name, e.grant)
		}
	}
	if oe := h.nodes[owner].owned.get(k); oe != nil {
		t.Errorf("the owner still holds the bucket after 2s idle (reserving %v)", oe.reserving())
	}
	for _, name := range h.names {
		if d := h.nodes[name].Stats().Degraded; d != 0 {
			t.Errorf("%s: %d degraded decisions with no fault", name, d)
		}
	}
}

// TestDemandSlackLossNeverOvercommits drops every third message to and from
// the busiest node for a while: grants and their confirmations are lost, and
// the pool must still never be over-committed.
func TestDemandSlackLossNeverOvercommits(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1000, time.Second, 100)
	h := demandHarness(t, 4, 300*time.Microsecond, rule)
	p := h.nodes[h.names[0]].rules["api"]
	const id = "user:lossy"
	owner := h.ring.OwnerName(id)
	var senders []string
	for _, name := range h.names {
		if name != owner {
			senders = append(senders, name)
		}
	}
	for i := range 12000 {
		// The load moves from the first sender to the second halfway.
		from := senders[0]
		if i >= 6000 || i%4 == 3 {
			from = senders[1]
		}
		h.cut[senders[0]] = i%3 == 0 && i < 8000
		h.request(from, "api", id, 1)
		h.flush()
		h.step(330 * time.Microsecond)
		checkPool(t, h, p, id)
	}
	// on_failure decisions (forwards lost with the messages) are outside
	// the owners' accounting: the envelope holds for the others.
	accounted := slices.DeleteFunc(slices.Clone(h.admits), func(a admit) bool { return a.src == SourceFailure })
	if up := upperExcess(accounted, float64(rule.Limit)/float64(rule.Window)); up > float64(rule.Burst+p.Pool())+1e-6 {
		t.Errorf("excess over r·Δ %.2f, above B + P = %d", up, rule.Burst+p.Pool())
	}
}

// TestSlackSchemeSums: S = Σ sᵢ stays within ⌊a·L⌋ for both schemes.
func TestSlackSchemeSums(t *testing.T) {
	for _, limit := range []int64{1, 20, 100, 1000, 12345} {
		for _, s := range []SlackScheme{SlackFixed, SlackDemand} {
			for n := 1; n <= 40; n++ {
				rule := gcraRule("r", quota.ModeShared, limit, time.Second, limit)
				p, err := NewRuleParams(&rule, 1)
				if err != nil {
					t.Fatal(err)
				}
				p.Scheme = s
				if S := p.RegionSlack(n); S > p.Pool() || S < 0 {
					t.Errorf("%v limit %d n %d: S = %d, pool %d", s, limit, n, S, p.Pool())
				}
				if n > 1 && p.MaxSlack(n) > p.Pool() {
					t.Errorf("%v limit %d n %d: one node may hold %d of pool %d", s, limit, n, p.MaxSlack(n), p.Pool())
				}
			}
		}
	}
	for _, in := range []string{"fixed", "demand"} {
		if s, err := ParseSlackScheme(in); err != nil || s.String() != in {
			t.Errorf("ParseSlackScheme(%q) = %v, %v", in, s, err)
		}
	}
	if _, err := ParseSlackScheme("even"); err == nil {
		t.Error("ParseSlackScheme accepted \"even\"")
	}
}

// smoothRR is a deterministic weighted round robin (nginx's smooth one).
type smoothRR struct{ w, cur []int }

func newSmoothRR(w []int) *smoothRR { return &smoothRR{w: w, cur: make([]int, len(w))} }

func (s *smoothRR) next() int {
	total, best := 0, 0
	for i, w := range s.w {
		s.cur[i] += w
		total += w
		if s.cur[i] > s.cur[best] {
			best = i
		}
	}
	s.cur[best] -= total
	return best
}
