package lease

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var testRule = Rule{ID: "global", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 5}

func newTestMachine(t testing.TB, regions ...string) *Machine {
	m, err := NewMachine(Config{Regions: regions, LeaseDuration: 10 * time.Second, MaxSkew: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(Command{Now: 1, Rules: []Rule{testRule}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestAllocate: max-min fairness with floors, never above capacity.
func TestAllocate(t *testing.T) {
	cases := []struct {
		cap, floor int64
		demand     []int64
		active     []bool
		want       []int64
	}{
		{1000, 50, []int64{100, 100, 100}, []bool{true, true, true}, []int64{100, 100, 100}},
		{1000, 50, []int64{900, 900, 0}, []bool{true, true, false}, []int64{500, 500, 0}},
		{1000, 50, []int64{10, 2000, 300}, []bool{true, true, true}, []int64{50, 650, 300}},
		{1000, 50, []int64{0, 0, 0}, []bool{false, false, false}, []int64{0, 0, 0}},
		{10, 0, []int64{5, 5, 5}, []bool{true, true, true}, []int64{3, 3, 4}},
		{100, 40, []int64{100, 100, 100}, []bool{true, true, true}, []int64{40, 40, 20}},
	}
	for _, c := range cases {
		got := Allocate(c.cap, c.floor, c.demand, c.active)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Allocate(%d, %d, %v, %v) = %v, want %v", c.cap, c.floor, c.demand, c.active, got, c.want)
		}
	}
}

// TestAllocateProperties: the sum never passes capacity; every active region
// gets its floor or its demand; no region gets more than its demand unless
// held up to the floor; and no region below its demand gets less than one
// that got more than it (max-min fairness, within a token of rounding).
func TestAllocateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "n")
		capacity := rapid.Int64Range(0, 5000).Draw(t, "cap")
		floor := rapid.Int64Range(0, capacity/int64(n)).Draw(t, "floor")
		demand := rapid.SliceOfN(rapid.Int64Range(0, 5000), n, n).Draw(t, "demand")
		active := rapid.SliceOfN(rapid.Bool(), n, n).Draw(t, "active")
		got := Allocate(capacity, floor, demand, active)
		var sum int64
		for i, g := range got {
			sum += g
			if !active[i] && g != 0 {
				t.Fatalf("inactive region %d got %d", i, g)
			}
			if active[i] && g < min(floor, capacity) {
				t.Fatalf("active region %d got %d, below the floor %d", i, g, floor)
			}
			if g > max(demand[i], floor) {
				t.Fatalf("region %d got %d, more than max(demand %d, floor %d)", i, g, demand[i], floor)
			}
		}
		if sum > capacity {
			t.Fatalf("sum %d > capacity %d", sum, capacity)
		}
		for i := range got {
			for j := range got {
				if active[i] && active[j] && got[i] < demand[i] && got[j] > got[i]+1 && got[j] > floor {
					t.Fatalf("region %d starved at %d (demand %d) while %d got %d", i, got[i], demand[i], j, got[j])
				}
			}
		}
		if sum < capacity {
			for i := range got {
				if active[i] && got[i] < demand[i] {
					t.Fatalf("capacity left (%d of %d) while region %d wants more", sum, capacity, i)
				}
			}
		}
	})
}

// TestSharesFollowDemand: with steady demand and no fault, shares converge
// to the fair allocation within a few report rounds, the busy region gets
// what the idle ones give up, and the invariant holds after every step.
func TestSharesFollowDemand(t *testing.T) {
	m := newTestMachine(t, "eu", "us", "ap")
	holders := map[string]*Holder{}
	for _, r := range m.Regions() {
		h := NewHolder(testRule, 3, int64(500*time.Millisecond))
		holders[r] = &h
	}
	now := int64(time.Second)
	seq := uint64(0)
	demand := map[string]int64{"eu": 900, "us": 50, "ap": 0}
	round := func() {
		for _, r := range m.Regions() {
			seq++
			h := holders[r]
			res, err := m.Apply(Command{Now: now, Report: &Report{Reporter: r + "-node", Seq: seq, Region: r,
				Items: []ReportItem{{Rule: "global", Identity: "cust", Demand: demand[r], AckEpoch: h.Epoch()}}}})
			if err != nil {
				t.Fatal(err)
			}
			h.Accept(now, res.Grants[0])
			if err := m.Check(); err != nil {
				t.Fatal(err)
			}
			now += int64(100 * time.Millisecond)
		}
	}
	for range 6 {
		round()
	}
	share := func(r string) int64 { s, _, _ := holders[r].At(now); return s }
	// Floor 50 (5 % of 1000) for the two active regions, the rest to eu.
	if share("eu") != 900 || share("us") != 50 || share("ap") != 0 {
		t.Fatalf("shares eu/us/ap = %d/%d/%d, want 900/50/0", share("eu"), share("us"), share("ap"))
	}
	// Demand moves from eu to ap: capacity follows once eu acknowledged.
	demand["eu"], demand["ap"] = 0, 900
	for range 6 {
		round()
	}
	if share("ap") != 900 || share("eu") != 0 {
		t.Fatalf("after the shift eu/us/ap = %d/%d/%d, want 0/50/900", share("eu"), share("us"), share("ap"))
	}
}

