package region

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// Rules of another algorithm than gcra (Config.Algorithm): fixed_window,
// sliding_window, sliding_log and leaky_bucket rules in mode exact, whose
// owner decides every request on the algorithm's own state
// (docs/overshoot.md). Their promise is not an envelope over B + r·Δ but
// equality with one instance of the algorithm: what the region admits is
// what one fixed window, sliding counter, log or queue admits when fed the
// region's admissions in the order the owners decided them. The check
// replays every identity's admissions, at the times the owners decided
// them, into a fresh instance of the algorithm (the replay), and counts the
// tokens the replay refuses (uncharged, so that one over-admission is
// counted once): the run's excess. It is 0 with no fault; a fault may add
// its term (faultTerms): the state an owner crash loses (at most the
// burst, which is the limit for the window and log algorithms and the
// queue's positions for a leaky bucket), a second owner while views
// disagree, and so on.
//
// The replay reads the simulator's clock: the owners' window boundaries
// follow their own clocks, so a run of fixed_window or sliding_window with a
// clock skew is refused, and a sliding_log or leaky_bucket run takes skew
// steps only (a fault, with a term of one burst).

// SimAlgorithms are the algorithms Config.Algorithm takes besides gcra.
var SimAlgorithms = []quota.Algorithm{quota.AlgorithmFixedWindow, quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog, quota.AlgorithmLeakyBucket, quota.AlgorithmConcurrency}

// ruleKind is the rule's mode, and its algorithm when not gcra.
func (c Config) ruleKind() string {
	if c.Algorithm == "" || c.Algorithm == quota.AlgorithmGCRA {
		return string(c.Mode)
	}
	return string(c.Mode) + " " + string(c.Algorithm)
}

// validateAlgorithm checks a run of another algorithm than gcra (c has its
// defaults).
func (c Config) validateAlgorithm() error {
	if c.Algorithm == quota.AlgorithmGCRA || c.Algorithm == quota.AlgorithmTokenBucket {
		return nil
	}
	switch {
	case c.Hold < 0:
		return fmt.Errorf("hold %v: want > 0", c.Hold)
	case !slices.Contains(SimAlgorithms, c.Algorithm):
		return fmt.Errorf("algorithm %q: want gcra or one of %v", c.Algorithm, SimAlgorithms)
	case c.Mode != quota.ModeExact:
		return fmt.Errorf("algorithm %s: the cluster decides it in mode exact only, not %s", c.Algorithm, c.Mode)
	case len(c.Rules) > 0:
		return fmt.Errorf("algorithm %s: extra rules (-rules) are gcra rules, simulated with a gcra main rule only", c.Algorithm)
	case c.Algorithm != quota.AlgorithmLeakyBucket && c.Burst != c.Limit:
		return fmt.Errorf("algorithm %s: burst %d: a window or a log holds its limit (%d); leave -burst unset", c.Algorithm, c.Burst, c.Limit)
	}
	for _, f := range c.Faults {
		switch {
		case f.Kind != FaultSkew, c.Algorithm == quota.AlgorithmConcurrency:
			// A slot lapses a window after it was taken on the owner's
			// clock: a skew moves no boundary.
		case c.Algorithm == quota.AlgorithmFixedWindow || c.Algorithm == quota.AlgorithmSlidingWindow:
			return fmt.Errorf("algorithm %s: a clock skew (%s) moves the owner's window boundaries for good, and the replay reads the simulator's clock: it would count every window it shifts", c.Algorithm, f.Text)
		case !f.Windowed:
			return fmt.Errorf("algorithm %s: a static clock skew (%s): the replay reads the simulator's clock; use a skew step (@time)", c.Algorithm, f.Text)
		}
	}
	return nil
}

// skipped reports whether a grid's config c is left out of a sweep: an
// algorithm other than gcra runs in mode exact only, and the window
// algorithms without clock skews (validateAlgorithm).
func (c Config) skipped() bool {
	if c.Algorithm == "" || c.Algorithm == quota.AlgorithmGCRA {
		return false
	}
	return c.Mode != quota.ModeExact || c.validateAlgorithm() != nil
}

// algoRef is one identity's instance of a rule's algorithm.
type algoRef interface {
	// admit decides a request of cost at now and counts it when admitted.
	admit(now, cost int64) bool
}

type fixedRef struct {
	fw bucket.FixedWindow
	st bucket.FixedState
}

func (f *fixedRef) admit(now, cost int64) bool { return f.fw.Step(&f.st, now, cost).Allowed }

