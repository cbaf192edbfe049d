package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// outcome is what the summary found.
type outcome struct {
	ok       bool
	problems []string
}

func (o *outcome) bad(format string, args ...any) {
	o.ok = false
	o.problems = append(o.problems, fmt.Sprintf(format, args...))
}

// load is the process's CPU use while the clients ran.
type load struct {
	wall, cpu  time.Duration
	cpuOK      bool
	avg1       float64
	avgOK      bool
	offeredRPS float64
}

// ruleRegion keys the nodes' counters.
type ruleRegion struct{ rule, region string }

// summary is what the summary is computed from, and what it found.
type summary struct {
	f        *fleet
	clients  []*client
	rules    []quota.Rule
	byID     map[string]quota.Rule
	s        *scheduler
	m        *monitor
	n        int // nodes per region
	global   quota.Rule
	o        *outcome
	counts   map[ruleRegion]*[4]uint64 // allowed, rejected, shadow-rejected, fail-open
	refs     map[string]int64          // each client's reference
	held     map[string]bool           // each client's envelope held
	samples  []sample                  // the global customer's shares over time
	maxSum   int64                     // the largest Σ of the shares, and when
	maxAt    time.Duration
	failOpen uint64
	admitted int64 // what the demo's clients were admitted, all together
}

// summarize prints the summary and returns the exit status. It leads with
// one plain sentence per client and per global rule and whether the
// accuracy contract held, then the run's events and load; with verbose it
// prints the details after: the bound each client was checked against,
// the nodes' counters per rule, the global rule's figures.
func summarize(w io.Writer, f *fleet, clients []*client, rules []quota.Rule, s *scheduler, m *monitor, up *upstreamCalls, ld load, nodesPerRegion int, verbose bool) int {
	sm := &summary{f: f, clients: clients, rules: rules, byID: map[string]quota.Rule{}, s: s, m: m, n: nodesPerRegion,
		o: &outcome{ok: true}, refs: map[string]int64{}, held: map[string]bool{}}
	for _, r := range rules {
		sm.byID[r.ID] = r
	}
	sm.global = sm.byID[m.global]
	sm.count()
	m.mu.Lock()
	sm.samples = slices.Clone(m.samples)
	m.mu.Unlock()

	// The details are computed with the checks and printed only with -v.
	var detail bytes.Buffer
	sm.clientDetails(&detail)
	sm.ruleDetails(&detail)
	sm.globalDetails(&detail)
	sm.gatewayDetails(&detail)

	fmt.Fprintln(w)
	fmt.Fprintln(w, "── summary ──")
	sm.plainClients(w)
	sm.plainGlobal(w)
	sm.plainAccuracy(w)
	if sm.f.clustered {
		printShares(w, sm.f, sm.samples, sm.global.Limit)
	}
	fmt.Fprintln(w)
	sm.events(w, up)
	sm.loadLine(w, ld)
	if verbose {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "── details ──")
		w.Write(detail.Bytes())
	} else {
		fmt.Fprintln(w, "details: run with -v for the bound each client was checked against, the nodes' counters per rule and every canary")
	}
	for _, msg := range s.failures {
		sm.o.bad("scheduled step failed: %s", msg)
	}
	if !sm.o.ok {
		for _, p := range sm.o.problems {
			fmt.Fprintln(w, "PROBLEM:", p)
		}
		fmt.Fprintln(w, "RESULT: FAILED")
		return 1
	}
	fmt.Fprintf(w, "RESULT: ok: the envelope held for every client and for %s; fail-open decisions: %d; every scheduled step succeeded\n", sm.global.ID, sm.failOpen)
	return 0
}

// count sums the nodes' own counters per rule and region, over every
// incarnation.
func (sm *summary) count() {
	sm.counts = map[ruleRegion]*[4]uint64{}
	for _, g := range sm.f.all() {
		for _, rc := range ops.Counts(g.node) {
			k := ruleRegion{rc.Rule, g.region}
			if sm.counts[k] == nil {
				sm.counts[k] = &[4]uint64{}
			}
			c := sm.counts[k]
			c[0] += rc.Allowed
			c[1] += rc.Rejected
			c[2] += rc.ShadowRejected
			c[3] += rc.FailOpen
			sm.failOpen += rc.FailOpen
		}
	}
}

