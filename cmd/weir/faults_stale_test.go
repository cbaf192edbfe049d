package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease/raftgroup"
)

// TestStaleVoterDir restarts a voter of a three-voter lease group from a
// copy of its data directory taken earlier (a restore from a backup, a
// volume snapshot rolled back), with real raft-boltdb, and says what is
// lost (docs/reliability.md, "A voter restarted from a stale directory"):
//
//   - healthy: the copy is a minute old and the other two voters are up.
//     The stale voter rejoins as a follower that is behind, the leader sends
//     it what it lacks, and nothing acknowledged is lost.
//   - quorum: the copy is taken while a second voter is down, so that the
//     entries acknowledged after it are on the leader and the copied voter
//     only; then the leader dies, and the stale voter and the lagging one
//     make a quorum that has never seen them. Those entries are lost; what
//     was acknowledged before the copy is kept, and the old leader, once
//     back, takes the new history.
//
// It runs with WEIR_FAULTS set (any value), like TestFaults:
//
//	WEIR_FAULTS=short go test -count=1 -run TestStaleVoterDir -v -timeout 10m ./cmd/weir
func TestStaleVoterDir(t *testing.T) {
	if os.Getenv("WEIR_FAULTS") == "" {
		t.Skip("starts three voters for minutes: WEIR_FAULTS=short go test -run TestStaleVoterDir -v ./cmd/weir")
	}
	dir := t.TempDir()
	h := &harness{t: t, bin: filepath.Join(dir, "weir"), dir: dir, env: []string{"WEIR_ADMIN_TOKENS=alice:" + testToken},
		faults: map[string]int{}}
	if out, err := exec.Command("go", "build", "-ldflags=-s -w", "-o", h.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	h.start = time.Now()
	rpcs := h.startVoters()
	if !h.recovered(60 * time.Second) {
		t.Fatal("the voters did not elect a leader within 60s")
	}
	lc, err := raftgroup.NewClient(raftgroup.ClientConfig{Voters: rpcs, Name: "stale-load"})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	s := &staleRun{h: h, lc: lc}
	v1, v2, v3 := h.voters[0], h.voters[1], h.voters[2]

	// healthy: a copy of v2 a minute old, the others up.
	s.work("before", 3)
	copyDir := s.copyOf(v2)
	age := 60 * time.Second
	for end := time.Now().Add(age); time.Now().Before(end); {
		s.work("healthy", 1)
		time.Sleep(time.Second)
	}
	lost := s.restoreAndCheck(v2, copyDir, "healthy", nil)
	if len(lost) > 0 {
		t.Errorf("healthy: a stale voter beside a healthy quorum lost %v", lost)
	}

	// quorum: v3 down, a copy of v2, 10 s of work on v1 + v2, then v1 dies
	// and v2 restarts from the copy beside v3.
	fromV3 := h.kill(v3)
	s.work("lagging", 2)
	copyDir = s.copyOf(v2)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		s.work("quorum", 1)
		time.Sleep(time.Second)
	}
	fromV1 := h.kill(v1)
	lost = s.restoreAndCheck(v2, copyDir, "quorum", func() { h.restart(v3, fromV3) })
	t.Logf("quorum: with v1 down, v2 from its copy and v3 form the group; lost: %v", lost)
	h.restart(v1, fromV1)
	if !h.recovered(60 * time.Second) {
		t.Fatal("quorum: the old leader did not rejoin within 60s")
	}
	// The old leader takes the new history: every voter at one version.
	back := time.Now()
	var versions []string
	same := false
	for deadline := time.Now().Add(30 * time.Second); !same && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		versions, same = versions[:0], true
		var first uint64
		for i, v := range h.voters {
			doc, err := h.rules(v, false)
			if err != nil {
				t.Fatalf("rules on %s: %v", v.name, err)
			}
			if i == 0 {
				first = doc.Version
			}
			same = same && doc.Version == first
			versions = append(versions, fmt.Sprintf("%s v%d", v.name, doc.Version))
		}
	}
	t.Logf("quorum: %v after the old leader's return: %s", time.Since(back).Round(time.Millisecond), strings.Join(versions, ", "))
	if !same {
		t.Errorf("quorum: the voters disagree 30s after the old leader's return: %s", strings.Join(versions, ", "))
	}
	// A node applies a rule set only when its version is above the one it
	// enforces: after the loss, the nodes that had applied the lost
	// versions keep enforcing them until the group's version passes theirs.
	s.work("after", 2)
	time.Sleep(3 * time.Second) // three check intervals
	var enforced []string
	for _, v := range h.voters {
		ov, err := overview(v.current().addrs.HTTP)
		if err != nil {
			t.Fatalf("status of %s: %v", v.name, err)
		}
		enforced = append(enforced, fmt.Sprintf("%s v%d", v.name, ov.Status.RulesVersion))
	}
	doc, err := h.rules(v1, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("quorum: two PUTs later the group is at v%d; the voters enforce %s", doc.Version, strings.Join(enforced, ", "))
	// Nothing acknowledged before either copy is lost.
	for _, l := range s.lostNow() {
		if !strings.Contains(l, "quorum") {
			t.Errorf("quorum: %s was acknowledged before the copy and is lost", l)
		}
	}
}

