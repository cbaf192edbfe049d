package region

import (
	"math"
	"slices"

	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// Traffic generators are events that issue one request when they fire and
// schedule their next firing; they stop at the end of the run's traffic.
// Nodes are chosen among the initial nodes; a request for a node that is
// down or has left goes to the next serving node, as a load balancer would
// send it.

// periodic issues one identity's requests every period, at the nodes a
// picker chooses.
type periodic struct {
	rg     *Region
	ident  int
	period float64 // ns
	start  int64
	k      int64
	pick   func(k int64) int
}

func (p *periodic) Fire(s *engine.Sim) {
	p.rg.arrive(p.ident, p.pick(p.k))
	p.k++
	next := p.start + int64(math.Round(float64(p.k)*p.period))
	if next < p.rg.trafficEnd {
		s.At(next, p)
	}
}

// bursty issues Load × limit requests of one identity once per window,
// evenly spread over the window's first tenth.
type bursty struct {
	rg      *Region
	ident   int
	n       int64 // requests per burst
	window  int64
	spacing float64
	start   int64
	k       int64
	rr      int64
}

func (b *bursty) Fire(s *engine.Sim) {
	b.rg.arrive(b.ident, int(b.rr%int64(b.rg.cfg.Nodes)))
	b.rr++
	b.k++
	burst, i := b.k/b.n, b.k%b.n
	next := b.start + burst*b.window + int64(math.Round(float64(i)*b.spacing))
	if next < b.rg.trafficEnd {
		s.At(next, b)
	}
}

// pulse issues one identity's requests at one node every spacing ns
// during the first on ns of each period of length every, the periods
// aligned on multiples of every counted from time 0 as the sketch's are.
type pulse struct {
	rg                *Region
	ident, node       int
	spacing           float64
	every, on, offset int64
	base              int64 // start of the current period
	k                 int64 // requests issued in it
}

func (p *pulse) Fire(s *engine.Sim) {
	p.rg.arrive(p.ident, p.node)
	p.k++
	next := p.base + p.offset + int64(math.Round(float64(p.k)*p.spacing))
	if next >= p.base+p.on {
		p.base += p.every
		p.k = 0
		next = p.base + p.offset
	}
	if next < p.rg.trafficEnd {
		s.At(next, p)
	}
}

// poisson issues requests at exponential intervals; ident < 0 draws each
// request's identity from zipf.
type poisson struct {
	rg    *Region
	ident int
	mean  float64 // ns between requests
	zipf  *zipf
}

func (p *poisson) Fire(s *engine.Sim) {
	r := s.PCG()
	id := p.ident
	if p.zipf != nil {
		id = int(p.zipf.Uint64())
	}
	p.rg.arrive(id, r.IntN(p.rg.cfg.Nodes))
	next := s.Now() + max(int64(r.ExpFloat64()*p.mean), 1)
	if next < p.rg.trafficEnd {
		s.At(next, p)
	}
}

// startTraffic schedules the generators of the configured kind.
func (rg *Region) startTraffic() {
	c := &rg.cfg
	s := rg.sim
	n := c.Nodes
	perNS := c.rate() / 1e9 // tokens per ns
	period := 1 / (c.Load * perNS / float64(c.Cost))
	switch c.Traffic {
	case TrafficConstant:
		for i := range c.IDs {
			start := rg.t0 + int64(float64(i)*period/float64(c.IDs))
			off := int64(i)
			s.At(start, &periodic{rg: rg, ident: i, period: period, start: start,
				pick: func(k int64) int { return int((k + off) % int64(n)) }})
		}
	case TrafficSaturate:
		for i := range c.IDs {
			for j := range n {
				start := rg.t0 + int64(float64(i*n+j)*period/float64(c.IDs*n))
				node := j
				s.At(start, &periodic{rg: rg, ident: i, period: period, start: start,
					pick: func(int64) int { return node }})
			}
		}
	case TrafficOneNode:
		for i := range c.IDs {
			node := rg.spreadOrder(i)[0]
			start := rg.t0 + int64(float64(i)*period/float64(c.IDs))
			s.At(start, &periodic{rg: rg, ident: i, period: period, start: start,
				pick: func(int64) int { return node }})
		}
	case TrafficUneven:
		for i := range c.IDs {
			order := rg.spreadOrder(i)
			weights := []int{80, 15, 5}[:min(3, n)]
			w := newSmoothWRR(weights)
			start := rg.t0 + int64(float64(i)*period/float64(c.IDs))
			s.At(start, &periodic{rg: rg, ident: i, period: period, start: start,
				pick: func(int64) int { return order[w.next()] }})
		}
	case TrafficBursty:
		for i := range c.IDs {
			cnt := max(int64(math.Ceil(c.Load*float64(c.Limit)/float64(c.Cost))), 1)
			win := int64(c.Window)
			start := rg.t0 + int64(i)*win/int64(c.IDs)
			s.At(start, &bursty{rg: rg, ident: i, n: cnt, window: win,
				spacing: float64(win) / 10 / float64(cnt), start: start, rr: int64(i)})
		}
	case TrafficPoisson:
		for i := range c.IDs {
			p := &poisson{rg: rg, ident: i, mean: period}
			s.At(rg.t0+int64(s.Rand().ExpFloat64()*period), p)
		}
	case TrafficPulse:
		every := c.pulsePeriod()
		on := every - c.pulseQuiet()
		base := rg.t0 / every * every
		for i := range c.IDs {
			for j := range n {
				off := int64(float64(i*n+j) * period / float64(c.IDs*n))
				if off >= on { // requests further apart than the burst lasts
					off = 0
				}
				p := &pulse{rg: rg, ident: i, node: j, spacing: period, every: every, on: on, offset: off, base: base}
				for p.base+off < rg.t0 {
					p.base += every
				}
				s.At(p.base+off, p)
			}
		}
	case TrafficZipf:
		z := newZipf(s.PCG(), c.ZipfS, 1, uint64(c.IDs-1))
		mean := 1e9 / c.Rate
		s.At(rg.t0, &poisson{rg: rg, ident: -1, mean: mean, zipf: z})
	}
}

// pulsePeriod is the period of pulse traffic: the sketch period, or the
// window without gating (ns).
func (c *Config) pulsePeriod() int64 {
	if c.Sketch > 0 {
		return int64(c.SketchPeriod)
	}
	return int64(c.Window)
}

// pulseQuiet is the quiet end of each period of pulse traffic: B·T for the
// owner's bucket to refill, and two syncs, a decide timeout and four ticks
// for the entries to be dropped (ns).
func (c *Config) pulseQuiet() int64 {
	return c.Burst*int64(c.Window)/c.Limit + int64(2*c.Sync+c.DecideTimeout+4*c.Tick)
}

// saturating reports whether the configured traffic keeps every identity's
// demand at or above its rule's rate all the time, so that docs/overshoot.md's
// lower bound applies: the saturating client, and the deterministic kinds
// offering at least twice the rate.
func (c *Config) saturating() bool {
	switch c.Traffic {
	case TrafficSaturate:
		return c.Load >= 1
	case TrafficConstant, TrafficOneNode, TrafficUneven:
		return c.Load >= 2
	}
	return false
}

// checksLower reports whether the run checks the lower bound: for
// saturating traffic with one rule. With several rules a rule's admissions
// are held down by the others too (a request another rule rejects is
// refunded), so no rule's shortfall is bounded by its own terms.
func (c *Config) checksLower() bool {
	return c.saturating() && len(c.Rules) == 0 && (c.Algorithm == "" || c.Algorithm == quota.AlgorithmGCRA)
}

// spreadOrder returns the initial nodes for identity i, non-owners first
// (by index), its initial owner last: the busiest share of uneven traffic
// lands on a node that must sync, the interesting case.
func (rg *Region) spreadOrder(i int) []int {
	owner := rg.initialRing.OwnerName(rg.ids.names[i])
	order := make([]int, 0, rg.cfg.Nodes)
	for j := range rg.cfg.Nodes {
		if nodeName(j) != owner {
			order = append(order, j)
		}
	}
	if o := slices.Index(rg.names, owner); o >= 0 && o < rg.cfg.Nodes {
		order = append(order, o)
	}
	return order
}

// smoothWRR is nginx's smooth weighted round robin: deterministic, and it
// interleaves (80/15/5 gives no long runs on one node).
type smoothWRR struct{ w, cur []int }

func newSmoothWRR(w []int) *smoothWRR { return &smoothWRR{w: w, cur: make([]int, len(w))} }

func (s *smoothWRR) next() int {
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
