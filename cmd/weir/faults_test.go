package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
)

// The process fault harness (docs/reliability.md, "The process fault
// harness"): `weir serve` processes on loopback, two regions of three
// gateways and a lease group of three voters, under steady load from this
// test process, while a seeded scheduler pauses (SIGSTOP/SIGCONT) and kills
// (SIGKILL) them and restarts the killed ones. Every decision the load makes
// is recorded; the checks run on the records and on the processes at the end.
// The fleet is in faults_harness_test.go, the load in faults_load_test.go,
// the faults in faults_inject_test.go, the checks in faults_check_test.go,
// the shared and exact envelope in faults_envelope_test.go and the durable
// model in faults_model_test.go. Its short, always-run members (a paused
// lease leader, paused gateways) are in faults_pause_test.go.
//
//	WEIR_FAULTS=short go test -run TestFaults -v ./cmd/weir     # two faults of each kind, about 2 minutes
//	WEIR_FAULTS=long WEIR_FAULTS_TIME=1h go test -run TestFaults -v -timeout 3h ./cmd/weir
//
// WEIR_FAULTS_SEED picks the schedule (default: drawn, and printed).

// The durable rule of the load: 5 per 720 h, burst 5, so one token comes
// back every 144 h, far beyond any run: the model (faults_model_test.go)
// needs no refill.
const (
	durableBurst = 5
	faultsRuleID = "faults-trial"
)

var durableRule = lease.DurableRule{ID: faultsRuleID, Limit: durableBurst, Window: 720 * time.Hour, Burst: durableBurst}

// fault kinds the scheduler injects.
const (
	fPauseGateway  = "pause a gateway"
	fPauseLeader   = "pause the lease leader"
	fKillGateway   = "kill -9 and restart a gateway"
	fKillVoters    = "kill -9 and restart two voters"
	fKillLeaderPut = "kill -9 the leader during a rules PUT"
	fFullDisk      = "fill a voter's disk"
)

var faultKinds = []string{fPauseGateway, fPauseLeader, fKillGateway, fKillVoters, fKillLeaderPut, fFullDisk}

// tmpfsVoter is the voter whose data directory is a small tmpfs (when the
// test runs as root), which fFullDisk fills.
const tmpfsVoter = "v3"

// TestFaults is the process fault harness (see the top of this file).
func TestFaults(t *testing.T) {
	mode := os.Getenv("WEIR_FAULTS")
	if mode == "" {
		t.Skip("the process fault harness: WEIR_FAULTS=short (two faults of each kind, about 2 minutes) or WEIR_FAULTS=long WEIR_FAULTS_TIME=1h (at most 2h) go test -run TestFaults -v -timeout 3h ./cmd/weir")
	}
	runFor := time.Duration(0)
	switch mode {
	case "short":
	case "long":
		runFor = 30 * time.Minute
		if s := os.Getenv("WEIR_FAULTS_TIME"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > 2*time.Hour {
				t.Fatalf("WEIR_FAULTS_TIME=%q: want a duration in (0, 2h]", s)
			}
			runFor = d
		}
	default:
		t.Fatalf("WEIR_FAULTS=%q: want short or long", mode)
	}
	seed := rand.Uint64()
	if s := os.Getenv("WEIR_FAULTS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("WEIR_FAULTS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (WEIR_FAULTS_SEED=%d reruns this schedule)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 24))

	dir := t.TempDir()
	h := &harness{t: t, bin: filepath.Join(dir, "weir"), dir: dir, env: []string{"WEIR_ADMIN_TOKENS=alice:" + testToken},
		faults: map[string]int{}}
	built := time.Now()
	if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", h.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("go build: %v", time.Since(built).Round(time.Millisecond))
	h.start = time.Now()
	h.setup()
	if h.noTmpfs != "" {
		t.Logf("%s skipped: %s", fFullDisk, h.noTmpfs)
	}
	t.Logf("9 processes up in %v: voters %s; gateways %s", time.Since(h.start).Round(time.Millisecond),
		names(h.voters), names(h.gws))

	ctx, cancel := context.WithCancel(context.Background())
	l := &load{firstRLSErr: map[string]string{}, firstDurErr: map[string]string{}}
	wg := h.runLoad(ctx, l)
	// Warm-up: the load runs, a few rules PUTs land; then the baseline of
	// every process's file descriptors.
	for range 3 {
		if rec := h.put(h.gws[0]); rec.version == 0 {
			t.Fatalf("a rules PUT with no fault failed: %s", rec.err)
		}
	}
	time.Sleep(3 * time.Second)
	for _, p := range h.all() {
		n, err := fdCount(p.current().cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		p.baseFDs = n
	}

	// A slow PUT loop through random gateways while faults run.
	putCtx, putStop := context.WithCancel(ctx)
	var putWG sync.WaitGroup
	putWG.Go(func() {
		prng := rand.New(rand.NewPCG(seed, 25))
		for putCtx.Err() == nil {
			h.put(h.gws[prng.IntN(len(h.gws))])
			select {
			case <-putCtx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	})

	runStart := time.Now()
	var faultTime time.Duration
	var count int
	for round := 0; ; round++ {
		order := slices.Clone(faultKinds)
		if h.tmpfs == "" {
			order = slices.DeleteFunc(order, func(k string) bool { return k == fFullDisk })
		}
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, kind := range order {
			f0 := time.Now()
			what := h.inject(kind, rng)
			ok := h.recovered(90 * time.Second)
			took := time.Since(f0)
			faultTime += took
			count++
			t.Logf("t=%v fault %d: %s: %s; recovered in %v", time.Since(h.start).Round(time.Second), count, kind, what, took.Round(time.Millisecond))
			if !ok {
				h.violation("after %q (%s) the fleet did not recover within 90s", kind, what)
				if !h.recovered(60 * time.Second) {
					t.Fatalf("the fleet is down after %q; giving up", kind)
				}
			}
			// Fault-free as long as the fault took: at least half the run
			// has no fault.
			time.Sleep(took)
		}
		if (mode == "short" && round == 1) || (mode == "long" && time.Since(runStart) > runFor) {
			break
		}
	}
	putStop()
	putWG.Wait()
	time.Sleep(2 * time.Second)
	h.loadEnd = h.now()
	cancel()
	wg.Wait()
	runTime := time.Since(runStart)
	h.check(l)

	h.faultMu.Lock()
	var kinds []string
	for _, k := range faultKinds {
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, h.faults[k]))
	}
	h.faultMu.Unlock()
	t.Logf("run: %v, %d faults (%s), %v of it in faults or recovery; %d full-disk faults ended with the voter exited", runTime.Round(time.Second), count, strings.Join(kinds, ", "), faultTime.Round(time.Second), h.diskCrashes)
	t.Logf("envelope, worst excess over B + r·Δ against its bound: %s", h.envelopeSummary())
	if len(h.violations) > 0 {
		t.Logf("%d violations", len(h.violations))
	}
}

func names(ps []*fproc) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.name)
	}
	return strings.Join(s, " ")
}
