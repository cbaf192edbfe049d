package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// Tests of sketch gating (sketch.go; docs/overshoot.md "Sketch gating").

func gatedRule(id string, limit int64, window time.Duration, burst int64, sk *quota.Sketch) quota.Rule {
	r := gcraRule(id, quota.ModeShared, limit, window, burst)
	r.Sketch = sk
	return r
}

// tracker drives a harness like its request and step do, and also records
// admissions per identity, every outcome and every message, in order.
type tracker struct {
	h       *harness
	byID    map[string][]admit
	ids     map[string]map[uint64]string // node -> ticket -> identity
	log     []string
	logging bool
}

func newTracker(h *harness, logging bool) *tracker {
	tr := &tracker{h: h, byID: map[string][]admit{}, ids: map[string]map[uint64]string{}, logging: logging}
	for _, n := range h.names {
		tr.ids[n] = map[uint64]string{}
	}
	h.complete = func(node string, c Completion, cost int64) {
		id := tr.ids[node][c.Ticket]
		delete(tr.ids[node], c.Ticket)
		tr.record(node, id, c.Outcome, cost)
	}
	h.observe = func(node string, rd Ready) {
		if tr.logging && (len(rd.Messages) > 0 || len(rd.Completions) > 0) {
			tr.log = append(tr.log, fmt.Sprintf("%d %s ready %+v", h.now, node, rd))
		}
	}
	return tr
}

func (tr *tracker) request(node, rule, identity string, cost int64) Outcome {
	h := tr.h
	o, err := h.nodes[node].Decide(h.now, rule, identity, cost)
	if err != nil {
		h.t.Fatal(err)
	}
	if tr.logging {
		tr.log = append(tr.log, fmt.Sprintf("%d %s %s %+v", h.now, node, identity, o))
	}
	if o.Pending {
		h.waiting[node][o.Ticket] = cost
		tr.ids[node][o.Ticket] = identity
		return o
	}
	tr.record(node, identity, o, cost)
	return o
}

// record notes an admission both in the harness (all identities) and per
// identity, at the time the harness's record uses.
func (tr *tracker) record(node, identity string, o Outcome, cost int64) {
	h := tr.h
	h.record(node, o, cost)
	if !o.Allowed {
		return
	}
	at := h.now
	if o.Source == SourceRemote {
		at -= h.oneway
	}
	as := tr.byID[identity]
	i := len(as)
	for i > 0 && as[i-1].at > at {
		i--
	}
	tr.byID[identity] = slices.Insert(as, i, admit{at: at, cost: cost, node: node})
}

// step is harness.step with completions attributed to their identities.
func (tr *tracker) step(d time.Duration) { tr.h.step(d) }

// totals sums the nodes' counters.
func (tr *tracker) totals() Stats {
	var s Stats
	for _, n := range tr.h.names {
		st := tr.h.nodes[n].Stats()
		s.LocalAdmits += st.LocalAdmits
		s.Degraded += st.Degraded
		s.SyncsSent += st.SyncsSent
		s.Forwarded += st.Forwarded
		s.Entries += st.Entries
		s.Owned += st.Owned
		s.SketchAdmits += st.SketchAdmits
		s.SketchPromotions += st.SketchPromotions
		s.SketchBytes += st.SketchBytes
	}
	return s
}

// worstWithSketchTerm returns the largest excess, over every interval
// [tᵢ, tⱼ] of an identity's admissions, of admitted − r·Δ − N·θ·(⌈Δ/P⌉+1):
// what the sketch-gated envelope bounds by B + S (docs/overshoot.md,
// "Sketch gating"). It also returns the largest plain excess admitted − r·Δ.
func worstWithSketchTerm(admits []admit, rate float64, nTheta int64, period int64) (withTerm, plain float64) {
	withTerm, plain = math.Inf(-1), math.Inf(-1)
	for i := range admits {
		var sum float64
		for j := i; j < len(admits); j++ {
			sum += float64(admits[j].cost)
			d := admits[j].at - admits[i].at
			ex := sum - rate*float64(d)
			plain = max(plain, ex)
			periods := (d+period-1)/period + 1
			withTerm = max(withTerm, ex-float64(nTheta*periods))
		}
	}
	return withTerm, plain
}