// TestReleaseSetByFirstAck: a shrunk region that stays throttled reports
// debt in every report; the capacity it gave up is handed on once the debt
// of its first acknowledgement is repaid, not pushed back by every later
// report (the region would otherwise keep it for as long as it is busy).
func TestReleaseSetByFirstAck(t *testing.T) {
	m := newTestMachine(t, "eu", "us")
	var seq uint64
	report := func(now int64, region string, demand int64, ack uint64, debt int64) Grant {
		t.Helper()
		seq++
		res, err := m.Apply(Command{Now: now, Report: &Report{Reporter: region + "-node", Seq: seq, Region: region,
			Items: []ReportItem{{Rule: "global", Identity: "cust", Demand: demand, AckEpoch: ack, Debt: debt}}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.CheckAt(now); err != nil {
			t.Fatal(err)
		}
		return res.Grants[0]
	}
	now := int64(time.Second)
	eu := report(now, "eu", 1000, 0, 0) // the whole limit: us is not active
	eu = report(now, "eu", 1000, eu.Epoch, 0)
	us := report(now, "us", 1000, 0, 0) // eu shrinks toward 500; us waits for it
	eu = report(now, "eu", 1000, eu.Epoch, 0)
	if eu.Share > 500 {
		t.Fatalf("eu's share %d after us asked for as much, want at most 500", eu.Share)
	}
	// eu acknowledges the shrink owing 2 s of refill, then keeps reporting
	// the same debt every 500 ms, as a throttled region does.
	debt := int64(2 * time.Second)
	report(now, "eu", 1000, eu.Epoch, debt)
	for range 8 {
		now += int64(500 * time.Millisecond)
		report(now, "eu", 1000, eu.Epoch, debt)
		us = report(now, "us", 1000, us.Epoch, 0)
	}
	// 4 s after the first acknowledgement, 2 s past its debt: us has eu's
	// half.
	if us.Share < 500 {
		t.Fatalf("us's share %d, 2 s after eu's debt was repaid; want 500", us.Share)
	}
}

// TestRetryIsIdempotent: a report applied twice (the same reporter and
// sequence number) changes nothing the second time and returns the same
// leases.
func TestRetryIsIdempotent(t *testing.T) {
	m := newTestMachine(t, "eu", "us")
	rep := &Report{Reporter: "n1", Seq: 7, Region: "eu", Items: []ReportItem{{Rule: "global", Identity: "c", Demand: 800}}}
	a, err := m.Apply(Command{Now: 10, Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Apply(Command{Now: 20, Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	if a.Grants[0].Epoch != b.Grants[0].Epoch || a.Grants[0].Share != b.Grants[0].Share {
		t.Fatalf("retry changed the lease: %+v then %+v", a.Grants[0], b.Grants[0])
	}
}

// TestBadCommands: malformed commands are refused with an error that names
// the problem, and change nothing.
func TestBadCommands(t *testing.T) {
	m := newTestMachine(t, "eu", "us")
	for _, c := range []struct {
		cmd  Command
		want error
	}{
		{Command{Now: 5}, ErrBadCommand},
		{Command{Now: 5, Tick: true, Takeover: true}, ErrBadCommand},
		{Command{Now: 5, Report: &Report{Reporter: "n", Region: "mars"}}, ErrUnknownRegion},
		{Command{Now: 5, Report: &Report{Reporter: "n", Region: "eu", Items: []ReportItem{{Rule: "nope"}}}}, ErrUnknownRule},
		{Command{Now: 5, Report: &Report{Reporter: "n", Region: "eu", Items: []ReportItem{{Rule: "global", Demand: -1}}}}, ErrBadCommand},
		{Command{Now: 5, Report: &Report{Region: "eu"}}, ErrBadCommand},
		{Command{Now: 5, Rules: []Rule{{ID: "x", Limit: 10, Window: time.Second, Burst: 1, MaxCost: 1}}}, ErrBadCommand},
	} {
		if _, err := m.Apply(c.cmd); !errors.Is(err, c.want) {
			t.Errorf("%+v: err %v, want %v", c.cmd, err, c.want)
		}
	}
	if len(m.keys) != 0 {
		t.Errorf("a refused command left state behind: %d keys", len(m.keys))
	}
}

// TestInvariantUnderFaults is the safety property of docs/global.md's
// scope, checked after every step of random runs: at every moment the
// shares the regions actually enforce (their Holders, on their own clocks)
// sum to at most L, and so does the leader's accounting (Check), through
// lost reports, lost and late replies, replies out of order, expiries,
// leader changes with clocks off by up to the skew, and demand that moves.
func TestInvariantUnderFaults(t *testing.T) {
	// Ten checks of 100 random runs each: a fencing bug planted on purpose
	// took about 80 runs to show.
	for range 10 {
		invariantUnderFaults(t)
	}
}

func invariantUnderFaults(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		regions := []string{"a", "b", "c", "d"}[:rapid.IntRange(1, 4).Draw(t, "regions")]
		const lease, skew = int64(10 * time.Second), int64(500 * time.Millisecond)
		m, err := NewMachine(Config{Regions: regions, LeaseDuration: time.Duration(lease), MaxSkew: time.Duration(skew)})
		if err != nil {
			t.Fatal(err)
		}
		rule := Rule{ID: "g", Limit: rapid.Int64Range(int64(len(regions)), 5000).Draw(t, "limit"), Window: time.Minute, MaxCost: 1}
		rule.Burst = rapid.Int64Range(int64(len(regions)), 500).Draw(t, "burst")
		if _, err := m.Apply(Command{Now: 0, Rules: []Rule{rule}}); err != nil {
			t.Fatal(err)
		}
		type reply struct {
			at     int64  // real time it arrives
			sentAt int64  // region time the report left
			seq    uint64 // of the report it answers
			g      Grant
		}
		type sent struct {
			rep    *Report
			sentAt int64
		}
		type region struct {
			h       Holder
			off     int64 // region clock = real + off
			seq     uint64
			capSeq  uint64 // the first report that carried the cap in force
			replies []reply
			late    []sent // reports still on their way to the leader
		}
		rs := make([]*region, len(regions))
		for i := range rs {
			rs[i] = &region{h: NewHolder(rule, len(regions), skew), off: rapid.Int64Range(-skew/2, skew/2).Draw(t, "offset")}
		}
		real, leaderOff := int64(time.Hour), int64(0)
		// accept hands a reply to its region's Holder, and lifts the cap
		// when the reply answers the report that carried it or a later one
		// (Regional.Accept).
		accept := func(r *region, p reply) {
			if r.h.Accept(p.sentAt, p.g) {
				if _, capped := r.h.Capped(); capped && p.seq >= r.capSeq {
					r.h.Uncap()
				}
			}
		}
		// apply delivers a report to the leader now; its reply may be lost.
		apply := func(i int, s sent) {
			res, err := m.Apply(Command{Now: real + leaderOff, Report: s.rep})
			if err != nil {
				t.Fatal(err)
			}
			if rapid.IntRange(0, 4).Draw(t, "reply lost") == 0 {
				return
			}
			rs[i].replies = append(rs[i].replies, reply{at: real + rapid.Int64Range(0, lease).Draw(t, "back"), sentAt: s.sentAt,
				seq: s.rep.Seq, g: res.Grants[0]})
		}
		check := func(step string) {
			var sum int64
			for i, r := range rs {
				s, _, _ := r.h.At(real + r.off)
				sum += s
				_ = i
			}
			// After the limit was lowered, what was granted under the
			// old one is counted until given back (Machine.setRules).
			bound := rule.Limit
			for _, ks := range m.keys {
				bound = max(bound, ks.over)
			}
			if sum > bound {
				for k, ks := range m.keys {
					for i, l := range ks.regions {
						t.Logf("%v region %d: leader %+v (now %d guard %d) holder %+v at %d", k, i, l, m.now, m.guard, rs[i].h, real+rs[i].off)
					}
				}
				t.Fatalf("%s: regions enforce %d in all, above L = %d (bound %d)", step, sum, rule.Limit, bound)
			}
			if err := m.CheckAt(max(real+leaderOff, m.now)); err != nil {
				t.Fatalf("%s: %v", step, err)
			}
		}
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for s := range steps {
			switch rapid.IntRange(0, 11).Draw(t, "action") {
			case 0, 1: // time passes, sometimes past a whole lease
				real += rapid.Int64Range(0, 2*lease).Draw(t, "dt") / int64(rapid.IntRange(1, 20).Draw(t, "div"))
			case 2, 3, 4, 5: // a region reports, off cycle or not
				i := rapid.IntRange(0, len(rs)-1).Draw(t, "region")
				r := rs[i]
				r.seq++
				if rapid.IntRange(0, 3).Draw(t, "give back") == 0 {
					// The region gives capacity back: it caps itself
					// before the report leaves (Regional.ReportDue).
					share, _, _ := r.h.At(real + r.off)
					c := rapid.Int64Range(0, max(share, 0)).Draw(t, "cap")
					r.h.Cap(c, burst(rule, c))
					if cur, _ := r.h.Capped(); cur == c {
						r.capSeq = r.seq
					}
				}
				item := ReportItem{Rule: "g", Identity: "cust", Demand: rapid.Int64Range(0, 2*rule.Limit).Draw(t, "demand"),
					AckEpoch: r.h.Epoch(), Debt: rapid.Int64Range(0, int64(time.Minute)).Draw(t, "debt")}
				if c, ok := r.h.Capped(); ok && r.capSeq == r.seq {
					item.Capped, item.Cap = true, c // only the report that sets a cap carries it
				}
				s := sent{rep: &Report{Reporter: regions[i] + "-owner", Seq: r.seq, Region: regions[i], Items: []ReportItem{item}},
					sentAt: real + r.off}
				switch rapid.IntRange(0, 5).Draw(t, "report fate") {
				case 0:
					// the report never reaches the leader
				case 1:
					r.late = append(r.late, s) // it arrives later, after later ones maybe
				default:
					real += rapid.Int64Range(0, int64(time.Second)).Draw(t, "to leader")
					apply(i, s)
				}
			case 11: // a late report reaches the leader
				i := rapid.IntRange(0, len(rs)-1).Draw(t, "region")
				r := rs[i]
				if len(r.late) == 0 {
					break
				}
				k := rapid.IntRange(0, len(r.late)-1).Draw(t, "which late")
				s := r.late[k]
				r.late = append(r.late[:k], r.late[k+1:]...)
				real += rapid.Int64Range(0, int64(time.Second)).Draw(t, "late by")
				apply(i, s)
			case 6: // replies that are due arrive, in any order
				for _, r := range rs {
					var keep []reply
					for _, p := range r.replies {
						if p.at <= real && rapid.Bool().Draw(t, "deliver") {
							accept(r, p)
						} else {
							keep = append(keep, p)
						}
					}
					r.replies = keep
				}
			case 7: // a new leader, its clock off by up to the skew
				leaderOff = rapid.Int64Range(-skew/2, skew/2).Draw(t, "leader offset")
				real += rapid.Int64Range(0, int64(time.Second)).Draw(t, "election")
				if _, err := m.Apply(Command{Now: real + leaderOff, Takeover: true}); err != nil {
					t.Fatal(err)
				}
			case 8:
				if _, err := m.Apply(Command{Now: real + leaderOff, Tick: true}); err != nil {
					t.Fatal(err)
				}
			case 10: // an operator changes the limit; regions learn it at once
				if rapid.IntRange(0, 3).Draw(t, "change limit") != 0 {
					break
				}
				rule.Limit = rapid.Int64Range(int64(len(regions)), 5000).Draw(t, "new limit")
				rule.Burst = max(rule.Burst, int64(len(regions)))
				if _, err := m.Apply(Command{Now: max(real+leaderOff, m.now), Rules: []Rule{rule}}); err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					r.h.SetRule(rule, len(regions))
				}
			case 9: // a late reply arrives even if not due yet (reordering)
				for _, r := range rs {
					if len(r.replies) > 0 {
						p := r.replies[len(r.replies)-1]
						r.replies = r.replies[:len(r.replies)-1]
						if p.at > real {
							real = p.at
						}
						accept(r, p)
						break
					}
				}
			}
			check(fmt.Sprintf("step %d", s))
		}
	})
}

// TestFloor: the floor is the floor fraction of L, raised until the share's
// burst covers the largest cost, and never above the safe share.
func TestFloor(t *testing.T) {
	m := newTestMachine(t, "ap", "eu", "us")
	for _, c := range []struct {
		r    Rule
		want int64
	}{
		{Rule{ID: "a", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 1}, 50},   // 5 % of L
		{Rule{ID: "b", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 10}, 100}, // ⌊100·f ÷ 1000⌋ ≥ 10
		{Rule{ID: "c", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 50}, 333}, // capped at the safe share
		{Rule{ID: "d", Limit: 3, Window: time.Minute, Burst: 3, MaxCost: 1}, 1},         // at least 1
	} {
		if got := m.Floor(c.r); got != c.want {
			t.Errorf("Floor(%+v) = %d, want %d", c.r, got, c.want)
		}
		if f := m.Floor(c.r); f < m.safe(c.r) && burst(c.r, f) < c.r.MaxCost {
			t.Errorf("Floor(%+v) = %d: its burst %d is below the cost", c.r, f, burst(c.r, f))
		}
	}
}

// TestCapReleasesHold: a report that gives capacity back (ReportItem.Capped)
// lowers the region's share at once and its hold once the debt it carries is
// repaid, with no grant and acknowledgement in between; the capacity then
// goes to a region that wants it. A cap at or above the hold changes
// nothing, and a negative cap is refused.
func TestCapReleasesHold(t *testing.T) {
	m := newTestMachine(t, "eu", "us")
	now := int64(time.Second)
	report := func(region string, seq uint64, it ReportItem) Grant {
		t.Helper()
		it.Rule, it.Identity = "global", "cust"
		res, err := m.Apply(Command{Now: now, Report: &Report{Reporter: region + "-node", Seq: seq, Region: region, Items: []ReportItem{it}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
		return res.Grants[0]
	}
	eu := report("eu", 1, ReportItem{Demand: 2000})
	if eu.Share != 1000 {
		t.Fatalf("eu's first grant %+v, want the whole limit", eu)
	}
	us := report("us", 1, ReportItem{Demand: 2000})
	if us.Share != 0 || us.Pending != 500 {
		t.Fatalf("us while eu holds everything: %+v, want share 0 with 500 pending", us)
	}
	// A cap at the hold gives nothing back.
	now += int64(100 * time.Millisecond)
	report("eu", 2, ReportItem{Demand: 2000, AckEpoch: eu.Epoch, Capped: true, Cap: 1000})
	if v := m.View("global", "cust", now); v[0].Hold != 1000 || v[0].Releasing {
		t.Fatalf("eu after a cap at its hold: %+v, want hold 1000, nothing released", v[0])
	}
	now += int64(100 * time.Millisecond)
	g := report("eu", 3, ReportItem{Demand: 0, AckEpoch: eu.Epoch, Capped: true, Cap: 0, Debt: int64(time.Second)})
	if g.Share != 0 || g.Epoch <= eu.Epoch {
		t.Fatalf("eu's grant after giving everything back: %+v, want share 0 in a new epoch", g)
	}
	v := m.View("global", "cust", now)
	if v[0].Hold != 1000 || !v[0].Releasing {
		t.Fatalf("eu before its debt is repaid: %+v, want hold 1000 releasing", v[0])
	}
	now += int64(time.Second)
	if _, err := m.Apply(Command{Now: now, Tick: true}); err != nil {
		t.Fatal(err)
	}
	if v := m.View("global", "cust", now); v[0].Hold != 0 || v[0].Term != 0 {
		t.Fatalf("eu after its debt is repaid: %+v, want hold 0", v[0])
	}
	if us = report("us", 2, ReportItem{Demand: 2000, AckEpoch: us.Epoch}); us.Share != 1000 || us.Pending != 0 {
		t.Fatalf("us once eu gave everything back: %+v, want the whole limit", us)
	}
	if _, err := m.Apply(Command{Now: now, Report: &Report{Reporter: "eu-node", Seq: 9, Region: "eu",
		Items: []ReportItem{{Rule: "global", Identity: "cust", Capped: true, Cap: -1}}}}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("a negative cap: %v, want ErrBadCommand", err)
	}
}
