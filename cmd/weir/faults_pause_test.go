package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/weir-dev/weir/lease/raftgroup"
)

// TestPausedLeaderDurable is the short, always-run member of the process
// fault harness (docs/reliability.md, "A paused lease leader"): three
// `weir serve` voters, durable decisions from three clients (each its own
// raftgroup.Client, each starting at a different voter), and the lease
// leader stopped with SIGSTOP for longer than its leader lease and the
// group's election timeout, then resumed. The resumed process believes it
// leads until it hears the new term; it must not decide durable requests on
// that belief. From the outside: no identity is admitted past its burst,
// the whole history is linearizable against the bucket model (porcupine,
// with a time bound; a failure writes the visualization to the test's
// directory), a new leader was elected while the old one was stopped, the
// old one rejoins, and a failed call only overlaps the pause (or the 10 s
// after it, the new leader's election and the clients' retries). Then the
// new leader is killed with SIGKILL mid-history and restarted, and every
// identity with an acknowledged admission is probed at the end: none lost.
func TestPausedLeaderDurable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three voters and pauses one")
	}
	dir := t.TempDir()
	h := &harness{t: t, bin: filepath.Join(dir, "weir"), dir: dir, env: []string{"WEIR_ADMIN_TOKENS=alice:" + testToken},
		faults: map[string]int{}}
	built := time.Now()
	if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", h.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("go build: %v", time.Since(built).Round(time.Millisecond))
	h.start = time.Now()
	rpcs := h.startVoters()
	if !h.recovered(60 * time.Second) {
		t.Fatal("the voters did not elect a leader within 60s")
	}

	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var recs []durableRec
	var seq atomic.Uint32
	var wg sync.WaitGroup
	for w := range 3 {
		lc, err := raftgroup.NewClient(raftgroup.ClientConfig{Voters: append(slices.Clone(rpcs[w:]), rpcs[:w]...),
			Name: fmt.Sprintf("pause-load-%d", w)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lc.Close() })
		rng := rand.New(rand.NewPCG(uint64(w), 11))
		wg.Go(func() {
			var mine []durableRec
			defer func() { mu.Lock(); recs = append(recs, mine...); mu.Unlock() }()
			for ctx.Err() == nil {
				// About 6 decisions per identity from the three clients at
				// once, asking for about 9 tokens of its 5.
				id := seq.Add(1) / 6
				cost := 1 + rng.IntN(2)
				call := h.now()
				cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
				d, err := lc.Durable(cctx, durableRule, fmt.Sprintf("acct-%d", id), int64(cost))
				ccancel()
				r := durableRec{Call: call, Return: h.now(), ID: id, Cost: uint8(cost)}
				switch {
				case err != nil:
					r.Out = outUnknown
				case d.Allowed:
					r.Out = outAdmitted
				default:
					r.Out = outRejected
				}
				mine = append(mine, r)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	stopLoad := func() { cancel(); wg.Wait() }
	defer stopLoad()

	time.Sleep(3 * time.Second) // load before the fault: part of the history, no assertion
	old := h.currentLeader()
	if old == nil {
		t.Fatal("no voter logged that it became leader")
	}
	// SIGSTOP for 5 s: weir serve keeps hashicorp/raft's timeouts (1 s
	// heartbeat and election, a 500 ms leader lease), so the others elect a
	// new leader while it is stopped.
	// The harness's cleanup sends SIGCONT before it kills, so nothing stays
	// stopped if the test fails here.
	c := old.current()
	from := h.now()
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var elected string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		h.leaderMu.Lock()
		if h.leader != old.name {
			elected = h.leader
		}
		h.leaderMu.Unlock()
	}
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	to := h.now()
	t.Logf("%s (leader) stopped for %v; %q became leader meanwhile", old.name, time.Duration(to-from).Round(time.Millisecond), elected)
	if elected == "" {
		t.Errorf("no other voter became leader while %s was stopped for %v", old.name, time.Duration(to-from))
	}
	if !h.recovered(60 * time.Second) {
		t.Fatalf("the group did not answer linearizable reads on every voter within 60s of resuming %s", old.name)
	}
	back := time.Since(h.start.Add(time.Duration(to)))
	time.Sleep(3 * time.Second) // load after the pause: part of the history
	ws := []window{{from: from, to: to, paused: true}}

	// kill -9 of the new leader mid-history, restarted after 2 s.
	if killed := h.currentLeader(); killed == nil {
		t.Error("no leader after the pause")
	} else {
		kfrom := h.kill(killed)
		time.Sleep(2 * time.Second)
		h.restart(killed, kfrom)
		if !h.recovered(60 * time.Second) {
			t.Fatalf("the group did not recover within 60s of restarting %s", killed.name)
		}
		ws = append(ws, window{from: kfrom, to: h.now()})
		t.Logf("%s (leader) killed with SIGKILL and restarted: back in %v", killed.name, time.Duration(h.now()-kfrom).Round(time.Millisecond))
	}
	time.Sleep(3 * time.Second) // load after the kill
	loadEnd := h.now()
	stopLoad()
	recs = append(recs, probeSpent(t, h, rpcs, recs)...)
	for _, v := range h.voters {
		if v.current().cmd.ProcessState != nil {
			t.Errorf("%s exited", v.name)
		}
	}
	checkPausedHistory(t, recs, ws, loadEnd, back)
}

// checkPausedHistory holds the durable history of TestPausedLeaderDurable
// and TestPausedGateways to their checks: failed calls only in a fault
// window and its grace (or cut off by the test cancelling its load at
// loadEnd), no identity past its burst, and a linearizable history.
func checkPausedHistory(t *testing.T, recs []durableRec, ws []window, loadEnd int64, back time.Duration) {
	var adm, rej int
	var longest time.Duration
	for _, r := range recs {
		switch r.Out {
		case outAdmitted:
			adm++
		case outRejected:
			rej++
		}
		longest = max(longest, time.Duration(r.Return-r.Call))
	}
	unk, cut, unexcused := failedCalls(recs, ws, 10*time.Second, loadEnd)
	t.Logf("durable: %d decisions on %d identities (%d admitted, %d rejected, %d failed, %d of them cut off by the end of the load); longest answer %v",
		len(recs), len(distinctIDs(recs)), adm, rej, unk, cut, longest.Round(time.Millisecond))
	for _, r := range unexcused {
		t.Logf("durable: acct-%d failed at t=%v..%v, outside every fault window", r.ID,
			time.Duration(r.Call).Round(time.Millisecond), time.Duration(r.Return).Round(time.Millisecond))
	}
	if back > 0 {
		t.Logf("every voter answered a linearizable read %v after SIGCONT", back.Round(time.Millisecond))
	}
	if len(recs) < 200 {
		t.Errorf("only %d durable decisions: too short a history to mean anything", len(recs))
	}
	if len(unexcused) > 0 {
		t.Errorf("%d durable calls failed outside the voters' fault windows and the 10 s after them", len(unexcused))
	}
	if unk > len(recs)/4 {
		t.Errorf("%d of %d durable calls failed: more than a quarter", unk, len(recs))
	}
	if over := overAdmitted(recs, durableBurst); len(over) > 0 {
		t.Errorf("%d identities admitted past the burst of %d: %v", len(over), durableBurst, over)
	}
	checked := time.Now()
	model := durableModel(durableBurst)
	res, info := porcupine.CheckOperationsVerbose(model, durableHistory(recs), 60*time.Second)
	t.Logf("durable: porcupine says %s on %d operations in %v", res, len(recs), time.Since(checked).Round(time.Millisecond))
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "durable-history.html")
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Errorf("the durable history is %s against the bucket model; the operations are drawn in %s", res, path)
	}
}

