package global

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestDeterministic: the same flags print the same bytes, and a different
// seed a different run.
func TestDeterministic(t *testing.T) {
	args := []string{"-regions", "3", "-demand", "poisson", "-ids", "2", "-faults", "partition:r1@5s-20s,leader@8s,loss:0.02", "-duration", "25s", "-seed", "4"}
	var a, b, c, errs bytes.Buffer
	if code := Main(args, &a, &errs); code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, a.String(), errs.String())
	}
	Main(args, &b, &errs)
	if a.String() != b.String() {
		t.Fatalf("outputs differ:\n%s\n---\n%s", a.String(), b.String())
	}
	Main(append(args[:len(args)-1:len(args)-1], "5"), &c, &errs)
	if c.String() == a.String() {
		t.Fatal("seeds 4 and 5 printed the same run")
	}
	if !strings.Contains(a.String(), "Σ shares ÷ L, peak at any event") || !strings.Contains(a.String(), "\nok: ") {
		t.Fatalf("summary lacks the table or the verdict:\n%s", a.String())
	}
}

// TestShortSweep: the invariant (at every event), Check (after every
// Apply) and the global envelope (every interval) hold over a grid of
// regions, demand and faults; runs with no fault admit nothing open and
// hand out at most L. See docs/overshoot.md, "Global limits across
// regions".
func TestShortSweep(t *testing.T) {
	g, err := ParseGrid("regions=2,3,5;demand=constant,move,bursty,poisson;faults=[none][partition:r1@6s-20s][leader@6s][loss:0.05]")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := Sweep(Config{Limit: 200, Duration: 25 * time.Second, MoveEvery: 8 * time.Second, Skew: 300 * time.Millisecond, Seed: 11}, g, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.OK() {
			t.Errorf("%s:\n%s", r.Config.Flags(), strings.Join(r.Violations, "\n"))
		}
		if r.SharesPeak > 1 {
			t.Errorf("%s: Σ shares peaked at %.4f of L", r.Config.Flags(), r.SharesPeak)
		}
		if r.Excess > r.Bound {
			t.Errorf("%s: excess %.2f above the bound %.2f", r.Config.Flags(), r.Excess, r.Bound)
		}
		if r.Config.Faults == nil {
			if r.Degraded != 0 {
				t.Errorf("%s: %d tokens admitted open with no fault", r.Config.Flags(), r.Degraded)
			}
			if r.Fallbacks != 0 || r.FaultTerm != 0 {
				t.Errorf("%s: %d falls back (fault term %.2f) with no fault", r.Config.Flags(), r.Fallbacks, r.FaultTerm)
			}
		}
	}
	if !strings.Contains(out.String(), "48 runs, 0 violations") {
		t.Fatalf("sweep output:\n%s", out.String())
	}
}

// TestPartitionFallsBack: a region cut off from the leader keeps its lease
// (its share, not the fallback) until the lease runs out, then enforces
// min(safe share, last share). Its capacity moves to a region that wants it
// only once the cut region's lease has expired and its last report is older
// than the machine's ActiveFor (3 leases): until then its stale demand
// keeps its fair allocation. After the heal it is granted again.
func TestPartitionFallsBack(t *testing.T) {
	const from, to = 10 * time.Second, 50 * time.Second
	cfg := Config{Regions: 3, Limit: 300, Demand: DemandSchedule, Schedule: mustSchedule(t, "0s=600,450,20"),
		Faults: mustFaults(t, "partition:r0@10s-50s"), Duration: 65 * time.Second, Skew: 400 * time.Millisecond, Seed: 3}
	safe := cfg.Limit / 3
	var before, r1Before, r1During int64
	held, fellBack, back := false, false, false
	cfg.probe = func(at time.Duration, share []int64, fb []bool) {
		switch {
		case at > 5*time.Second && at < from:
			before, r1Before = share[0], share[1]
		case at >= from && at < from+5*time.Second:
			// Well inside the lease (10 s, at most one refresh spent
			// before the cut): the region still enforces its share.
			if fb[0] || share[0] != before {
				t.Errorf("at %v, %v into the cut: r0 enforces %d (fallback %v), want its lease's %d", at, at-from, share[0], fb[0], before)
			}
			if share[1] > r1Before {
				t.Errorf("at %v: r1 grew to %d while r0's lease was live", at, share[1])
			}
			held = true
		case at >= from+12*time.Second && at < to:
			if !fb[0] || share[0] != min(safe, before) {
				t.Errorf("at %v: r0 enforces %d (fallback %v), want the fallback min(safe %d, last %d)", at, share[0], fb[0], safe, before)
			}
			fellBack = true
			if at >= from+35*time.Second {
				r1During = max(r1During, share[1])
			}
		case at >= to+4*time.Second:
			if fb[0] || share[0] == 0 {
				t.Errorf("at %v, after the heal: r0 enforces %d (fallback %v), want a lease", at, share[0], fb[0])
			}
			back = true
		}
	}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("%s", strings.Join(res.Violations, "\n"))
	}
	if !held || !fellBack || !back {
		t.Fatalf("probe missed a phase: held %v, fell back %v, back %v", held, fellBack, back)
	}
	if before <= safe {
		t.Fatalf("r0's share before the cut %d is not above the safe share %d: the test shows nothing", before, safe)
	}
	if r1During <= r1Before {
		t.Errorf("r1 stayed at %d (from %d) after r0 fell back: the freed capacity did not move", r1During, r1Before)
	}
	if res.Fallbacks != 1 || res.FaultTerm <= 0 {
		t.Errorf("falls back %d, fault term %.2f: want one fall back with a positive term", res.Fallbacks, res.FaultTerm)
	}
}