// fault is the fault term of a rule in a set of regions: its fail-open
// decisions there, each admitting at most the rule's largest cost.
func (sm *summary) fault(r quota.Rule, regions []string) int64 {
	maxCost := r.CostFor("")
	for _, c := range r.CostByMethod {
		maxCost = max(maxCost, c)
	}
	var n uint64
	for _, region := range regions {
		if c := sm.counts[ruleRegion{r.ID, region}]; c != nil {
			n += c[3]
		}
	}
	return int64(n) * maxCost
}

// phases returns the phases a client of rule r is checked against (check)
// and its reference follows (ref). api-per-key changes version mid-run:
// the envelope is checked before the PUT and after every node runs the new
// version; the transition between is not checked (nodes switch at
// different moments).
func (sm *summary) phases(r quota.Rule) (check, ref []phase) {
	if r.Scope == quota.ScopeGlobal {
		glim := limitsOf(r)
		var gslack int64
		if sm.f.clustered {
			gslack = glim.globalSlack(len(sm.f.regions), sm.n)
		}
		p := []phase{{from: math.MinInt64, to: math.MaxInt64, lim: glim, slack: gslack}}
		return p, p
	}
	slack := func(l limits) int64 {
		if sm.f.clustered {
			return l.regionSlack(sm.n)
		}
		return 0
	}
	lim := limitsOf(r)
	putAt, allAt := sm.s.change()
	if r.ID != tightRule || putAt == 0 {
		p := []phase{{from: math.MinInt64, to: math.MaxInt64, lim: lim, slack: slack(lim)}}
		return p, p
	}
	tl := lim
	tl.limit, tl.burst = tightLimit, tightBurst
	check = []phase{{from: math.MinInt64, to: putAt, lim: lim, slack: slack(lim)}, {from: allAt, to: math.MaxInt64, lim: tl, slack: slack(tl)}}
	ref = []phase{{from: math.MinInt64, to: putAt, lim: lim}, {from: putAt, to: math.MaxInt64, lim: tl}}
	return check, ref
}

// regionsOf returns the regions c sent requests to.
func (sm *summary) regionsOf(c *client) []string {
	var regs []string
	for i, name := range sm.f.regions {
		if c.regionSent[i].Load() > 0 {
			regs = append(regs, name)
		}
	}
	return regs
}

