package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Global lease rule of TestPausedGlobalOwner: L = 40 per second, leased to
// eu and us with a 2 s lease (shorter than the pause) and the default skew
// margin of 500 ms.
const (
	globalRule    = "world"
	globalLimit   = 40
	globalLease   = 2 * time.Second
	globalPause   = 5 * time.Second
	globalCanary  = 10 * time.Millisecond
	globalRuleDoc = `{"limit": 40, "window": "1s", "burst": 10, "key": ["header:X-Api-Key"], "scope": "global", "mode": "exact"}`
)

// leaseEvent is a "lease granted" line of a voter or a "lease accepted"
// line of a region's owner (slog JSON; times unix ns). Both name the report
// they answer: its reporter (the owner's node name) and sequence number.
type leaseEvent struct {
	Msg      string `json:"msg"`
	Region   string `json:"region"`
	Reporter string `json:"reporter"`
	Seq      uint64 `json:"seq"`
	Rule     string `json:"rule"`
	Identity string `json:"identity"`
	Epoch    uint64 `json:"epoch"`
	Share    int64  `json:"share"`
	At       int64  `json:"at"`       // granted: the machine's time when it applied the report; accepted: when the region took it
	Proposed int64  `json:"proposed"` // granted: the entry's time, the leader's clock when it proposed the report
	Expiry   int64  `json:"expiry"`   // granted: the leader's expiry (at + lifetime)
	Sent     int64  `json:"sent"`     // accepted: when the region sent its report
	Until    int64  `json:"until"`    // accepted: when the region stops using it
	node     string
}

// leaseEvents returns the lease lines of msg in a process's log.
func leaseEvents(node, log, msg string) []leaseEvent {
	var out []leaseEvent
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), `"msg":"`+msg+`"`) {
			continue
		}
		var e leaseEvent
		if json.Unmarshal(line, &e) == nil {
			e.node = node
			out = append(out, e)
		}
	}
	return out
}

// TestPausedGlobalOwner pauses, with SIGSTOP for longer than its lease, the
// gateway that holds region eu's share of a global rule (docs/
// reliability.md, "A paused global owner"), then resumes it. Four `weir
// serve` gateways (two per region, rules from the lease group) decide the
// rule's one identity through their canaries, one probe every 10 ms each,
// ten times the limit in all; three voters lease it. Every grant the voters
// log ("lease granted": the report's reporter and sequence number, the
// machine's time when it applied the report and the expiry) and every lease
// a region's owner takes ("lease accepted": the same reporter and sequence
// number, the send time of the report and when it stops using it) are
// checked:
//
//   - at every grant the voters logged, Σ over regions of the latest share
//     granted and not expired as the leader counts it ≤ L;
//   - every lease a region took ends, as the region counts it (send time +
//     lifetime − skew), no later than the leader's expiry of the grant of
//     its own report (same reporter, sequence number, key and epoch; the
//     first applied, when a retry applied it again), the leases read after
//     the resume included;
//   - at every lease a region took, Σ over regions of the latest share taken
//     and not ended as the regions count them ≤ L.
//
// With WEIR_FAULTS=long the lease leader is then paused too, as long, past
// its election timeout. What this does not see is a decision whose clock
// read came before the stop and that completed after the resume against
// the lease of that reading: the pause term of docs/overshoot.md (k·c, k
// decisions in flight).
func TestPausedGlobalOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts seven weir serve processes and pauses one")
	}
	dir := t.TempDir()
	h := &harness{t: t, bin: filepath.Join(dir, "weir"), dir: dir, env: []string{"WEIR_ADMIN_TOKENS=alice:" + testToken},
		faults: map[string]int{}, noTmpfs: "not used here",
		voterLease: fmt.Sprintf("\n  lease_duration: %v", globalLease), voterLog: "debug, format: json"}
	if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", h.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	h.start = time.Now()
	rpcs := h.startVoters()
	if !h.recovered(60 * time.Second) {
		t.Fatal("the voters did not elect a leader within 60s")
	}
	code, b, err := h.admin(http.MethodPut, "http://"+h.voters[0].current().addrs.HTTP+"/v1/rules/"+globalRule, []byte(globalRuleDoc))
	if err != nil || code != http.StatusOK {
		t.Fatalf("PUT the global rule: %d %s %v", code, b, err)
	}
	h.startGlobalGateways(rpcs)
	if !h.recovered(60 * time.Second) {
		t.Fatal("the fleet did not converge within 60s")
	}
	t.Logf("7 processes up in %v", time.Since(h.start).Round(time.Millisecond))

	// Wait until both regions hold a lease; eu's owner is the eu gateway
	// that takes them.
	var owner *fproc
	for deadline := time.Now().Add(30 * time.Second); owner == nil || !h.regionLeased("us"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no lease taken in both regions within 30s")
		}
		for _, g := range h.regions["eu"] {
			if len(leaseEvents(g.name, g.current().log.String(), "lease accepted")) > 0 {
				owner = g
			}
		}
	}
	time.Sleep(3 * time.Second) // leases renewed a few times before the fault
	paused := []*fproc{owner}
	if os.Getenv("WEIR_FAULTS") == "long" {
		paused = append(paused, h.currentLeader())
	}
	for _, p := range paused {
		if p == nil {
			t.Fatal("no voter logged that it became leader")
		}
		t.Logf("%s (%s); SIGSTOP for %v (lease %v)", p.name, map[bool]string{true: "the lease leader", false: "holds eu's share"}[p.voter], globalPause, globalLease)
		h.pause(p, globalPause)
		if !h.recovered(60 * time.Second) {
			t.Fatalf("the fleet did not recover within 60s of resuming %s", p.name)
		}
		time.Sleep(4 * time.Second) // leases taken again after the resume
	}
	h.checkGlobalLeases(owner)
}

