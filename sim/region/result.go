package region

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
)

// Result is what one run measured, and the bounds it is checked against.
// Token figures are in tokens; Excess and Shortfall are the worst over all
// identities.
type Result struct {
	// Config is the run's configuration with defaults filled in.
	Config Config
	// Requests offered; Unserved found no running node.
	Requests, Unserved int64
	// RefAdmitted is what the reference bucket (one exact GCRA per
	// identity, fed every request in arrival order) admitted; Admitted
	// what the cluster admitted, BySource split by how it decided.
	RefAdmitted, Admitted int64
	BySource              [cluster.NumSources]int64
	// Degraded counts decisions made by on_failure; DegradedAdmitted the
	// tokens they admitted.
	Degraded, DegradedAdmitted int64
	// Slack is each node's slack at the initial size, S the region's total
	// in fault-free stretches, SFault the total while views disagree.
	Slack, S, SFault int64
	// Terms are the fault terms of the run.
	Terms []Term
	// ExcessAccounted is the worst excess over B + r·Δ of the admissions
	// the owners account for (all but on_failure decisions), over every
	// interval; BoundAccounted is S (SFault with faults) plus the terms.
	ExcessAccounted, BoundAccounted float64
	// ExcessAll counts on_failure admissions too (reported, bounded by
	// BoundAccounted + DegradedAdmitted).
	ExcessAll float64
	// ExcessClean is the worst excess over intervals inside fault-free
	// stretches; its bound is S.
	ExcessClean float64
	// Shortfall is the worst r·Δ − admitted over fault-free intervals for
	// a saturating client (NaN when the traffic does not saturate);
	// BoundShortfall is S + c + ⌈r·ℓ⌉ with Ell, ℓ, the linger plus the
	// longest time from when a request's items were taken from the
	// coordinator (the earliest flush, for a batch that waited behind an
	// exchange in flight) to its reply (derived where result sets it),
	// plus ShortfallCollision.
	Shortfall, BoundShortfall float64
	// ShortfallCollision is ⌊B/2⌋ when the run spends blind with a key cap
	// below its identities (0 otherwise): the owners' sketches, at most two
	// cells per row for each key the cap allows, cannot spread the
	// identities out, and an identity whose cells all hold others' later
	// TATs gets its bucket up to half spent (docs/overshoot.md, "Blind
	// spend": the sketch collision term, under-admission only).
	ShortfallCollision float64
	Ell                time.Duration
	// ShortfallFrom and ShortfallTo bound the interval of the worst
	// shortfall (run time).
	ShortfallFrom, ShortfallTo time.Duration
	// Gated runs (Config.Sketch > 0) add the sketch term N·θ_eff·(⌈Δ/P⌉ +
	// 1) to the upper bound over an interval of length Δ: SketchN is N
	// (the node incarnations, each with a sketch), SketchTheta θ_eff,
	// SketchPeriod P. In a gated run ExcessAccounted, ExcessAll and
	// ExcessClean are the worst excess over B + r·Δ + N·θ_eff·(⌈Δ/P⌉ + 1),
	// from an exact pass (check.go), and ExcessPlain is the worst accounted
	// excess over B + r·Δ alone. SketchPerPeriod is the most tokens
	// admitted through the sketch in an interval, per aligned period it
	// meets (÷ (⌈Δ/P⌉ + 1)), for SketchID; its bound is N·θ_eff.
	SketchN         int
	SketchTheta     int64
	SketchPeriod    time.Duration
	ExcessPlain     float64
	SketchPerPeriod float64
	SketchID        string
	// Key cap runs (Config.KeyCap > 0) charge each identity the term of
	// its evictions (docs/overshoot.md, the key cap row of "Fault terms"): the
	// debt its evicted owner buckets held plus s for each of its node
	// entries evicted with a view; every upper check then scores an
	// identity's excess beyond its own term. KeyCapTerm is the largest
	// term of an identity; ExcessRaw is the worst accounted excess over
	// B + r·Δ without the term, RawID its identity and RawTerm its term.
	// KeyCapDerived is the derived bound on all forgiven debt, (B + S)
	// per forgiven eviction plus s per view evicted: Coord.ForgivenTokens
	// must stay within it (checked in fault-free runs).
	KeyCapTerm, ExcessRaw, RawTerm, KeyCapDerived float64
	RawID                                         string
	// MaxForgiven is the largest debt one eviction forgave; CapBreaks
	// counts forgiven evictions whose debt was above B + S_f plus s per
	// view of the identity evicted before (a violation without faults).
	MaxForgiven, CapBreaks int64
	// WorstID names the identity with the worst accounted excess.
	WorstID string
	// Exchanges and Replies are the messages sent; FailedExchanges timed
	// out; Lost and Cut were lost or cut by a partition.
	Exchanges, Replies, FailedExchanges, Lost, Cut uint64
	// BreakerOpens and RingChanges count breakers opened and rings installed.
	BreakerOpens, RingChanges uint64
	// Coord sums the coordinators' counters over nodes and incarnations.
	Coord cluster.Stats
	// CleanTime is the simulated time outside fault windows.
	CleanTime time.Duration
	// Bin is the width of the rate series (Config.Bin); Cluster and
	// Reference are the tokens admitted per bin, Fallback the part of
	// Cluster that on_failure admitted (outside the owners' accounting).
	// Bound is, per bin, the most the envelope lets the owners admit in
	// it: over the identities that offered requests in the bin or up to
	// BoundLag before it (a decision is recorded at the time its owner
	// made it, at most BoundLag after the request arrived), the sum of the
	// least of what each offered then and B + r·Δ + S (Δ the bin's width),
	// with BoundAccounted in place of S in a bin that is not inside a
	// fault-free stretch, plus the sketch term of a gated rule and an
	// identity's key cap term; nil when the run's algorithm is held to
	// its reference instead (neither gcra nor token_bucket).
	Bin                          time.Duration
	Cluster, Reference, Fallback []int64
	Bound                        []float64
	BoundLag                     time.Duration
	// FaultFree are the fault-free stretches of the run, in time order.
	FaultFree []Span
	// Rings lists each ring a node installed after the start, in time
	// order (one per node per view change).
	Rings []RingChange
	// Events is the number of simulator events fired.
	Events uint64
	// Rules are the per-rule figures of a multi-rule run (Config.Rules),
	// the main rule first; nil with one rule. The run's own excess and
	// source figures are then the main rule's (its charges that stood),
	// Admitted and RefAdmitted count requests every rule admitted.
	Rules []RuleResult
	// Late counts admissions that reached a checker after it had checked
	// past their time (a simulator error: the reorder horizon too short).
	Late int64
	// Violations describes every bound the run broke.
	Violations []string
}

