package global

import (
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/sim/engine"
)

// region is one region: its owner runs the gateways' own lease.Regional
// (the Holders, the parameters of the owner's buckets and their rescale
// across a change of share, the demand it reports, the acknowledgements
// and their debt), and keeps, per identity, the owner's bucket and the
// slack spend of the region's other nodes not yet charged to it.
type region struct {
	r       *run
	i       int
	name    string
	off     int64 // clock = virtual time + off
	reg     *lease.Regional
	seq     uint64 // the newest report's sequence number
	replied uint64
	b       []owner
	kicked  bool  // an early report is scheduled (a new identity appeared)
	lastRep int64 // virtual time of the last report
}

// owner is a region's bucket of one identity as the owner's coordinator
// keeps it: the TAT that Regional.Share rescales and the owner steps and
// charges, and what the simulator notes beside it.
type owner struct {
	tat bucket.TAT
	// g is the GCRA tat is kept at: Regional.Share's last answer.
	g bucket.GCRA
	// unconf is the slack spend not yet charged to the bucket.
	unconf int64
	// share and fb are the share enforced at the last look and whether it
	// was the fallback (for the fault term).
	share int64
	fb    bool
}

func newRegion(r *run, i int, name string, off int64) (*region, error) {
	reg, err := lease.NewRegional(lease.RegionalConfig{Reporter: name + "-owner", Region: name, Regions: r.cfg.Regions,
		Skew: r.cfg.MaxSkew, Interval: r.cfg.Refresh})
	if err != nil {
		return nil, err
	}
	fb := map[string]lease.Fallback{FallbackShare: lease.FallbackShare, FallbackOpen: lease.FallbackOpen,
		FallbackClosed: lease.FallbackClosed}[r.cfg.Fallback]
	if err := reg.SetRules([]lease.RegionalRule{{Rule: r.rule, Fallback: fb}}); err != nil {
		return nil, err
	}
	return &region{r: r, i: i, name: name, off: off, reg: reg, b: make([]owner, r.cfg.IDs), lastRep: r.s.Now()}, nil
}

func (g *region) now() int64 { return g.r.s.Now() + g.off }

// share is the share identity id's key enforces at the region's clock and
// whether it is the fallback (0, false for an identity the region holds no
// key of).
func (g *region) share(id int) (int64, bool) {
	s, _, fb, _ := g.reg.Lease(g.now(), rulID, g.r.ids[id])
	return s, fb
}

// tokens is what the bucket holds at now at the parameters it is kept at
// (negative: owed).
func (o *owner) tokens(now int64) float64 {
	if o.g.Interval() <= 0 {
		return 0
	}
	used := max(int64(o.tat)-now, 0)
	return float64(o.g.Burst()) - float64(used)/float64(o.g.Interval())
}

// look notes identity id's share. A fall back to a smaller share leaves the
// bucket's debt and the unconfirmed spend that the leader, which hands the
// difference on after the expiry, no longer counts: that is the partition
// fault term (see Result.FaultTerm), measured here before the next Share
// rescales the bucket.
func (g *region) look(id int) {
	now := g.now()
	share, _, fb, ok := g.reg.Lease(now, rulID, g.r.ids[id])
	if !ok {
		return
	}
	o := &g.b[id]
	was, wasFB := o.share, o.fb
	o.share, o.fb = share, fb
	if g.r.cfg.Fallback != FallbackShare || !fb || wasFB || share >= was {
		return
	}
	owed := max(-o.tokens(now), 0) + float64(o.unconf) - float64(int64(g.r.cfg.Accuracy*float64(share)))
	if owed > 0 {
		g.r.res.FaultTerm += owed
	}
	g.r.res.Fallbacks++
}

// request is one request of cost tokens for identity id arriving at the
// region. The owner decides it as the coordinator decides a leased rule
// (Regional.Share, then the share's bucket, then Regional.Observe); a
// request the bucket rejects is admitted within the region's slack while
// the bucket is not in debt, and observed when the slack spend is charged.
func (g *region) request(id int, cost int64) {
	r := g.r
	r.res.Requested += cost
	r.win[id].add(r.s.Now(), cost, 0, r)
	g.look(id)
	now := g.now()
	o, ident := &g.b[id], r.ids[id]
	gc, mode, _ := g.reg.Share(now, rulID, ident, &o.tat)
	o.g = gc
	g.kick()
	share, _, fb, _ := g.reg.Lease(now, rulID, ident)
	o.share, o.fb = share, fb
	if fb {
		r.res.FallbackDecisions++
	}
	switch mode {
	case lease.ModeAdmit: // the open fallback
		g.reg.Observe(now, rulID, ident, cost, true, o.tat)
		r.res.Degraded += cost
		return
	case lease.ModeReject:
		g.reg.Observe(now, rulID, ident, cost, false, o.tat)
		return
	}
	switch {
	case gc.Step(&o.tat, now, cost).Allowed:
		g.reg.Observe(now, rulID, ident, cost, true, o.tat)
	case share > 0 && o.unconf+cost <= int64(r.cfg.Accuracy*float64(share)) &&
		int64(o.tat)-now <= gc.Burst()*int64(gc.Interval()):
		o.unconf += cost
		r.res.SlackAdmitted += cost
	default:
		g.reg.Observe(now, rulID, ident, cost, false, o.tat)
		return
	}
	r.res.Admitted += cost
	r.win[id].add(r.s.Now(), 0, cost, r)
	r.env[id].admit(r, id, r.s.Now(), cost)
}

