package region

import (
	"fmt"
	"math"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/internal/policy"
	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// ruleID is the main rule of a run (the only one, without Config.Rules).
const ruleID = "sim"

// T0 is the virtual time at which every run starts: a plausible unix time
// in nanoseconds, as the production clock reads, so that a clock skewed
// backwards stays positive.
const T0 = int64(1_800_000_000) * int64(time.Second)

// Region is one run in progress: the nodes, the network, the traffic, the
// reference buckets and the checks.
type Region struct {
	cfg        Config
	sim        *engine.Sim
	net        *engine.Network
	t0         int64
	trafficEnd int64 // no request arrives at or after
	end        int64 // the run stops here (traffic end plus a drain)
	nodes      []*node
	names      []string // nodeNames.names
	nodeNames  *idNames // the nodes' names, indexed by where their bytes lie
	byName     map[string]int
	pending    [][]pairChange
	params     cluster.RuleParams
	ref        bucket.GCRA
	ids        *idNames // the identities' names
	refTAT     []bucket.TAT
	// A rule of another algorithm than gcra (algorithms.go): the arrival
	// order reference's instance per identity (made on first use), and
	// the replay check.
	altRef      []algoRef
	altFresh    func() algoRef
	rep         *replay
	spans       *inFlight // a concurrency rule's check instead of rep
	initialRing *cluster.Ring
	chk         *checker
	horizon     int64
	baseLoss    float64
	freeX       *exchange           // exchanges to reuse
	owners      map[string][]string // owner caches by member set (tableOf)
	// tickLane and flushLane queue the nodes' ticks and linger flushes:
	// each is scheduled a fixed delay ahead, so in firing order.
	tickLane, flushLane *engine.Lane

	requests, unserved, refAdmitted, admitted int64
	degraded, degradedAdmitted                int64
	bySource                                  [cluster.NumSources]int64
	exchanges, replies, failedExchanges       uint64
	breakerOpens, ringChanges                 uint64
	maxLate                                   int64 // the longest ready-to-reply time (Result.Ell)
	series                                    rateSeries
	windows                                   []segment
	terms                                     []Term
	sClean, sFault, slack                     int64
	sView                                     int64 // the most slack one node may hold (key cap term)
	// Key cap runs: views[i] counts identity i's node entries evicted
	// with a view so far; maxForgiven is the largest debt one eviction
	// forgave, capBreaks the forgiven evictions above B + S_f + s·views.
	views                  []int64
	maxForgiven, capBreaks int64
	// The sketch term N·θ_eff·(⌈Δ/P⌉ + 1): sketchN the sketches that may
	// admit for an identity (node incarnations), sketchTheta θ_eff.
	sketchN                   int
	sketchTheta               int64
	liveMin, liveMax, sideMin int

	// A multi-rule run (Config.Rules, rules.go): every rule, the main one
	// first; the coordinators' rules; the request policy's view of them.
	multi       bool
	rules       []*ruleRun
	allParams   []cluster.RuleParams
	policyRules []policy.Rule
	// Refunds asked of remote owners (refunds.go), in deadline order and
	// by node, rule and identity.
	asks    []*askedRefund
	askedBy map[askKey][]*askedRefund
}

// Term is a fault term of the envelope: the extra tokens a fault may admit
// over B + r·Δ + S, and how it was derived (docs/overshoot.md).
type Term struct {
	Fault  string
	Tokens float64
	Why    string
}

// bucketFor returns the coordinator's main rule of c.
func bucketFor(c Config) (cluster.RuleParams, error) { return bucketForID(c, ruleID) }

// bucketForID returns the coordinator's rule id with c's rule settings.
func bucketForID(c Config, id string) (cluster.RuleParams, error) {
	algo := c.Algorithm
	if algo == "" {
		algo = quota.AlgorithmGCRA
	}
	r := quota.Rule{ID: id, Algorithm: algo, Mode: c.Mode, Limit: c.Limit, Window: c.Window,
		Burst: c.Burst, Accuracy: c.Accuracy, OnFailure: c.OnFailure}
	if algo == quota.AlgorithmLeakyBucket {
		r.MaxDelay = c.queueDelay()
	}
	if c.Sketch > 0 {
		r.Sketch = &quota.Sketch{Threshold: c.Sketch, Period: c.SketchPeriod}
	}
	p, err := cluster.NewRuleParams(&r, 1)
	if err != nil {
		return p, fmt.Errorf("rule: %w", err)
	}
	if p.Scheme, err = cluster.ParseSlackScheme(c.Scheme); err != nil {
		return p, fmt.Errorf("slack scheme: %w", err)
	}
	p.TrackAll = c.TrackAll
	return p, nil
}

// newRegion builds a run from a validated config with defaults.
func newRegion(c Config) *Region {
	rg := &Region{cfg: c, t0: T0, byName: map[string]int{}}
	rg.sim = engine.New(T0, c.Seed)
	rg.net = engine.NewNetwork(rg.sim, c.Nodes, c.Latency)
	rg.tickLane, rg.flushLane = rg.sim.Lane(), rg.sim.Lane()
	rg.trafficEnd = T0 + int64(c.Duration)
	rg.end = rg.trafficEnd + int64(c.CallTimeout+c.DecideTimeout+c.Linger) + 2*int64(c.Tick)
	if k := int64(len(c.Rules) + 1); k > 1 {
		// Each rule of a request may wait for its owner in turn.
		rg.end = rg.trafficEnd + k*int64(c.CallTimeout+c.DecideTimeout+c.Linger+2*c.Tick)
	}
	// An admission is recorded when its result reaches the asking node,
	// at the time the owner decided it: at most two call timeouts later (a
	// result may wait in a backlog behind an exchange in flight, which
	// returns within its call timeout, then makes its own trip, which
	// arrives within its call timeout or not at all).
	rg.horizon = int64(2*c.CallTimeout+c.Linger) + int64(time.Millisecond)
	if k := int64(len(c.Rules) + 1); k > 1 {
		// A multi-rule request's charges are recorded when the request
		// ends: after each of its rules had its answer (at most a decide
		// timeout and a tick each, the last one's result a reply later).
		rg.horizon = k*int64(2*c.CallTimeout+c.DecideTimeout+c.Linger+2*c.Tick) + int64(time.Millisecond)
		// A charge whose refund was asked of its owner is held until the
		// owner gives it back or no longer can (refunds.go).
		rg.horizon += c.askLife()
	}
	rg.params, _ = bucketFor(c)
	rg.ref, _ = bucket.NewGCRA(c.Limit, c.Window, c.Burst)
	total := c.Nodes + countJoins(c.Faults)
	rg.net.Grow(total)
	rg.nodeNames = newNames("n", total)
	rg.names = rg.nodeNames.names
	for i, name := range rg.names {
		rg.byName[name] = i
	}
	rg.pending = make([][]pairChange, total)
	for i := range total {
		rg.pending[i] = make([]pairChange, total)
		n := &node{rg: rg, id: i, name: rg.names[i], replyAt: -1}
		rg.nodes = append(rg.nodes, n)
	}
	rg.ids = newIDNames(c.IDs)
	rg.refTAT = make([]bucket.TAT, c.IDs)
	if c.Algorithm != quota.AlgorithmGCRA {
		rg.altFresh, _ = newAlgoRef(c)
		rg.altRef = make([]algoRef, c.IDs)
		if c.Algorithm == quota.AlgorithmConcurrency {
			rg.spans = &inFlight{limit: c.Limit}
		} else {
			rg.rep = &replay{fresh: rg.altFresh}
		}
	}
	var ms []cluster.Member
	for i := range c.Nodes {
		ms = append(ms, cluster.Member{Name: rg.names[i], Addr: rg.names[i]})
	}
	rg.initialRing, _ = cluster.NewRing(1, ms)
	rg.deriveTerms()
	rg.chk = newChecker(c.IDs, c.rate()/1e9, cleanSegments(rg.windows, rg.end-T0), int64(c.Duration), c.checksLower())
	if c.Sketch > 0 {
		rg.chk.gate(float64(int64(rg.sketchN)*rg.sketchTheta), int64(c.SketchPeriod))
	}
	if c.KeyCap > 0 {
		rg.chk.capTerm = make([]float64, c.IDs)
		rg.views = make([]int64, c.IDs)
	}
	if len(c.Rules) > 0 {
		rg.setupRules()
	}
	rg.newSeries(int((rg.end-T0)/int64(c.Bin)) + 1)
	return rg
}

// Run simulates one region under cfg and returns what it measured.
func Run(cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rg := newRegion(cfg.withDefaults())
	rg.run()
	return rg.result(), nil
}

func (rg *Region) run() {
	c := &rg.cfg
	// Static skews and the latency apply from the start.
	for _, f := range c.Faults {
		switch {
		case f.Kind == FaultSkew && !f.Windowed:
			rg.nodes[rg.byName[f.Node]].skew += int64(f.Skew)
		case f.Kind == FaultLatency:
			rg.net.SetLatency(f.Latency)
		case f.Kind == FaultLoss && !f.Windowed:
			rg.baseLoss = f.Loss
			rg.net.SetLoss(f.Loss)
		}
	}
	// The region is formed before traffic starts: every initial node's
	// view holds every initial node.
	for i := range c.Nodes {
		for j := range c.Nodes {
			if i != j {
				rg.pending[i][j] = pairChange{want: true}
			}
		}
	}
	for i := range c.Nodes {
		view := make([]bool, len(rg.nodes))
		for j := range c.Nodes {
			view[j] = j != i
		}
		n := rg.nodes[i]
		n.start(view)
		n.epoch = 1
		n.coord.SetTable(n.now(), rg.tableOf(n, 1))
	}
	for _, f := range sortFaults(c.Faults) {
		rg.scheduleFault(f)
	}
	rg.startTraffic()
	if c.Progress != nil {
		for k := 1; k <= 10; k++ {
			at := rg.t0 + int64(c.Duration)*int64(k)/10
			rg.sim.At(at, engine.EventFunc(func(s *engine.Sim) {
				c.Progress(time.Duration(s.Now()-rg.t0), c.Duration)
			}))
		}
	}
	rg.sim.Run(rg.end)
	if rg.multi {
		for _, n := range rg.nodes {
			n.dropRules() // requests still waiting at the end
		}
		rg.settleAsks(0, true)
		for _, rr := range rg.rules[1:] {
			rr.chk.finish()
		}
	}
	rg.chk.finish()
	rg.series.finish()
}

// tickPhase spreads the nodes' ticks over one tick interval, so that they
// do not all fire at once (they do not in production either).
func (rg *Region) tickPhase(i int) int64 {
	return int64(rg.cfg.Tick) * int64(i+1) / int64(len(rg.nodes)+1)
}

func (rg *Region) elapsed() time.Duration { return time.Duration(rg.sim.Now() - rg.t0) }

func (rg *Region) logf(format string, args ...any) {
	if rg.cfg.Log != nil {
		fmt.Fprintf(rg.cfg.Log, "%v ", rg.elapsed())
		fmt.Fprintf(rg.cfg.Log, format+"\n", args...)
	}
}

// scheduleFault turns one fault into events.
func (rg *Region) scheduleFault(f Fault) {
	at := rg.t0 + int64(f.At)
	switch f.Kind {
	case FaultCrash:
		n := rg.nodes[rg.byName[f.Node]]
		rg.sim.At(at, engine.EventFunc(func(*engine.Sim) {
			rg.logf("crash %s", n.name)
			n.stop()
			rg.topologyChanged(false)
		}))
	case FaultRestart, FaultJoin:
		n := rg.nodes[rg.byName[f.Node]]
		rg.sim.At(at, engine.EventFunc(func(*engine.Sim) {
			rg.logf("%s %s", f.Kind, n.name)
			// A new process knows only itself until gossip tells it more
			// (the gateway starts with a ring of itself).
			for j := range rg.pending[n.id] {
				rg.pending[n.id][j] = pairChange{}
			}
			n.start(make([]bool, len(rg.nodes)))
			rg.topologyChanged(false)
		}))
	case FaultLeave:
		n := rg.nodes[rg.byName[f.Node]]
		rg.sim.At(at, engine.EventFunc(func(s *engine.Sim) {
			rg.logf("leave %s", n.name)
			// Shell.Leave: hand every owned bucket to its owner in the
			// ring without this node, report all spend, send at once.
			rest := make([]bool, len(n.member))
			copy(rest, n.member)
			var ms []cluster.Member
			for j, in := range rest {
				if in {
					ms = append(ms, cluster.Member{Name: rg.names[j], Addr: rg.names[j]})
				}
			}
			if next, err := cluster.NewRing(n.epoch+1, ms); err == nil && next.Len() > 0 {
				n.coord.HandoffAll(n.now(), next)
			} else {
				n.coord.FlushAll(n.now())
			}
			n.flushDirect()
			n.serving = false
			rg.topologyChanged(true)
			// It stops once the leave has spread (memberlist's Leave
			// waits for its broadcast before Shutdown).
			s.After(int64(rg.cfg.Gossip+rg.cfg.CallTimeout), engine.EventFunc(func(*engine.Sim) {
				n.stop()
				rg.topologyChanged(true)
			}))
		}))
	case FaultPartition:
		end := rg.t0 + int64(f.End)
		var id int
		rg.sim.At(at, engine.EventFunc(func(*engine.Sim) {
			rg.logf("partition %s", f.Text)
			id = rg.net.Partition(rg.groupsOf(f))
			rg.topologyChanged(false)
		}))
		rg.sim.At(end, engine.EventFunc(func(*engine.Sim) {
			rg.logf("heal %s", f.Text)
			rg.net.Heal(id)
			rg.topologyChanged(false)
		}))
	case FaultLoss:
		if f.Windowed {
			rg.sim.At(at, engine.EventFunc(func(*engine.Sim) { rg.net.SetLoss(f.Loss) }))
			rg.sim.At(rg.t0+int64(f.End), engine.EventFunc(func(*engine.Sim) { rg.net.SetLoss(rg.baseLoss) }))
		}
	case FaultSkew:
		if f.Windowed {
			n := rg.nodes[rg.byName[f.Node]]
			rg.sim.At(at, engine.EventFunc(func(*engine.Sim) {
				rg.logf("clock step %s %v", n.name, f.Skew)
				n.skew += int64(f.Skew)
			}))
		}
	}
}

// nodeIndex returns the index of the node named name ("n" and its index,
// nodeName): the coordinators address their messages with the names of
// rg.names, whose index follows from where their bytes lie; any other
// string is parsed (nodeNames.index), not looked up in a map, as every
// exchange needs it.
func (rg *Region) nodeIndex(name string) (int, bool) {
	if i := rg.nodeNames.at(name); i >= 0 {
		return i, true
	}
	return rg.nodeNames.parse(name)
}

// parseIndex parses the decimal index after prefix in s (at most 9
// digits, no sign, no leading zero unless it is 0). What it accepts is
// prefix and strconv.Itoa of the index, nothing else: a name it parses to
// i is the name made for i.
func parseIndex(s, prefix string) (int, bool) {
	if len(s) <= len(prefix) || len(s) > len(prefix)+9 {
		return 0, false
	}
	for j := 0; j < len(prefix); j++ { // byte by byte: no call for a short prefix
		if s[j] != prefix[j] {
			return 0, false
		}
	}
	d := s[len(prefix):]
	if len(d) > 1 && d[0] == '0' {
		return 0, false
	}
	i := 0
	for j := 0; j < len(d); j++ {
		c := d[j]
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	return i, true
}

// groupsOf returns each node's side of a partition: its group's index, or
// one more for nodes in no group.
func (rg *Region) groupsOf(f Fault) []int {
	g := make([]int, len(rg.nodes))
	for i := range g {
		g[i] = len(f.Groups)
	}
	for gi, grp := range f.Groups {
		for _, name := range grp {
			if i, ok := rg.byName[name]; ok {
				g[i] = gi
			}
		}
	}
	return g
}

// arrive is a request of identity ident at node k (or, if k is down, the
// next serving node).
func (rg *Region) arrive(ident, k int) {
	vnow := rg.sim.Now()
	cost := rg.cfg.Cost
	rg.requests++
	var refOK bool
	switch {
	case rg.multi:
		refOK = rg.refPolicy(int32(ident), vnow, cost)
	case rg.altRef != nil:
		if rg.altRef[ident] == nil {
			rg.altRef[ident] = rg.altFresh()
		}
		refOK = rg.altRef[ident].admit(vnow, cost)
	default:
		refOK = rg.ref.Allow(&rg.refTAT[ident], vnow, cost).Allowed()
	}
	if refOK {
		rg.refAdmitted += cost
		rg.series.ref[(vnow-rg.t0)/rg.series.bin] += cost
	}
	rg.series.offered(ident, vnow-rg.t0, cost)
	n := len(rg.nodes)
	for range n {
		if nd := rg.nodes[k]; nd.up && nd.serving {
			if rg.multi {
				nd.requestRules(ident, cost)
			} else {
				nd.request(ident, cost)
			}
			if rg.requests&1023 == 0 {
				rg.drain(vnow - rg.t0 - rg.horizon)
			}
			return
		}
		k = (k + 1) % n
	}
	rg.unserved++
}

// drain feeds every checker the admissions up to upTo (run time).
func (rg *Region) drain(upTo int64) {
	if rg.multi {
		rg.settleAsks(rg.sim.Now(), false)
	}
	rg.chk.drain(upTo)
	for i := 1; i < len(rg.rules); i++ {
		rg.rules[i].chk.drain(upTo)
	}
}

// outcome records a decision for ident made at virtual time at.
func (rg *Region) outcome(ident int, at int64, o *cluster.Outcome, cost int64) {
	if o.Degraded {
		rg.degraded++
	}
	if !o.Allowed {
		return
	}
	rg.admitted += cost
	rg.bySource[o.Source] += cost
	b := (at - rg.t0) / rg.series.bin
	if o.Degraded {
		rg.degradedAdmitted += cost
		rg.series.fallback[b] += cost
	}
	rg.series.cluster[b] += cost
	rg.chk.record(at-rg.t0, ident, cost, o.Degraded, o.Source == cluster.SourceSketch)
	if rg.rep != nil {
		rg.rep.record(at-rg.t0, ident, cost, o.Degraded)
	}
}

// evicted charges a key cap eviction's term to its identity: the debt an
// owner bucket forgave, or s for a node entry evicted with its view
// (docs/overshoot.md, the key cap row of "Fault terms").
func (rg *Region) evicted(ev cluster.Eviction) {
	if ev.Idle || rg.chk.capTerm == nil {
		return
	}
	i, ok := parseIndex(ev.Identity, "id-")
	if !ok || i >= len(rg.ids.names) {
		return
	}
	t := float64(ev.Forgiven)
	if ev.Owner {
		// The derived bound on one bucket's debt: B + S_f, plus s for
		// each view of the identity evicted before.
		rg.maxForgiven = max(rg.maxForgiven, ev.Forgiven)
		B := rg.cfg.Burst
		if rg.cfg.Algorithm != quota.AlgorithmGCRA {
			B = rg.cfg.algoBurst() // the most one instance's state holds
		}
		if ev.Forgiven > B+rg.sFault+rg.sView*rg.views[i] {
			rg.capBreaks++
		}
	} else {
		t = float64(rg.sView)
		rg.views[i]++
	}
	rg.chk.capTerm[i] += t
}

// deriveTerms computes S, the fault windows and the fault terms of the
// envelope (docs/overshoot.md derives each).
func (rg *Region) deriveTerms() {
	c := &rg.cfg
	nMax := c.Nodes + countJoins(c.Faults)
	rg.liveRange(nMax)
	rg.deriveSlack(nMax)
	if c.Sketch > 0 {
		rg.sketchGating(nMax)
	}
	rg.faultTerms(nMax)
}

// liveRange sets the fewest and the most live nodes the fault schedule
// passes through, and the smallest side a partition leaves among nMax
// nodes (the initial ones and every join): the view sizes S depends on.
func (rg *Region) liveRange(nMax int) {
	c := &rg.cfg
	live, liveMin, liveMax := c.Nodes, c.Nodes, c.Nodes
	sideMin := nMax
	for _, f := range sortFaults(c.Faults) {
		switch f.Kind {
		case FaultCrash, FaultLeave:
			live--
		case FaultRestart, FaultJoin:
			live++
		case FaultPartition:
			for _, g := range rg.groupsOfN(f, nMax) {
				sideMin = min(sideMin, g)
			}
		}
		liveMin, liveMax = min(liveMin, live), max(liveMax, live)
	}
	rg.liveMin, rg.liveMax, rg.sideMin = liveMin, liveMax, sideMin
}

// deriveSlack sets the initial per-node slack and the S figures of the
// envelope: S in fault-free stretches (sClean), S while views disagree
// (sFault) and the most slack one node may then hold (sView). It needs
// liveRange's counts.
func (rg *Region) deriveSlack(nMax int) {
	c := &rg.cfg
	p := &rg.params
	rg.slack = p.Slack(c.Nodes)
	// S in fault-free stretches: the largest (n−1)·sᵢ(n) over the live
	// counts the run passes through.
	for n := max(rg.liveMin, 1); n <= rg.liveMax; n++ {
		rg.sClean = max(rg.sClean, p.RegionSlack(n))
	}
	// S while views disagree: any node may use the slack of the smallest
	// view that still has a remote owner (a view of one owns everything).
	// Under demand-following slack a node may hold the largest grant of
	// any owner it sees (MaxSlack).
	nView := max(min(rg.liveMin, rg.sideMin), 2)
	rg.sFault = max(int64(nMax-1)*p.MaxSlack(nView), rg.sClean)
	rg.sView = p.MaxSlack(nView)
}

// sketchGating sets the sketch term's parameters (docs/overshoot.md
// "Sketch gating"): every incarnation of a node has a sketch of its own, a
// restarted or joining node an empty one, so sketchN counts incarnations.
// θ_eff = min(θ, sᵢ(n), B) at the view size n the node has: the initial
// size without faults, any size up to nMax (a restarted node starts alone)
// with them.
func (rg *Region) sketchGating(nMax int) {
	c := &rg.cfg
	p := &rg.params
	rg.sketchN = c.Nodes
	slackMax := p.Slack(c.Nodes)
	for _, f := range c.Faults {
		if f.Kind == FaultRestart || f.Kind == FaultJoin {
			rg.sketchN++
		}
	}
	if len(c.Faults) > 0 {
		for n := 1; n <= nMax; n++ {
			slackMax = max(slackMax, p.Slack(n))
		}
	}
	rg.sketchTheta = min(c.Sketch, slackMax, c.Burst)
}

// faultTerms sets, for each fault in time order, the window in which the
// envelope is suspended and the term of tokens the fault may add
// (docs/overshoot.md "Fault terms"). A window lasts past the fault by the
// time detection, gossip, the breaker and the timeouts take to settle, and
// by the refill of B + S tokens. It needs deriveSlack's S figures and
// sketchGating's θ_eff.
func (rg *Region) faultTerms(nMax int) {
	c := &rg.cfg
	B := float64(c.Burst)
	if c.Algorithm != quota.AlgorithmGCRA {
		B = float64(c.algoBurst()) // the state one instance holds
	}
	r := c.rate()
	T := c.Window.Seconds() / float64(c.Limit) // s per token
	S := float64(rg.sFault)
	s := float64(rg.sView)
	G := c.Gossip.Seconds()
	tail := c.Detect + 2*c.Gossip + c.BreakerCooldown + c.CallTimeout + c.DecideTimeout + c.Sync + 2*c.Tick +
		time.Duration((B+S)*T*1e9)
	win := func(from, to time.Duration) {
		rg.windows = append(rg.windows, segment{int64(from), int64(to + tail)})
	}
	// A fault's over-admission is charged as debt and paid back by refill,
	// which holds admissions under r·Δ afterwards: the lower bound stays
	// suspended until a term's worth of debt is repaid too.
	addTerm := func(t Term) {
		rg.terms = append(rg.terms, t)
		if w := &rg.windows[len(rg.windows)-1]; w.to < 1<<62 {
			w.to += int64(t.Tokens * T * 1e9)
		}
	}
	ceil := math.Ceil
	// A ring change moves identities between live owners: a blind
	// identity's state on its previous owner (the sketch's estimate, at
	// most half the bucket) is not handed over, nor what that owner
	// charged from blind reports in flight to it (at most S).
	blindTerm := func(f Fault) {
		if rg.params.SpendsBlind() {
			addTerm(Term{f.Text + " (blind)", ceil(B/2) + S,
				"⌈B/2⌉ + S: a blind identity's sketch state is not handed over, nor the reports in flight to its previous owner"})
		}
	}
	for _, f := range sortFaults(c.Faults) {
		switch f.Kind {
		case FaultCrash:
			win(f.At, f.At)
			addTerm(Term{f.Text, B + S, "B + S: the owner's bucket, debt included, is lost"})
		case FaultRestart, FaultJoin:
			win(f.At, f.At)
			addTerm(Term{f.Text, 2*B + S + 2*ceil(r*G),
				"2B + S + 2⌈r·G⌉: alone it owns every identity with fresh buckets until gossip reaches it (B + r·G); then two owners while views converge (B + r·G), a lost handoff (S)"})
			blindTerm(f)
		case FaultLeave:
			win(f.At, f.At+c.Gossip+c.CallTimeout)
			addTerm(Term{f.Text, B + S + ceil(r*(G+c.CallTimeout.Seconds())),
				"B + S + ⌈r·(G + call timeout)⌉: the leaver still decides for nodes whose view has not changed"})
			blindTerm(f)
		case FaultPartition:
			k := float64(len(f.Groups))
			if len(rg.groupsOfN(f, nMax)) > len(f.Groups) {
				k++
			}
			d := (f.End - f.At).Seconds()
			win(f.At, f.End)
			addTerm(Term{f.Text, (k - 1) * (2*B + 2*S + ceil(r*(d+2*G))),
				"(k−1)·(2B + 2S + ⌈r·(D + 2G)⌉): each cut-off side elects its own owner, with a fresh bucket, for the partition; views converge twice"})
		case FaultLoss:
			if f.Windowed {
				win(f.At, f.End)
			} else {
				rg.windows = append(rg.windows, segment{0, 1 << 62})
			}
			addTerm(Term{f.Text, 0,
				"0 for accounted admissions: reports are cumulative; a lost exchange only adds on_failure decisions, counted apart"})
		case FaultSkew:
			if f.Windowed {
				win(f.At, f.At)
				t := s
				switch {
				case c.Algorithm == quota.AlgorithmLeakyBucket:
					// The queue drains j early at once, but a queue that
					// never empties shows it only when it next fills,
					// however late: no fault-free stretch follows.
					t = max(min(ceil(r*f.Skew.Seconds()), B), 0)
					rg.windows[len(rg.windows)-1].to = 1 << 62
				case c.Algorithm != quota.AlgorithmGCRA:
					t = B // a log's entries in view expire j early, once
				case f.Skew > 0:
					t += min(ceil(r*f.Skew.Seconds()), B+S)
				}
				addTerm(Term{f.Text, t,
					"min(⌈r·j⌉, B + S) + s for a forward step j: the owner's bucket refills by j at once, a node's views expire j early"})
				if c.Sketch > 0 && f.Skew > 0 {
					addTerm(Term{f.Text + " (sketch)", float64(rg.sketchTheta),
						"θ_eff: a forward step ends the node's sketch period early, once"})
				}
			}
		}
	}
}

// groupsOfN returns the sizes of a partition's sides among n nodes.
func (rg *Region) groupsOfN(f Fault, n int) []int {
	sizes := make([]int, len(f.Groups))
	in := 0
	for i, g := range f.Groups {
		sizes[i] = len(g)
		in += len(g)
	}
	if rest := n - in; rest > 0 {
		sizes = append(sizes, rest)
	}
	return sizes
}