// heavyTail runs a heavy-tailed population on 3 nodes: ids one-shot
// identities, each sending one request and half of them a second one a few
// seconds later, each request on a node drawn at random, plus heavy
// hitters at 3× the rule's rate, round-robin over the nodes. It samples
// the live entries (Entries + Owned on all nodes) after every step.
type heavyTailRun struct {
	tr          *tracker
	heavy       []string
	peakEntries int
	end         int64
}

func runHeavyTail(t *testing.T, rule quota.Rule, ids, heavy int, run time.Duration, seed uint64, tracked bool) heavyTailRun {
	h := newHarness(t, 3, time.Millisecond, rule)
	if tracked {
		h.trackAll()
	}
	tr := newTracker(h, false)
	const step = 5 * time.Millisecond
	steps := int(run / step)
	// Plan every one-shot request by step, deterministically.
	rng := rand.New(rand.NewPCG(seed, 1))
	plan := make([][]int32, steps) // step -> identity numbers
	nodeOf := make([][]uint8, steps)
	arrive := steps * 4 / 5 // one-shots arrive in the first 80 % of the run
	for i := range ids {
		s := rng.IntN(arrive)
		plan[s] = append(plan[s], int32(i))
		nodeOf[s] = append(nodeOf[s], uint8(rng.IntN(3)))
		if rng.IntN(2) == 0 {
			s2 := min(s+1+rng.IntN(int(5*time.Second/step)), steps-1)
			plan[s2] = append(plan[s2], int32(i))
			nodeOf[s2] = append(nodeOf[s2], uint8(rng.IntN(3)))
		}
	}
	res := heavyTailRun{tr: tr}
	for i := range heavy {
		res.heavy = append(res.heavy, "heavy-"+strconv.Itoa(i))
	}
	// Heavy hitters: one request every 1/(3r), each hitter offset a
	// little, on the nodes in turn.
	gap := int64(rule.Window) / (3 * rule.Limit)
	next := make([]int64, heavy)
	turn := make([]int, heavy)
	for i := range next {
		next[i] = h.now + int64(i)*gap/int64(heavy)
	}
	for s := range steps {
		for j, i := range plan[s] {
			tr.request(h.names[nodeOf[s][j]], rule.ID, "user-"+strconv.Itoa(int(i)), 1)
		}
		for i, id := range res.heavy {
			for next[i] <= h.now {
				tr.request(h.names[turn[i]%3], rule.ID, id, 1)
				turn[i]++
				next[i] += gap
			}
		}
		tr.step(step)
		st := tr.totals()
		res.peakEntries = max(res.peakEntries, st.Entries+st.Owned)
	}
	res.end = h.now
	for range 100 {
		tr.step(time.Millisecond)
	}
	return res
}

