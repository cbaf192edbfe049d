package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The fleet of the process fault harness (faults_test.go): its processes
// across their incarnations, their configs, start-up and readiness, and the
// admin API calls the harness makes.

// window is a span of a process's fault, ns since the run's start: from
// the signal to the moment it was back (resumed, or restarted and ready);
// paused says it was a SIGSTOP, not a kill.
type window struct {
	from, to int64
	paused   bool
}

// fproc is one process of the harness across its incarnations.
type fproc struct {
	name, region string
	voter        bool
	cfg          func(join []string) string // writes its config for a start
	mu           sync.Mutex
	cur          *proc
	starts       int
	windows      []window
	expectExit   bool // set while the harness kills it
	baseFDs      int
}

func (p *fproc) current() *proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// harness is the running fleet and its records.
type harness struct {
	t       *testing.T
	bin     string
	dir     string
	env     []string
	start   time.Time
	voters  []*fproc
	gws     []*fproc
	regions map[string][]*fproc

	leaderMu sync.Mutex
	leader   string // the voter that logged "became leader" last
	leaderAt time.Time

	violMu     sync.Mutex
	violations []string
	unexpected atomic.Int64 // processes that exited without being killed

	putMu   sync.Mutex
	putSeq  int
	puts    []putRec
	faults  map[string]int
	faultMu sync.Mutex
	// tmpfs is the tmpfs data directory of tmpfsVoter; noTmpfs says why
	// there is none (fFullDisk is then skipped).
	tmpfs, noTmpfs string
	diskCrashes    int // fFullDisk faults after which the voter had exited
	// loadEnd is when the run cancelled its load (ns since the start): a
	// durable call that fails from then on was cut off by the test, not
	// answered; it stays in the history (its outcome unknown) but is no
	// caller error.
	loadEnd int64
	// envelope is the envelope check's result per region.
	envelope []envelopeResult
	// voterLease is YAML added to the voters' lease section (lines
	// starting with a newline and two spaces); voterLog their log
	// settings ("" is info).
	voterLease, voterLog string
}

// putRec is one rules PUT: its sequence number (the rule's limit is
// 1000+seq), the rule id, and the version it was acknowledged with (0: the
// PUT failed, it may or may not have been applied).
type putRec struct {
	seq     int
	id      string
	version uint64
	err     string
}

func (h *harness) now() int64 { return int64(time.Since(h.start)) }

func (h *harness) violation(format string, args ...any) {
	h.violMu.Lock()
	defer h.violMu.Unlock()
	msg := fmt.Sprintf(format, args...)
	h.violations = append(h.violations, msg)
	h.t.Errorf("violation: %s", msg)
}

// leaderWatch is a voter's log writer: it keeps the log (lockedBuf) and
// notes each "became leader" line. The status API does not name the lease
// leader; a voter logs it when it takes over.
type leaderWatch struct {
	h    *harness
	name string
	log  *lockedBuf
	line []byte
}

func (w *leaderWatch) Write(p []byte) (int, error) {
	w.log.Write(p)
	w.line = append(w.line, p...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		if bytes.Contains(w.line[:i], []byte("became leader")) {
			w.h.leaderMu.Lock()
			w.h.leader, w.h.leaderAt = w.name, time.Now()
			w.h.leaderMu.Unlock()
		}
		w.line = w.line[i+1:]
	}
	return len(p), nil
}