// charge charges identity id's unconfirmed slack spend to the owner's
// bucket (it may go into debt) and observes it, as the owner does with the
// spend a sync reports (the coordinator's chargeOwned).
func (g *region) charge(id int) {
	o := &g.b[id]
	if o.unconf == 0 {
		return
	}
	now, ident := g.now(), g.r.ids[id]
	gc, _, _ := g.reg.Share(now, rulID, ident, &o.tat)
	o.g = gc
	gc.Charge(&o.tat, now, o.unconf)
	g.reg.Observe(now, rulID, ident, o.unconf, true, o.tat)
	o.unconf = 0
}

// kick schedules an early report when Regional has a new identity to
// report, as the gateway's report loop does: at once, but no sooner than
// Regional's gap after the last report.
func (g *region) kick() {
	if g.kicked || !g.reg.Urgent() {
		return
	}
	g.kicked = true
	gap := int64(g.reg.Gap())
	g.r.s.After(max(g.lastRep+gap-g.r.s.Now(), 0), &urgentReport{g: g})
}

// report charges the slack spend, then sends Regional's report (demand per
// identity, the newest epoch enforced and its debt, a cap given back): the
// periodic one, or the report off cycle of the keys due (ReportDue); it
// arms the report's retry.
func (g *region) report(offCycle bool) {
	r := g.r
	for id := range r.ids {
		g.look(id)
		g.charge(id)
	}
	var rep lease.Report
	var ok bool
	if offCycle {
		rep, ok = g.reg.ReportDue(g.now(), nil)
	} else {
		rep, ok = g.reg.Report(g.now(), nil)
	}
	if !ok {
		return
	}
	g.lastRep = r.s.Now()
	// A cap set for the report lowers what the region enforces now.
	for id := range r.ids {
		g.look(id)
	}
	g.seq = rep.Seq
	r.res.Reports++
	if offCycle {
		r.res.OffCycle++
	}
	g.send(rep)
	r.s.After(int64(r.cfg.Refresh)/2, &retry{g: g, rep: rep})
}

func (g *region) send(rep lease.Report) {
	g.r.nw.Send(g.i, g.r.leader, &reportMsg{g: g, to: g.r.leader, rep: rep, sentAt: g.now()})
}

// onReply hands the grants to Regional, with the time the report they
// answer left (the region's own clock).
func (g *region) onReply(sentAt int64, seq uint64, grants []lease.Grant) {
	r := g.r
	g.replied = max(g.replied, seq)
	r.res.Grants += g.reg.Accept(seq, sentAt, lease.Result{Grants: grants})
	for _, gr := range grants {
		if id, ok := r.idx[gr.Identity]; ok {
			g.look(id)
		}
	}
	r.checkFollow(g)
}

type reportTick struct{ g *region }

func (e *reportTick) Fire(s *engine.Sim) {
	e.g.r.noRaise = true
	e.g.report(false)
	s.After(int64(e.g.r.cfg.Refresh), e)
}

type urgentReport struct{ g *region }

func (e *urgentReport) Fire(*engine.Sim) {
	e.g.r.noRaise = true
	e.g.kicked = false
	e.g.report(true)
}

// pollTick asks Regional for a report off cycle a gap after the last
// report and every gap after that, as the gateway's report loop does.
type pollTick struct{ g *region }

func (e *pollTick) Fire(s *engine.Sim) {
	e.g.r.noRaise = true
	gap := int64(e.g.reg.Gap())
	if wait := e.g.lastRep + gap - s.Now(); wait > 0 {
		s.After(wait, e)
		return
	}
	e.g.report(true)
	s.After(gap, e)
}

type syncTick struct{ g *region }

func (e *syncTick) Fire(s *engine.Sim) {
	e.g.r.noRaise = true
	for id := range e.g.b {
		e.g.look(id)
		e.g.charge(id)
	}
	s.After(int64(e.g.r.cfg.Sync), e)
}

// retry resends a report that got no reply in half a refresh interval,
// with the same sequence number (the machine applies it once).
type retry struct {
	g   *region
	rep lease.Report
}

func (e *retry) Fire(*engine.Sim) {
	e.g.r.noRaise = true
	if e.g.replied >= e.rep.Seq || e.g.seq != e.rep.Seq {
		return
	}
	e.g.r.res.Retries++
	e.g.send(e.rep)
}
