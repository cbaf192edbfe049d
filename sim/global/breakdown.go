package global

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// This file is the capacity breakdown (Config.Breakdown): where each
// identity's global limit L is at every instant, in seven parts that sum to
// L, integrated over time between events:
//
//   - used: Σᵣ min(shareᵣ, demandᵣ), the share each region enforces (its
//     Holder, on its own clock) that its offered demand uses;
//   - unused: the rest of what the regions enforce;
//   - not delivered: what the leader granted above what a region enforces
//     (min(leader's share, its term) − enforced): in a reply on its way, or
//     granted at a Tick or in another region's round and waiting for the
//     region's next report to collect it;
//   - awaiting acknowledgement: what the leader still counts for a region
//     (its term) above both, until the region acknowledges its smaller share
//     or gives it back;
//   - awaiting repayment: the same once acknowledged, until the region's
//     debt at its larger share is repaid;
//   - awaiting expiry: the same for a region whose lease has run out on its
//     own clock or on the leader's (the leader counts it until expiry plus
//     the skew, then min(safe share, hold));
//   - unallocated: L − Σᵣ termᵣ, capacity the leader has not handed out.
//
// It is reported per interval between demand shifts, and averaged over the
// shifts after the warm-up by time since the shift.

// Breakdown parts, in the order of breakdown.parts.
const (
	partUsed = iota
	partUnused
	partFlight
	partAck
	partRepay
	partExpiry
	partFree
	nParts
)

var partNames = [nParts]string{"used", "unused", "not delivered", "awaiting ack", "awaiting repayment", "awaiting expiry", "unallocated"}

// breakdownStep is the width of the time-since-shift rows; breakdownRows
// how many there are before the rest of the interval.
const (
	breakdownStep = 250 * time.Millisecond
	breakdownRows = 16
)

// BreakdownRow is the capacity breakdown over one stretch of time, each
// part as a fraction of L·time (the parts sum to 1).
type BreakdownRow struct {
	Label string
	Parts [nParts]float64
	time  float64 // ns·identities integrated
}

// breakdown integrates the parts over time.
type breakdown struct {
	last      int64
	cur       [][nParts]float64 // per identity, the parts at the last event (fractions of L)
	shiftAt   []int64           // per identity: the last shift, and its interval index
	interval  []int
	counted   []bool // the last shift is after the warm-up and outside faults
	intervals []BreakdownRow
	since     [breakdownRows + 1]BreakdownRow
	shifts    int
}

func newBreakdown(r *run) *breakdown {
	b := &breakdown{last: r.s.Now(), cur: make([][nParts]float64, len(r.ids)), shiftAt: make([]int64, len(r.ids)),
		interval: make([]int, len(r.ids)), counted: make([]bool, len(r.ids))}
	for i := range b.cur {
		b.cur[i][partFree] = 1
		b.interval[i] = -1
	}
	return b
}

// shift notes a demand shift of identity id at now.
func (b *breakdown) shift(r *run, id int, now int64) {
	b.advance(r, now)
	b.shiftAt[id] = now
	b.interval[id]++
	for len(b.intervals) <= b.interval[id] {
		b.intervals = append(b.intervals, BreakdownRow{})
	}
	b.counted[id] = now >= start+int64(r.cfg.Warmup) && now >= r.faultUntil && now > start
	if b.counted[id] && id == 0 {
		b.shifts++
	}
}

// advance integrates the parts from the last event to now.
func (b *breakdown) advance(r *run, now int64) {
	dt := float64(now - b.last)
	if dt <= 0 {
		return
	}
	for id := range b.cur {
		if b.interval[id] < 0 {
			continue
		}
		row := &b.intervals[b.interval[id]]
		row.time += dt
		for p, v := range b.cur[id] {
			row.Parts[p] += v * dt
		}
		if !b.counted[id] {
			continue
		}
		// Split [last, now) over the time-since-shift rows.
		from, to := b.last-b.shiftAt[id], now-b.shiftAt[id]
		for from < to {
			k := min(from/int64(breakdownStep), breakdownRows)
			end := to
			if k < breakdownRows {
				end = min(to, (k+1)*int64(breakdownStep))
			}
			w := float64(end - from)
			s := &b.since[k]
			s.time += w
			for p, v := range b.cur[id] {
				s.Parts[p] += v * w
			}
			from = end
		}
	}
	b.last = now
}

