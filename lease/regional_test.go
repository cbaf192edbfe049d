package lease

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
)

const sec = int64(time.Second)

func newTestRegional(t *testing.T, region string, fb Fallback) *Regional {
	t.Helper()
	r, err := NewRegional(RegionalConfig{Reporter: "node-" + region, Region: region, Regions: 2,
		Skew: 100 * time.Millisecond, Interval: time.Second, FirstSeq: 1000})
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "g", Limit: 1000, Window: 10 * time.Second, Burst: 100, MaxCost: 1}
	if err := r.SetRules([]RegionalRule{{Rule: rule, Fallback: fb}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRegionalSequenceNumbers(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	if _, ok := r.Report(sec, nil); ok {
		t.Fatal("a report with no key")
	}
	var tat bucket.TAT
	r.Share(sec, "g", "x", &tat)
	if !r.Urgent() {
		t.Fatal("a new key did not ask for a report")
	}
	r.Observe(sec, "g", "x", 1, false, tat)
	a, ok := r.Report(2*sec, nil)
	if !ok || a.Seq != 1001 || a.Reporter != "node-eu" || a.Region != "eu" || len(a.Items) != 1 {
		t.Fatalf("first report %+v", a)
	}
	if r.Urgent() {
		t.Fatal("still urgent after a report")
	}
	b, _ := r.Report(3*sec, nil)
	if b.Seq != 1002 {
		t.Fatalf("second seq %d, want 1002", b.Seq)
	}
}

func TestRegionalDemand(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	r.Report(0, nil) // starts the period
	// 100 tokens asked over 2s, window 10s: 500 per window.
	for range 100 {
		r.Observe(sec, "g", "x", 1, true, tat)
	}
	rep, _ := r.Report(2*sec, nil)
	if d := rep.Items[0].Demand; d != 500 {
		t.Fatalf("demand %d, want 500", d)
	}
	// Throttled: a share of 200 granted, 40 asked over 1s of which 10 (a
	// quarter) were rejected: max(400, 300) = 400.
	r.Accept(0, 2*sec, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 1, Share: 200, Burst: 20, Lifetime: 10 * sec}}})
	for i := range 40 {
		r.Observe(2*sec, "g", "x", 1, i >= 10, tat)
	}
	rep, _ = r.Report(3*sec, nil)
	if it := rep.Items[0]; it.Demand != 400 || it.AckEpoch != 1 {
		t.Fatalf("throttled item %+v, want demand 400 ack 1", it)
	}
	// Throttled while what it saw is small: the share grows by half.
	r.Observe(3*sec, "g", "x", 1, false, tat)
	rep, _ = r.Report(4*sec, nil)
	if d := rep.Items[0].Demand; d != 300 {
		t.Fatalf("demand %d, want 300 (3/2 of the share)", d)
	}
	// Idle: demand 0.
	rep, _ = r.Report(5*sec, nil)
	if d := rep.Items[0].Demand; d != 0 {
		t.Fatalf("idle demand %d", d)
	}
	// A rejection or two in what a share nearly serves is the noise of the
	// count, not hidden demand: what was asked, 20 over 1s.
	for i := range 20 {
		r.Observe(5*sec, "g", "x", 1, i > 0, tat)
	}
	rep, _ = r.Report(6*sec, nil)
	if d := rep.Items[0].Demand; d != 200 {
		t.Fatalf("demand %d, want 200 (what was asked: 1 rejection in 20)", d)
	}
}

// TestRegionalShortPeriod: a report less than an interval after the last
// one measures over an interval, the rest of it from the last measurement:
// three requests in 100 ms after 10 a second are not a demand of 30 a
// second.
func TestRegionalShortPeriod(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	r.Report(0, nil) // starts the period
	for range 10 {
		r.Observe(sec/2, "g", "x", 1, true, tat)
	}
	rep, _ := r.Report(sec, nil)
	if d := rep.Items[0].Demand; d != 100 { // 10 over 1s, window 10s
		t.Fatalf("demand %d, want 100", d)
	}
	for range 3 {
		r.Observe(sec+sec/20, "g", "x", 1, true, tat)
	}
	// 3 over the last 100 ms and 9 over the 900 ms before: 12 over 1s.
	rep, _ = r.Report(sec+sec/10, nil)
	if d := rep.Items[0].Demand; d != 120 {
		t.Fatalf("demand %d 100 ms after the last report, want 120 (measured over an interval)", d)
	}
}