// TestSketchHeavyTail: with gating, entries and syncs follow the heavy
// hitters, not the 50 000 light identities, and the heavy hitters stay
// inside the envelope plus the sketch term over every
// interval, and above the lower bound.
func TestSketchHeavyTail(t *testing.T) {
	const ids, heavy = 50_000, 5
	run := 125 * time.Second
	sk := &quota.Sketch{Threshold: 4} // period = window = 1m, width 65536, depth 4
	gated := gatedRule("api", 600, time.Minute, 60, sk)
	plain := gatedRule("api", 600, time.Minute, 60, nil)
	p, err := NewRuleParams(&gated, 1)
	if err != nil {
		t.Fatal(err)
	}
	g := runHeavyTail(t, gated, ids, heavy, run, 7, false)
	u := runHeavyTail(t, plain, ids, heavy, run, 7, true)
	gs, us := g.tr.totals(), u.tr.totals()
	t.Logf("gated:   peak entries %d, syncs %d, sketch admits %d, promotions %d, sketch bytes %d",
		g.peakEntries, gs.SyncsSent, gs.SketchAdmits, gs.SketchPromotions, gs.SketchBytes)
	t.Logf("ungated: peak entries %d, syncs %d", u.peakEntries, us.SyncsSent)
	for _, s := range []Stats{gs, us} {
		if s.Degraded != 0 {
			t.Errorf("%d degraded decisions in a run with no fault", s.Degraded)
		}
	}
	// Entries follow the heavy hitters: one per node and hitter (the
	// owner's bucket and two node entries), plus identities the sketch
	// promoted by mistake, which are few at this width.
	if limit := 3*heavy + 20; g.peakEntries > limit {
		t.Errorf("gated run peaked at %d live entries; want at most %d (3 per heavy hitter and a few collisions)", g.peakEntries, limit)
	}
	if g.peakEntries*4 > u.peakEntries {
		t.Errorf("gated run peaked at %d live entries, not far below the ungated run's %d", g.peakEntries, u.peakEntries)
	}
	if g.peakEntries*100 > ids {
		t.Errorf("gated run peaked at %d live entries for %d identities", g.peakEntries, ids)
	}
	// Syncs follow the heavy hitters too: no more than one per heavy
	// admission (each reports at least one new token), while without
	// gating most light identities cost a sync of their own.
	var heavyAdmitted uint64
	for _, id := range g.heavy {
		heavyAdmitted += uint64(len(g.tr.byID[id]))
	}
	if gs.SyncsSent > heavyAdmitted || gs.SyncsSent*5 > us.SyncsSent {
		t.Errorf("gated run sent %d syncs for %d heavy admissions; the ungated run %d", gs.SyncsSent, heavyAdmitted, us.SyncsSent)
	}
	if gs.SketchPromotions > uint64(3*heavy*3+50) {
		t.Errorf("%d promotions: light identities were promoted (want about one per node, hitter and period)", gs.SketchPromotions)
	}

	// The heavy hitters' envelope, every interval: at most
	// B + S + N·θ_eff·(⌈Δ/P⌉+1) over r·Δ, and at least r·Δ − S − c − ⌈r·ℓ⌉.
	n := int64(len(g.tr.h.names))
	s := p.Slack(int(n))
	S := (n - 1) * s
	theta := min(sk.Threshold, s, p.Burst)
	rate := float64(gated.Limit) / float64(gated.Window)
	ell := 2 * float64(g.tr.h.oneway)
	for _, id := range g.heavy {
		as := g.tr.byID[id]
		withTerm, plainEx := worstWithSketchTerm(as, rate, n*theta, int64(p.Sketch.Period))
		if withTerm > float64(gated.Burst+S)+0.01 {
			t.Errorf("%s: excess %.2f over r·Δ + N·θ·(⌈Δ/P⌉+1) is above B + S = %d", id, withTerm, gated.Burst+S)
		}
		low := lowerShortfall(as, rate, t0, g.end)
		bound := float64(S) + 1 + math.Ceil(rate*ell)
		if low > bound+0.01 {
			t.Errorf("%s: shortfall %.2f under r·Δ is above S + c + ⌈r·ℓ⌉ = %.0f", id, low, bound)
		}
		t.Logf("%s: admitted %d; worst excess over r·Δ %.2f (B + S = %d, + sketch term N·θ = %d per period met); shortfall %.2f (bound %.0f)",
			id, len(as), plainEx, gated.Burst+S, n*theta, low, bound)
	}
}