// TestLeaderLoss: two leader crashes; each new leader takes over after the
// election with its own clock. No lease is double-allocated (the invariant
// at every event and Check after every Apply), and the regions keep
// enforcing their leases throughout: a lease outlives an election.
func TestLeaderLoss(t *testing.T) {
	cfg := Config{Regions: 3, Limit: 300, Demand: DemandMove, MoveEvery: 7 * time.Second,
		Faults: mustFaults(t, "leader@8s,leader@16s,loss:0.02"), Duration: 40 * time.Second, Skew: 500 * time.Millisecond, Seed: 9}
	cfg.probe = func(at time.Duration, share []int64, expired []bool) {
		for i := range share {
			if expired[i] {
				t.Errorf("at %v: r%d's lease expired", at, i)
			}
		}
	}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		t.Fatalf("%s", strings.Join(res.Violations, "\n"))
	}
	if res.LeaderCrashes != 2 || res.Takeovers != 3 {
		t.Fatalf("crashes %d, takeovers %d: want 2 and 3 (the first leader's included)", res.LeaderCrashes, res.Takeovers)
	}
	if res.Fallbacks != 0 || res.Degraded != 0 {
		t.Fatalf("falls back %d, open admissions %d: want none", res.Fallbacks, res.Degraded)
	}
	if res.LostAtLeader == 0 {
		t.Fatal("no report reached a dead leader: the crashes did not bite")
	}
}

// TestDoormanShort: ten minutes of Doorman's scenario in both mappings
// pass every check, and Σ shares never passes the capacity.
func TestDoormanShort(t *testing.T) {
	for _, regions := range []int{3, 9} {
		c := DoormanConfig(regions, false, 1)
		c.Duration = 10 * time.Minute
		res, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		if !res.OK() || res.SharesPeak > 1 {
			t.Fatalf("%d regions: peak %.4f, violations:\n%s", regions, res.SharesPeak, strings.Join(res.Violations, "\n"))
		}
		if res.Spikes+res.Elections+res.Outages != 10 {
			t.Fatalf("%d regions: %d mishaps in 10 minutes, want 10 (at 1, 2, ... 10 minutes)", regions, res.Spikes+res.Elections+res.Outages)
		}
	}
}

// TestFlagErrors: bad flags exit 2 naming the problem.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-regions", "1"}, "regions 1"},
		{[]string{"-faults", "partition:r1"}, `missing "@T1-T2"`},
		{[]string{"-faults", "partition:r7@1s-2s"}, "no region r7"},
		{[]string{"-faults", "quake@1s"}, "unknown kind"},
		{[]string{"-demand", "heavy"}, `demand "heavy"`},
		{[]string{"-schedule", "0s=x"}, "-schedule"},
		{[]string{"-demand", "bursty", "-poisson"}, "poisson: demand bursty"},
		{[]string{"-skew", "2s"}, "skew 2s"},
		{[]string{"-refresh", "20s"}, "refresh 20s"},
		{[]string{"-sweep", "regions=1"}, "regions="},
		{[]string{"-latency", "gauss:1ms"}, "-latency"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var out, errs bytes.Buffer
		if code := Main(tc.args, &out, &errs); code != 2 || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs.String(), tc.want)
		}
	}
}

// TestFlagsReproduce: a config's Flags parse back to the same run, with
// evenly spaced and with Poisson arrivals (which give another run).
func TestFlagsReproduce(t *testing.T) {
	var runs []string
	for _, poisson := range []bool{false, true} {
		c := Config{Regions: 4, Limit: 300, Demand: DemandSchedule, Schedule: mustSchedule(t, "0s=100,0,200,50;5s=0,300,0,10"),
			Faults: mustFaults(t, "partition:r2@3s-9s,loss:0.01@2s-4s"), Duration: 12 * time.Second, Seed: 8, Poisson: poisson}
		res, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		var want, got, errs bytes.Buffer
		res.Summary(&want)
		args := strings.Fields(strings.ReplaceAll(strings.TrimPrefix(c.Flags(), "-global "), "'", ""))
		if code := Main(args, &got, &errs); code != 0 {
			t.Fatalf("exit %d: %s", code, errs.String())
		}
		if got.String() != want.String() {
			t.Fatalf("flags %q do not reproduce the run:\n%s\n---\n%s", c.Flags(), want.String(), got.String())
		}
		runs = append(runs, want.String())
	}
	if runs[0] == runs[1] {
		t.Fatal("Poisson arrivals gave the same run as evenly spaced ones")
	}
}

func mustSchedule(t *testing.T, s string) []Shift {
	t.Helper()
	sh, err := ParseSchedule(s)
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

func mustFaults(t *testing.T, s string) []Fault {
	t.Helper()
	f, err := ParseFaults(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTwentyRegions: twenty regions with cross-region latencies from 20 to
// 150 ms keep every check, serve at least 95 % of min(demand, L) under
// moving and Poisson demand, and follow a shift within a second (median).
func TestTwentyRegions(t *testing.T) {
	lat, err := ParseLatency("uniform:20ms:150ms")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{DemandMove, DemandPoisson} {
		res, err := Run(Config{Regions: 20, Limit: 2000, Demand: d, Latency: lat, Duration: 30 * time.Second, Skew: 200 * time.Millisecond, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !res.OK() {
			t.Fatalf("%s: %s", res.Config.Flags(), strings.Join(res.Violations, "\n"))
		}
		med, _ := res.FollowStats()
		if res.FillMean < 0.95 || med > time.Second {
			t.Errorf("%s: served %.2f%% of min(demand, L), followed in a median of %v", d, 100*res.FillMean, med)
		}
	}
}
