package region

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// TestDeterministic runs one seed twice, with faults, loss, random latency
// and Zipf traffic, and compares the summaries byte for byte.
func TestDeterministic(t *testing.T) {
	fs, err := ParseFaults("crash:n1@1s,restart:n1@2s,partition:n0|n2@2500ms-3s,loss:0.01,latency:lognormal:300us:1,skew:n2:+20ms@1500ms")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Nodes: 4, Traffic: TrafficZipf, IDs: 50, Rate: 2000, Duration: 4 * time.Second, Seed: 42, Faults: fs}
	var out [2]bytes.Buffer
	for i := range out {
		r, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.Summary(&out[i])
	}
	if !bytes.Equal(out[0].Bytes(), out[1].Bytes()) {
		t.Fatalf("two runs of seed 42 differ:\n%s\n---\n%s", out[0].String(), out[1].String())
	}
	r, _ := Run(Config{Nodes: 4, Traffic: TrafficZipf, IDs: 50, Rate: 2000, Duration: 4 * time.Second, Seed: 43, Faults: fs})
	var other bytes.Buffer
	r.Summary(&other)
	if bytes.Equal(other.Bytes(), out[0].Bytes()) {
		t.Fatal("seeds 42 and 43 gave identical runs: the seed is not used")
	}
}

// TestShortSweep runs a small grid and asserts, in every run, the upper
// envelope with the stated fault terms, the lower bound in every fault-free
// interval for saturating traffic, and no on_failure decision in a run
// with no fault (docs/overshoot.md, "The envelope").
func TestShortSweep(t *testing.T) {
	g, err := ParseGrid("nodes=3,5;accuracy=0.05,0.2;sync=20ms,100ms;traffic=uneven,saturate,bursty,zipf;" +
		"faults=[none][crash:n2@1s,restart:n2@2s][partition:n0@1s-1500ms][leave:n1@1s,join:n1@2s]")
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Duration: 4 * time.Second, Seed: 1, IDs: 0, Rate: 0}
	if testing.Short() {
		g.Accuracy, g.Sync = g.Accuracy[:1], g.Sync[:1]
	}
	var buf bytes.Buffer
	rs, err := Sweep(base, g, &buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("seed %d: %s\n  go run ./sim %s", r.Config.Seed, strings.Join(r.Violations, "; "), r.Config.Flags())
		}
		if len(r.Config.Faults) == 0 && r.Degraded != 0 {
			t.Errorf("seed %d: %d on_failure decisions with no fault", r.Config.Seed, r.Degraded)
		}
		if r.Config.saturating() && math.IsNaN(r.Shortfall) {
			t.Errorf("seed %d: saturating traffic but the lower bound was not checked", r.Config.Seed)
		}
	}
	if t.Failed() {
		t.Log(buf.String())
	}
}