// launch starts one incarnation of p and waits for its ready line.
func (h *harness) launch(p *fproc, join []string) error {
	cfg := p.cfg(join)
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		np := &proc{name: p.name, done: make(chan struct{}), log: &lockedBuf{}}
		np.cmd = exec.Command(h.bin, "serve", "--config", cfg)
		np.cmd.Env = append(os.Environ(), h.env...)
		if p.voter {
			np.cmd.Stderr = &leaderWatch{h: h, name: p.name, log: np.log}
		} else {
			np.cmd.Stderr = np.log
		}
		out, err := np.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := np.cmd.Start(); err != nil {
			return err
		}
		h.t.Cleanup(func() {
			select {
			case <-np.done:
			default:
				_ = np.cmd.Process.Signal(syscall.SIGCONT)
				_ = np.cmd.Process.Kill() // only the PID this harness started
				<-np.done
			}
		})
		ready := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(out)
			first := true
			for sc.Scan() {
				if first {
					first = false
					ready <- json.Unmarshal(sc.Bytes(), &np.addrs)
				}
			}
			np.err = np.cmd.Wait()
			close(np.done)
			if first {
				ready <- fmt.Errorf("exited before its ready line: %v", np.err)
			}
			p.mu.Lock()
			expected := p.expectExit || p.cur != np
			p.mu.Unlock()
			if !expected && h.t.Context().Err() == nil {
				h.unexpected.Add(1)
				h.violation("%s exited by itself (%v); its log ends:\n%s", p.name, np.err, tail(np.log.String(), 2000))
			}
		}()
		select {
		case err = <-ready:
		case <-time.After(60 * time.Second):
			err = fmt.Errorf("no ready line within 60s")
			_ = np.cmd.Process.Kill()
		}
		if err == nil {
			p.mu.Lock()
			p.cur, p.expectExit = np, false
			p.starts++
			p.mu.Unlock()
			return nil
		}
		last = fmt.Errorf("%s: %v\n%s", p.name, err, tail(np.log.String(), 2000))
		if !strings.Contains(np.log.String(), "could not join") {
			break
		}
		time.Sleep(time.Second)
	}
	return last
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// liveJoin returns the gossip addresses of p's region's other gateways
// that are running.
func (h *harness) liveJoin(p *fproc) []string {
	var join []string
	for _, o := range h.regions[p.region] {
		if o == p {
			continue
		}
		if c := o.current(); c != nil {
			select {
			case <-c.done:
			default:
				join = append(join, c.addrs.Gossip)
			}
		}
	}
	return join
}

// setup writes the configs and starts the voters, then the gateways.
func (h *harness) setup() {
	h.mountTmpfs(filepath.Join(h.dir, tmpfsVoter+"-data"))
	h.startGateways(h.startVoters())
	if !h.recovered(60 * time.Second) {
		h.t.Fatal("the fleet did not converge within 60s")
	}
}