// startGlobalGateways starts eu-1, eu-2, us-1 and us-2: rules from the
// lease group, a canary probing the global rule's identity every 10 ms,
// debug logs in JSON (their lease lines).
func (h *harness) startGlobalGateways(rpcs []string) {
	t := h.t
	label := fmt.Sprintf("weir-global-%d", os.Getpid())
	h.regions = map[string][]*fproc{}
	for _, region := range []string{"eu", "us"} {
		for i := 1; i <= 2; i++ {
			name := fmt.Sprintf("%s-%d", region, i)
			gossip, rpc, httpAddr := freePort(t), freePort(t), freePort(t)
			p := &fproc{name: name, region: region}
			p.cfg = func(join []string) string {
				path := filepath.Join(h.dir, name+".yaml")
				body := fmt.Sprintf(`node: {name: %s, region: %s}
gossip: {bind: %s, join: [%s], local_timing: true, label: %s-%s}
peer: {rpc: %s}
rules: {lease: true}
http: {listen: %s}
lease: {voters: [%s], regions: [eu, us], lease_duration: %v, check_interval: 1s}
canary: {rule: %s, identity: %s, interval: %v, window: 5s}
log: {level: debug, format: json}
`, name, region, gossip, strings.Join(join, ", "), label, region, rpc, httpAddr, strings.Join(rpcs, ", "),
					globalLease, globalRule, globalRule, globalCanary)
				if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			}
			h.gws = append(h.gws, p)
			h.regions[region] = append(h.regions[region], p)
		}
	}
	for _, g := range h.gws {
		if err := h.launch(g, h.liveJoin(g)); err != nil {
			t.Fatal(err)
		}
	}
}

// regionLeased reports whether a gateway of region has taken a lease.
func (h *harness) regionLeased(region string) bool {
	for _, g := range h.regions[region] {
		if len(leaseEvents(g.name, g.current().log.String(), "lease accepted")) > 0 {
			return true
		}
	}
	return false
}