// failedCalls counts the durable calls that failed (their outcome unknown),
// those of them cut off by the test cancelling its load (returned at or
// after loadEnd: the load's context, not the group, ended them), and returns
// the others that overlap no window of ws nor its grace after it.
func failedCalls(recs []durableRec, ws []window, grace time.Duration, loadEnd int64) (failed, cut int, unexcused []durableRec) {
	for _, r := range recs {
		if r.Out != outUnknown {
			continue
		}
		failed++
		switch {
		case r.Return >= loadEnd:
			cut++
		case !excused(ws, r.Call, r.Return, grace):
			unexcused = append(unexcused, r)
		}
	}
	return failed, cut, unexcused
}

// probeSpent asks, for every identity with an acknowledged admission, one
// token more than the burst minus what was acknowledged: a lost
// acknowledged admission (or a lost identity) would admit it. A rejection
// spends nothing. The probes are returned to join the history.
func probeSpent(t *testing.T, h *harness, rpcs []string, recs []durableRec) []durableRec {
	acked := map[uint32]int64{}
	for _, r := range recs {
		if r.Out == outAdmitted {
			acked[r.ID] += int64(r.Cost)
		}
	}
	lc, err := raftgroup.NewClient(raftgroup.ClientConfig{Voters: rpcs, Name: "pause-probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	ids := slices.Sorted(maps.Keys(acked))
	var out []durableRec
	var lost int
	for _, id := range ids {
		cost := durableBurst - acked[id] + 1
		if cost <= 0 {
			continue // past the burst: overAdmitted reports it
		}
		call := h.now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := lc.Durable(ctx, durableRule, fmt.Sprintf("acct-%d", id), cost)
		cancel()
		if err != nil {
			t.Fatalf("probe of acct-%d with no fault: %v", id, err)
		}
		r := durableRec{Call: call, Return: h.now(), ID: id, Cost: uint8(cost), Out: outRejected}
		if d.Allowed {
			r.Out = outAdmitted
			lost++
		}
		out = append(out, r)
	}
	t.Logf("probes: %d identities with acknowledged admissions, %d admitted a cost that only a lost admission allows", len(out), lost)
	if lost > 0 {
		t.Errorf("%d identities lost acknowledged durable admissions", lost)
	}
	return out
}

// TestPausedGateways is the short, always-run pause of a gateway (docs/
// reliability.md, "A paused gateway, in every go test"): the fleet of the
// harness (two regions of three gateways, three voters) under its load, one
// gateway of each region stopped with SIGSTOP for 4 s (past memberlist's
// failure detection, so the others take its identities) and resumed, one
// after the other. It must not keep deciding on the ownership and the
// buckets it had when it stopped: the hot admissions of each region stay
// within the envelope of docs/overshoot.md, outside the windows B + r·Δ + S
// and through them plus the pause term (decisions in flight, owner crash,
// restart); RLS errors only from the paused gateway while stopped or just
// back; and the durable history (the voters are not touched) is
// linearizable with no identity past its burst.
func TestPausedGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nine weir serve processes")
	}
	dir := t.TempDir()
	h := &harness{t: t, bin: filepath.Join(dir, "weir"), dir: dir, env: []string{"WEIR_ADMIN_TOKENS=alice:" + testToken},
		faults: map[string]int{}, noTmpfs: "not used here"}
	if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", h.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	h.start = time.Now()
	h.startGateways(h.startVoters())
	if !h.recovered(60 * time.Second) {
		t.Fatal("the fleet did not converge within 60s")
	}
	t.Logf("9 processes up in %v", time.Since(h.start).Round(time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{firstRLSErr: map[string]string{}, firstDurErr: map[string]string{}}
	wg := h.runLoad(ctx, l)
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(3 * time.Second)
	for _, name := range []string{"eu-2", "us-3"} {
		p := h.byName(name)
		h.pause(p, 4*time.Second)
		if !h.recovered(60 * time.Second) {
			t.Fatalf("the fleet did not recover within 60s of resuming %s", name)
		}
		t.Logf("%s stopped for 4 s; fleet converged %v after SIGCONT", name, time.Duration(h.now()-p.windows[len(p.windows)-1].to).Round(time.Millisecond))
		time.Sleep(3 * time.Second)
	}
	time.Sleep(3 * time.Second) // past hotTail: the last window's intervals are checked whole
	h.loadEnd = h.now()
	cancel()
	wg.Wait()

	var rlsErr, unexcused int
	for _, r := range l.rls {
		if r.Out == 2 {
			rlsErr++
			if !excused(h.gws[r.GW].windows, r.Call, r.Return, 5*time.Second) {
				unexcused++
			}
		}
	}
	t.Logf("RLS: %d decisions, %d errors; first errors %v", len(l.rls), rlsErr, l.firstRLSErr)
	if unexcused > 0 {
		t.Errorf("%d RLS errors outside a paused gateway's window and the 5 s after it", unexcused)
	}
	h.checkEnvelope(l)
	t.Logf("envelope, worst excess over B + r·Δ against its bound: %s", h.envelopeSummary())
	checkPausedHistory(t, l.durable, nil, h.loadEnd, 0)
}

// TestFailedCallsCutOff: a durable call in flight when a test cancels its
// load fails with the load's context, not by any fault, and must not count
// as a failure outside the fault windows (TestPausedGateways has no voter
// window at all, so each of its three durable callers could fail it at the
// end). A call that failed before the end, outside every window, still
// counts.
func TestFailedCallsCutOff(t *testing.T) {
	s := int64(time.Second)
	ws := []window{{from: 10 * s, to: 12 * s}}
	recs := []durableRec{
		{Call: 1 * s, Return: 1*s + 5, ID: 1, Out: outAdmitted},
		{Call: 11 * s, Return: 14 * s, ID: 2, Out: outUnknown},   // in the window
		{Call: 30 * s, Return: 30*s + 9, ID: 3, Out: outUnknown}, // outside it and its grace
		{Call: 39 * s, Return: 40 * s, ID: 4, Out: outUnknown},   // cut off at the end
		{Call: 40 * s, Return: 40 * s, ID: 5, Out: outUnknown},   // cut off at the end
	}
	failed, cut, unexcused := failedCalls(recs, ws, 10*time.Second, 40*s)
	if failed != 4 || cut != 2 || len(unexcused) != 1 || unexcused[0].ID != 3 {
		t.Errorf("failedCalls = %d failed, %d cut off, unexcused %+v; want 4, 2, [acct-3]", failed, cut, unexcused)
	}
}