// TestSketchTermMeasured drives the client that the sketch term is for: it
// spends θ through the sketch on every node at the start of each period,
// then saturates from all nodes, then stays quiet just long enough for its
// bucket to refill and its entries to be dropped, so that the next period
// starts through the sketch again. Its excess over r·Δ grows by about
// N·θ per period, and stays under B + S + N·θ·(⌈Δ/P⌉+1).
func TestSketchTermMeasured(t *testing.T) {
	const periods = 5
	sk := &quota.Sketch{Threshold: 4}
	rule := gatedRule("r", 600, time.Minute, 60, sk)
	p, _ := NewRuleParams(&rule, 1)
	h := newHarness(t, 3, time.Millisecond, rule)
	tr := newTracker(h, false)
	per := int64(time.Minute)
	h.now = (t0/per + 1) * per // a period boundary
	n := int64(len(h.names))
	s := p.Slack(int(n))
	theta := min(sk.Threshold, s, p.Burst)
	tau := int64(time.Duration(rule.Burst) * rule.Window / time.Duration(rule.Limit)) // B·t: empty to full
	gap := int64(rule.Window) / (3 * rule.Limit)
	const id = "sneaky"
	var turn int
	for k := range periods {
		start := h.now
		for _, node := range h.names {
			for range theta {
				if o := tr.request(node, "r", id, 1); o.Source != SourceSketch {
					t.Fatalf("period %d: %s: %+v, want a sketch admission", k, node, o)
				}
			}
		}
		quiet := start + per - tau - 100*int64(time.Millisecond)
		next := h.now
		for h.now < start+per {
			for h.now < quiet && next <= h.now {
				tr.request(h.names[turn%3], "r", id, 1)
				turn++
				next += gap
			}
			tr.step(time.Millisecond)
		}
		if st := tr.totals(); st.Entries+st.Owned != 0 {
			t.Fatalf("period %d: %d entries left at the boundary; the client would not go through the sketch", k, st.Entries+st.Owned)
		}
	}
	rate := float64(rule.Limit) / float64(rule.Window)
	S := (n - 1) * s
	as := tr.byID[id]
	withTerm, plain := worstWithSketchTerm(as, rate, n*theta, per)
	t.Logf("%d periods: worst excess over r·Δ %.2f, of which %.2f above B = %d (the sketch term over the run: N·θ·periods = %d, bound N·θ·(⌈Δ/P⌉+1) = %d, plus S = %d); worst admitted − r·Δ − N·θ·(⌈Δ/P⌉+1) %.2f (bound B + S = %d)",
		periods, plain, plain-float64(rule.Burst), rule.Burst, n*theta*periods, n*theta*(periods+1), S, withTerm, rule.Burst+S)
	if withTerm > float64(rule.Burst+S)+0.01 {
		t.Errorf("excess %.2f over r·Δ + N·θ·(⌈Δ/P⌉+1) is above B + S = %d", withTerm, rule.Burst+S)
	}
	// The term is real: the excess passes B by most of the N·θ each
	// period adds.
	if want := float64(rule.Burst + (periods-1)*n*theta); plain < want {
		t.Errorf("excess %.2f: the client did not get the sketch's N·θ per period (want above %.0f)", plain, want)
	}
	if d := tr.totals().Degraded; d != 0 {
		t.Errorf("%d degraded decisions in a run with no fault", d)
	}
}

// TestSketchDeterministic: the same gated run twice gives the same outcomes
// and messages, and the sketch starts over at multiples of the period
// counted from time 0, whatever the ticks.
func TestSketchDeterministic(t *testing.T) {
	run := func() []string {
		rule := gatedRule("r", 600, time.Second, 60, &quota.Sketch{Threshold: 3, Width: 512, Depth: 3})
		h := newHarness(t, 3, time.Millisecond, rule)
		tr := newTracker(h, true)
		rng := rand.New(rand.NewPCG(11, 12))
		for range 3000 { // 3 s: three periods
			for range 3 {
				id := "id-" + strconv.Itoa(rng.IntN(400))
				if rng.IntN(10) == 0 {
					id = "hot-" + strconv.Itoa(rng.IntN(2))
				}
				tr.request(h.names[rng.IntN(3)], "r", id, 1)
			}
			tr.step(time.Millisecond)
		}
		st := tr.totals()
		if st.SketchAdmits == 0 || st.SketchPromotions == 0 {
			t.Fatalf("the scenario does not exercise the sketch: %+v", st)
		}
		return tr.log
	}
	a, b := run(), run()
	if len(a) != len(b) {
		t.Fatalf("two runs logged %d and %d lines", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("two runs differ at line %d:\n%s\n%s", i, a[i], b[i])
		}
	}

	// Period boundaries: an identity that spent θ in the last 4 ms of a
	// period (counted from time 0, not from the sketch's first use) spends
	// θ again in the first 4 ms of the next one, and is promoted on the
	// next request; a coordinator ticked every millisecond and one never
	// ticked decide alike.
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 4, Period: time.Minute})
	params := ruleParams(t, []quota.Rule{rule})
	per := int64(time.Minute)
	boundary := (t0/per + 7) * per
	var got [2][]Source
	for i, ticked := range []bool{true, false} {
		c := NewCoordinator(CoordinatorConfig{Self: "a"})
		c.SetRules(0, params)
		for ms := int64(-4); ms <= 4; ms++ {
			now := boundary + ms*int64(time.Millisecond)
			if ticked {
				c.Tick(now)
			}
			o, err := c.Decide(now, "r", "edge", 1)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append(got[i], o.Source)
		}
	}
	if !slices.Equal(got[0], got[1]) {
		t.Fatalf("ticked and idle coordinators differ:\n%v\n%v", got[0], got[1])
	}
	s, o := SourceSketch, SourceOwner
	if want := []Source{s, s, s, s, s, s, s, s, o}; !slices.Equal(got[0], want) {
		t.Fatalf("sources around the boundary %v, want %v", got[0], want)
	}
}