// TestExactModeIsTheReference: an exact rule with no fault admits exactly
// what GCRA allows in the owner's order: no interval exceeds B + r·Δ.
func TestExactModeIsTheReference(t *testing.T) {
	for _, tr := range []string{TrafficUneven, TrafficZipf, TrafficSaturate} {
		r, err := Run(Config{Nodes: 5, Mode: quota.ModeExact, Traffic: tr, IDs: 5, Duration: 3 * time.Second, Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		if r.ExcessAccounted > eps || r.Degraded != 0 || !r.OK() {
			t.Errorf("%s: excess %.4f over B + r·Δ, %d degraded, violations %v", tr, r.ExcessAccounted, r.Degraded, r.Violations)
		}
	}
}

// TestOwnerCrash crashes the owner of the only identity while a non-owner
// saturates it, for each on_failure, and checks the fallback (docs/cluster.md:
// "When a peer fails") and the crash's fault term (docs/overshoot.md, "Owner
// crash"): while the owner is unreachable and still in the ring, every
// decision for its identities is marked degraded; open admits them all,
// closed none, local at most limit ÷ N with burst ⌊B ÷ N⌋; the accounted
// admissions stay within B + r·Δ + S + (B + S).
func TestOwnerCrash(t *testing.T) {
	const nodes = 3
	owner := mustRing(t, nodes).OwnerName("id-0")
	for _, of := range []quota.OnFailure{quota.OnFailureLocal, quota.OnFailureOpen, quota.OnFailureClosed} {
		t.Run(string(of), func(t *testing.T) {
			fs, err := ParseFaults("crash:" + owner + "@2s")
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{Nodes: nodes, Limit: 100, Burst: 30, OnFailure: of, Traffic: TrafficOneNode, Load: 4,
				Duration: 6 * time.Second, Seed: 5, Faults: fs}
			r, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK() {
				t.Fatalf("violations: %v", r.Violations)
			}
			if r.Degraded == 0 {
				t.Fatal("no on_failure decision while the owner was down")
			}
			c := r.Config
			switch of {
			case quota.OnFailureOpen:
				if r.DegradedAdmitted != r.Degraded*c.Cost {
					t.Errorf("open: %d of %d degraded decisions admitted", r.DegradedAdmitted, r.Degraded)
				}
			case quota.OnFailureClosed:
				if r.DegradedAdmitted != 0 {
					t.Errorf("closed: %d admitted", r.DegradedAdmitted)
				}
			default:
				// One node sends; it falls back for at most the detection
				// delay plus a decide timeout and a tick.
				d := (c.Detect + c.DecideTimeout + c.Tick).Seconds()
				limit := float64(c.Burst/nodes) + math.Ceil(float64(c.Limit/nodes)*d/c.Window.Seconds()) + 1
				if float64(r.DegradedAdmitted) > limit {
					t.Errorf("local: %d admitted by the fallback, above ⌊B/N⌋ + (L/N)·d = %.0f", r.DegradedAdmitted, limit)
				}
				if r.DegradedAdmitted == 0 {
					t.Error("local: the fallback admitted nothing")
				}
			}
			term := float64(c.Burst) + float64(r.SFault)
			if len(r.Terms) != 1 || r.Terms[0].Tokens != term {
				t.Fatalf("fault terms %+v, want one of B + S = %.0f", r.Terms, term)
			}
			if r.ExcessAccounted > float64(r.SFault)+term+eps {
				t.Errorf("accounted excess %.2f above S + B + S = %.2f", r.ExcessAccounted, float64(r.SFault)+term)
			}
			t.Logf("degraded %d (admitted %d), accounted excess %.2f (bound %.2f), all %.2f",
				r.Degraded, r.DegradedAdmitted, r.ExcessAccounted, r.BoundAccounted, r.ExcessAll)
		})
	}
}

// TestChecksAgainstBruteForce compares the streaming interval checks with
// a direct scan over every pair of admissions.
func TestChecksAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + rng.IntN(30)
		rate := 0.5 + rng.Float64()
		var ts []int64
		var cs []int64
		at := int64(0)
		for range n {
			at += rng.Int64N(5)
			ts = append(ts, at)
			cs = append(cs, 1+rng.Int64N(3))
		}
		up := newUp()
		for i := range ts {
			up.add(ts[i], cs[i], rate)
		}
		want := math.Inf(-1)
		for i := range ts {
			var sum float64
			for j := i; j < len(ts); j++ {
				sum += float64(cs[j])
				want = max(want, sum-rate*float64(ts[j]-ts[i]))
			}
		}
		if math.Abs(up.best-want) > 1e-9 {
			t.Fatalf("trial %d: upper %.4f, brute force %.4f", trial, up.best, want)
		}
		from, to := int64(0), at+3
		low := newLow()
		low.point(from, 0, rate)
		for i := range ts {
			low.point(ts[i], cs[i], rate)
		}
		low.point(to, 0, rate)
		pts := append(append([]int64{from}, ts...), to)
		costs := append(append([]int64{0}, cs...), 0)
		wantLow := math.Inf(-1)
		for i := range pts {
			var sum float64
			for j := i + 1; j < len(pts); j++ {
				// strictly between i and j
				wantLow = max(wantLow, rate*float64(pts[j]-pts[i])-sum)
				sum += float64(costs[j])
			}
		}
		if math.Abs(low.worst-wantLow) > 1e-9 {
			t.Fatalf("trial %d: lower %.4f, brute force %.4f", trial, low.worst, wantLow)
		}
	}
}

