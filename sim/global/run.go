package global

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/sim/engine"
)

// start is the virtual time of a run's beginning: an hour, so that no
// clock (skewed back by up to half the skew) reads zero or less, which the
// machine takes for "never".
const start = int64(time.Hour)

// voters is the size of the lease group: three voters, one of them the
// leader.
const voters = 3

const rulID = "global"

type run struct {
	// arrivalOnly is set by an arrival, the only event that touches one
	// identity alone (touched): the invariant is then checked for it
	// alone; noRaise by the events that change no region's lease but by
	// lowering it: the invariant holds after them if it held before
	// (checkAfter).
	arrivalOnly, noRaise bool
	touched              int
	cfg                  Config
	s                    *engine.Sim
	nw                   *engine.Network
	m                    *lease.Machine
	rule                 lease.Rule
	ids                  []string
	idx                  map[string]int
	res                  *Result

	regions   []*region
	leader    int // network id of the leader (regions are 0..R-1, voters R..R+2)
	leaderUp  bool
	leaderOff int64
	term      int
	floor     int64
	end       int64

	rates   [][]float64 // [identity][region]: offered tokens per window
	doorman *doormanDemand

	env        []envelope
	win        []windows
	pending    []follow
	faultUntil int64
	baseLoss   float64
	shareSum   float64
	shareN     int
	bd         *breakdown // nil unless Config.Breakdown
}

// Run simulates cfg and returns what it measured.
func Run(cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &run{cfg: cfg, s: engine.New(start, cfg.Seed), res: &Result{Config: cfg}, idx: map[string]int{}}
	R := cfg.Regions
	names := make([]string, R)
	for i := range names {
		names[i] = fmt.Sprintf("r%d", i)
	}
	m, err := lease.NewMachine(lease.Config{Regions: names, LeaseDuration: cfg.Lease, MaxSkew: cfg.MaxSkew})
	if err != nil {
		return nil, err
	}
	r.m = m
	r.rule = lease.Rule{ID: rulID, Limit: cfg.Limit, Window: cfg.Window, Burst: cfg.Burst, MaxCost: cfg.Cost}
	if _, err := m.Apply(lease.Command{Now: start, Rules: []lease.Rule{r.rule}}); err != nil {
		return nil, err
	}
	// The machine's own floor, what its allocation gives an active region
	// at least.
	r.floor = m.Floor(r.rule)
	r.nw = engine.NewNetwork(r.s, R+voters, cfg.Latency)
	r.end = start + int64(cfg.Duration)
	rng := r.s.Rand()
	skew := func() int64 {
		if cfg.Skew <= 0 {
			return 0
		}
		return rng.Int64N(int64(cfg.Skew)+1) - int64(cfg.Skew)/2
	}
	for i := range cfg.IDs {
		id := fmt.Sprintf("cust%d", i)
		r.ids = append(r.ids, id)
		r.idx[id] = i
	}
	r.rates = make([][]float64, cfg.IDs)
	for i := range r.rates {
		r.rates[i] = make([]float64, R)
	}
	r.env = make([]envelope, cfg.IDs)
	r.win = make([]windows, cfg.IDs)
	for i := range r.win {
		r.win[i].start = start
	}
	for i := range R {
		g, err := newRegion(r, i, names[i], skew())
		if err != nil {
			return nil, err
		}
		r.regions = append(r.regions, g)
	}
	if cfg.Breakdown {
		r.bd = newBreakdown(r)
	}
	r.leader, r.leaderUp, r.leaderOff = R, true, skew()
	if _, err := m.Apply(lease.Command{Now: r.s.Now() + r.leaderOff, Takeover: true}); err != nil {
		return nil, err
	}
	r.applied("takeover")
	r.res.Takeovers++

	// Loops: reports, syncs, the leader's ticks, samples.
	for _, g := range r.regions {
		r.s.After(rng.Int64N(int64(cfg.Refresh)), &reportTick{g: g})
		r.s.After(rng.Int64N(int64(cfg.Sync)), &syncTick{g: g})
		r.s.After(rng.Int64N(int64(g.reg.Gap())), &pollTick{g: g})
	}
	r.s.After(int64(cfg.Tick), &leaderTick{r: r})
	r.s.After(int64(cfg.Sample), &sampleTick{r: r})
	r.demand(rng)
	r.faults()

	for r.s.Step(r.end) {
		r.checkAfter()
		if r.bd != nil {
			r.bd.observe(r)
		}
	}
	r.s.Run(r.end)
	r.finish()
	return r.res, nil
}