// TestSketchNoSlackIsUngated: with a slack under one token every admission
// needs the owner, so a gated rule behaves exactly as without gating.
func TestSketchNoSlackIsUngated(t *testing.T) {
	run := func(sk *quota.Sketch) ([]string, Stats) {
		rule := gatedRule("r", 20, time.Second, 5, sk) // a·L = 1: slack ⌊1/3⌋ = 0
		if p, _ := NewRuleParams(&rule, 1); p.Slack(3) != 0 {
			t.Fatalf("slack %d, want 0", p.Slack(3))
		}
		h := newHarness(t, 3, time.Millisecond, rule)
		tr := newTracker(h, true)
		rng := rand.New(rand.NewPCG(3, 4))
		for range 2000 {
			tr.request(h.names[rng.IntN(3)], "r", "id-"+strconv.Itoa(rng.IntN(50)), 1)
			tr.step(time.Millisecond)
		}
		for range 100 {
			tr.step(time.Millisecond)
		}
		return tr.log, tr.totals()
	}
	a, as := run(&quota.Sketch{Threshold: 4})
	b, bs := run(nil)
	if as.SketchAdmits != 0 || as.SketchPromotions != 0 || as.SketchBytes != 0 {
		t.Fatalf("gating acted with no slack: %+v", as)
	}
	if as.Degraded != 0 || bs.Degraded != 0 {
		t.Fatalf("degraded decisions in a run with no fault: %d, %d", as.Degraded, bs.Degraded)
	}
	if !slices.Equal(a, b) {
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("gated and ungated runs differ at line %d:\n%s\n%s", i, a[i], b[i])
			}
		}
		t.Fatalf("gated and ungated runs logged %d and %d lines", len(a), len(b))
	}
}

