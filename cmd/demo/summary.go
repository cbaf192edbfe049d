package main

import (
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

// summarize prints the per-client and per-rule summary, the global
// customer's shares over time and the load, and returns the exit status.
func summarize(w io.Writer, f *fleet, clients []*client, rules []quota.Rule, s *scheduler, m *monitor, upstream int64, ld load, nodesPerRegion int) int {
	o := &outcome{ok: true}
	byID := map[string]quota.Rule{}
	for _, r := range rules {
		byID[r.ID] = r
	}
	global := byID[m.global]
	putAt, allAt := s.change()

	// The phases of each rule: api-per-key changes version mid-run. The
	// envelope is checked before the PUT and after every node runs the new
	// version; the transition between is not checked (nodes switch at
	// different moments).
	regionPhases := func(r quota.Rule) (check, ref []phase) {
		lim := limitsOf(r)
		slack := int64(0)
		if f.clustered {
			slack = lim.regionSlack(nodesPerRegion)
		}
		if r.ID != tightRule || putAt == 0 {
			p := []phase{{from: math.MinInt64, to: math.MaxInt64, lim: lim, slack: slack}}
			return p, p
		}
		tl := lim
		tl.limit, tl.burst = tightLimit, tightBurst
		tslack := int64(0)
		if f.clustered {
			tslack = tl.regionSlack(nodesPerRegion)
		}
		check = []phase{{from: math.MinInt64, to: putAt, lim: lim, slack: slack}, {from: allAt, to: math.MaxInt64, lim: tl, slack: tslack}}
		ref = []phase{{from: math.MinInt64, to: putAt, lim: lim}, {from: putAt, to: math.MaxInt64, lim: tl}}
		return check, ref
	}
	glim := limitsOf(global)
	gslack := int64(0)
	if f.clustered {
		gslack = glim.globalSlack(len(f.regions), nodesPerRegion)
	}
	globalPhase := []phase{{from: math.MinInt64, to: math.MaxInt64, lim: glim, slack: gslack}}

	// Per rule and region, from the nodes' own counters.
	type key struct{ rule, region string }
	counts := map[key]*[4]uint64{}
	for _, g := range f.all() {
		for _, rc := range ops.Counts(g.node) {
			k := key{rc.Rule, g.region}
			if counts[k] == nil {
				counts[k] = &[4]uint64{}
			}
			c := counts[k]
			c[0] += rc.Allowed
			c[1] += rc.Rejected
			c[2] += rc.ShadowRejected
			c[3] += rc.FailOpen
		}
	}
	// The fault term of a rule in a set of regions: its fail-open
	// decisions there, each admitting at most the rule's largest cost.
	fault := func(r quota.Rule, regions []string) int64 {
		maxCost := r.CostFor("")
		for _, c := range r.CostByMethod {
			maxCost = max(maxCost, c)
		}
		var n uint64
		for _, region := range regions {
			if c := counts[key{r.ID, region}]; c != nil {
				n += c[3]
			}
		}
		return int64(n) * maxCost
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "── summary: per client ──")
	fmt.Fprintln(w, "envelope: over every interval Δ, admitted tokens ≤ r·Δ + B + S + timing (timing: what refills in 100ms, +1)")
	fmt.Fprintln(w, "+ F, the fault term: every decision on_failure made for the rule in the client's regions (fail-open, degraded) counted at the rule's")
	fmt.Fprintln(w, "largest cost (0 in a quiet run);")
	fmt.Fprintln(w, "worst = the largest excess over r·Δ the client saw over intervals that overlap no ring change; reference = one exact GCRA bucket fed the same requests")
	changes := s.ringChanges()
	if len(changes) > 0 {
		fmt.Fprintln(w, "across ring changes = the worst over every interval, against the bound + J: docs/overshoot.md's fault term of each ring change in the client's regions")
		fmt.Fprintln(w, "(a restart: 2B + S_f + 2⌈r·G⌉; a graceful leave: B + S_f + ⌈r·(G + call timeout)⌉; G measured until every ring agreed), over the change until its")
		fmt.Fprintln(w, "handoff timeout (join) or call timeout (leave) after that:")
		for _, c := range changes {
			what := "left"
			if c.join {
				what = "joined again"
			}
			fmt.Fprintf(w, "  %s %s %s at t=%.2fs, every ring agreed after %v\n", c.region, c.node, what,
				time.Duration(c.from-s.start.UnixNano()).Seconds(), time.Duration(c.settled-c.from).Round(time.Millisecond))
		}
	}
	if putAt != 0 {
		fmt.Fprintf(w, "%s is checked before the PUT that changed it and after every node ran the new version; not over the %v between, while nodes switch\n",
			tightRule, time.Duration(allAt-putAt).Round(time.Millisecond))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tregion\tsent\tadmitted\trejected\treference\trule (phase)\tworst\tbound B+S+timing+F\tacross ring changes\tenvelope\t")
	heldClients := map[string]bool{}
	refs := map[string]int64{} // each client's reference
	var admittedAll int64
	for _, c := range clients {
		recs := c.records()
		r := byID[c.rule]
		var chk, ref []phase
		if r.Scope == quota.ScopeGlobal {
			chk, ref = globalPhase, globalPhase
		} else {
			chk, ref = regionPhases(r)
		}
		var regs []string
		for i, name := range f.regions {
			if c.regionSent[i].Load() > 0 {
				regs = append(regs, name)
			}
		}
		chk = slices.Clone(chk)
		for i := range chk {
			chk[i].fault = fault(r, regs)
		}
		exp := reference(recs, ref)
		refs[c.name] = exp
		admittedAll += c.admitted.Load()
		held := c.other.Load() == 0
		var touching []ringChange
		for _, rc := range changes {
			if slices.Contains(regs, rc.region) {
				touching = append(touching, rc)
			}
		}
		for i, k := range checkPhases(recs, chk, touching, nodesPerRegion) {
			mark := "held"
			sec := func(t int64) float64 { return time.Duration(t - s.start.UnixNano()).Seconds() }
			if !k.quietHeld() {
				o.bad("%s: %v admitted %.1f over r·Δ between t=%.2fs and t=%.2fs (no ring change), above B + S + timing + F = %d", c.name, k.phase.lim, k.excess,
					sec(k.from), sec(k.to), k.bound)
			}
			if !k.allHeld() {
				o.bad("%s: %v admitted %.1f over r·Δ between t=%.2fs and t=%.2fs, above B + S + timing + F + J = %d (J = %d for %d ring changes)", c.name, k.phase.lim, k.excessAll,
					sec(k.fromAll), sec(k.toAll), k.bound+k.jterm, k.jterm, k.changes)
			}
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
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%.1f\t%d = %d+%d+%d+%d\t%s\t%s\t\n", c.name, strings.Join(regs, "+"), c.sent.Load(), c.admitted.Load(),
					c.rejected.Load(), exp, label, k.excess, k.bound, k.phase.lim.burst, k.phase.slack, k.phase.lim.timing(), k.phase.fault, across, mark)
			} else {
				fmt.Fprintf(tw, "\t\t\t\t\t\t%s\t%.1f\t%d = %d+%d+%d+%d\t%s\t%s\t\n", label, k.excess, k.bound, k.phase.lim.burst, k.phase.slack, k.phase.lim.timing(), k.phase.fault, across, mark)
			}
		}
		if c.other.Load() > 0 {
			msg := ""
			if p := c.firstFailure.Load(); p != nil {
				msg = *p
			}
			o.bad("%s: %d requests got neither 200 nor 429; the first: %s", c.name, c.other.Load(), msg)
		}
		heldClients[c.name] = held
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, c := range clients {
		verdict := "envelope held"
		if !heldClients[c.name] {
			verdict = "ENVELOPE BROKEN"
		}
		extra := ""
		if c.honour {
			extra = fmt.Sprintf("; backed off %d times as Retry-After said", c.backoffs.Load())
		}
		fmt.Fprintf(w, "%-8s %s: %s%s\n", c.name, verdict, c.about, extra)
	}
	for _, c := range clients {
		if s := c.sample429.Load(); s != nil && c.name == "abusive" {
			fmt.Fprintf(w, "a 429 (%s): %s\n", c.name, *s)
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "── summary: per rule (the nodes' counters, every incarnation) ──")
	var failOpenAll uint64
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tscope\tregion\tallowed\trejected\tshadow-rejected\tfail-open\treference\tenvelope\t")
	for _, r := range rules {
		verdict := "held (every identity above)"
		switch {
		case r.Shadow:
			verdict = "shadow: never rejects"
		case r.Scope == quota.ScopeGlobal:
			verdict = "see below"
		default:
			for _, c := range clients {
				if c.rule == r.ID && !heldClients[c.name] {
					verdict = "BROKEN for " + c.name
				}
			}
		}
		scope := string(r.Scope)
		if scope == "" {
			scope = string(quota.ScopeRegion)
		}
		for _, region := range f.regions {
			c := counts[key{r.ID, region}]
			if c == nil {
				c = &[4]uint64{}
			}
			failOpenAll += c[3]
			// The reference: the sum of the references of the rule's
			// clients in the region; a global rule's is one for all
			// regions. A shadow rule has none (it never rejects).
			refText := "-"
			if !r.Shadow {
				var sum int64
				for _, cl := range clients {
					if cl.rule == r.ID && (r.Scope == quota.ScopeGlobal || regionOf(cl, f) == region) {
						sum += refs[cl.name]
					}
				}
				refText = fmt.Sprint(sum)
				if r.Scope == quota.ScopeGlobal && len(f.regions) > 1 {
					refText += " (all regions)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.ID, scope, region, c[0], c[1], c[2], c[3], refText, verdict)
		}
	}
	tw.Flush()
	if failOpenAll > 0 {
		fmt.Fprintf(w, "WARNING: %d decisions were made by on_failure (an owner unreachable or slow: degraded, counted as fail-open, which alerts). "+
			"The envelopes above count them as the fault term F. In a quiet run this is 0; a busy machine (or -race) makes peer calls slow.\n", failOpenAll)
	}

	// The global customer.
	fmt.Fprintln(w)
	globalHeld := true
	for _, c := range clients {
		if c.rule == global.ID && !heldClients[c.name] {
			globalHeld = false
		}
	}
	maxSum, maxAt := int64(0), time.Duration(0)
	m.mu.Lock()
	samples := append([]sample(nil), m.samples...)
	m.mu.Unlock()
	for _, sm := range samples {
		if v := sm.share[0] + sm.share[1]; v > maxSum {
			maxSum, maxAt = v, sm.at
		}
	}
	if f.clustered {
		fmt.Fprintf(w, "── %s across regions: limit L = %v, Σ over regions of nodes × slack = %d ──\n", global.ID, glim, gslack)
		if maxSum > global.Limit {
			globalHeld = false
			o.bad("Σ shares reached %d > L = %d at t=%.1fs (sampled from the holders, node by node)", maxSum, global.Limit, maxAt.Seconds())
		}
		verdict := "held"
		if !globalHeld {
			verdict = "BROKEN"
		}
		fmt.Fprintf(w, "global envelope %s: admitted across regions ≤ r·Δ + B + Σ Nᵣ·sᵣ + timing over every interval; Σ shares ≤ L in every sample (max Σ %d of %d)\n",
			verdict, maxSum, global.Limit)
		printShares(w, f, samples, global.Limit)
		var sum float64
		for _, sm := range samples {
			sum += float64(sm.share[0] + sm.share[1])
		}
		for _, c := range clients {
			if c.rule != global.ID {
				continue
			}
			exp := reference(c.records(), globalPhase)
			fmt.Fprintf(w, "the partner was admitted %d, %.0f %% of the reference's %d: Σ shares averaged %.0f %% of L, since a region's share grows only as its\n"+
				"reports show demand, and a gradual fall of a region's demand moves its capacity on at its periodic reports, not off cycle (docs/global.md)\n",
				c.admitted.Load(), 100*float64(c.admitted.Load())/float64(max(exp, 1)), exp, 100*sum/float64(len(samples))/float64(global.Limit))
		}
	} else {
		fmt.Fprintf(w, "── %s on one node: no cluster, no lease group, so enforced on this node at the full limit ──\n", global.ID)
		verdict := "held"
		if !globalHeld {
			verdict = "BROKEN"
		}
		fmt.Fprintf(w, "global envelope %s (one node: S = 0)\n", verdict)
	}

	// The schedule.
	fmt.Fprintln(w)
	if putAt != 0 && f.clustered {
		fmt.Fprintf(w, "rule change: %s tightened to %d/1m burst %d through the admin API; every live node ran it %v after the PUT\n",
			tightRule, tightLimit, tightBurst, time.Duration(allAt-putAt).Round(time.Millisecond))
	}
	if s.killedLeader != "" {
		fmt.Fprintf(w, "lease leader: %s killed, %s elected after %v\n", s.killedLeader, s.newLeader, s.election.Round(time.Millisecond))
	}
	var reports, failures uint64
	for _, g := range f.all() {
		st := ops.GlobalStatus(g.node)
		reports += st.Reports
		failures += st.ReportFailures
	}
	if f.clustered {
		fmt.Fprintf(w, "lease reports: %d sent by the owners, %d failed (a failed report changes nothing: the leases run on until they expire)\n", reports, failures)
	}
	var perNode []string
	for _, g := range f.all() {
		perNode = append(perNode, fmt.Sprintf("%s %d/%d", g.label(), g.admitted.Load(), g.served.Load()))
	}
	fmt.Fprintf(w, "upstream calls: %d, admitted: %d (a rejected request never reaches the upstream); per gateway (#2: after its restart), admitted/answered: %s\n", upstream, admittedAll, strings.Join(perNode, ", "))
	if upstream != admittedAll {
		o.bad("the upstream was called %d times but %d requests were admitted", upstream, admittedAll)
	}

	// The enforcement canary of every live node.
	for _, g := range f.gateways() {
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

	// Load.
	fmt.Fprintf(w, "load: the clients offered %.0f requests/s", ld.offeredRPS)
	if ld.cpuOK {
		fmt.Fprintf(w, "; the whole process (gateways, gossip, Raft, clients) used %.2f of %d cores (CPU %v over %v)",
			ld.cpu.Seconds()/ld.wall.Seconds(), runtime.NumCPU(), ld.cpu.Round(10*time.Millisecond), ld.wall.Round(10*time.Millisecond))
	}
	if ld.avgOK {
		fmt.Fprintf(w, "; load average %.2f", ld.avg1)
	}
	fmt.Fprintln(w)

	if n := f.logHidden.Load(); n > 0 {
		fmt.Fprintf(w, "the nodes logged %d more error lines than the %d shown on stderr\n", n, maxLogLines)
	}
	for _, msg := range s.failures {
		o.bad("scheduled step failed: %s", msg)
	}
	if !o.ok {
		for _, p := range o.problems {
			fmt.Fprintln(w, "PROBLEM:", p)
		}
		fmt.Fprintln(w, "RESULT: FAILED")
		return 1
	}
	fmt.Fprintf(w, "RESULT: ok: the envelope held for every client and for %s; fail-open decisions: %d; every scheduled step succeeded\n", global.ID, failOpenAll)
	return 0
}

// printShares prints the global customer's shares per region over time as
// sparklines, the demand beside them, and a few rows of figures.
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
	fmt.Fprintf(w, "shares held per region (█ = the whole limit, %d/1m; one column per %.1fs) and the partner's demand (its requests, share of each column):\n",
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
	// A few rows: at every fifth of the run.
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