func (r *run) violate(format string, args ...any) {
	if len(r.res.Violations) < 20 {
		at := time.Duration(r.s.Now() - start)
		r.res.Violations = append(r.res.Violations, fmt.Sprintf("at %v: ", at)+fmt.Sprintf(format, args...))
	}
	r.res.ViolationCount++
}

// applied runs Machine.Check after an Apply.
func (r *run) applied(what string) {
	r.res.Applies++
	if err := r.m.Check(); err != nil {
		r.violate("after %s: %v", what, err)
	}
}

// checkInvariant is docs/global.md's invariant as the regions enforce it: for
// every identity, Σ over regions of the share each region's Regional
// enforces on the region's own clock (its Holder's At) ≤ L, at every event.
func (r *run) checkInvariant() {
	for id := range r.ids {
		r.checkIdentity(id)
	}
}

// checkAfter checks the invariant after an event: for the identity an
// arrival touched, for none after an event that only lowers leases (a
// report gives capacity back by its cap, the leader's own events change
// no region's lease), and for every identity after any other event (a
// reply accepted raises shares). An arrival changes no other identity's
// lease, and a share changes with time only when its lease expires, which
// never raises it (lease.Holder.At: the smaller of the share and the safe
// share), so the sum over the regions rises only at an event checked here:
// this is checking at every event.
func (r *run) checkAfter() {
	switch {
	case r.arrivalOnly:
		r.checkIdentity(r.touched)
	case r.noRaise:
	default:
		r.checkInvariant() // a reply accepted, a fault, a demand change
	}
	r.arrivalOnly, r.noRaise = false, false
}

// checkIdentity checks the invariant for identity id.
func (r *run) checkIdentity(id int) {
	var sum int64
	for _, g := range r.regions {
		s, _ := g.share(id)
		sum += s
	}
	if sum > r.cfg.Limit {
		r.violate("%s: the regions enforce %d in all, above L = %d", r.ids[id], sum, r.cfg.Limit)
	}
	if f := float64(sum) / float64(r.cfg.Limit); f > r.res.SharesPeak {
		r.res.SharesPeak = f
	}
}

// ---- the leader's side ----

type reportMsg struct {
	g      *region
	to     int
	rep    lease.Report
	sentAt int64
}

// Fire is the report's arrival at voter to: the leader applies it (the
// Raft FSM's Apply calls Machine.Apply, nothing else) and answers after a
// commit round. A report to a voter that is not the live leader is lost.
func (e *reportMsg) Fire(s *engine.Sim) {
	r := e.g.r
	r.noRaise = true
	if !r.leaderUp || e.to != r.leader {
		r.res.LostAtLeader++
		return
	}
	rep := e.rep
	res, err := r.m.Apply(lease.Command{Now: s.Now() + r.leaderOff, Report: &rep})
	if err != nil {
		r.violate("apply report of %s: %v", rep.Region, err)
		return
	}
	r.applied("report of " + rep.Region)
	s.After(int64(r.cfg.Commit), &replySend{g: e.g, term: r.term, sentAt: e.sentAt, seq: rep.Seq, grants: res.Grants})
}

type replySend struct {
	g      *region
	term   int
	sentAt int64
	seq    uint64
	grants []lease.Grant
}

func (e *replySend) Fire(*engine.Sim) {
	r := e.g.r
	r.noRaise = true
	if r.term != e.term || !r.leaderUp {
		return // the leader crashed before it answered
	}
	r.nw.Send(r.leader, e.g.i, &replyMsg{e})
}

type replyMsg struct{ *replySend }

func (e *replyMsg) Fire(*engine.Sim) { e.g.onReply(e.sentAt, e.seq, e.grants) }

type leaderTick struct{ r *run }

func (e *leaderTick) Fire(s *engine.Sim) {
	r := e.r
	r.noRaise = true
	if r.leaderUp {
		if _, err := r.m.Apply(lease.Command{Now: s.Now() + r.leaderOff, Tick: true}); err != nil {
			r.violate("apply tick: %v", err)
		}
		r.applied("tick")
	}
	s.After(int64(r.cfg.Tick), e)
}