// startVoters writes the configs of the three voters (v1, v2, v3: data in
// <name>-data) and starts them; they bootstrap together. It returns their
// lease RPC addresses.
func (h *harness) startVoters() []string {
	t := h.t
	type vaddr struct{ name, raft, rpc, http string }
	var vs []vaddr
	for i := 1; i <= 3; i++ {
		vs = append(vs, vaddr{fmt.Sprintf("v%d", i), freePort(t), freePort(t), freePort(t)})
	}
	var voterList, rpcs []string
	for _, v := range vs {
		voterList = append(voterList, fmt.Sprintf("{name: %s, raft: %s, rpc: %s}", v.name, v.raft, v.rpc))
		rpcs = append(rpcs, v.rpc)
	}
	for _, v := range vs {
		path := filepath.Join(h.dir, v.name+".yaml")
		body := fmt.Sprintf(`node: {name: %s, region: eu}
rules: {lease: true}
lease:
  voter: {data_dir: %s, raft: %s, rpc: %s, voters: [%s]}
  regions: [eu, us]
  check_interval: 1s%s
http: {listen: %s}
log: {level: %s}
`, v.name, filepath.Join(h.dir, v.name+"-data"), v.raft, v.rpc, strings.Join(voterList, ", "), h.voterLease, v.http, cmp.Or(h.voterLog, "info"))
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		h.voters = append(h.voters, &fproc{name: v.name, region: "eu", voter: true, cfg: func([]string) string { return path }})
	}
	errs := make(chan error, len(h.voters))
	for _, v := range h.voters {
		go func() { errs <- h.launch(v, nil) }()
	}
	for range h.voters {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return rpcs
}

// startGateways writes the descriptor file and the configs of the two
// regions' gateways (lease clients of the voters at rpcs) and starts them.
// Region eu runs the imported limits in shared mode, us in exact mode, both
// with on_failure: closed (faults_envelope_test.go).
func (h *harness) startGateways(rpcs []string) {
	t := h.t
	label := fmt.Sprintf("weir-faults-%d", os.Getpid())
	desc := filepath.Join(h.dir, "edge.yaml")
	if err := os.WriteFile(desc, []byte(edgeDescriptors), 0o600); err != nil {
		t.Fatal(err)
	}
	h.regions = map[string][]*fproc{}
	for _, region := range []string{"eu", "us"} {
		mode := regionModes[region]
		for i := 1; i <= 3; i++ {
			name := fmt.Sprintf("%s-%d", region, i)
			gossip, rpc, rlsAddr, httpAddr := freePort(t), freePort(t), freePort(t), freePort(t)
			p := &fproc{name: name, region: region}
			p.cfg = func(join []string) string {
				path := filepath.Join(h.dir, name+".yaml")
				body := fmt.Sprintf(`node: {name: %s, region: %s}
gossip: {bind: %s, join: [%s], local_timing: true, label: %s-%s}
peer: {rpc: %s, decide_timeout: 250ms, call_timeout: 200ms}
envoy: {listen: %s, descriptors: [%s], mode: %s, on_failure: closed%s}
http: {listen: %s}
lease: {voters: [%s]}
log: {level: warn}
`, name, region, gossip, strings.Join(join, ", "), label, region, rpc, rlsAddr, desc, mode, accuracyField(mode), httpAddr, strings.Join(rpcs, ", "))
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

// mountTmpfs mounts a 64 MiB tmpfs on dir, the data directory of
// tmpfsVoter, when it can (mounting needs root); else it says why in
// h.noTmpfs.
func (h *harness) mountTmpfs(dir string) {
	if os.Geteuid() != 0 {
		h.noTmpfs = "mounting a tmpfs needs root"
		return
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		h.t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		h.noTmpfs = fmt.Sprintf("mount -t tmpfs: %v", err)
		return
	}
	h.tmpfs = dir
	// Registered before the voters start: it runs after they are killed.
	h.t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			h.t.Errorf("unmount the voter's tmpfs: %v", err)
		}
	})
}

// recovered waits up to limit for every process to run, every region's
// gateways to see their three members, and the lease group to answer a
// linearizable read (it has a leader with a quorum).
func (h *harness) recovered(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if h.healthy() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (h *harness) healthy() bool {
	for _, gs := range h.regions {
		var ps []*proc
		for _, g := range gs {
			ps = append(ps, g.current())
		}
		if !membersEverywhere(ps, len(gs))() {
			return false
		}
	}
	for _, v := range h.voters {
		if _, err := h.rules(v, true); err != nil {
			return false
		}
	}
	return true
}

// rulesDoc is GET /v1/rules.
type rulesDoc struct {
	Version uint64 `json:"version"`
	Rules   []struct {
		ID    string `json:"id"`
		Limit int64  `json:"limit"`
	} `json:"rules"`
}

var adminClient = &http.Client{Timeout: 5 * time.Second}

func (h *harness) admin(method, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// rules reads GET /v1/rules on p (consistent: from the leader).
func (h *harness) rules(p *fproc, consistent bool) (rulesDoc, error) {
	var doc rulesDoc
	url := "http://" + p.current().addrs.HTTP + "/v1/rules"
	if consistent {
		url += "?consistent=true"
	}
	code, b, err := h.admin(http.MethodGet, url, nil)
	if err != nil {
		return doc, err
	}
	if code != http.StatusOK {
		return doc, fmt.Errorf("%s: %d %.200s", url, code, b)
	}
	return doc, json.Unmarshal(b, &doc)
}

// put sends one rules PUT through gateway g and records it. The rule
// r<seq mod 8> gets limit 1000+seq: each PUT is a change.
func (h *harness) put(g *fproc) putRec {
	h.putMu.Lock()
	defer h.putMu.Unlock()
	h.putSeq++
	rec := putRec{seq: h.putSeq, id: fmt.Sprintf("r%d", h.putSeq%8)}
	body := fmt.Sprintf(`{"key": ["header:X-Api-Key"], "limit": %d, "window": "1m", "match": {"prefix": "/%s"}}`, 1000+rec.seq, rec.id)
	code, b, err := h.admin(http.MethodPut, "http://"+g.current().addrs.HTTP+"/v1/rules/"+rec.id, []byte(body))
	switch {
	case err != nil:
		rec.err = err.Error()
	case code != http.StatusOK:
		rec.err = fmt.Sprintf("%d %.200s", code, b)
	default:
		var doc struct {
			Version uint64 `json:"version"`
		}
		if err := json.Unmarshal(b, &doc); err != nil || doc.Version == 0 {
			rec.err = fmt.Sprintf("an answer without a version: %.200s", b)
		} else {
			rec.version = doc.Version
		}
	}
	h.puts = append(h.puts, rec)
	return rec
}

// fdCount counts a process's open file descriptors.
func fdCount(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return len(ents), err
}

func (h *harness) all() []*fproc { return append(slices.Clone(h.voters), h.gws...) }

func (h *harness) byName(name string) *fproc {
	for _, p := range h.all() {
		if p.name == name {
			return p
		}
	}
	return nil
}

// currentLeader returns the lease leader: the voter that logged "became
// leader" last, checked to be running.
func (h *harness) currentLeader() *fproc {
	for range 100 {
		h.leaderMu.Lock()
		name := h.leader
		h.leaderMu.Unlock()
		if p := h.byName(name); p != nil {
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}
