package global

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is what one run measured. Tokens are summed over identities;
// ratios are averaged over identities and windows.
type Result struct {
	Config Config

	// Requested, Admitted: tokens asked for and admitted by the regions'
	// buckets and slack (SlackAdmitted of them through slack). Degraded:
	// tokens admitted open in fallback (Fallback "open"), outside the
	// envelope. FallbackDecisions: decisions made while a Holder reported
	// the fallback (before the first lease, or after an expiry).
	Requested, Admitted, SlackAdmitted, Degraded, FallbackDecisions int64

	// Excess is the worst, over every identity and every interval between
	// two admissions, of admitted − r·Δ; Bound is B + a·L + FaultTerm.
	Excess, Bound float64
	// FaultTerm is the partition term: at every fall back of a region to a
	// smaller share, the debt and unconfirmed spend it still owes beyond
	// the slack of its fallback share (see docs/overshoot.md); Fallbacks
	// counts those falls back.
	FaultTerm float64
	Fallbacks int

	// SharesMean is Σ shares ÷ L sampled every Config.Sample after the
	// warm-up (Doorman's "capacity handed out"); SharesPeak the largest
	// Σ shares ÷ L at any event of the run.
	SharesMean, SharesPeak float64
	// WindowMean, WindowWorst: admitted ÷ L per window of length W after
	// the warm-up. FillMean, FillWorst: admitted ÷ min(requested, L) per
	// window (windows with no demand skipped).
	WindowMean, WindowWorst float64
	FillMean, FillWorst     float64
	winN, fillN             int

	// Follow lists, per demand shift measured, how long the destination
	// region took to reach 95 % of its fair allocation. NotFollowed are
	// still waiting at the end, Superseded were overtaken by the next
	// shift, ShiftsInFaults fell in or within a lease after a fault.
	Follow                                  []time.Duration
	NotFollowed, Superseded, ShiftsInFaults int

	// Intervals and SinceShift are the capacity breakdown (Config.Breakdown)
	// per interval between demand shifts and by time since a shift, over
	// BreakdownShifts shifts after the warm-up and outside faults.
	Intervals, SinceShift []BreakdownRow
	BreakdownShifts       int

	// Protocol counts.
	// OffCycle counts the reports sent off cycle (Regional.ReportDue),
	// of Reports.
	Reports, OffCycle, Retries, Grants, Applies, Takeovers, LostAtLeader int
	LeaderCrashes, Partitions, Spikes, Elections, Outages                int
	Sent, Lost, Cut                                                      uint64
	Events                                                               uint64

	// Violations describe the first broken checks (invariant, Check, the
	// envelope); ViolationCount counts them all.
	Violations     []string
	ViolationCount int
}

// OK reports whether every check held.
func (r *Result) OK() bool { return r.ViolationCount == 0 }

// FollowStats returns the median and the largest follow time (0, 0 with
// none).
func (r *Result) FollowStats() (median, worst time.Duration) {
	if len(r.Follow) == 0 {
		return 0, 0
	}
	f := slices.Clone(r.Follow)
	slices.Sort(f)
	return f[len(f)/2], f[len(f)-1]
}

// Summary writes the run's table. The same Config writes the same bytes.
func (r *Result) Summary(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "global limit %d per %v, burst %d, cost %d, a = %g, %d identit%s, %d regions\n", c.Limit, c.Window, c.Burst, c.Cost, c.Accuracy, c.IDs, plural(c.IDs, "y", "ies"), c.Regions)
	fmt.Fprintf(w, "refresh %v, lease %v, max skew %v (clocks spread %v), election %v, commit %v, latency %s\n", c.Refresh, c.Lease, c.MaxSkew, c.Skew, c.Election, c.Commit, c.Latency)
	fmt.Fprintf(w, "demand %s (load %g), fallback %s, faults %s, %v simulated, seed %d\n\n", c.Demand, c.Load, c.Fallback, FormatFaults(c.Faults), c.Duration, c.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure\tvalue\tbound\n")
	fmt.Fprintf(tw, "Σ shares ÷ L, peak at any event\t%.2f%%\t≤ 100%%\n", 100*r.SharesPeak)
	fmt.Fprintf(tw, "Σ shares ÷ L, mean after warm-up\t%.2f%%\t\n", 100*r.SharesMean)
	fmt.Fprintf(tw, "worst excess over r·Δ (tokens)\t%.2f\t%.2f = B %d + a·L %.2f + fault term %.2f\n", r.Excess, r.Bound, c.Burst, c.Accuracy*float64(c.Limit), r.FaultTerm)
	fmt.Fprintf(tw, "admitted ÷ L per window, mean / worst\t%.2f%% / %.2f%%\t%.2f%% by the envelope\n", 100*r.WindowMean, 100*r.WindowWorst, 100*(1+r.Bound/float64(c.Limit)))
	fmt.Fprintf(tw, "admitted ÷ min(demand, L) per window, mean / worst\t%.2f%% / %.2f%%\t\n", 100*r.FillMean, 100*r.FillWorst)
	med, worst := r.FollowStats()
	fmt.Fprintf(tw, "capacity follows demand: shifts measured, median / worst\t%d, %v / %v\t(%d not reached, %d superseded, %d in faults)\n", len(r.Follow), med, worst, r.NotFollowed, r.Superseded, r.ShiftsInFaults)
	fmt.Fprintf(tw, "tokens requested / admitted / via slack / open in fallback\t%d / %d / %d / %d\t\n", r.Requested, r.Admitted, r.SlackAdmitted, r.Degraded)
	fmt.Fprintf(tw, "decisions in fallback, falls back to a smaller share\t%d, %d\t\n", r.FallbackDecisions, r.Fallbacks)
	fmt.Fprintf(tw, "reports (off cycle) / retries / grants / applies\t%d (%d) / %d / %d / %d\t\n", r.Reports, r.OffCycle, r.Retries, r.Grants, r.Applies)
	fmt.Fprintf(tw, "leader crashes / takeovers / partitions\t%d / %d / %d\t\n", r.LeaderCrashes, r.Takeovers, r.Partitions)
	if c.Demand == DemandDoorman {
		fmt.Fprintf(tw, "Doorman mishaps: spikes / elections / outages\t%d / %d / %d\t\n", r.Spikes, r.Elections, r.Outages)
	}
	fmt.Fprintf(tw, "messages sent / lost / cut, events\t%d / %d / %d, %d\t\n", r.Sent, r.Lost, r.Cut, r.Events)
	tw.Flush()
	r.writeBreakdown(w)
	if r.OK() {
		fmt.Fprintf(w, "\nok: the invariant held at every event, Check after every Apply, and the envelope over every interval\n")
		return
	}
	fmt.Fprintf(w, "\n%d VIOLATIONS (seed %d):\n  %s\n", r.ViolationCount, c.Seed, strings.Join(r.Violations, "\n  "))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