// clientDetails checks every client against its envelope, records its
// reference and verdict, and prints the detailed table: the formulas, the
// ring changes, and per client and phase the worst excess and its bound.
func (sm *summary) clientDetails(w io.Writer) {
	fmt.Fprintln(w, "per client: the envelope of docs/overshoot.md")
	fmt.Fprintln(w, "envelope: over every interval Δ, admitted tokens ≤ r·Δ + B + S + timing (timing: what refills in 100ms, +1)")
	fmt.Fprintln(w, "+ F, the fault term: every decision on_failure made for the rule in the client's regions (fail-open, degraded) counted at the rule's")
	fmt.Fprintln(w, "largest cost (0 in a quiet run);")
	fmt.Fprintln(w, "worst = the largest excess over r·Δ the client saw over intervals that overlap no ring change; reference = one exact GCRA bucket fed the same requests")
	changes := sm.s.ringChanges()
	if len(changes) > 0 {
		fmt.Fprintln(w, "across ring changes = the worst over every interval, against the bound + J: docs/overshoot.md's fault term of each ring change in the client's regions")
		fmt.Fprintln(w, "(a restart: 2B + S_f + 2⌈r·G⌉; a graceful leave: B + S_f + ⌈r·(G + call timeout)⌉; G measured until every ring agreed), over the change until its")
		fmt.Fprintln(w, "handoff timeout (join) or call timeout (leave) after that; \"J = x, n\": the terms of n ring changes sum to x:")
		for _, c := range changes {
			what := "left"
			if c.join {
				what = "joined again"
			}
			fmt.Fprintf(w, "  %s %s %s at t=%.2fs, every ring agreed after %v\n", c.region, c.node, what,
				time.Duration(c.from-sm.s.start.UnixNano()).Seconds(), time.Duration(c.settled-c.from).Round(time.Millisecond))
		}
	}
	if putAt, allAt := sm.s.change(); putAt != 0 {
		fmt.Fprintf(w, "%s is checked before the PUT that changed it and after every node ran the new version; not over the %v between, while nodes switch\n",
			tightRule, time.Duration(allAt-putAt).Round(time.Millisecond))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tregion\tsent\tadmitted\trejected\treference\trule (phase)\tworst\tbound B+S+timing+F\tacross ring changes\tenvelope\t")
	for _, c := range sm.clients {
		sm.checkClient(tw, c, changes)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, c := range sm.clients {
		verdict := "envelope held"
		if !sm.held[c.name] {
			verdict = "ENVELOPE BROKEN"
		}
		fmt.Fprintf(w, "%-8s %s: %s\n", c.name, verdict, c.about)
	}
}

// checkClient checks c against the envelope of each phase of its rule and
// prints its rows of the detailed table.
func (sm *summary) checkClient(tw io.Writer, c *client, changes []ringChange) {
	recs := c.records()
	r := sm.byID[c.rule]
	chk, ref := sm.phases(r)
	regs := sm.regionsOf(c)
	chk = slices.Clone(chk)
	for i := range chk {
		chk[i].fault = sm.fault(r, regs)
	}
	exp := reference(recs, ref)
	sm.refs[c.name] = exp
	sm.admitted += c.admitted.Load()
	held := c.other.Load() == 0
	var touching []ringChange
	for _, rc := range changes {
		if slices.Contains(regs, rc.region) {
			touching = append(touching, rc)
		}
	}
	sec := func(t int64) float64 { return time.Duration(t - sm.s.start.UnixNano()).Seconds() }
	for i, k := range checkPhases(recs, chk, touching, sm.n) {
		if !k.quietHeld() {
			sm.o.bad("%s: %v admitted %.1f over r·Δ between t=%.2fs and t=%.2fs (no ring change), above B + S + timing + F = %d", c.name, k.phase.lim, k.excess,
				sec(k.from), sec(k.to), k.bound)
		}
		if !k.allHeld() {
			sm.o.bad("%s: %v admitted %.1f over r·Δ between t=%.2fs and t=%.2fs, above B + S + timing + F + J = %d (J = %d for %d ring changes)", c.name, k.phase.lim, k.excessAll,
				sec(k.fromAll), sec(k.toAll), k.bound+k.jterm, k.jterm, k.changes)
		}
		mark := "held"
		if !k.held() {
			mark = "BROKEN"
			held = false
		}
		across := "none"
		if k.changes > 0 {
			across = fmt.Sprintf("%.1f ≤ %d (J = %d, %d)", k.excessAll, k.bound+k.jterm, k.jterm, k.changes)
		}
		label := k.phase.lim.String()
		if len(chk) > 1 {
			label += []string{" (before the change)", " (after)"}[i]
		}
		lead := "\t\t\t\t"
		if i == 0 {
			lead = fmt.Sprintf("%s\t%s\t%d\t%d\t%d", c.name, strings.Join(regs, "+"), c.sent.Load(), c.admitted.Load(), c.rejected.Load())
		}
		refCol := ""
		if i == 0 {
			refCol = fmt.Sprint(exp)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d = %d+%d+%d+%d\t%s\t%s\t\n", lead, refCol, label, k.excess, k.bound, k.phase.lim.burst, k.phase.slack,
			k.phase.lim.timing(), k.phase.fault, across, mark)
	}
	if c.other.Load() > 0 {
		msg := ""
		if p := c.firstFailure.Load(); p != nil {
			msg = *p
		}
		sm.o.bad("%s: %d requests got neither 200 nor 429; the first: %s", c.name, c.other.Load(), msg)
	}
	sm.held[c.name] = held
}

// ruleDetails prints the nodes' counters per rule and region beside the
// references.
func (sm *summary) ruleDetails(w io.Writer) {
	fmt.Fprintln(w)
	note := ""
	if n := sm.f.outside.Load(); n > 0 {
		note = fmt.Sprintf("; they include the %d requests from outside the demo", n)
	}
	fmt.Fprintf(w, "per rule: the nodes' counters, every incarnation%s\n", note)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tscope\tregion\tallowed\trejected\tshadow-rejected\tfail-open\treference\tenvelope\t")
	for _, r := range sm.rules {
		verdict := "held (every identity above)"
		switch {
		case r.Shadow:
			verdict = "shadow: never rejects"
		case r.Scope == quota.ScopeGlobal:
			verdict = "see below"
		default:
			for _, c := range sm.clients {
				if c.rule == r.ID && !sm.held[c.name] {
					verdict = "BROKEN for " + c.name
				}
			}
		}
		scope := string(r.Scope)
		if scope == "" {
			scope = string(quota.ScopeRegion)
		}
		for _, region := range sm.f.regions {
			c := sm.counts[ruleRegion{r.ID, region}]
			if c == nil {
				c = &[4]uint64{}
			}
			// The reference: the sum of the references of the rule's
			// clients in the region; a global rule's is one for all
			// regions. A shadow rule has none (it never rejects).
			refText := "-"
			if !r.Shadow {
				var sum int64
				for _, cl := range sm.clients {
					if cl.rule == r.ID && (r.Scope == quota.ScopeGlobal || regionOf(cl, sm.f) == region) {
						sum += sm.refs[cl.name]
					}
				}
				refText = fmt.Sprint(sum)
				if r.Scope == quota.ScopeGlobal && len(sm.f.regions) > 1 {
					refText += " (all regions)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.ID, scope, region, c[0], c[1], c[2], c[3], refText, verdict)
		}
	}
	tw.Flush()
}

// globalDetails checks that the global rule's shares never summed above
// its limit and prints its envelope and its shares at a few moments.
func (sm *summary) globalDetails(w io.Writer) {
	for _, s := range sm.samples {
		if v := s.share[0] + s.share[1]; v > sm.maxSum {
			sm.maxSum, sm.maxAt = v, s.at
		}
	}
	fmt.Fprintln(w)
	held := sm.globalHeld()
	if !sm.f.clustered {
		fmt.Fprintf(w, "%s on one node: no cluster, no lease group, so enforced on this node at the full limit; global envelope %s (one node: S = 0)\n",
			sm.global.ID, heldWord(held))
		return
	}
	_, chk := sm.phases(sm.global)
	fmt.Fprintf(w, "%s across regions: limit L = %v, Σ over regions of nodes × slack = %d\n", sm.global.ID, chk[0].lim, chk[0].slack)
	fmt.Fprintf(w, "global envelope %s: admitted across regions ≤ r·Δ + B + Σ Nᵣ·sᵣ + timing over every interval; Σ shares ≤ L in every sample (max Σ %d of %d)\n",
		heldWord(held), sm.maxSum, sm.global.Limit)
	printShareRows(w, sm.f, sm.samples)
	fmt.Fprintln(w, "a region's share grows only as its reports show demand, and a gradual fall of a region's demand moves its capacity on at its periodic reports,")
	fmt.Fprintln(w, "not off cycle (docs/global.md)")
}

// globalHeld reports whether the global rule's envelope held: for its
// clients and, in a cluster, Σ shares ≤ L in every sample (plainGlobal
// records the problem of a sample above L).
func (sm *summary) globalHeld() bool {
	held := true
	for _, c := range sm.clients {
		if c.rule == sm.global.ID && !sm.held[c.name] {
			held = false
		}
	}
	if sm.f.clustered && sm.maxSum > sm.global.Limit {
		held = false
	}
	return held
}

func heldWord(held bool) string {
	if held {
		return "held"
	}
	return "BROKEN"
}

// plainClients prints one sentence per client: what it was admitted of what
// it sent, beside what the exact limit (the reference) would have
// admitted, and what it does.
func (sm *summary) plainClients(w io.Writer) {
	for _, c := range sm.clients {
		fmt.Fprintf(w, "%s: %d of %d admitted", c.name, c.admitted.Load(), c.sent.Load())
		if c.rule == sm.global.ID {
			ref := sm.refs[c.name]
			fmt.Fprintf(w, " (%.0f %% of the %d the exact limit would have admitted) — %s\n", percent(c.admitted.Load(), ref), ref, c.about)
			if sm.f.clustered {
				fmt.Fprintf(w, "  %s\n", sm.partnerWhy())
			}
			continue
		}
		fmt.Fprintf(w, "; the exact limit would have admitted %d — %s", sm.refs[c.name], c.about)
		if c.honour && c.backoffs.Load() > 0 {
			fmt.Fprintf(w, "; it backed off %s as Retry-After said", plural(c.backoffs.Load(), "time", "times"))
		}
		fmt.Fprintln(w)
	}
}

// plural is "1 one" or "n many".
func plural[N int | int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func percent(a, b int64) float64 { return 100 * float64(a) / float64(max(b, 1)) }

// partnerWhy says why the global customer got less than its reference:
// its limit is split into the regions' shares, which follow its traffic at
// their reports; their sum, averaged over the samples, is what the share
// of the reference it got tracks.
func (sm *summary) partnerWhy() string {
	var sum int64
	for _, s := range sm.samples {
		sum += s.share[0] + s.share[1]
	}
	avg := float64(sum) / float64(max(len(sm.samples), 1))
	if len(sm.f.regions) == 1 {
		return fmt.Sprintf("its limit is leased to %s, whose share follows its traffic at its reports (every %v): the share grows only once the reports\n"+
			"  show demand, so it averaged %.0f %% of the limit (docs/global.md)", sm.f.regions[0], leaseRefresh, 100*avg/float64(sm.global.Limit))
	}
	return fmt.Sprintf("its limit is split into the regions' shares, which follow its traffic there at their reports (every %v): a share follows the demand\n"+
		"  its region measured, and its requests arrive at random, so each count is noisy and capacity swings between the regions; the\n"+
		"  shares summed to %.0f %% of the limit on average (docs/global.md, \"Try it\")", leaseRefresh, 100*avg/float64(sm.global.Limit))
}

// plainGlobal prints one sentence per global rule.
func (sm *summary) plainGlobal(w io.Writer) {
	for _, r := range sm.rules {
		if r.Scope != quota.ScopeGlobal {
			continue
		}
		lim := limitsOf(r)
		if !sm.f.clustered {
			fmt.Fprintf(w, "%s: one limit of %v per customer; one node and no lease group, so this node enforces it at the full limit\n", r.ID, lim)
			continue
		}
		if len(sm.f.regions) == 1 {
			fmt.Fprintf(w, "%s: one limit of %v per customer, leased to %s: its share reached at most %d", r.ID, lim, sm.f.regions[0], sm.maxSum)
		} else {
			fmt.Fprintf(w, "%s: one limit of %v per customer across %s, leased to the regions: their shares summed to at most %d",
				r.ID, lim, strings.Join(sm.f.regions, " and "), sm.maxSum)
		}
		if sm.maxSum > r.Limit {
			fmt.Fprintf(w, " — ABOVE the limit at t=%.1fs\n", sm.maxAt.Seconds())
			sm.o.bad("Σ shares reached %d > L = %d at t=%.1fs (sampled from the holders, node by node)", sm.maxSum, r.Limit, sm.maxAt.Seconds())
			continue
		}
		fmt.Fprintln(w, ", never above the limit")
	}
}

// plainAccuracy says whether the accuracy contract held, and shows what
// a rejected client sees.
func (sm *summary) plainAccuracy(w io.Writer) {
	var broken []string
	for _, c := range sm.clients {
		if !sm.held[c.name] {
			broken = append(broken, c.name)
		}
	}
	if !sm.globalHeld() && !slices.Contains(broken, sm.global.ID) {
		broken = append(broken, sm.global.ID)
	}
	if len(broken) == 0 {
		fmt.Fprintln(w, "accuracy contract: held — weir admitted more than the exact limit only within the documented overshoot, for every client over every interval")
		fmt.Fprintln(w, "  (docs/overshoot.md, docs/global.md; -v prints each bound)")
	} else {
		fmt.Fprintf(w, "accuracy contract: BROKEN for %s — see PROBLEM below and -v\n", strings.Join(broken, ", "))
	}
	// Why weir may admit more than the exact limit, on the client where it
	// shows most.
	var most *client
	for _, c := range sm.clients {
		if over := c.admitted.Load() - sm.refs[c.name]; over > 0 && (most == nil || over > most.admitted.Load()-sm.refs[most.name]) {
			most = c
		}
	}
	if sm.f.clustered && most != nil {
		fmt.Fprintf(w, "  more than the exact limit: a node that does not own a client's bucket may admit its requests within its slack (an allowance of the\n"+
			"  rule's accuracy × limit, split among the region's nodes) before the owner's count reaches it; %s shows it most: %d against %d\n",
			most.name, most.admitted.Load(), sm.refs[most.name])
	}
	for _, c := range sm.clients {
		if s := c.sample429.Load(); s != nil && c.name == "abusive" {
			fmt.Fprintf(w, "what a rejected client sees (abusive's first 429): %s\n", *s)
		}
	}
}

// events prints what the schedule did, the warnings it expected, the
// upstream's count against the clients', outside requests and the
// canaries.
func (sm *summary) events(w io.Writer, up *upstreamCalls) {
	f, s := sm.f, sm.s
	if putAt, allAt := s.change(); putAt != 0 && f.clustered {
		fmt.Fprintf(w, "rule change: %s tightened to %d/1m burst %d through the admin API; every live node ran it %v after the PUT\n",
			tightRule, tightLimit, tightBurst, time.Duration(allAt-putAt).Round(time.Millisecond))
	}
	if s.killedLeader != "" {
		fmt.Fprintf(w, "lease leader: %s killed, %s elected after %v\n", s.killedLeader, s.newLeader, s.election.Round(time.Millisecond))
	}
	if f.clustered {
		var reports, failures uint64
		for _, g := range f.all() {
			st := ops.GlobalStatus(g.node)
			reports += st.Reports
			failures += st.ReportFailures
		}
		fmt.Fprintf(w, "lease reports: %d sent by the owners, %d failed (a failed report changes nothing: the leases run on until they expire)\n", reports, failures)
	}
	if ex := f.expected.counts(); len(ex) > 0 {
		fmt.Fprintf(w, "expected warnings, counted and not shown: %s\n", strings.Join(ex, "; "))
	}
	if sm.failOpen > 0 {
		fmt.Fprintf(w, "WARNING: %d decisions were made by on_failure (an owner unreachable or slow: degraded, counted as fail-open, which alerts). "+
			"The envelopes count them as the fault term F. In a quiet run this is 0; a busy machine (or -race) makes peer calls slow.\n", sm.failOpen)
	}
	ours := up.ours.Load()
	fmt.Fprintf(w, "upstream: called %d times for the %d requests the demo's clients were admitted (a rejected request never reaches it)\n", ours, sm.admitted)
	if ours != sm.admitted {
		sm.o.bad("the upstream was called %d times but %d requests were admitted", ours, sm.admitted)
	}
	if n := f.outside.Load(); n > 0 {
		fmt.Fprintf(w, "outside requests: %d (not counted; %d of them were admitted to the upstream)\n", n, up.outside.Load())
	}
	var notOK []string
	for _, g := range f.gateways() {
		if c := ops.Canary(g.node); c.Enabled && !c.OK {
			notOK = append(notOK, g.label())
		}
	}
	if len(notOK) == 0 {
		fmt.Fprintln(w, "canary: every node's enforcement canary sees rejections")
	} else {
		fmt.Fprintf(w, "canary: NOT OK on %s: no rejection seen within its window\n", strings.Join(notOK, ", "))
	}
	if n := f.logHidden.Load(); n > 0 {
		fmt.Fprintf(w, "the nodes logged %d more error lines than the %d shown on stderr\n", n, maxLogLines)
	}
}

// loadLine prints the load the run put on the machine.
func (sm *summary) loadLine(w io.Writer, ld load) {
	fmt.Fprintf(w, "load: the clients offered %.0f requests/s", ld.offeredRPS)
	if ld.cpuOK {
		fmt.Fprintf(w, "; the whole process (gateways, gossip, Raft, clients) used %.2f of %d cores (CPU %v over %v)",
			ld.cpu.Seconds()/ld.wall.Seconds(), runtime.NumCPU(), ld.cpu.Round(10*time.Millisecond), ld.wall.Round(10*time.Millisecond))
	}
	if ld.avgOK {
		fmt.Fprintf(w, "; load average %.2f", ld.avg1)
	}
	fmt.Fprintln(w)
}

// gatewayDetails prints every gateway's counts and canary.
func (sm *summary) gatewayDetails(w io.Writer) {
	var perNode []string
	for _, g := range sm.f.all() {
		perNode = append(perNode, fmt.Sprintf("%s %d/%d", g.label(), g.admitted.Load(), g.served.Load()))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "per gateway (#2: after its restart), the demo's requests admitted/answered: %s\n", strings.Join(perNode, ", "))
	for _, g := range sm.f.gateways() {
		c := ops.Canary(g.node)
		if !c.Enabled {
			continue
		}
		state := "ok (sees rejections)"
		if !c.OK {
			state = "NOT OK: no rejection seen within its window"
		}
		fmt.Fprintf(w, "canary on %s: %s, %d of %d probes rejected\n", g.label(), state, c.Rejected, c.Allowed+c.Rejected+c.Errors)
	}
}

// printShares prints the global customer's shares per region over time as
// sparklines, and the demand beside them.
func printShares(w io.Writer, f *fleet, samples []sample, limit int64) {
	if len(samples) < 2 {
		return
	}
	const cols = 40
	per := (len(samples) + cols - 1) / cols
	levels := []rune(" ▁▂▃▄▅▆▇█")
	spark := func(v float64) rune {
		i := int(math.Round(v * float64(len(levels)-1)))
		return levels[min(max(i, 0), len(levels)-1)]
	}
	step := samples[min(per, len(samples)-1)].at - samples[0].at
	fmt.Fprintf(w, "the partner's limit as shares held per region (█ = the whole limit, %d/1m; one column per %.1fs) and its demand (its requests, share of each column):\n",
		limit, step.Seconds())
	for i, r := range f.regions {
		var share, demand []rune
		for c := 0; c*per < len(samples); c++ {
			lo, hi := c*per, min((c+1)*per, len(samples)-1)
			var sum int64
			for _, sm := range samples[lo : hi+1] {
				sum += sm.share[i]
			}
			share = append(share, spark(float64(sum)/float64(hi-lo+1)/float64(limit)))
			prev := samples[max(lo-1, 0)]
			mine := samples[hi].sent[i] - prev.sent[i]
			all := samples[hi].sent[0] + samples[hi].sent[1] - prev.sent[0] - prev.sent[1]
			if all > 0 {
				demand = append(demand, spark(float64(mine)/float64(all)))
			} else {
				demand = append(demand, ' ')
			}
		}
		fmt.Fprintf(w, "  %s share   |%s|\n", r, string(share))
		fmt.Fprintf(w, "  %s demand  |%s|\n", r, string(demand))
	}
}

// printShareRows prints the global customer's shares at every fifth of the
// run.
func printShareRows(w io.Writer, f *fleet, samples []sample) {
	if len(samples) < 2 {
		return
	}
	var rows []string
	for k := 1; k <= 5; k++ {
		sm := samples[min(len(samples)-1, k*len(samples)/5)]
		var parts []string
		var sum int64
		for i, r := range f.regions {
			parts = append(parts, fmt.Sprintf("%s %4d (leased %d, fallback %d)", r, sm.share[i], sm.leased[i], sm.fallback[i]))
			sum += sm.share[i]
		}
		rows = append(rows, fmt.Sprintf("  t=%5.1fs  %s  Σ %d", sm.at.Seconds(), strings.Join(parts, "  "), sum))
	}
	rows = slices.Compact(rows)
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
}

// regionOf is the region a client of a region rule sends to (its first
// region with traffic).
func regionOf(c *client, f *fleet) string {
	for i, r := range f.regions {
		if c.regionSent[i].Load() > 0 {
			return r
		}
	}
	return ""
}