const eps = 1e-6

func (rg *Region) result() *Result {
	c := rg.cfg
	ch := rg.chk
	res := &Result{
		Config: c, Requests: rg.requests, Unserved: rg.unserved, RefAdmitted: rg.refAdmitted,
		Admitted: rg.admitted, BySource: rg.bySource, Degraded: rg.degraded, DegradedAdmitted: rg.degradedAdmitted,
		Slack: rg.slack, S: rg.sClean, SFault: rg.sFault, Terms: rg.terms,
		ExcessAccounted: ch.worstAcc - float64(c.Burst), ExcessAll: ch.worstAll - float64(c.Burst),
		ExcessClean: ch.worstClean - float64(c.Burst), Shortfall: math.NaN(),
		Exchanges: rg.exchanges, Replies: rg.replies, FailedExchanges: rg.failedExchanges,
		Lost: rg.net.Lost, Cut: rg.net.Cut, BreakerOpens: rg.breakerOpens, RingChanges: rg.ringChanges,
		Bin: c.Bin, Cluster: rg.series.cluster, Reference: rg.series.ref, Fallback: rg.series.fallback,
		Bound: rg.series.bound, BoundLag: time.Duration(rg.series.lag), FaultFree: rg.series.faultFree, Rings: rg.series.rings, Events: rg.sim.Fired(),
	}
	if ch.worstAccID >= 0 && ch.worstAccID < len(rg.ids.names) {
		res.WorstID = rg.ids.names[ch.worstAccID]
	}
	res.ExcessPlain = res.ExcessAccounted
	if ch.gated {
		res.SketchN, res.SketchTheta, res.SketchPeriod = rg.sketchN, rg.sketchTheta, c.SketchPeriod
		res.ExcessAccounted, res.ExcessAll = ch.gAcc-float64(c.Burst), ch.gAll-float64(c.Burst)
		res.ExcessClean = ch.gClean - float64(c.Burst)
		res.SketchPerPeriod = ch.gSketch
		if ch.gAccID >= 0 && ch.gAccID < len(rg.ids.names) {
			res.WorstID = rg.ids.names[ch.gAccID]
		}
		if !math.IsInf(ch.gSketch, -1) {
			res.SketchID = rg.ids.names[ch.gSketchID]
		}
	}
	for _, seg := range ch.segs {
		res.CleanTime += time.Duration(min(seg.to, int64(c.Duration)) - min(seg.from, int64(c.Duration)))
	}
	res.BoundAccounted = float64(rg.sClean)
	if len(rg.terms) > 0 {
		res.BoundAccounted = float64(rg.sFault)
		for _, t := range rg.terms {
			res.BoundAccounted += t.Tokens
		}
	}
	// ℓ bounds how late an item (a report, a forwarded request) reaches
	// its owner and the answer comes back, from when the coordinator
	// queued it. The node takes it from the coordinator at the latest
	// one linger later: a Decide that queues work flushes at once when no
	// exchange is in flight, else schedules the backstop flush a linger
	// ahead unless one is scheduled already (which fires sooner), and
	// every other producer (Step, Tick, a ring change) is followed by a
	// Ready at once. From that flush the item leaves at once, or waits in
	// its peer's backlog for the exchange in flight (and leaves with the
	// backlog, whose readyAt is its earliest flush, so no later than its
	// own); the reply to the exchange that carries it is then measured
	// from that readyAt (maxLate). Hence queued-to-answer ≤ linger +
	// maxLate. (The old model flushed a linger after every Decide and
	// sent at once, so maxLate was the longest round trip.)
	res.Ell = c.Linger + time.Duration(rg.maxLate)
	if c.checksLower() && len(ch.segs) > 0 {
		res.Shortfall = ch.worstLow
		res.ShortfallFrom, res.ShortfallTo = time.Duration(ch.lowFrom), time.Duration(ch.lowTo)
		res.BoundShortfall = float64(rg.sClean) + float64(c.Cost) + math.Ceil(c.rate()*res.Ell.Seconds())
		if rg.params.SpendsBlind() && c.KeyCap > 0 && c.KeyCap < c.IDs {
			res.ShortfallCollision = float64(c.Burst / 2)
			res.BoundShortfall += res.ShortfallCollision
		}
	}
	for _, n := range rg.nodes {
		if n.up {
			n.addPast()
		}
		p := &res.Coord
		s := n.past
		p.LocalAdmits += s.LocalAdmits
		p.ViewRejects += s.ViewRejects
		p.Forwarded += s.Forwarded
		p.RemoteResults += s.RemoteResults
		p.Degraded += s.Degraded
		p.SyncsSent += s.SyncsSent
		p.AcksSent += s.AcksSent
		p.ReportsCharged += s.ReportsCharged
		p.SketchAdmits += s.SketchAdmits
		p.SketchPromotions += s.SketchPromotions
		addEvictions(p, s)
		addBlind(p, s)
	}
	if c.KeyCap > 0 {
		st := &res.Coord
		res.KeyCapDerived = float64(c.Burst+rg.sFault)*float64(st.EvictedForgiven) + float64(rg.sView)*float64(st.EvictedViews)
		res.KeyCapTerm = slices.Max(ch.capTerm)
		res.ExcessRaw = ch.worstAccRaw - float64(c.Burst)
		res.MaxForgiven, res.CapBreaks = rg.maxForgiven, rg.capBreaks
		if i := ch.worstAccRawID; !math.IsInf(ch.worstAccRaw, -1) && i < len(ch.capTerm) {
			res.RawID, res.RawTerm = rg.ids.names[i], ch.capTerm[i]
		}
	}
	rg.algoResult(res)
	res.Late = ch.late
	if rg.multi {
		res.Rules = rg.ruleResults()
		res.BySource, res.DegradedAdmitted = rg.rules[0].bySource, rg.rules[0].degStood
		for _, rr := range rg.rules[1:] {
			res.Late += rr.chk.late
		}
	}
	res.check()
	return res
}