type slidingRef struct {
	sw bucket.SlidingWindow
	st bucket.SlidingState
}

func (s *slidingRef) admit(now, cost int64) bool { return s.sw.Step(&s.st, now, cost).Allowed }

type logRef struct {
	l  bucket.SlidingLog
	st bucket.SlidingLogState
}

func (l *logRef) admit(now, cost int64) bool { return l.l.Step(&l.st, now, cost).Allowed }

type leakyRef struct {
	lk bucket.Leaky
	st bucket.Departure
}

func (l *leakyRef) admit(now, cost int64) bool { return l.lk.Step(&l.st, now, cost).Allowed }

// concRef is a concurrency limit whose every admitted request is held for
// hold: the reference in arrival order.
type concRef struct {
	n, hold int64
	ends    []int64 // of the requests in flight
}

func (r *concRef) admit(now, cost int64) bool {
	live := r.ends[:0]
	var n int64
	for _, e := range r.ends {
		if e > now {
			live = append(live, e)
			n++
		}
	}
	r.ends = live
	if n+cost > r.n {
		return false
	}
	for range cost {
		r.ends = append(r.ends, now+r.hold)
	}
	return true
}

// newAlgoRef returns a maker of fresh instances of c's algorithm.
func newAlgoRef(c Config) (func() algoRef, error) {
	switch c.Algorithm {
	case quota.AlgorithmFixedWindow:
		fw, err := bucket.NewFixedWindow(c.Limit, c.Window)
		return func() algoRef { return &fixedRef{fw: fw} }, err
	case quota.AlgorithmSlidingWindow:
		sw, err := bucket.NewSlidingWindow(c.Limit, c.Window)
		return func() algoRef { return &slidingRef{sw: sw} }, err
	case quota.AlgorithmSlidingLog:
		l, err := bucket.NewSlidingLog(c.Limit, c.Window)
		return func() algoRef { return &logRef{l: l} }, err
	case quota.AlgorithmLeakyBucket:
		lk, err := bucket.NewLeaky(c.Limit, c.Window, c.queueDelay())
		return func() algoRef { return &leakyRef{lk: lk} }, err
	case quota.AlgorithmConcurrency:
		hold := int64(c.Hold)
		return func() algoRef { return &concRef{n: c.Limit, hold: hold} }, nil
	}
	return nil, fmt.Errorf("algorithm %q: want gcra or one of %v", c.Algorithm, SimAlgorithms)
}

// queueDelay is a leaky_bucket rule's longest wait: quota's default for
// the run's limit and burst.
func (c Config) queueDelay() time.Duration {
	r := quota.Rule{Limit: c.Limit, Window: c.Window, Burst: c.Burst}
	return r.QueueDelay(c.Limit, c.Burst)
}

// algoBurst is the most an instance of c's algorithm holds: the limit of a
// window or a log, the queue's positions of a leaky bucket.
func (c Config) algoBurst() int64 {
	if c.Algorithm == quota.AlgorithmLeakyBucket {
		return int64(c.queueDelay()/(c.Window/time.Duration(c.Limit))) + 1
	}
	return c.Limit
}

// replayAdmit is one admission the replay check takes.
type replayAdmit struct {
	at       int64 // when the owner decided it (run time)
	seq      int   // record order, for equal times
	ident    int
	cost     int64
	degraded bool
}

// replay collects a non-gcra run's admissions and replays them.
type replay struct {
	fresh func() algoRef
	adm   []replayAdmit
}

func (p *replay) record(at int64, ident int, cost int64, degraded bool) {
	p.adm = append(p.adm, replayAdmit{at: at, seq: len(p.adm), ident: ident, cost: cost, degraded: degraded})
}

// replayed is what the replay refused beyond each identity's key cap term
// (the state its evicted owner entries held), for the identity where that
// is most: of the admissions the owners account for (on_failure decisions
// left out), of all of them, and of the accounted ones inside fault-free
// stretches; worst is the identity of acc (-1: none refused).
type replayed struct {
	acc, all, clean float64
	worst           int
}

// keep sets r's figures for an identity id whose own are acc, all and clean
// tokens, beyond its key cap term.
func (r *replayed) keep(id int, acc, all, clean int64, term float64) {
	if a := float64(acc) - term; a > r.acc {
		r.acc, r.worst = a, id
	}
	r.all, r.clean = max(r.all, float64(all)-term), max(r.clean, float64(clean)-term)
}

