package region

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// nagleProbe checks the one-exchange-per-peer state of every node at a
// fixed period during a run, and counts what it saw.
type nagleProbe struct {
	t                  *testing.T
	rg                 *Region
	every              int64
	samples, busy, bl  int
	pendingBehindBusy  int
	lingering          int
	maxInflight        int
	failedAtInvariants bool
}

func (p *nagleProbe) Fire(s *engine.Sim) {
	for _, n := range p.rg.nodes {
		if !n.up {
			continue
		}
		st := n.lk.Stats()
		if st.Busy == 0 && st.Pending && !st.Lingering {
			p.fail("%s: work pending with no exchange in flight and no backstop", n.name)
		}
		if st.Backlogged > st.Busy {
			p.fail("%s: %d backlogs for %d busy peers", n.name, st.Backlogged, st.Busy)
		}
		p.samples++
		p.busy += st.Busy
		p.bl += st.Backlogged
		if st.Pending && st.Busy > 0 {
			p.pendingBehindBusy++
		}
		p.maxInflight = max(p.maxInflight, st.Busy)
		if st.Lingering {
			p.lingering++
		}
	}
	if s.Now() < p.rg.end {
		s.After(p.every, p)
	}
}

func (p *nagleProbe) fail(format string, args ...any) {
	if !p.failedAtInvariants {
		p.t.Errorf("at %v: "+format, append([]any{p.rg.elapsed()}, args...)...)
	}
	p.failedAtInvariants = true
}

// runProbed runs cfg with a nagleProbe sampling every 50µs.
func runProbed(t *testing.T, cfg Config) (*Result, *nagleProbe) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rg := newRegion(cfg.withDefaults())
	p := &nagleProbe{t: t, rg: rg, every: int64(50 * time.Microsecond)}
	rg.sim.At(rg.t0+1, p)
	rg.run()
	return rg.result(), p
}

// TestNagleBatchesBehindBusyPeers: under load, what is due to a peer while
// an exchange with it is in flight waits in its backlog and leaves as the
// next exchange, so exchanges carry several items; the node's count of
// busy peers and backlogs matches its links at every sample; and, with no
// fault, nothing is decided by on_failure.
func TestNagleBatchesBehindBusyPeers(t *testing.T) {
	cfg := Config{Nodes: 3, Limit: 100, Traffic: TrafficZipf, IDs: 200, Rate: 20000,
		Duration: 2 * time.Second, Seed: 3}
	r, p := runProbed(t, cfg)
	if !r.OK() {
		t.Fatalf("violations: %v", r.Violations)
	}
	if r.Degraded != 0 {
		t.Fatalf("%d on_failure decisions in a run with no fault", r.Degraded)
	}
	if p.bl == 0 || p.pendingBehindBusy == 0 {
		t.Fatalf("no backlog (%d) or pending work behind a busy peer (%d) in %d samples: the load does not queue",
			p.bl, p.pendingBehindBusy, p.samples)
	}
	if p.maxInflight > cfg.Nodes-1 {
		t.Fatalf("%d exchanges in flight from one node with %d peers", p.maxInflight, cfg.Nodes-1)
	}
	items := r.Coord.Forwarded + r.Coord.SyncsSent + r.Coord.BlindAdmits
	if r.Exchanges >= uint64(items) {
		t.Fatalf("%d exchanges for %d forwarded requests and syncs: no batching", r.Exchanges, items)
	}
	t.Logf("%d exchanges for %d items; in %d samples %d busy peers, %d backlogs, %d pending behind a busy peer",
		r.Exchanges, items, p.samples, p.busy, p.bl, p.pendingBehindBusy)
}

// TestNagleIdleSendsAtOnce: at a low rate no exchange is in flight when a
// request comes, so a forwarded request leaves at once and ℓ is one round
// trip, not the linger plus one (the old model's): with a linger far above
// the round trip, ℓ stays under linger + 2 round trips' worth, and no
// backlog ever forms.
func TestNagleIdleSendsAtOnce(t *testing.T) {
	cfg := Config{Nodes: 3, Limit: 100, Mode: quota.ModeExact, Traffic: TrafficZipf, IDs: 20, Rate: 20,
		Linger: 50 * time.Millisecond, Duration: 3 * time.Second, Seed: 4}
	r, p := runProbed(t, cfg)
	if !r.OK() {
		t.Fatalf("violations: %v", r.Violations)
	}
	if r.Degraded != 0 {
		t.Fatalf("%d on_failure decisions in a run with no fault", r.Degraded)
	}
	if r.Coord.Forwarded == 0 {
		t.Fatal("nothing forwarded")
	}
	// The latency is lognormal with a median of 200µs: a round trip over
	// 10ms is far in its tail. ℓ is the linger plus the longest
	// ready-to-reply time.
	if late := r.Ell - cfg.Linger; late <= 0 || late > 10*time.Millisecond {
		t.Fatalf("ℓ − linger = %v, want one round trip (0, 10ms]", late)
	}
	if p.bl != 0 {
		t.Fatalf("%d backlogs sampled at 20 requests a second", p.bl)
	}
	// A backstop flush is scheduled only behind an exchange in flight:
	// rarely at this rate (the old model scheduled one, 50ms long, for
	// every forwarded request: a third of the samples).
	if p.lingering*100 > p.samples {
		t.Fatalf("a backstop flush scheduled in %d of %d samples", p.lingering, p.samples)
	}
}

// TestNagleCrashRestartKeepsLinksConsistent: a node that crashes while its
// exchanges are in flight restarts with no busy peer and no backlog, and
// the old incarnation's exchanges, returning or timing out later, leave
// the new one's counts matching its links (the probe checks at every
// sample).
func TestNagleCrashRestartKeepsLinksConsistent(t *testing.T) {
	fs, err := ParseFaults("crash:n1@1s,restart:n1@1100ms,loss:0.02")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Nodes: 3, Limit: 100, Traffic: TrafficZipf, IDs: 100, Rate: 10000,
		Duration: 2 * time.Second, Seed: 6, Faults: fs}
	r, p := runProbed(t, cfg)
	if !r.OK() {
		t.Fatalf("violations: %v", r.Violations)
	}
	if r.FailedExchanges == 0 {
		t.Fatal("no exchange failed: the crash and the loss did not bite")
	}
	if p.bl == 0 {
		t.Fatal("no backlog sampled")
	}
}