// TestSketchGate checks the gate on one coordinator: admissions within
// min(θ, slack, burst) per identity and period, the decision it reports,
// the counters, no gating while the owner is down, and reloads.
func TestSketchGate(t *testing.T) {
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 3})
	h := newHarness(t, 3, time.Millisecond, rule)
	id := "light"
	owner := h.ring.OwnerName(id)
	var other string
	for _, n := range h.names {
		if n != owner {
			other = n
			break
		}
	}
	for _, node := range []string{owner, other} {
		c := h.nodes[node]
		for i := range 3 {
			o, _ := c.Decide(h.now, "r", id, 1)
			if o.Source != SourceSketch || !o.Allowed || o.Remaining != 100-int64(i+1) || o.Limit != 100 ||
				o.Reset != time.Duration(i+1)*10*time.Millisecond {
				t.Fatalf("%s: decision %d: %+v", node, i, o)
			}
		}
		if st := c.Stats(); st.Entries+st.Owned != 0 || st.SketchAdmits != 3 || st.SketchBytes != 65536*4 {
			t.Fatalf("%s: after 3 sketch admissions: %+v", node, st)
		}
		o, _ := c.Decide(h.now, "r", id, 1)
		if o.Source == SourceSketch || !o.Allowed {
			t.Fatalf("%s: 4th request %+v, want promoted and admitted", node, o)
		}
		if st := c.Stats(); st.Entries+st.Owned != 1 || st.SketchPromotions != 1 {
			t.Fatalf("%s: after the promotion: %+v", node, st)
		}
	}
	// A cost above θ is promoted at once.
	if o, _ := h.nodes[other].Decide(h.now, "r", "big-spender", 4); o.Source == SourceSketch {
		t.Fatalf("cost 4 over θ 3 went through the sketch: %+v", o)
	}
	// Owner down: on_failure decides, as without gating.
	fo := h.ring.OwnerName("fresh")
	fn := h.names[0]
	if fn == fo {
		fn = h.names[1]
	}
	h.nodes[fn].SetPeerDown(h.now, fo, true)
	if o, _ := h.nodes[fn].Decide(h.now, "r", "fresh", 1); o.Source != SourceFailure || !o.Degraded {
		t.Fatalf("owner down: %+v, want decided by on_failure", o)
	}
	h.nodes[fn].SetPeerDown(h.now, fo, false)

	// Reloads: a new version or threshold keeps the counts; a new layout
	// starts over.
	c := h.nodes[other]
	fresh := "reload-" + other
	for range 2 {
		if o, _ := c.Decide(h.now, "r", fresh, 1); o.Source != SourceSketch {
			t.Fatalf("%+v", o)
		}
	}
	p, _ := NewRuleParams(&rule, 2)
	c.SetRules(h.now, []RuleParams{p})
	if o, _ := c.Decide(h.now, "r", fresh, 2); o.Source == SourceSketch {
		t.Fatalf("counts lost on a version change: %+v", o)
	}
	c.Refund(h.now, "r", fresh, 1, SourceSketch) // a no-op, by design
	wide := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 3, Width: 1024})
	p, _ = NewRuleParams(&wide, 3)
	c.SetRules(h.now, []RuleParams{p})
	if o, _ := c.Decide(h.now, "r", "reload-2", 3); o.Source != SourceSketch {
		t.Fatalf("new layout: %+v", o)
	}
	if st := c.Stats(); st.SketchBytes != 1024*4 {
		t.Fatalf("sketch bytes %d after the reload, want %d", st.SketchBytes, 1024*4)
	}
	// A period with no use gives the memory back.
	c.Tick(h.now + int64(time.Minute))
	c.Tick(h.now + 2*int64(time.Minute))
	if st := c.Stats(); st.SketchBytes != 0 {
		t.Fatalf("an idle sketch kept %d bytes", st.SketchBytes)
	}
	// exact rules cannot be gated.
	ex := gcraRule("x", quota.ModeExact, 10, time.Second, 10)
	ex.Sketch = &quota.Sketch{Threshold: 1}
	if _, err := NewRuleParams(&ex, 1); err == nil {
		t.Fatal("NewRuleParams accepted a gated exact rule")
	}
}

// TestSketchGateNoAlloc: the gated path allocates nothing.
func TestSketchGateNoAlloc(t *testing.T) {
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 4})
	h := newHarness(t, 3, time.Millisecond, rule)
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "one-shot-" + strconv.Itoa(i)
	}
	c := h.nodes[h.names[0]]
	c.Decide(h.now, "r", "warm-up", 1) // allocates the sketch
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		o, _ := c.Decide(h.now, "r", ids[i%len(ids)], 1)
		if o.Source != SourceSketch {
			t.Fatalf("request %d not gated: %+v", i, o)
		}
		i++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per gated decision, want 0", allocs)
	}
}

