package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The faults the scheduler of the process fault harness (faults_test.go)
// injects: pauses, kills and restarts, and a full disk.

// fillDisk writes a file into h.tmpfs until the disk is full and returns
// its path and the bytes written.
func (h *harness) fillDisk() (string, int64) {
	path := filepath.Join(h.tmpfs, "filler")
	f, err := os.Create(path)
	if err != nil {
		return path, 0 // full already
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	var n int64
	for {
		w, err := f.Write(chunk)
		n += int64(w)
		if err != nil {
			return path, n
		}
	}
}

func (h *harness) noteWindow(p *fproc, from int64) {
	p.mu.Lock()
	p.windows = append(p.windows, window{from: from, to: h.now()})
	p.mu.Unlock()
}

// pause stops p for d, then resumes it.
func (h *harness) pause(p *fproc, d time.Duration) {
	c := p.current()
	from := h.now()
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		h.violation("SIGSTOP %s: %v", p.name, err)
		return
	}
	time.Sleep(d)
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		h.violation("SIGCONT %s: %v", p.name, err)
	}
	p.mu.Lock()
	p.windows = append(p.windows, window{from: from, to: h.now(), paused: true})
	p.mu.Unlock()
}

// kill kills p with SIGKILL and waits for it to exit; restart starts it
// again with its config (a gateway joins its region's running members).
func (h *harness) kill(p *fproc) int64 {
	c := p.current()
	p.mu.Lock()
	p.expectExit = true
	p.mu.Unlock()
	from := h.now()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	return from
}

func (h *harness) restart(p *fproc, from int64) {
	var join []string
	if !p.voter {
		join = h.liveJoin(p)
	}
	if err := h.launch(p, join); err != nil {
		h.violation("restart of %s: %v", p.name, err)
	}
	h.noteWindow(p, from)
}

// inject runs one fault of kind with the seeded rng.
func (h *harness) inject(kind string, rng *rand.Rand) string {
	h.faultMu.Lock()
	h.faults[kind]++
	h.faultMu.Unlock()
	pauseFor := time.Duration(1000+rng.IntN(9000)) * time.Millisecond
	switch kind {
	case fPauseGateway:
		g := h.gws[rng.IntN(len(h.gws))]
		h.pause(g, pauseFor)
		return fmt.Sprintf("%s for %v", g.name, pauseFor)
	case fPauseLeader:
		l := h.currentLeader()
		if l == nil {
			h.violation("no lease leader to pause")
			return "no leader"
		}
		h.pause(l, pauseFor)
		return fmt.Sprintf("%s for %v", l.name, pauseFor)
	case fKillGateway:
		g := h.gws[rng.IntN(len(h.gws))]
		from := h.kill(g)
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
		h.restart(g, from)
		return g.name
	case fKillVoters:
		perm := rng.Perm(len(h.voters))
		a, b := h.voters[perm[0]], h.voters[perm[1]]
		fa, fb := h.kill(a), h.kill(b)
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
		var wg sync.WaitGroup
		wg.Go(func() { h.restart(a, fa) })
		wg.Go(func() { h.restart(b, fb) })
		wg.Wait()
		return a.name + " and " + b.name
	case fKillLeaderPut:
		l := h.currentLeader()
		if l == nil {
			h.violation("no lease leader to kill")
			return "no leader"
		}
		g := h.gws[rng.IntN(len(h.gws))]
		delay := time.Duration(rng.IntN(20)) * time.Millisecond
		done := make(chan putRec, 1)
		go func() { done <- h.put(g) }()
		time.Sleep(delay)
		from := h.kill(l)
		rec := <-done
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
		h.restart(l, from)
		ack := "acknowledged v" + strconv.FormatUint(rec.version, 10)
		if rec.version == 0 {
			ack = "failed: " + rec.err
		}
		return fmt.Sprintf("%s %v into a PUT of %s through %s (%s)", l.name, delay, rec.id, g.name, ack)
	case fFullDisk:
		v := h.byName(tmpfsVoter)
		v.mu.Lock()
		v.expectExit = true // a voter may stop on a full disk: counted, not a violation
		c := v.cur
		v.mu.Unlock()
		from := h.now()
		path, n := h.fillDisk()
		hold := time.Duration(2000+rng.IntN(6000)) * time.Millisecond
		time.Sleep(hold)
		if err := os.Remove(path); err != nil {
			h.violation("removing the filler: %v", err)
		}
		what := fmt.Sprintf("%s's tmpfs full (%d MiB written) for %v", v.name, n>>20, hold)
		select {
		case <-c.done:
			h.diskCrashes++
			what += fmt.Sprintf("; it exited (%v), restarted; its log ends: %s", c.err, tail(c.log.String(), 300))
			h.restart(v, from)
		default:
			v.mu.Lock()
			v.expectExit = false
			v.mu.Unlock()
			h.noteWindow(v, from)
			what += "; it kept running"
		}
		return what
	}
	panic(kind)
}