// run replays every identity's admissions in decision order; term is an
// identity's key cap term (nil: none).
func (p *replay) run(segs []segment, term []float64) replayed {
	slices.SortFunc(p.adm, func(a, b replayAdmit) int {
		return cmp.Or(cmp.Compare(a.ident, b.ident), cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq))
	})
	out := replayed{worst: -1}
	for i := 0; i < len(p.adm); {
		j := i
		for j < len(p.adm) && p.adm[j].ident == p.adm[i].ident {
			j++
		}
		accRef, allRef := p.fresh(), p.fresh()
		var acc, all, clean int64
		for _, a := range p.adm[i:j] {
			if !allRef.admit(T0+a.at, a.cost) {
				all += a.cost
			}
			if a.degraded {
				continue
			}
			if !accRef.admit(T0+a.at, a.cost) {
				acc += a.cost
				if inSegments(segs, a.at) {
					clean += a.cost
				}
			}
		}
		out.keep(p.adm[i].ident, acc, all, clean, termOf(term, p.adm[i].ident))
		i = j
	}
	return out
}

// inSegments reports whether t lies in one of segs (cleanSegments).
func inSegments(segs []segment, t int64) bool { return segIndex(segs, t) >= 0 }

// termOf is identity id's key cap term in term (0 for none).
func termOf(term []float64, id int) float64 {
	if id < len(term) {
		return term[id]
	}
	return 0
}

// slotSpan is an admitted concurrency request as its client saw it: from
// when the owner decided it to when the client released it (the owner
// holds its slot at least that long: the release reaches it later).
type slotSpan struct {
	from, to int64
	ident    int
	cost     int64
	degraded bool
}

// inFlight is the check of a concurrency run: the region's requests in
// flight per identity, counted over the clients' spans, against the limit.
// A span lies within its slot on the owner, so this count is at most the
// owner's.
type inFlight struct {
	limit int64
	spans []slotSpan
}

// run returns, for the identity where it is largest, how far the spans in
// flight at once passed the limit: accounted ones (on_failure decisions
// left out), all, and accounted ones at instants in fault-free stretches.
func (f *inFlight) run(segs []segment, term []float64) replayed {
	type edge struct {
		at    int64
		delta int64
	}
	by := map[int][]slotSpan{}
	var ids []int
	for _, s := range f.spans {
		if _, ok := by[s.ident]; !ok {
			ids = append(ids, s.ident)
		}
		by[s.ident] = append(by[s.ident], s)
	}
	slices.Sort(ids)
	out := replayed{worst: -1}
	most := func(spans []slotSpan, accounted bool) (over, clean int64) {
		var es []edge
		for _, s := range spans {
			if accounted && s.degraded {
				continue
			}
			es = append(es, edge{s.from, s.cost}, edge{s.to, -s.cost})
		}
		// Ends first at equal times: a span is [from, to).
		slices.SortFunc(es, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
		var cur int64
		for _, e := range es {
			cur += e.delta
			if e.delta > 0 && cur > f.limit {
				over = max(over, cur-f.limit)
				if inSegments(segs, e.at) {
					clean = max(clean, cur-f.limit)
				}
			}
		}
		return over, clean
	}
	for _, id := range ids {
		acc, clean := most(by[id], true)
		all, _ := most(by[id], false)
		out.keep(id, acc, all, clean, termOf(term, id))
	}
	return out
}

// algoResult sets res's upper checks for a rule of another algorithm than
// gcra: not an envelope, but the tokens one instance of the algorithm, fed
// the admissions in decision order, refuses, or the requests in flight
// beyond the limit; with the key cap, the same with no term (ExcessRaw).
func (rg *Region) algoResult(res *Result) {
	if rg.rep == nil && rg.spans == nil {
		return
	}
	ch := rg.chk
	run := func(term []float64) replayed {
		if rg.rep != nil {
			return rg.rep.run(ch.segs, term)
		}
		return rg.spans.run(ch.segs, term)
	}
	rp := run(ch.capTerm)
	res.ExcessAccounted, res.ExcessAll, res.ExcessClean = rp.acc, rp.all, rp.clean
	res.WorstID = ""
	if rp.worst >= 0 {
		res.WorstID = rg.ids.names[rp.worst]
	}
	if rg.cfg.KeyCap > 0 {
		raw := run(nil)
		res.ExcessRaw, res.RawID, res.RawTerm = raw.acc, "", 0
		if raw.worst >= 0 {
			res.RawID, res.RawTerm = rg.ids.names[raw.worst], ch.capTerm[raw.worst]
		}
	}
}