func TestRegionalFallbacks(t *testing.T) {
	for _, c := range []struct {
		fb   Fallback
		want Mode
	}{{FallbackShare, ModeReject}, {FallbackOpen, ModeAdmit}, {FallbackClosed, ModeReject}} {
		r := newTestRegional(t, "eu", c.fb)
		var tat bucket.TAT
		if _, m, ok := r.Share(0, "g", "x", &tat); !ok || m != c.want {
			t.Fatalf("fallback %d before a grant: mode %d, want %d", c.fb, m, c.want)
		}
		r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 3, Share: 800, Burst: 80, Lifetime: 10 * sec}}})
		g, m, _ := r.Share(sec, "g", "x", &tat)
		if m != ModeEnforce || g.Burst() != 80 || g.Interval() != 10*time.Second/800 {
			t.Fatalf("under lease: mode %d burst %d interval %v", m, g.Burst(), g.Interval())
		}
		// Expired (10s − 100ms skew): the fallback, min(safe 500, 800).
		g, m, _ = r.Share(10*sec, "g", "x", &tat)
		switch c.fb {
		case FallbackShare:
			if m != ModeEnforce || g.Interval() != 10*time.Second/500 || g.Burst() != 50 {
				t.Fatalf("expired: mode %d interval %v burst %d, want the safe share", m, g.Interval(), g.Burst())
			}
		default:
			if m != c.want {
				t.Fatalf("expired: mode %d, want %d", m, c.want)
			}
		}
		st := r.Status(10*sec, nil)
		if len(st) != 1 || st[0].Fallback != 1 || st[0].Leased != 0 {
			t.Fatalf("status %+v", st)
		}
	}
}

func TestRegionalRescale(t *testing.T) {
	small, _ := bucket.NewGCRA(100, 10*time.Second, 10) // 100ms per token
	big, _ := bucket.NewGCRA(1000, 10*time.Second, 100) // 10ms per token
	now := 50 * sec
	// Full, then a grow: the tokens (10) stay, the capacity is 100.
	tat := rescale(bucket.TAT(now), now, small, big)
	if d := big.Peek(tat, now); d.Remaining != 10 {
		t.Fatalf("after a grow %d tokens, want 10", d.Remaining)
	}
	// 50 of 100 tokens, then a shrink: clamped to the new burst, 10.
	tat = bucket.TAT(now + 50*int64(10*time.Millisecond))
	tat = rescale(tat, now, big, small)
	if d := small.Peek(tat, now); d.Remaining != 10 {
		t.Fatalf("after a shrink %d tokens, want 10", d.Remaining)
	}
	// 5 tokens owed stay owed.
	tat = bucket.TAT(now + 15*int64(100*time.Millisecond))
	tat = rescale(tat, now, small, big)
	if want := now + 105*int64(10*time.Millisecond); int64(tat) != want {
		t.Fatalf("owed tokens: TAT %d, want %d", tat, want)
	}
}

func TestRegionalDrops(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "mine", &tat)
	r.Share(0, "g", "moved", &tat)
	rep, _ := r.Report(sec, func(id string) bool { return id == "mine" })
	if len(rep.Items) != 1 || rep.Items[0].Identity != "mine" || r.Keys() != 1 {
		t.Fatalf("items %+v keys %d: a moved key was reported or kept", rep.Items, r.Keys())
	}
	// Given up: demand 0, a share of 0 granted and acknowledged.
	r.Accept(0, sec, Result{Grants: []Grant{{Rule: "g", Identity: "mine", Epoch: 7, Share: 0, Lifetime: 10 * sec}}})
	rep, _ = r.Report(2*sec, nil)
	if len(rep.Items) != 1 || rep.Items[0].AckEpoch != 7 {
		t.Fatalf("the zero share was not acknowledged: %+v", rep.Items)
	}
	if _, ok := r.Report(3*sec, nil); ok || r.Keys() != 0 {
		t.Fatalf("a given-up key is still reported (keys %d)", r.Keys())
	}
}