// checkLabels names the three upper checks of the summary: the excess over
// over, or, for another algorithm than gcra, the tokens the replay refuses.
func (c *Config) checkLabels(over string) (what, all, clean string) {
	switch c.Algorithm {
	case quota.AlgorithmConcurrency:
		return "requests in flight at once beyond the limit, accounted", "the same, all admissions", "the same, in fault-free stretches"
	case quota.AlgorithmGCRA:
	default:
		return "admitted that one " + string(c.Algorithm) + " fed them refuses, accounted", "the same, all admissions", "the same, in fault-free stretches"
	}
	return "worst excess over " + over + ", accounted, any interval", "worst excess over " + over + ", all admissions, any interval", "worst excess over " + over + ", fault-free intervals"
}

// check fills in Violations.
func (r *Result) check() {
	c := &r.Config
	if r.ExcessAccounted > r.BoundAccounted+eps && c.Algorithm == quota.AlgorithmConcurrency {
		r.Violations = append(r.Violations, fmt.Sprintf("in flight: %.0f requests (accounted admissions, %s) beyond the limit at once, above the bound %.0f",
			r.ExcessAccounted, r.WorstID, r.BoundAccounted))
	} else if r.ExcessAccounted > r.BoundAccounted+eps && c.Algorithm != quota.AlgorithmGCRA {
		r.Violations = append(r.Violations, fmt.Sprintf("replay: %.0f tokens admitted (accounted admissions, %s) that one %s fed them refuses, above the bound %.0f",
			r.ExcessAccounted, r.WorstID, c.Algorithm, r.BoundAccounted))
	} else if r.ExcessAccounted > r.BoundAccounted+eps {
		r.Violations = append(r.Violations, fmt.Sprintf("upper envelope: excess %.3f over B + r·Δ (accounted admissions, %s) above the bound %.3f",
			r.ExcessAccounted, r.WorstID, r.BoundAccounted))
	}
	if r.ExcessAll > r.BoundAccounted+float64(r.DegradedAdmitted)+eps {
		r.Violations = append(r.Violations, fmt.Sprintf("upper envelope: excess %.3f (all admissions) above the bound %.3f + %d degraded",
			r.ExcessAll, r.BoundAccounted, r.DegradedAdmitted))
	}
	if !math.IsInf(r.ExcessClean, -1) && r.ExcessClean > float64(r.S)+eps {
		r.Violations = append(r.Violations, fmt.Sprintf("upper envelope: excess %.3f in a fault-free interval above S = %d", r.ExcessClean, r.S))
	}
	if c.KeyCap > 0 && len(c.Faults) == 0 && (float64(r.Coord.ForgivenTokens) > r.KeyCapDerived+eps || r.CapBreaks > 0) {
		r.Violations = append(r.Violations, fmt.Sprintf("key cap: %d tokens of debt forgiven by %d evictions (above the derived (B + S)·evictions + s·views = %.0f?), %d evictions above B + S + s·views",
			r.Coord.ForgivenTokens, r.Coord.EvictedForgiven, r.KeyCapDerived, r.CapBreaks))
	}
	if !math.IsNaN(r.Shortfall) && !math.IsInf(r.Shortfall, -1) && r.Shortfall > r.BoundShortfall+eps {
		terms := "S + c + ⌈r·ℓ⌉"
		if r.ShortfallCollision > 0 {
			terms += " + ⌊B/2⌋"
		}
		r.Violations = append(r.Violations, fmt.Sprintf("lower bound: shortfall %.3f under r·Δ in the fault-free interval (%v, %v) above %s = %.0f (ℓ = %v)",
			r.Shortfall, r.ShortfallFrom, r.ShortfallTo, terms, r.BoundShortfall, r.Ell))
	}
	if r.SketchN > 0 && !math.IsInf(r.SketchPerPeriod, -1) && r.SketchPerPeriod > r.SketchBound()+eps {
		r.Violations = append(r.Violations, fmt.Sprintf("sketch term: %.3f tokens per aligned period through the sketch (%s) above N·θ_eff = %.0f",
			r.SketchPerPeriod, r.SketchID, r.SketchBound()))
	}
	if len(c.Faults) == 0 && r.Degraded != 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d degraded (on_failure) decisions in a run with no fault", r.Degraded))
	}
	r.checkRules()
	if r.Late > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("checks: %d admissions reached the checks after their time (the reorder horizon is too short)", r.Late))
	}
}