// TestParseFaultsErrors checks that each malformed spec fails with an error
// that names what is wrong.
func TestParseFaultsErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"explode:n1@1s", `unknown kind "explode"`},
		{"crash:n1", `missing "@TIME"`},
		{"crash:node1@1s", `node "node1"`},
		{"crash:n1@soon", `time "soon"`},
		{"crash:n1@-1s", `negative`},
		{"partition:n0|n1@5s", `window "5s"`},
		{"partition:n0|n1@5s-4s", `ends before it starts`},
		{"partition:n0|n0@1s-2s", `in two groups`},
		{"loss:1.5", `loss "1.5"`},
		{"latency:normal:1ms", `want const:D`},
		{"latency:uniform:2ms:1ms", `upper bound below lower bound`},
		{"latency:lognormal:1ms:x", `sigma "x"`},
		{"skew:n1:50ms", `signed duration`},
		{"crash", `want KIND:`},
		{"crash:n1@1s,n2@2s", `item 2 "n2@2s": want KIND:`},
	} {
		_, err := ParseFaults(tc.spec)
		if err == nil || !errors.Is(err, ErrFaultSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFaults(%q) = %v, want an ErrFaultSpec naming %q", tc.spec, err, tc.want)
		}
	}
	for _, tc := range []struct {
		nodes      int
		spec, want string
	}{
		{3, "restart:n1@1s", "is running then"},
		{3, "crash:n1@1s,crash:n1@2s", "is not running then"},
		{3, "join:n5@1s", "must be n3"},
		{3, "join:n1@1s", "already in the cluster"},
		{3, "restart:n4@1s", "never started"},
		{3, "partition:n0|n7@1s-2s", "no node n7"},
	} {
		fs, err := ParseFaults(tc.spec)
		if err != nil {
			t.Fatalf("ParseFaults(%q): %v", tc.spec, err)
		}
		err = Config{Nodes: tc.nodes, Faults: fs}.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%q) = %v, want an error naming %q", tc.spec, err, tc.want)
		}
	}
}

// TestParseFaults checks a spec with every kind and the comma inside a
// partition's group.
func TestParseFaults(t *testing.T) {
	spec := "crash:n1@10s,restart:n1@20s,partition:n0|n1,n2@5s-8s,loss:0.01,latency:lognormal:200us:2;skew:n2:-5ms;join:n3@1s,leave:n0@2s"
	fs, err := ParseFaults(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 8 {
		t.Fatalf("%d faults, want 8: %+v", len(fs), fs)
	}
	p := fs[2]
	if p.Kind != FaultPartition || len(p.Groups) != 2 || strings.Join(p.Groups[1], ",") != "n1,n2" || p.At != 5*time.Second || p.End != 8*time.Second {
		t.Fatalf("partition parsed as %+v", p)
	}
	if fs[5].Skew != -5*time.Millisecond || fs[5].Windowed {
		t.Fatalf("skew parsed as %+v", fs[5])
	}
	again, err := ParseFaults(FormatFaults(fs))
	if err != nil || len(again) != len(fs) {
		t.Fatalf("round trip: %v, %d faults", err, len(again))
	}
}

// TestParseGridErrors checks the sweep spec's errors.
func TestParseGridErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"nodes=0", "positive integer"},
		{"colour=red", `unknown dimension "colour"`},
		{"traffic=heavy", "want one of"},
		{"faults=crash:n1@1s", "want [SPEC]"},
		{"faults=[crash:n1@1s", "missing ]"},
		{"faults=[crash:n1]", `missing "@TIME"`},
		{"accuracy=0.9", "(0, 0.5]"},
		{"sync", "NAME=VALUE"},
	} {
		_, err := ParseGrid(tc.spec)
		if err == nil || !errors.Is(err, ErrGridSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseGrid(%q) = %v, want an ErrGridSpec naming %q", tc.spec, err, tc.want)
		}
	}
}

// FuzzParseFaults: the parser never panics, and what it accepts it writes
// back in a form it parses to the same faults.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{
		"crash:n1@10s,restart:n1@20s,partition:n0|n1,n2@5s-8s,loss:0.01,latency:lognormal:200us:2",
		"skew:n0:+50ms@1s", "join:n3@1s;leave:n0@2s", "loss:0.5@1s-2s", "latency:uniform:1ms:2ms", "none", "",
		"partition:n0,n1|n2@0s-1h", "latency:const:0s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		fs, err := ParseFaults(spec)
		if err != nil {
			if !errors.Is(err, ErrFaultSpec) {
				t.Fatalf("error %v does not wrap ErrFaultSpec", err)
			}
			return
		}
		again, err := ParseFaults(FormatFaults(fs))
		if err != nil {
			t.Fatalf("%q parsed, but its formatted form %q does not: %v", spec, FormatFaults(fs), err)
		}
		if len(again) != len(fs) {
			t.Fatalf("%q: %d faults, %d after a round trip", spec, len(fs), len(again))
		}
		for i := range fs {
			if fs[i].Kind != again[i].Kind || fs[i].At != again[i].At || fs[i].End != again[i].End || fs[i].Node != again[i].Node {
				t.Fatalf("%q: fault %d changed in a round trip: %+v, %+v", spec, i, fs[i], again[i])
			}
		}
		_ = Config{Nodes: 4, Faults: fs}.Validate() // must not panic
	})
}

func mustRing(t *testing.T, n int) interface{ OwnerName(string) string } {
	t.Helper()
	rg := newRegion(Config{Nodes: n, Duration: time.Second}.withDefaults())
	return rg.initialRing
}