// crashLeader stops the leader; after down (at least the election time)
// the next voter takes over with its own clock.
func (r *run) crashLeader(down time.Duration) {
	if !r.leaderUp {
		return
	}
	r.leaderUp = false
	r.term++
	r.res.LeaderCrashes++
	r.faultUntil = max(r.faultUntil, r.s.Now()+int64(max(down, r.cfg.Election)+r.cfg.Lease+r.cfg.MaxSkew+2*r.cfg.Refresh))
	r.s.After(int64(max(down, r.cfg.Election)), engine.EventFunc(func(s *engine.Sim) {
		R := r.cfg.Regions
		r.leader = R + (r.leader-R+1)%voters
		r.leaderUp = true
		r.term++
		if r.cfg.Skew > 0 {
			r.leaderOff = s.Rand().Int64N(int64(r.cfg.Skew)+1) - int64(r.cfg.Skew)/2
		}
		if _, err := r.m.Apply(lease.Command{Now: s.Now() + r.leaderOff, Takeover: true}); err != nil {
			r.violate("apply takeover: %v", err)
		}
		r.applied("takeover")
		r.res.Takeovers++
	}))
}

// partition cuts region i off from everyone for d.
func (r *run) partition(i int, d time.Duration) {
	g := make([]int, r.nw.Nodes())
	g[i] = 1
	id := r.nw.Partition(g)
	r.res.Partitions++
	r.faultUntil = max(r.faultUntil, r.s.Now()+int64(d+r.cfg.Lease+r.cfg.MaxSkew+2*r.cfg.Refresh))
	r.s.After(int64(d), engine.EventFunc(func(*engine.Sim) { r.nw.Heal(id) }))
}

func (r *run) faults() {
	for _, f := range r.cfg.Faults {
		switch f.Kind {
		case FaultPartition:
			r.s.At(start+int64(f.At), engine.EventFunc(func(*engine.Sim) { r.partition(f.Region, f.End-f.At) }))
		case FaultLeader:
			r.s.At(start+int64(f.At), engine.EventFunc(func(*engine.Sim) { r.crashLeader(0) }))
		case FaultLoss:
			if f.End == 0 {
				r.baseLoss = f.Loss
				r.nw.SetLoss(f.Loss)
				continue
			}
			r.s.At(start+int64(f.At), engine.EventFunc(func(s *engine.Sim) {
				r.nw.SetLoss(f.Loss)
				r.faultUntil = max(r.faultUntil, s.Now()+int64(f.End-f.At+r.cfg.Lease+r.cfg.MaxSkew+2*r.cfg.Refresh))
			}))
			r.s.At(start+int64(f.End), engine.EventFunc(func(*engine.Sim) { r.nw.SetLoss(r.baseLoss) }))
		}
	}
	if r.baseLoss > 0 {
		r.faultUntil = r.end
	}
}

// ---- measurements ----

// envelope streams one identity's admissions (all regions, in time order)
// and keeps the worst excess over every interval between two admissions:
// admitted − r·Δ, computed exactly in one pass.
type envelope struct {
	cum   float64 // tokens admitted so far
	best  float64 // max over admissions i of r·tᵢ − cum before i
	worst float64
	any   bool
}

func (e *envelope) admit(r *run, id int, at, cost int64) {
	rate := float64(r.cfg.Limit) / float64(r.cfg.Window)
	t := float64(at - start)
	if c := rate*t - e.cum; !e.any || c > e.best {
		e.best, e.any = c, true
	}
	e.cum += float64(cost)
	ex := e.cum - rate*t + e.best
	if ex > e.worst {
		e.worst = ex
	}
	bound := r.bound()
	if ex > bound+1e-6 {
		r.violate("%s: %.2f tokens over r·Δ in an interval ending here, above the envelope B + a·L + fault term = %.2f", r.ids[id], ex, bound)
	}
}

// bound is the global envelope's excess term at this point of the run:
// B + Σ S_r (≤ a·L) + the fault term so far.
func (r *run) bound() float64 {
	return float64(r.cfg.Burst) + r.cfg.Accuracy*float64(r.cfg.Limit) + r.res.FaultTerm
}

// windows tallies one identity's requested and admitted tokens per window
// of length W.
type windows struct {
	start          int64
	asked, granted int64
}

func (w *windows) add(at, asked, granted int64, r *run) {
	W := int64(r.cfg.Window)
	for at >= w.start+W {
		w.close(r)
		w.start += W
	}
	w.asked += asked
	w.granted += granted
}