// staleRun is the work of TestStaleVoterDir: rules PUTs and durable
// identities spent to their burst, each acknowledged one remembered with
// the phase it was made in.
type staleRun struct {
	h     *harness
	lc    *raftgroup.Client
	n     int
	phase map[int]string // PUT seq -> phase
	spent []string       // durable identities spent to the burst, acknowledged
}

// work makes n rules PUTs through the leader's HTTP and spends one durable
// identity to its burst, labelled with phase.
func (s *staleRun) work(phase string, n int) {
	if s.phase == nil {
		s.phase = map[int]string{}
	}
	for range n {
		l := s.h.currentLeader()
		if rec := s.h.put(l); rec.version != 0 {
			s.phase[rec.seq] = phase
		}
	}
	s.n++
	id := fmt.Sprintf("%s-%d", phase, s.n)
	admitted := 0
	for range durableBurst {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		d, err := s.lc.Durable(ctx, durableRule, id, 1)
		cancel()
		if err == nil && d.Allowed {
			admitted++
		}
	}
	if admitted == durableBurst {
		s.spent = append(s.spent, id)
	}
}

// copyOf copies v's data directory while v is stopped (SIGSTOP: the copy
// is what a crash at that instant leaves) and returns the copy's path.
func (s *staleRun) copyOf(v *fproc) string {
	h := s.h
	src := filepath.Join(h.dir, v.name+"-data")
	dst := filepath.Join(h.dir, fmt.Sprintf("%s-copy-%d", v.name, h.now()))
	c := v.current()
	doc, err := h.rules(v, false)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("copy of %s's data directory at t=%v, its rule set at v%d", v.name, time.Duration(h.now()).Round(time.Millisecond), doc.Version)
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		h.t.Fatal(err)
	}
	err = os.CopyFS(dst, os.DirFS(src))
	if err2 := c.cmd.Process.Signal(syscall.SIGCONT); err2 != nil {
		h.t.Fatal(err2)
	}
	if err != nil {
		h.t.Fatalf("copy %s: %v", src, err)
	}
	return dst
}

// restoreAndCheck kills v, puts the copy in place of its data directory,
// runs also (another voter's start) and restarts v, waits for a leader,
// and returns what is lost: acknowledged PUTs whose change the group's
// history no longer holds, and durable identities spent to their burst
// that admit again.
func (s *staleRun) restoreAndCheck(v *fproc, copyDir, phase string, also func()) []string {
	h := s.h
	from := h.kill(v)
	data := filepath.Join(h.dir, v.name+"-data")
	if err := os.RemoveAll(data); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(copyDir, data); err != nil {
		h.t.Fatal(err)
	}
	var wg sync.WaitGroup
	if also != nil {
		wg.Go(also)
	}
	h.restart(v, from)
	wg.Wait()
	var lead rulesDoc
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if lead, err = h.rules(v, true); err == nil {
			break
		}
	}
	if err != nil {
		h.t.Fatalf("%s: no leader 60s after the restart from the copy: %v", phase, err)
	}
	// The stale voter catches up: its own rule set reaches the group's.
	caught := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if doc, err := h.rules(v, false); err == nil && doc.Version >= lead.Version {
			break
		}
	}
	h.t.Logf("%s: at t=%v %s restarted from its copy, caught up with the group (v%d) in %v", phase, time.Duration(h.now()).Round(time.Millisecond), v.name, lead.Version,
		time.Since(caught).Round(time.Millisecond))
	return s.lostNow()
}

// lostNow lists what the group no longer holds of what was acknowledged.
func (s *staleRun) lostNow() []string {
	h := s.h
	byVersion := map[uint64]histEntry{}
	for _, e := range h.historyFrom(h.currentLeader()) {
		byVersion[e.Version] = e
	}
	var lost []string
	h.putMu.Lock()
	for _, p := range h.puts {
		if p.version == 0 {
			continue
		}
		if e, ok := byVersion[p.version]; !ok || e.RuleID != p.id || e.After.Limit != int64(1000+p.seq) {
			lost = append(lost, fmt.Sprintf("%s PUT %d (v%d)", s.phase[p.seq], p.seq, p.version))
		}
	}
	h.putMu.Unlock()
	for _, id := range s.spent {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		d, err := s.lc.Durable(ctx, durableRule, id, 1)
		cancel()
		if err == nil && d.Allowed {
			lost = append(lost, "durable "+id)
		}
	}
	return lost
}