// TestRegionalWithMachine runs two regions' Regionals against one Machine:
// demand in both, then only in one, checking the invariant after every
// step and that the busy region's share grows to take what the idle one
// gave up.
func TestRegionalWithMachine(t *testing.T) {
	m, err := NewMachine(Config{Regions: []string{"eu", "us"}, LeaseDuration: 10 * time.Second, MaxSkew: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "g", Limit: 1000, Window: 10 * time.Second, Burst: 100, MaxCost: 1}
	if _, err := m.Apply(Command{Rules: []Rule{rule}}); err != nil {
		t.Fatal(err)
	}
	eu, us := newTestRegional(t, "eu", FallbackShare), newTestRegional(t, "us", FallbackShare)
	tats := map[*Regional]*bucket.TAT{eu: new(bucket.TAT), us: new(bucket.TAT)}
	// Each region is asked at most `want` tokens per second and admits
	// what its share allows.
	step := func(now int64, r *Regional, want int) {
		tat := tats[r]
		for range want {
			g, mode, _ := r.Share(now, "g", "cust", tat)
			allowed := false
			if mode == ModeEnforce {
				allowed = g.Step(tat, now, 1).Allowed
			}
			r.Observe(now, "g", "cust", 1, allowed, *tat)
		}
		if rep, ok := r.Report(now, nil); ok {
			res, err := m.Apply(Command{Now: now, Report: &rep})
			if err != nil {
				t.Fatal(err)
			}
			r.Accept(rep.Seq, now, res)
		}
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
	}
	now := int64(0)
	for range 20 {
		now += sec
		step(now, eu, 80)
		step(now, us, 80)
	}
	for range 60 {
		now += sec
		step(now, eu, 80)
		step(now, us, 0)
		if _, err := m.Apply(Command{Now: now, Tick: true}); err != nil {
			t.Fatal(err)
		}
	}
	st := eu.Status(now, nil)
	if st[0].Leased != 1 || st[0].Share < 700 {
		t.Fatalf("eu, alone in demand (800 per window), holds %+v", st[0])
	}
}

// TestRegionalDebt: the first acknowledgement of an epoch carries the
// bucket's debt then (how long until it holds no debt); later ones what is left of it, however throttled the
// bucket still is.
func TestRegionalDebt(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 1, Share: 100, Burst: 10, Lifetime: 10 * sec}}})
	g, _, _ := r.Share(sec, "g", "x", &tat)
	for range 10 {
		g.Step(&tat, sec, 1) // spent out
	}
	g.Charge(&tat, sec, 10) // and 10 tokens in debt: out of it 1s away
	r.Observe(sec, "g", "x", 1, false, tat)
	rep, _ := r.Report(sec, nil)
	if it := rep.Items[0]; it.AckEpoch != 1 || it.Debt != sec {
		t.Fatalf("first ack %+v, want epoch 1 debt 1s", it)
	}
	// Half a second on, the bucket spent out again: the ack carries the
	// half second left of the first debt.
	tat = bucket.TAT(sec/2 + sec)
	r.Observe(sec/2+sec, "g", "x", 1, false, tat)
	rep, _ = r.Report(sec/2+sec, nil)
	if it := rep.Items[0]; it.Debt != sec/2 {
		t.Fatalf("second ack debt %v, want 500ms", time.Duration(it.Debt))
	}
}