// observe recomputes the parts at now, after an event.
func (b *breakdown) observe(r *run) {
	now := r.s.Now()
	b.advance(r, now)
	L := float64(r.cfg.Limit)
	lnow := max(now+r.leaderOff, 0)
	for id, ident := range r.ids {
		var p [nParts]float64
		views := r.m.View(rulID, ident, max(lnow, r.m.Now()))
		var terms float64
		for i, g := range r.regions {
			e, _ := g.share(id)
			d := int64(r.rates[id][i])
			used := min(e, d)
			p[partUsed] += float64(used)
			p[partUnused] += float64(e - used)
			if views == nil {
				continue
			}
			v := views[i]
			terms += float64(v.Term)
			gap := max(v.Term-e, 0)
			flight := min(max(min(v.Share, v.Term)-e, 0), gap)
			rest := float64(gap - flight)
			p[partFlight] += float64(flight)
			switch {
			case v.Expired || g.reg.Expired(g.now(), rulID, ident):
				p[partExpiry] += rest
			case v.Releasing:
				p[partRepay] += rest
			default:
				p[partAck] += rest
			}
		}
		if views == nil {
			// No key at the leader: nothing granted (the regions enforce
			// their fallbacks, which are then 0).
			terms = p[partUsed] + p[partUnused]
		}
		p[partFree] = max(L-terms, 0)
		for k := range p {
			p[k] /= L
		}
		b.cur[id] = p
	}
}

// rows returns the interval rows and the time-since-shift rows, each part
// as a fraction of L·time.
func (b *breakdown) rows(r *run) (intervals, since []BreakdownRow) {
	b.advance(r, r.end)
	norm := func(row BreakdownRow, label string) BreakdownRow {
		row.Label = label
		if row.time > 0 {
			for p := range row.Parts {
				row.Parts[p] /= row.time
			}
		}
		return row
	}
	var at time.Duration
	for i, row := range b.intervals {
		// Intervals are those of identity 0's shifts (every identity
		// shifts at the same times).
		label := fmt.Sprintf("interval %d", i)
		if r.cfg.Demand == DemandMove {
			at = time.Duration(i) * r.cfg.MoveEvery
			label = fmt.Sprintf("%v-%v", at, min(at+r.cfg.MoveEvery, r.cfg.Duration))
		}
		intervals = append(intervals, norm(row, label))
	}
	for k, row := range b.since {
		if row.time == 0 {
			continue
		}
		label := fmt.Sprintf("+%v-%v", time.Duration(k)*breakdownStep, time.Duration(k+1)*breakdownStep)
		if k == breakdownRows {
			label = fmt.Sprintf("+%v-next shift", time.Duration(k)*breakdownStep)
		}
		since = append(since, norm(row, label))
	}
	return intervals, since
}

// writeBreakdown writes Result.Intervals and Result.SinceShift.
func (res *Result) writeBreakdown(w io.Writer) {
	if len(res.Intervals) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := func(first string) {
		fmt.Fprintf(tw, "%s\t", first)
		for _, n := range partNames {
			fmt.Fprintf(tw, "%s\t", n)
		}
		fmt.Fprintf(tw, "\n")
	}
	line := func(row BreakdownRow) {
		fmt.Fprintf(tw, "%s\t", row.Label)
		for _, v := range row.Parts {
			fmt.Fprintf(tw, "%.1f%%\t", 100*v)
		}
		fmt.Fprintf(tw, "\n")
	}
	fmt.Fprintf(w, "\ncapacity breakdown, %% of L over time, per interval between demand shifts:\n")
	head("interval")
	for _, row := range res.Intervals {
		line(row)
	}
	tw.Flush()
	if len(res.SinceShift) == 0 {
		return
	}
	fmt.Fprintf(w, "\nby time since a shift, over the %d shift%s after the warm-up and outside faults:\n", res.BreakdownShifts, plural(res.BreakdownShifts, "", "s"))
	head("since shift")
	for _, row := range res.SinceShift {
		line(row)
	}
	tw.Flush()
}