func (w *windows) close(r *run) {
	res := r.res
	if w.start >= start+int64(r.cfg.Warmup) {
		L := float64(r.cfg.Limit)
		a := float64(w.granted) / L
		res.winN++
		res.WindowMean += a
		res.WindowWorst = max(res.WindowWorst, a)
		if d := min(float64(w.asked), L); d > 0 {
			f := float64(w.granted) / d
			res.fillN++
			res.FillMean += f
			if res.fillN == 1 || f < res.FillWorst {
				res.FillWorst = f
			}
		}
	}
	w.asked, w.granted = 0, 0
}

type sampleTick struct{ r *run }

func (e *sampleTick) Fire(s *engine.Sim) {
	r := e.r
	r.noRaise = true
	if r.cfg.probe != nil {
		share, fb := make([]int64, len(r.regions)), make([]bool, len(r.regions))
		for i, g := range r.regions {
			share[i], _ = g.share(0)
			fb[i] = g.reg.Expired(g.now(), rulID, r.ids[0])
		}
		r.cfg.probe(time.Duration(s.Now()-start), share, fb)
	}
	if s.Now() >= start+int64(r.cfg.Warmup) {
		for id := range r.ids {
			var sum int64
			for _, g := range r.regions {
				sh, _ := g.share(id)
				sum += sh
			}
			r.shareSum += float64(sum) / float64(r.cfg.Limit)
			r.shareN++
		}
	}
	s.After(int64(r.cfg.Sample), e)
}

// follow is a region waiting for its share to reach its fair allocation
// after a demand shift.
type follow struct {
	id, region int
	target     int64
	since      int64
}

// followFraction: a share "reaches" its fair allocation at 95 % of it
// (demand is measured from counts, so the allocation the leader computes
// wobbles by a token or two around the exact one).
const followFraction = 0.95

// shifted is called after identity id's offered rates changed: the fair
// allocation of the new demand is computed, and every region whose share
// is below it waits to reach it. Shifts during faults (or within a lease
// after one) are not measured: there is no lower bound then.
func (r *run) shifted(id int) {
	now := r.s.Now()
	if r.bd != nil {
		r.bd.shift(r, id, now)
	}
	r.pending = slices.DeleteFunc(r.pending, func(f follow) bool {
		if f.id == id {
			r.res.Superseded++
			return true
		}
		return false
	})
	if now < r.faultUntil {
		r.res.ShiftsInFaults++
		return
	}
	R := len(r.regions)
	demand := make([]int64, R)
	active := make([]bool, R)
	for i := range R {
		demand[i] = int64(math.Round(r.rates[id][i]))
		active[i] = demand[i] > 0
	}
	target := lease.Allocate(r.cfg.Limit, r.floor, demand, active)
	for i, g := range r.regions {
		sh, _ := g.share(id)
		if float64(sh) < followFraction*float64(target[i]) {
			r.pending = append(r.pending, follow{id: id, region: i, target: target[i], since: now})
		}
	}
}

func (r *run) checkFollow(g *region) {
	now := r.s.Now()
	r.pending = slices.DeleteFunc(r.pending, func(f follow) bool {
		if f.region != g.i {
			return false
		}
		if now < r.faultUntil && f.since < r.faultUntil {
			r.res.ShiftsInFaults++
			return true
		}
		sh, _ := g.share(f.id)
		if float64(sh) >= followFraction*float64(f.target) {
			r.res.Follow = append(r.res.Follow, time.Duration(now-f.since))
			return true
		}
		return false
	})
}

func (r *run) finish() {
	res := r.res
	for id := range r.win {
		r.win[id].close(r)
		res.Excess = max(res.Excess, r.env[id].worst)
	}
	if res.winN > 0 {
		res.WindowMean /= float64(res.winN)
	}
	if res.fillN > 0 {
		res.FillMean /= float64(res.fillN)
	}
	if r.shareN > 0 {
		res.SharesMean = r.shareSum / float64(r.shareN)
	}
	res.NotFollowed = len(r.pending)
	if r.bd != nil {
		res.Intervals, res.SinceShift = r.bd.rows(r)
		res.BreakdownShifts = r.bd.shifts
	}
	res.Bound = r.bound()
	res.Sent, res.Lost, res.Cut = r.nw.Sent, r.nw.Lost, r.nw.Cut
	res.Events = r.s.Fired()
}