// TestRegionalRuleChange: a changed limit keeps the lease held (the leader
// counts it until a new share is acknowledged) with the fallback share from
// the new limit, and asks for a report soon; a changed window starts over.
func TestRegionalRuleChange(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	r.Report(sec, nil)
	r.Accept(0, sec, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 3, Share: 700, Burst: 70, Lifetime: 10 * sec}}})
	lowered := Rule{ID: "g", Limit: 400, Window: 10 * time.Second, Burst: 100, MaxCost: 1}
	if err := r.SetRules([]RegionalRule{{Rule: lowered, Fallback: FallbackShare}}); err != nil {
		t.Fatal(err)
	}
	k := r.keys[key{"g", "x"}]
	if k == nil || k.holder.Epoch() != 3 || !r.Urgent() {
		t.Fatalf("after a limit change: key %v, urgent %v; want the lease of epoch 3 kept and a report asked for", k, r.Urgent())
	}
	if s, _, fb := k.holder.At(2 * sec); s != 700 || fb {
		t.Fatalf("share %d (fallback %v) while the lease lasts, want 700", s, fb)
	}
	// Past the lease: the fallback is the new safe share, 400 ÷ 2.
	if s, _, fb := k.holder.At(20 * sec); s != 200 || !fb {
		t.Fatalf("fallback %d (%v) after expiry, want 200 from the new limit", s, fb)
	}
	// The owner's bucket at the lease's share, 700 per 10 s burst 70, holding
	// 30 tokens.
	now := 2 * sec
	g, mode, _ := r.Share(now, "g", "x", &tat)
	if mode != ModeEnforce || g.Burst() != 70 {
		t.Fatalf("mode %v, burst %d: want the lease's bucket", mode, g.Burst())
	}
	tat = bucket.TAT(now + 40*g.Interval().Nanoseconds())
	if d := g.Peek(tat, now); d.Remaining != 30 {
		t.Fatalf("set up: %d tokens, want 30", d.Remaining)
	}
	r.Observe(now, "g", "x", 40, true, tat)
	// A window change keeps the lease: the same share, now per minute, and
	// the bucket keeps its 30 tokens.
	longer := lowered
	longer.Window = time.Minute
	if err := r.SetRules([]RegionalRule{{Rule: longer, Fallback: FallbackShare}}); err != nil {
		t.Fatal(err)
	}
	k = r.keys[key{"g", "x"}]
	if k == nil || k.holder.Epoch() != 3 {
		t.Fatalf("after a window change: key %v; want the lease of epoch 3 kept", k)
	}
	g, mode, _ = r.Share(now, "g", "x", &tat)
	want, _ := bucket.NewGCRA(700, time.Minute, 70)
	if mode != ModeEnforce || g != want {
		t.Fatalf("after a window change: mode %v, bucket %v; want %v enforced", mode, g, want)
	}
	if d := g.Peek(tat, now); d.Remaining != 30 {
		t.Fatalf("after a window change the bucket holds %d tokens, want 30", d.Remaining)
	}
	// Past the lease, the fallback share (400 ÷ 2) applies per the new
	// window too.
	if g, mode, _ := r.Share(20*sec, "g", "x", &tat); mode != ModeEnforce || g.Interval() != time.Minute/200 {
		t.Fatalf("fallback: mode %v, interval %v; want 200 per minute", mode, g.Interval())
	}
}

