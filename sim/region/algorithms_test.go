package region

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// TestAlgorithmsExactAreOneInstance: with no fault, a region deciding a
// fixed_window, sliding_window, sliding_log or leaky_bucket rule in mode
// exact admits exactly what one instance of the algorithm, fed the
// admissions in the owners' order, admits (the replay refuses nothing),
// under traffic that saturates every node and under Zipf traffic over many
// identities; and it admits within 5 % as much as one instance fed the
// requests in arrival order (10 % for concurrency, whose slots are held
// for the admission's and the release's trips too).
func TestAlgorithmsExactAreOneInstance(t *testing.T) {
	for _, a := range SimAlgorithms {
		for _, tr := range []string{TrafficSaturate, TrafficZipf, TrafficUneven} {
			c := Config{Nodes: 5, Algorithm: a, Traffic: tr, IDs: 5, Duration: 3 * time.Second, Seed: 3}
			if a == quota.AlgorithmConcurrency {
				c.Limit = 5 // 5 in flight, each held 20 ms
			}
			r, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			if r.Config.Mode != quota.ModeExact {
				t.Fatalf("%s: mode %s, want exact by default", a, r.Config.Mode)
			}
			if r.ExcessAccounted != 0 || r.ExcessAll != 0 || r.Degraded != 0 || !r.OK() {
				t.Errorf("%s %s: %.0f tokens the replay refuses (%.0f of all), %d degraded, violations %v", a, tr, r.ExcessAccounted, r.ExcessAll, r.Degraded, r.Violations)
			}
			// A slot is held its request's time plus the trips of the
			// admission and of the release: a few percent of 20 ms.
			tol := map[bool]float64{false: 0.05, true: 0.10}[a == quota.AlgorithmConcurrency]
			if lag := r.RefAdmitted - r.Admitted; float64(lag) > tol*float64(r.RefAdmitted) {
				t.Errorf("%s %s: admitted %d, %d fewer than the reference in arrival order", a, tr, r.Admitted, lag)
			}
		}
	}
}

// TestAlgorithmsFaults: the faults of the default sweep, each within its
// term, and an owner crash does cost a fresh state (the check is not blind).
func TestAlgorithmsFaults(t *testing.T) {
	g, err := ParseGrid("nodes=3;traffic=saturate,zipf;mode=exact;algorithm=fixed_window,sliding_window,sliding_log,leaky_bucket;" +
		"faults=[crash:n1@1s,restart:n1@2s][partition:n0@1s-1500ms][loss:0.01][leave:n1@1s,join:n1@2s][skew:n0:+200ms@1s]")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rs, err := Sweep(Config{Duration: 4 * time.Second, Seed: 1}, g, &buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := 4*2*5 - 2*2; len(rs) != want {
		t.Errorf("%d runs, want %d (the window algorithms without the skew)", len(rs), want)
	}
	g.Algorithm = []quota.Algorithm{quota.AlgorithmConcurrency}
	more, err := Sweep(Config{Duration: 4 * time.Second, Seed: 100, Limit: 5}, g, &buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs = append(rs, more...)
	crashCost := map[quota.Algorithm]bool{}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("seed %d: %s\n  go run ./sim %s", r.Config.Seed, strings.Join(r.Violations, "; "), r.Config.Flags())
		}
		if r.Config.Faults[0].Kind == FaultCrash && r.ExcessAccounted > 0 {
			crashCost[r.Config.Algorithm] = true
		}
	}
	for _, a := range SimAlgorithms {
		if !crashCost[a] {
			t.Errorf("%s: no owner crash cost anything the replay refuses", a)
		}
	}
	if t.Failed() {
		t.Log(buf.String())
	}
}

// TestReplayCounts: the replay refuses what one instance refuses, once.
func TestReplayCounts(t *testing.T) {
	c := Config{Algorithm: quota.AlgorithmFixedWindow, Limit: 10, Window: time.Second}.withDefaults()
	fresh, err := newAlgoRef(c)
	if err != nil {
		t.Fatal(err)
	}
	p := &replay{fresh: fresh}
	for i := range 25 { // 25 in one window, 10 allowed
		p.record(int64(i)*int64(time.Millisecond), 0, 1, i >= 20)
	}
	p.record(int64(1500*time.Millisecond), 0, 1, false) // the next window
	got := p.run([]segment{{0, int64(10 * time.Second)}}, nil)
	if got.acc != 10 || got.all != 15 || got.clean != 10 || got.worst != 0 {
		t.Errorf("replay %+v, want 10 accounted, 15 of all, 10 clean, identity 0", got)
	}
}

// TestAlgorithmConfigErrors: what the simulator cannot check is refused
// with the reason.
func TestAlgorithmConfigErrors(t *testing.T) {
	skew, err := ParseFaults("skew:n0:+100ms@1s")
	if err != nil {
		t.Fatal(err)
	}
	static, err := ParseFaults("skew:n0:+100ms")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Algorithm: quota.AlgorithmConcurrency, Hold: -time.Second}, "hold -1s"},
		{Config{Algorithm: "fixed"}, "want gcra or one of"},
		{Config{Algorithm: quota.AlgorithmSlidingLog, Mode: quota.ModeShared}, "mode exact only"},
		{Config{Algorithm: quota.AlgorithmFixedWindow, Burst: 5}, "holds its limit"},
		{Config{Algorithm: quota.AlgorithmFixedWindow, Faults: skew}, "window boundaries"},
		{Config{Algorithm: quota.AlgorithmLeakyBucket, Faults: static}, "static clock skew"},
		{Config{Algorithm: quota.AlgorithmSlidingLog, Rules: []RuleSpec{{Limit: 5}}}, "extra rules"},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.c.Algorithm, err, tc.want)
		}
	}
}

// TestInFlightCounts: the concurrency check counts the spans in flight at
// once, ends before starts at one instant, on_failure spans apart.
func TestInFlightCounts(t *testing.T) {
	f := &inFlight{limit: 2}
	for i := range 4 { // 4 at once over [10, 20): 2 beyond the limit
		f.spans = append(f.spans, slotSpan{from: 10, to: 20, ident: 1, cost: 1, degraded: i == 3})
	}
	f.spans = append(f.spans, slotSpan{from: 20, to: 30, ident: 1, cost: 2}) // starts as the others end
	got := f.run([]segment{{15, 100}}, nil)
	if got.acc != 1 || got.all != 2 || got.clean != 0 || got.worst != 1 {
		t.Errorf("in flight %+v, want 1 beyond the limit accounted, 2 of all, 0 clean (the peak began at 10), identity 1", got)
	}
}

// TestAlgorithmsKeyCap: with a key cap far under the identities, every
// algorithm's evictions forgive state, and each identity's excess stays
// within what its own evictions forgave (its key cap term).
func TestAlgorithmsKeyCap(t *testing.T) {
	for _, a := range SimAlgorithms {
		c := Config{Algorithm: a, Traffic: TrafficZipf, IDs: 2000, KeyCap: 50, Duration: 2 * time.Second, Seed: 7}
		if a == quota.AlgorithmConcurrency {
			c.Limit = 5
		}
		r, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK() || r.Coord.EvictedForgiven == 0 || r.ExcessRaw <= 0 {
			t.Errorf("%s: %d evictions forgave state, %.0f refused with no term; violations %v", a, r.Coord.EvictedForgiven, r.ExcessRaw, r.Violations)
		}
	}
}