// SketchBound is N·θ_eff, the sketch term per aligned period an interval
// meets (0 in an ungated run).
func (r *Result) SketchBound() float64 { return float64(r.SketchN) * float64(r.SketchTheta) }

// OK reports whether the run kept every bound.
func (r *Result) OK() bool { return len(r.Violations) == 0 }

// MessagesPerSecond is the exchanges and replies per simulated second.
func (r *Result) MessagesPerSecond() float64 {
	return float64(r.Exchanges+r.Replies) / r.Config.Duration.Seconds()
}

func fmtTok(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, -1):
		return "none"
	case math.Abs(v) < 0.005:
		return "0.00"
	}
	return fmt.Sprintf("%.2f", v)
}

// Summary writes the run's summary table. It depends only on the run's
// inputs: the same seed gives the same bytes.
func (r *Result) Summary(w io.Writer) {
	c := &r.Config
	mode := c.ruleKind()
	fmt.Fprintf(w, "weir sim: %d nodes, %s rule %d/%v burst %d cost %d, accuracy %g (%s slack %d/node, S %d), sync %v, on_failure %s\n",
		c.Nodes, mode, c.Limit, c.Window, c.Burst, c.Cost, c.Accuracy, c.Scheme, r.Slack, r.S, c.Sync, c.OnFailure)
	fmt.Fprintf(w, "traffic %s load %g ids %d", c.Traffic, c.Load, c.IDs)
	if c.Traffic == TrafficZipf {
		fmt.Fprintf(w, " rate %g/s zipf %g", c.Rate, c.ZipfS)
	}
	fmt.Fprintf(w, ", latency %s, faults %s, duration %v, seed %d\n", c.Latency, FormatFaults(c.Faults), c.Duration, c.Seed)
	if len(r.Rules) > 0 {
		r.summarizeRuleList(w)
	}
	if r.SketchN > 0 {
		fmt.Fprintf(w, "sketch gating: θ %d, period P %v, θ_eff %d, N %d: the upper bound gains N·θ_eff·(⌈Δ/P⌉ + 1) = %.0f·(⌈Δ/P⌉ + 1)\n",
			c.Sketch, c.SketchPeriod, r.SketchTheta, r.SketchN, r.SketchBound())
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	secs := c.Duration.Seconds()
	fmt.Fprintf(tw, "\trequests\tadmitted\tadmitted/s\tof reference\t\n")
	fmt.Fprintf(tw, "reference\t%d\t%d\t%.1f\t100.0%%\t\n", r.Requests, r.RefAdmitted, float64(r.RefAdmitted)/secs)
	pct := 0.0
	if r.RefAdmitted > 0 {
		pct = 100 * float64(r.Admitted) / float64(r.RefAdmitted)
	}
	fmt.Fprintf(tw, "cluster\t%d\t%d\t%.1f\t%.1f%%\t\n", r.Requests, r.Admitted, float64(r.Admitted)/secs, pct)
	if len(r.Rules) > 0 {
		fmt.Fprintf(tw, "  rule %s's charges that stood, by owner/slack/remote/on_failure\t\t%d/%d/%d/%d\t\t\t\n", r.Rules[0].ID,
			r.BySource[cluster.SourceOwner], r.BySource[cluster.SourceSlack], r.BySource[cluster.SourceRemote], r.BySource[cluster.SourceFailure])
	} else if r.SketchN > 0 {
		fmt.Fprintf(tw, "  by owner/slack/remote/on_failure/sketch\t\t%d/%d/%d/%d/%d\t\t\t\n",
			r.BySource[cluster.SourceOwner], r.BySource[cluster.SourceSlack], r.BySource[cluster.SourceRemote], r.BySource[cluster.SourceFailure], r.BySource[cluster.SourceSketch])
	} else {
		fmt.Fprintf(tw, "  by owner/slack/remote/on_failure\t\t%d/%d/%d/%d\t\t\t\n",
			r.BySource[cluster.SourceOwner], r.BySource[cluster.SourceSlack], r.BySource[cluster.SourceRemote], r.BySource[cluster.SourceFailure])
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Rules) > 0 {
		fmt.Fprintf(tw, "check (tokens), rule %s\tmeasured\tbound\tok\t\n", r.Rules[0].ID)
	} else {
		fmt.Fprintf(tw, "check (tokens)\tmeasured\tbound\tok\t\n")
	}
	ok := func(v, b float64) string {
		if math.IsNaN(v) || math.IsInf(v, -1) || v <= b+eps {
			return "yes"
		}
		return "NO"
	}
	over := "B + r·Δ"
	if r.SketchN > 0 {
		over = "B + r·Δ + sketch term"
	}
	if c.KeyCap > 0 {
		over += " + its key cap term"
	}
	if len(r.Rules) > 0 {
		over += " + its refund term"
	}
	what, all, clean := c.checkLabels(over)
	fmt.Fprintf(tw, "%s (%s)\t%s\t%s\t%s\t\n", what, r.WorstID, fmtTok(r.ExcessAccounted), fmtTok(r.BoundAccounted), ok(r.ExcessAccounted, r.BoundAccounted))
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", all, fmtTok(r.ExcessAll), fmtTok(r.BoundAccounted+float64(r.DegradedAdmitted)), ok(r.ExcessAll, r.BoundAccounted+float64(r.DegradedAdmitted)))
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t\n", clean, fmtTok(r.ExcessClean), r.S, ok(r.ExcessClean, float64(r.S)))
	if r.SketchN > 0 {
		fmt.Fprintf(tw, "  sketch term: admitted through the sketch per aligned period met, worst interval (%s)\t%s\t%s\t%s\t\n", r.SketchID, fmtTok(r.SketchPerPeriod), fmtTok(r.SketchBound()), ok(r.SketchPerPeriod, r.SketchBound()))
		fmt.Fprintf(tw, "  worst excess over B + r·Δ alone, accounted (sketch term included)\t%s\t\t\t\n", fmtTok(r.ExcessPlain))
	}
	if len(r.Rules) > 0 {
		fmt.Fprintf(tw, "worst shortfall under r·Δ\t-\t-\tn/a (several rules)\t\n")
	} else if math.IsNaN(r.Shortfall) {
		fmt.Fprintf(tw, "worst shortfall under r·Δ, saturating, fault-free\t-\t-\tn/a\t\n")
	} else {
		label := fmt.Sprintf("worst shortfall under r·Δ, saturating, fault-free (ℓ %v)", r.Ell)
		if r.ShortfallCollision > 0 {
			label += fmt.Sprintf(", + ⌊B/2⌋ %.0f: a sketch crowded by the key cap", r.ShortfallCollision)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", label, fmtTok(r.Shortfall), fmtTok(r.BoundShortfall), ok(r.Shortfall, r.BoundShortfall))
	}
	degBound := "any"
	if len(c.Faults) == 0 {
		degBound = "0"
	}
	degOK := "yes"
	if len(c.Faults) == 0 && r.Degraded != 0 {
		degOK = "NO"
	}
	fmt.Fprintf(tw, "on_failure decisions (admitted tokens %d)\t%d\t%s\t%s\t\n", r.DegradedAdmitted, r.Degraded, degBound, degOK)
	tw.Flush()
	for _, t := range r.Terms {
		fmt.Fprintf(w, "  fault term %-28s %8.2f  %s\n", t.Fault, t.Tokens, t.Why)
	}
	if len(r.Terms) > 0 {
		fmt.Fprintf(w, "  S while views disagree: %d; fault-free time %v of %v\n", r.SFault, r.CleanTime, c.Duration)
	}
	if len(r.Rules) > 0 {
		r.summarizeRules(w)
	}
	fmt.Fprintln(w)
	if r.SketchN > 0 {
		fmt.Fprintf(w, "sketch: %d admissions through the sketch, %d promotions\n", r.Coord.SketchAdmits, r.Coord.SketchPromotions)
	}
	if st := &r.Coord; st.BlindAdmits+st.BlindOwn > 0 {
		fmt.Fprintf(w, "blind spend: %d admissions without an entry in %d reports (%d charged to the owners' sketches, %d tracked after), %d decided on the owner's sketch\n",
			st.BlindAdmits, st.BlindReports, st.BlindCharged, st.BlindTracks, st.BlindOwn)
	}
	if c.KeyCap > 0 {
		r.summarizeKeyCap(w)
	}
	fmt.Fprintf(w, "messages: %d exchanges + %d replies = %.1f/s; %d failed, %d lost, %d cut; %d syncs, %d forwarded, %d view rejects; %d breaker opens, %d ring changes\n",
		r.Exchanges, r.Replies, r.MessagesPerSecond(), r.FailedExchanges, r.Lost, r.Cut, r.Coord.SyncsSent, r.Coord.Forwarded, r.Coord.ViewRejects, r.BreakerOpens, r.RingChanges)
	if r.OK() {
		fmt.Fprintln(w, "result: within the envelope")
	} else {
		fmt.Fprintf(w, "result: VIOLATION\n  %s\n", strings.Join(r.Violations, "\n  "))
	}
}

// summarizeKeyCap writes the summary's lines of a key cap run.
func (r *Result) summarizeKeyCap(w io.Writer) {
	c := &r.Config
	st := &r.Coord
	fmt.Fprintf(w, "key cap %d per rule per node: evicted %d idle, %d views, %d forgiven (%d tokens of debt; derived bound (B + S)·%d + s·%d = %.0f); %d made over the cap\n",
		c.KeyCap, st.EvictedIdle, st.EvictedViews, st.EvictedForgiven, st.ForgivenTokens, st.EvictedForgiven, st.EvictedViews, r.KeyCapDerived, st.OverCap)
	fmt.Fprintf(w, "  most debt one eviction forgave %d (bound B + S = %d, plus s per view of the identity evicted before; %d above it)\n",
		r.MaxForgiven, c.Burst+r.SFault, r.CapBreaks)
	what := "worst excess over B + r·Δ"
	if c.Algorithm != quota.AlgorithmGCRA {
		what, _, _ = c.checkLabels("")
		what += ","
	}
	fmt.Fprintf(w, "  %s without the key cap term %s (%s, whose term, forgiven debt + s per view evicted, is %.0f); largest term %.0f\n",
		what, fmtTok(r.ExcessRaw), r.RawID, r.RawTerm, r.KeyCapTerm)
}