// TestRegionalWindowChangeWithMachine: through a lease machine, a global
// rule whose window changes keeps its lease: the region's next report is
// granted at the same epoch and the owner never falls back.
func TestRegionalWindowChangeWithMachine(t *testing.T) {
	rule := Rule{ID: "g", Limit: 1000, Window: 10 * time.Second, Burst: 100, MaxCost: 1}
	m, err := NewMachine(Config{Regions: []string{"eu", "us"}, LeaseDuration: 10 * time.Second, MaxSkew: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(Command{Rules: []Rule{rule}}); err != nil {
		t.Fatal(err)
	}
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	step := func(now int64) {
		t.Helper()
		g, mode, _ := r.Share(now, "g", "x", &tat)
		allowed := false
		if mode == ModeEnforce {
			allowed = g.Step(&tat, now, 1).Allowed
		}
		r.Observe(now, "g", "x", 1, allowed, tat)
		rep, ok := r.Report(now, nil)
		if !ok {
			t.Fatal("nothing to report")
		}
		res, err := m.Apply(Command{Now: now, Report: &rep})
		if err != nil {
			t.Fatal(err)
		}
		r.Accept(rep.Seq, now, res)
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
	}
	step(sec)
	k := r.keys[key{"g", "x"}]
	epoch := k.holder.Epoch()
	if epoch == 0 {
		t.Fatal("no lease granted")
	}
	longer := rule
	longer.Window = time.Minute
	if _, err := m.Apply(Command{Now: 2 * sec, Rules: []Rule{longer}}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetRules([]RegionalRule{{Rule: longer, Fallback: FallbackShare}}); err != nil {
		t.Fatal(err)
	}
	for now := 2 * sec; now < 30*sec; now += sec {
		if _, mode, _ := r.Share(now, "g", "x", &tat); mode != ModeEnforce || r.Expired(now, "g", "x") {
			t.Fatalf("at %v: mode %v, expired %v: the lease was lost across the window change", time.Duration(now), mode, r.Expired(now, "g", "x"))
		}
		step(now)
	}
	if k := r.keys[key{"g", "x"}]; k == nil || k.holder.Epoch() == 0 {
		t.Fatal("key dropped")
	}
}

// TestRegionalLease: Lease reads a key's Holder (nothing for a key not
// tracked, the fallback before the first grant, the share while the lease
// runs, the fallback again after it), and Accept counts the grants a Holder
// took (not an older epoch, not a key not tracked).
func TestRegionalLease(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	if _, _, _, ok := r.Lease(0, "g", "x"); ok {
		t.Fatal("a key never decided is tracked")
	}
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	if share, _, fb, ok := r.Lease(0, "g", "x"); !ok || share != 0 || !fb {
		t.Fatalf("before the first grant: share %d fallback %v ok %v, want 0 true true", share, fb, ok)
	}
	res := Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 2, Share: 300, Burst: 30, Lifetime: 10 * sec},
		{Rule: "g", Identity: "untracked", Epoch: 2, Share: 300, Burst: 30, Lifetime: 10 * sec}}}
	if n := r.Accept(0, sec, res); n != 1 {
		t.Fatalf("accepted %d grants, want 1 (the untracked key's is ignored)", n)
	}
	if n := r.Accept(0, sec, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 1, Share: 900, Burst: 90, Lifetime: 10 * sec}}}); n != 0 {
		t.Fatalf("an older epoch was accepted (%d)", n)
	}
	if share, burst, fb, _ := r.Lease(2*sec, "g", "x"); share != 300 || burst != 30 || fb {
		t.Fatalf("during the lease: %d/%d fallback %v, want 300/30 false", share, burst, fb)
	}
	// Lifetime 10s from 1s, less the 100ms skew margin: the fallback is
	// min(safe 500, last 300) from 10.9s on.
	if share, _, fb, _ := r.Lease(11*sec, "g", "x"); share != 300 || !fb {
		t.Fatalf("after the lease: %d fallback %v, want 300 true", share, fb)
	}
}

