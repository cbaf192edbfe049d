package region

import (
	"math"
	"time"

	"github.com/weir-dev/weir/quota"
)

// Span is an interval of run time, from the start of traffic.
type Span struct{ From, To time.Duration }

// RingChange is a ring a node installed during the run: its view of the
// members changed (a crash or leave detected, a join or heal learnt).
type RingChange struct {
	At      time.Duration // run time
	Node    string
	Epoch   uint64
	Members int
}

// plotBin is the default width of the rate series' bins: one second, or
// coarser so that a bin holds at least 20 tokens at the rule's rate and a
// run has at most 300 bins, or finer for a run shorter than 10 s (at
// least 10 bins), always a round step of 100 ms, 200 ms, 500 ms, 1 s, 2 s,
// 5 s, 10 s, 15 s, 30 s, 1 m and so on. Bins of a tenth of a second at
// 10/s hold 0, 1 or 2 tokens each, a band of noise; bins of 20 tokens or
// more read as a rate.
func plotBin(duration time.Duration, rate float64) time.Duration {
	floor := min(time.Second, duration/10)
	lo := max(floor, duration/300, 100*time.Millisecond)
	if rate > 0 && !math.IsInf(rate, 0) {
		lo = max(lo, time.Duration(20/rate*float64(time.Second)))
	}
	steps := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second}
	for _, s := range steps {
		if s >= lo {
			return s
		}
	}
	step := time.Minute
	for _, m := range []time.Duration{1, 2, 5, 10, 15, 30, 60} {
		if step = m * time.Minute; step >= lo {
			return step
		}
	}
	for step < lo {
		step *= 2
	}
	return step
}

// rateSeries is the run's admissions in bins of Config.Bin: the cluster's,
// the reference's, on_failure's, and the envelope's bound on each bin.
//
// The bound counts what each identity offered, since an identity admits no
// more than it asks for: a decision is recorded at the time its owner made
// it, up to lag after the request arrived, so a request counts towards the
// bound of every bin from its arrival's to lag later's. Each identity keeps
// those counts for the k + 1 bins a request can reach, in a ring.
type rateSeries struct {
	bin                    int64
	cluster, ref, fallback []int64
	bound                  []float64 // nil: the envelope is not checked
	env                    []float64 // per bin: B + r·Δ + S, or the fault bound
	lag                    int64
	k                      int
	next                   []int32 // per identity: 1 + the first bin not yet flushed, 0 none
	reach                  []int64 // per identity, k + 1 counts by bin mod k + 1
	rings                  []RingChange
	faultFree              []Span
	capTerm                func(ident int) float64 // the key cap term so far (nil: none)
}

// newSeries sizes the series of a run of n bins and, for a rule the
// envelope checks (gcra, token_bucket), derives each bin's bound per
// identity: B + r·Δ + S inside a fault-free stretch, B + r·Δ plus the fault
// bound (S_f and the terms) elsewhere, each plus the sketch term of a gated
// rule, Δ the bin's width.
func (rg *Region) newSeries(n int) {
	c := &rg.cfg
	s := &rg.series
	s.bin = int64(c.Bin)
	s.cluster, s.ref, s.fallback = make([]int64, n), make([]int64, n), make([]int64, n)
	for _, seg := range rg.chk.segs {
		s.faultFree = append(s.faultFree, Span{time.Duration(seg.from), time.Duration(seg.to)})
	}
	if c.Algorithm != quota.AlgorithmGCRA && c.Algorithm != quota.AlgorithmTokenBucket {
		return
	}
	faultBound := float64(rg.sClean)
	if len(rg.terms) > 0 {
		faultBound = float64(rg.sFault)
		for _, t := range rg.terms {
			faultBound += t.Tokens
		}
	}
	s.bound, s.env = make([]float64, n), make([]float64, n)
	for b := range n {
		from, to := int64(b)*s.bin, int64(b+1)*s.bin
		x := faultBound
		if i := segIndex(rg.chk.segs, from); i >= 0 && rg.chk.segs[i].to >= to {
			x = float64(rg.sClean)
		}
		if c.Sketch > 0 {
			periods := (s.bin + int64(c.SketchPeriod) - 1) / int64(c.SketchPeriod)
			x += float64(int64(rg.sketchN)*rg.sketchTheta) * float64(periods+1)
		}
		s.env[b] = float64(c.Burst) + c.rate()*time.Duration(s.bin).Seconds() + x
	}
	// A decision is recorded at its owner's time, at most a horizon after
	// its request arrived (newRegion).
	s.lag = rg.horizon
	s.k = int((s.lag + s.bin - 1) / s.bin)
	s.next, s.reach = make([]int32, c.IDs), make([]int64, c.IDs*(s.k+1))
	if c.KeyCap > 0 {
		s.capTerm = func(i int) float64 { return rg.chk.capTerm[i] }
	}
}

// offered counts cost tokens that identity ident asked for at run time t
// (requests arrive in time order) towards the bounds of the bins its
// decision may fall in.
func (s *rateSeries) offered(ident int, t, cost int64) {
	if s.bound == nil {
		return
	}
	b0, b1 := int(t/s.bin), min(int((t+s.lag)/s.bin), len(s.bound)-1)
	s.flushBefore(ident, b0)
	w := s.reach[ident*(s.k+1) : (ident+1)*(s.k+1)]
	for b := b0; b <= b1; b++ {
		w[b%(s.k+1)] += cost
	}
}

// flushBefore adds identity ident's share to the bound of each of its bins
// before bin upTo: what it offered there, at most the envelope.
func (s *rateSeries) flushBefore(ident, upTo int) {
	if s.next[ident] == 0 {
		s.next[ident] = int32(upTo) + 1
		return
	}
	w := s.reach[ident*(s.k+1) : (ident+1)*(s.k+1)]
	first := int(s.next[ident]) - 1
	// Only the k + 1 bins from first can hold counts.
	for b := first; b < upTo && b <= first+s.k && b < len(s.bound); b++ {
		slot := b % (s.k + 1)
		if w[slot] == 0 {
			continue
		}
		env := s.env[b]
		if s.capTerm != nil {
			env += s.capTerm(ident)
		}
		s.bound[b] += min(float64(w[slot]), env)
		w[slot] = 0
	}
	s.next[ident] = int32(max(upTo, first)) + 1
}

// finish flushes every identity's last bins.
func (s *rateSeries) finish() {
	for i := range s.next {
		if s.next[i] != 0 {
			s.flushBefore(i, len(s.bound))
		}
	}
}