// checkGlobalLeases holds the leader's and the regions' lease lines to the
// checks of TestPausedGlobalOwner.
func (h *harness) checkGlobalLeases(paused *fproc) {
	t := h.t
	// The fleet still runs: the regions' logs first, then the voters'. The
	// leader logs a grant from its FSM before its reply leaves, so every
	// lease read from a region has its grant in the voters' logs read
	// after; read the other way, a report answered between the two reads
	// would have no grant.
	var granted, accepted []leaseEvent
	for _, g := range h.gws {
		accepted = append(accepted, leaseEvents(g.name, g.current().log.String(), "lease accepted")...)
	}
	for _, v := range h.voters {
		granted = append(granted, leaseEvents(v.name, v.current().log.String(), "lease granted")...)
	}
	slices.SortStableFunc(granted, func(a, b leaseEvent) int { return cmp.Compare(a.At, b.At) })
	slices.SortStableFunc(accepted, func(a, b leaseEvent) int { return cmp.Compare(a.At, b.At) })
	if len(granted) < 20 || len(accepted) < 20 {
		t.Fatalf("%d grant lines logged by the voters, %d leases taken by the regions: too few to check", len(granted), len(accepted))
	}

	// 1. Σ shares ≤ L at every grant the voters logged.
	type held struct{ share, end int64 }
	latest := map[string]held{}
	var worstLeader int64
	for _, g := range granted {
		latest[g.Region] = held{g.Share, g.Expiry}
		var sum int64
		for _, l := range latest {
			if l.end > g.At {
				sum += l.share
			}
		}
		worstLeader = max(worstLeader, sum)
		if sum > globalLimit {
			h.violation("at the leader's grant to %s at %d (share %d, epoch %d): Σ unexpired shares %d > L = %d", g.Region, g.At, g.Share, g.Epoch, sum, globalLimit)
		}
	}

	// 2. A region's lease ends before the leader's expiry of the grant of
	// its report. The owner's pause, in unix ns (the processes read one
	// machine's clock).
	w := paused.windows[0]
	stopped, resumed := h.start.UnixNano()+w.from, h.start.UnixNano()+w.to
	var usDuring int64
	for _, g := range granted {
		if g.Region == "us" && g.At >= stopped && g.At <= resumed {
			usDuring = max(usDuring, g.Share)
		}
	}
	var late, afterResume, pastOnArrival int
	var margin, sendToApply int64 = 1 << 62, 1 << 62
	for _, a := range accepted {
		if a.Reporter == "" || a.Seq == 0 {
			h.violation("%s logged a lease (epoch %d, sent %d) that names no report", a.node, a.Epoch, a.Sent)
			continue
		}
		var answer *leaseEvent
		for i := range granted {
			g := &granted[i]
			if g.Reporter == a.Reporter && g.Seq == a.Seq && g.Region == a.Region && g.Rule == a.Rule && g.Identity == a.Identity && g.Epoch == a.Epoch {
				answer = g
				break
			}
		}
		if answer == nil {
			h.violation("%s took epoch %d for its report %d (sent %d) that no voter logged granting", a.node, a.Epoch, a.Seq, a.Sent)
			continue
		}
		margin = min(margin, answer.Expiry-a.Until)
		sendToApply = min(sendToApply, answer.At-a.Sent)
		if a.Until > answer.Expiry {
			late++
			h.violation("%s holds epoch %d until %d, past the leader's expiry %d", a.node, a.Epoch, a.Until, answer.Expiry)
		}
		if a.node == paused.name && a.Sent < stopped && a.At >= stopped {
			afterResume++
			if a.Until < resumed {
				pastOnArrival++
			}
		}
	}

	// 3. Σ shares ≤ L at every lease a region took, as the regions count
	// their leases.
	latestR := map[string]held{}
	var worstRegions int64
	for _, a := range accepted {
		latestR[a.Region] = held{a.Share, a.Until}
		var sum int64
		for _, l := range latestR {
			if l.end > a.At {
				sum += l.share
			}
		}
		worstRegions = max(worstRegions, sum)
		if sum > globalLimit {
			h.violation("at %s's lease (epoch %d, taken %d): Σ shares the regions hold %d > L = %d", a.node, a.Epoch, a.At, sum, globalLimit)
		}
	}
	type grantID struct {
		reporter, rule, identity string
		seq, epoch               uint64
		at                       int64
	}
	grants := map[grantID]bool{}
	for _, g := range granted {
		grants[grantID{g.Reporter, g.Rule, g.Identity, g.Seq, g.Epoch, g.At}] = g.At > g.Proposed
	}
	var stampedBefore int
	for _, later := range grants {
		if later {
			stampedBefore++
		}
	}
	t.Logf("voters: %d grants (%d lines: each voter logs the grants it applies), %d applied after an entry stamped later; largest Σ unexpired shares %d of L = %d",
		len(grants), len(granted), stampedBefore, worstLeader, globalLimit)
	t.Logf("regions: %d leases taken, each ending at least %v before the leader's expiry; %d late; largest Σ shares held %d of %d; each report applied at least %v after its send",
		len(accepted), time.Duration(margin).Round(time.Millisecond), late, worstRegions, globalLimit, time.Duration(sendToApply).Round(10*time.Microsecond))
	t.Logf("%s: %d leases taken after the resume from reports sent before the stop, %d of them already ended when taken; us's share while it was stopped: up to %d",
		paused.name, afterResume, pastOnArrival, usDuring)
	for _, g := range h.gws {
		if c := g.current(); c.cmd.ProcessState != nil {
			t.Errorf("%s exited", g.name)
		}
	}
	if len(h.violations) > 0 {
		t.Errorf("%d violations", len(h.violations))
	}
	h.keepLogs()
}

// keepLogs writes every process's log to the directory WEIR_FAULTS_LOGS
// names, when it is set, one file per process (the test's start time and
// the process's name), to study a run.
func (h *harness) keepLogs() {
	dir := os.Getenv("WEIR_FAULTS_LOGS")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Logf("WEIR_FAULTS_LOGS: %v", err)
		return
	}
	for _, p := range h.all() {
		path := filepath.Join(dir, fmt.Sprintf("%d-%s.log", h.start.UnixNano(), p.name))
		if err := os.WriteFile(path, []byte(p.current().log.String()), 0o644); err != nil {
			h.t.Logf("WEIR_FAULTS_LOGS: %v", err)
			return
		}
	}
	h.t.Logf("logs kept in %s", dir)
}