// TestRegionalGivesBack: when a key's demand stops, ReportDue gives its
// share back within a few gaps: the key caps itself at 0 before the report
// leaves (so it enforces 0 at once), only that report carries the cap, and
// the leader hands the capacity to the region that asked for it at that
// region's next report off cycle, which its pending capacity makes due.
// A report off cycle waits for the gap after the last report.
func TestRegionalGivesBack(t *testing.T) {
	m, err := NewMachine(Config{Regions: []string{"eu", "us"}, LeaseDuration: 10 * time.Second, MaxSkew: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "g", Limit: 1000, Window: 10 * time.Second, Burst: 100, MaxCost: 1}
	if _, err := m.Apply(Command{Now: 1, Rules: []Rule{rule}}); err != nil {
		t.Fatal(err)
	}
	eu, us := newTestRegional(t, "eu", FallbackShare), newTestRegional(t, "us", FallbackShare)
	var euTAT, usTAT bucket.TAT
	ask := func(r *Regional, tat *bucket.TAT, now int64) {
		g, mode, _ := r.Share(now, "g", "x", tat)
		allowed := mode == ModeEnforce && g.Step(tat, now, 1).Allowed
		r.Observe(now, "g", "x", 1, allowed, *tat)
	}
	send := func(r *Regional, now int64, rep Report) Grant {
		t.Helper()
		res, err := m.Apply(Command{Now: now, Report: &rep})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
		r.Accept(rep.Seq, now, res)
		return res.Grants[0]
	}
	const ms = int64(time.Millisecond)
	// eu asks 100/s (1000 per window) for two seconds and holds L.
	for now := int64(0); now < 2*sec; now += 10 * ms {
		ask(eu, &euTAT, now)
		if now%sec == 0 {
			if rep, ok := eu.Report(now, nil); ok {
				send(eu, now, rep)
			}
		}
	}
	if share, _, _, _ := eu.Lease(2*sec, "g", "x"); share != 1000 {
		t.Fatalf("eu holds %d, want 1000", share)
	}
	// Its demand moves to us.
	ask(us, &usTAT, 2*sec)
	rep, ok := us.ReportDue(2*sec+10*ms, nil)
	if !ok || len(rep.Items) != 1 {
		t.Fatalf("us's new key: no report off cycle (%v, %+v)", ok, rep)
	}
	if g := send(us, 2*sec+10*ms, rep); g.Share != 0 || g.Pending == 0 {
		t.Fatalf("us while eu holds L: %+v, want nothing yet and capacity pending", g)
	}
	var capped Report
	for now := 2*sec + 10*ms; now < 2*sec+450*ms; now += 10 * ms {
		ask(us, &usTAT, now)
		if now%(100*ms) != 0 || len(capped.Items) > 0 {
			continue
		}
		if rep, ok := eu.ReportDue(now, nil); ok {
			capped = rep
			if share, _, _, _ := eu.Lease(now, "g", "x"); share != 0 {
				t.Fatalf("eu enforces %d after giving its share back, want 0", share)
			}
			send(eu, now, rep)
		}
	}
	if len(capped.Items) != 1 || !capped.Items[0].Capped || capped.Items[0].Cap != 0 {
		t.Fatalf("eu did not give its share back off cycle: %+v", capped)
	}
	if _, ok := eu.ReportDue(2*sec+450*ms, nil); ok {
		t.Fatal("a report off cycle with nothing due")
	}
	if rep, _ := eu.Report(3*sec, nil); len(rep.Items) == 1 && rep.Items[0].Capped {
		t.Fatalf("a report after the one that set the cap carries it: %+v", rep.Items[0])
	}
	rep, ok = us.ReportDue(2*sec+500*ms, nil)
	if !ok {
		t.Fatal("us, throttled with capacity pending, did not ask again")
	}
	if g := send(us, 2*sec+500*ms, rep); g.Share < 800 {
		t.Fatalf("us after eu gave back: %+v, want about L", g)
	}
}

// TestRegionalBurstyKeepsShare: a key that asks a second's worth at once,
// once a second, is not taken for one whose demand stopped in the pauses
// between its bursts: it never gives its share back.
func TestRegionalBurstyKeepsShare(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	const ms = int64(time.Millisecond)
	r.Share(0, "g", "x", &tat)
	r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 1, Share: 500, Burst: 50, Lifetime: 100 * sec}}})
	for now := int64(0); now < 10*sec; now += 100 * ms {
		if now%sec == 0 {
			for range 50 {
				g, _, _ := r.Share(now, "g", "x", &tat)
				r.Observe(now, "g", "x", 1, g.Step(&tat, now, 1).Allowed, tat)
			}
		}
		var rep Report
		if now%sec == 500*ms {
			rep, _ = r.Report(now, nil)
		} else {
			rep, _ = r.ReportDue(now, nil)
		}
		for _, it := range rep.Items {
			if it.Capped {
				t.Fatalf("at %v: a bursty key gave its share back: %+v", time.Duration(now), it)
			}
		}
	}
}

// TestRegionalAcksAtOnce: a grant smaller than the share enforced makes the
// key due off cycle, acknowledging the new epoch; a larger one does not.
func TestRegionalAcksAtOnce(t *testing.T) {
	r := newTestRegional(t, "eu", FallbackShare)
	var tat bucket.TAT
	r.Share(0, "g", "x", &tat)
	r.Observe(0, "g", "x", 1, true, tat)
	r.Report(0, nil)
	r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 1, Share: 300, Burst: 30, Lifetime: 10 * sec}}})
	r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 2, Share: 800, Burst: 80, Lifetime: 10 * sec}}})
	if rep, ok := r.ReportDue(sec/5, nil); ok {
		t.Fatalf("due after a larger grant: %+v", rep)
	}
	r.Accept(0, 0, Result{Grants: []Grant{{Rule: "g", Identity: "x", Epoch: 3, Share: 200, Burst: 20, Lifetime: 10 * sec}}})
	rep, ok := r.ReportDue(sec/5+1, nil)
	if !ok || len(rep.Items) != 1 || rep.Items[0].AckEpoch != 3 {
		t.Fatalf("a smaller grant not acknowledged at once: %v %+v", ok, rep)
	}
}