// TestSketchFalsePromotions measures how many one-token identities a sketch
// promotes by mistake against the estimate P(Poisson(λ) ≥ θ)^depth, λ the
// tokens per counter at the end of the period (docs/rules.md, sketch).
func TestSketchFalsePromotions(t *testing.T) {
	for _, c := range []struct {
		width, depth int
		m            int
	}{{4096, 4, 4096}, {4096, 4, 8192}, {4096, 4, 16384}, {1024, 2, 4096}} {
		rule := gatedRule("r", 1<<20, time.Minute, 100, &quota.Sketch{Threshold: 4, Width: int64(c.width), Depth: int64(c.depth)})
		rule.Accuracy = 0.5
		co := NewCoordinator(CoordinatorConfig{Self: "a"})
		co.SetRules(0, ruleParams(t, []quota.Rule{rule}))
		r := co.rules["r"]
		promoted := 0
		for i := range c.m {
			if _, ok := co.gate(t0, r, "u"+strconv.Itoa(i), 1); !ok {
				promoted++
			}
		}
		lambda := float64(c.m) / float64(c.width)
		tail := 1.0 // P(X ≥ 4) for X ~ Poisson(λ)
		term := math.Exp(-lambda)
		for k := range 4 {
			tail -= term
			term *= lambda / float64(k+1)
		}
		bound := math.Pow(tail, float64(c.depth))
		frac := float64(promoted) / float64(c.m)
		t.Logf("width %d depth %d, %d one-shots (λ %.1f): %.4f promoted; plain count-min at the end of the period %.4f",
			c.width, c.depth, c.m, lambda, frac, bound)
		if frac > bound+0.01 {
			t.Errorf("width %d depth %d, %d one-shots: %.4f promoted, above %.4f", c.width, c.depth, c.m, frac, bound)
		}
	}
}

// BenchmarkSketchMemory reports the heap per one-shot identity with and
// without gating: 1 M identities, one request each, on one node of three,
// within one period, measured with runtime.ReadMemStats after a GC.
func BenchmarkSketchMemory(b *testing.B) {
	const ids = 1_000_000
	names := make([]string, ids)
	for i := range names {
		names[i] = "one-shot-identity-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name string
		sk   *quota.Sketch
	}{
		{"gating=off", nil},
		{"gating=on/width=65536", &quota.Sketch{Threshold: 4}},
		{"gating=on/width=1M", &quota.Sketch{Threshold: 4, Width: 1 << 20}},
	} {
		b.Run(c.name, func(b *testing.B) {
			rule := gatedRule("r", 6_000_000, time.Hour, 1000, c.sk)
			var members []Member
			for i := range 3 {
				members = append(members, Member{Name: "node-" + strconv.Itoa(i), Addr: "x"})
			}
			ring, err := NewRing(1, members)
			if err != nil {
				b.Fatal(err)
			}
			p, err := NewRuleParams(&rule, 1)
			if err != nil {
				b.Fatal(err)
			}
			var perID, promoted float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				co := NewCoordinator(CoordinatorConfig{Self: "node-0"})
				co.SetRules(0, []RuleParams{p})
				co.SetTable(t0, ring)
				for _, id := range names {
					if _, err := co.Decide(t0, "r", id, 1); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				st := co.Stats()
				perID = float64(after.HeapAlloc-before.HeapAlloc) / ids
				promoted = float64(st.Entries+st.Owned) / ids
				runtime.KeepAlive(co)
			}
			b.ReportMetric(perID, "B/identity")
			b.ReportMetric(promoted, "tracked/identity")
		})
	}
}

// BenchmarkSketchDecide compares a decision through the sketch (an identity
// with no entry) with the reference measured in the same run: a decision on
// the bucket of an identity this node owns and already tracks (a map access
// and a GCRA step). 65 536 identities in turn, the clock advancing 16 µs
// per decision, so that each identity comes back once per 1 s period.
func BenchmarkSketchDecide(b *testing.B) {
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "identity-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name string
		sk   *quota.Sketch
	}{
		{"owner-bucket", nil},
		{"sketch", &quota.Sketch{Threshold: 4}},
	} {
		b.Run(c.name, func(b *testing.B) {
			co := benchDecide(b, gatedRule("r", 1<<29, time.Second, 1<<20, c.sk), ids, 16*time.Microsecond)
			if st := co.Stats(); c.sk != nil && st.Owned != 0 {
				b.Fatalf("%d identities promoted", st.Owned)
			}
		})
	}
}
