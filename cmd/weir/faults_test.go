package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
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

	"github.com/anishathalye/porcupine"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/lease"
)

// The process fault harness (docs/reliability.md, "The process fault
// harness"): `weir serve` processes on loopback, two regions of three
// gateways and a lease group of three voters, under steady load from this
// test process, while a seeded scheduler pauses (SIGSTOP/SIGCONT) and kills
// (SIGKILL) them and restarts the killed ones. Every decision the load makes
// is recorded; the checks run on the records and on the processes at the end.
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

// window is a span of a process's fault, ns since the run's start: from
// the signal to the moment it was back (resumed, or restarted and ready).
type window struct{ from, to int64 }

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
	t := h.t
	label := fmt.Sprintf("weir-faults-%d", os.Getpid())
	desc := filepath.Join(h.dir, "edge.yaml")
	if err := os.WriteFile(desc, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 60}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
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
	h.mountTmpfs(filepath.Join(h.dir, tmpfsVoter+"-data"))
	for _, v := range vs {
		path := filepath.Join(h.dir, v.name+".yaml")
		body := fmt.Sprintf(`node: {name: %s, region: eu}
rules: {lease: true}
lease:
  voter: {data_dir: %s, raft: %s, rpc: %s, voters: [%s]}
  regions: [eu, us]
  check_interval: 1s
http: {listen: %s}
log: {level: info}
`, v.name, filepath.Join(h.dir, v.name+"-data"), v.raft, v.rpc, strings.Join(voterList, ", "), v.http)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		h.voters = append(h.voters, &fproc{name: v.name, region: "eu", voter: true, cfg: func([]string) string { return path }})
	}
	h.regions = map[string][]*fproc{}
	for _, region := range []string{"eu", "us"} {
		for i := 1; i <= 3; i++ {
			name := fmt.Sprintf("%s-%d", region, i)
			gossip, rpc, rlsAddr, httpAddr := freePort(t), freePort(t), freePort(t), freePort(t)
			p := &fproc{name: name, region: region}
			p.cfg = func(join []string) string {
				path := filepath.Join(h.dir, name+".yaml")
				body := fmt.Sprintf(`node: {name: %s, region: %s}
gossip: {bind: %s, join: [%s], local_timing: true, label: %s-%s}
peer: {rpc: %s, decide_timeout: 250ms, call_timeout: 200ms}
envoy: {listen: %s, descriptors: [%s]}
http: {listen: %s}
lease: {voters: [%s]}
log: {level: warn}
`, name, region, gossip, strings.Join(join, ", "), label, region, rpc, rlsAddr, desc, httpAddr, strings.Join(rpcs, ", "))
				if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			}
			h.gws = append(h.gws, p)
			h.regions[region] = append(h.regions[region], p)
		}
	}
	// The voters bootstrap together.
	errs := make(chan error, len(h.voters))
	for _, v := range h.voters {
		go func() { errs <- h.launch(v, nil) }()
	}
	for range h.voters {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range h.gws {
		if err := h.launch(g, h.liveJoin(g)); err != nil {
			t.Fatal(err)
		}
	}
	if !h.recovered(60 * time.Second) {
		t.Fatal("the fleet did not converge within 60s")
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

// rlsRec is one Envoy decision through a gateway: call and return (ns since
// the start), the gateway's index, the key, and the outcome.
type rlsRec struct {
	Call, Return int64
	GW           uint8
	Key          uint16
	Out          uint8 // 0 OK, 1 OVER_LIMIT, 2 error
}

// load is the client side: RLS callers on every gateway, durable callers
// through a lease.Client, and a slow rules PUT loop.
type load struct {
	mu                       sync.Mutex
	rls                      []rlsRec
	durable                  []durableRec
	firstRLSErr, firstDurErr map[string]string
}

func (h *harness) runLoad(ctx context.Context, l *load) *sync.WaitGroup {
	var wg sync.WaitGroup
	conns := make([]rlsv3.RateLimitServiceClient, len(h.gws))
	for i, g := range h.gws {
		cc, err := grpc.NewClient(g.current().addrs.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { cc.Close() })
		conns[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	for i := range h.gws {
		wg.Go(func() {
			var recs []rlsRec
			defer func() { l.mu.Lock(); l.rls = append(l.rls, recs...); l.mu.Unlock() }()
			for n := 0; ctx.Err() == nil; n++ {
				key := uint16((n*7 + i*13) % 256)
				call := h.now()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := shouldRateLimit(cctx, conns[i], fmt.Sprintf("k%d", key), 1)
				cancel()
				r := rlsRec{Call: call, Return: h.now(), GW: uint8(i), Key: key}
				switch {
				case err != nil:
					if ctx.Err() != nil {
						return // the run ended: not an answer
					}
					r.Out = 2
					l.mu.Lock()
					if _, ok := l.firstRLSErr[h.gws[i].name]; !ok {
						l.firstRLSErr[h.gws[i].name] = err.Error()
					}
					l.mu.Unlock()
				case resp.OverallCode != rlsv3.RateLimitResponse_OK:
					r.Out = 1
				}
				recs = append(recs, r)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	var rpcs []string
	for _, v := range h.voters {
		rpcs = append(rpcs, v.current().addrs.LeaseRPC)
	}
	lc, err := lease.NewClient(lease.ClientConfig{Voters: rpcs, Name: "faults-load"})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { lc.Close() })
	var seq atomic.Uint32
	for w := range 3 {
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			var recs []durableRec
			defer func() { l.mu.Lock(); l.durable = append(l.durable, recs...); l.mu.Unlock() }()
			for ctx.Err() == nil {
				// About 6 decisions per identity, by the three callers at
				// once, asking for about 9 tokens of its 5.
				id := seq.Add(1) / 6
				cost := 1 + rng.IntN(2)
				call := h.now()
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				d, err := lc.Durable(cctx, durableRule, fmt.Sprintf("acct-%d", id), int64(cost))
				cancel()
				r := durableRec{Call: call, Return: h.now(), ID: id, Cost: uint8(cost)}
				switch {
				case err != nil:
					r.Out = outUnknown
					if ctx.Err() == nil {
						l.mu.Lock()
						if _, ok := l.firstDurErr["durable"]; !ok {
							l.firstDurErr["durable"] = err.Error()
						}
						l.mu.Unlock()
					}
				case d.Allowed:
					r.Out = outAdmitted
				default:
					r.Out = outRejected
				}
				recs = append(recs, r)
				time.Sleep(25 * time.Millisecond)
			}
		})
	}
	return &wg
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

func (h *harness) noteWindow(p *fproc, from int64) {
	p.mu.Lock()
	p.windows = append(p.windows, window{from, h.now()})
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
	h.noteWindow(p, from)
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

// excused reports whether a call over [call, ret] overlaps one of ws
// stretched by grace at their end (a call sent to a stopped process waits
// for its timeout; a client reconnects to a restarted one).
func excused(ws []window, call, ret int64, grace time.Duration) bool {
	for _, w := range ws {
		if call <= w.to+int64(grace) && ret >= w.from {
			return true
		}
	}
	return false
}

// check runs the checks on the records and the processes at the end.
func (h *harness) check(l *load) {
	t := h.t
	// 1. Every process runs and has rejoined.
	if !h.recovered(60 * time.Second) {
		h.violation("at the end the fleet has not recovered within 60s")
	}
	for _, p := range h.all() {
		select {
		case <-p.current().done:
			h.violation("%s is not running at the end", p.name)
		default:
		}
	}

	// 2. Caller errors only from a process that was down.
	var rlsN, rlsErr, rlsExcused, rlsOver int
	for _, r := range l.rls {
		rlsN++
		switch r.Out {
		case 1:
			rlsOver++
		case 2:
			rlsErr++
			g := h.gws[r.GW]
			if excused(g.windows, r.Call, r.Return, 5*time.Second) {
				rlsExcused++
			} else {
				h.violation("an RLS error from %s at t=%v..%v, outside its fault windows %v (first error: %s)", g.name,
					time.Duration(r.Call), time.Duration(r.Return), g.windows, l.firstRLSErr[g.name])
			}
		}
	}
	var voterWindows []window
	for _, v := range h.voters {
		voterWindows = append(voterWindows, v.windows...)
	}
	var durN, durAdm, durRej, durUnk, durExcused int
	for _, r := range l.durable {
		durN++
		switch r.Out {
		case outAdmitted:
			durAdm++
		case outRejected:
			durRej++
		default:
			durUnk++
			if r.Return >= h.loadEnd || excused(voterWindows, r.Call, r.Return, 10*time.Second) {
				durExcused++
			} else {
				h.violation("a durable decision failed at t=%v..%v, outside every voter's fault window (first error: %s)",
					time.Duration(r.Call), time.Duration(r.Return), l.firstDurErr["durable"])
			}
		}
	}
	// The longest durable answer (or failure) as the caller saw it, inside
	// a voter's fault window (two voters killed: no quorum) and outside.
	var durSlowIn, durSlowOut time.Duration
	for _, r := range l.durable {
		if r.Return >= h.loadEnd {
			continue
		}
		d := time.Duration(r.Return - r.Call)
		if excused(voterWindows, r.Call, r.Return, 0) {
			durSlowIn = max(durSlowIn, d)
		} else {
			durSlowOut = max(durSlowOut, d)
		}
	}
	t.Logf("durable: longest answer %v inside a voter's fault window, %v outside (the caller's deadline is 3s)", durSlowIn.Round(time.Millisecond), durSlowOut.Round(time.Millisecond))
	t.Logf("RLS: %d decisions, %d over limit, %d errors (%d from a process down or just back); first errors %v", rlsN, rlsOver, rlsErr, rlsExcused, l.firstRLSErr)
	t.Logf("durable: %d decisions (%d admitted, %d rejected, %d failed, %d of them in a voter's fault window or cut off by the end of the run) on %d identities; first error %v",
		durN, durAdm, durRej, durUnk, durExcused, len(distinctIDs(l.durable)), l.firstDurErr)

	// 3. Durable decisions: no identity past its limit, and the history is
	// linearizable against the bucket model.
	if over := overAdmitted(l.durable, durableBurst); len(over) > 0 {
		h.violation("durable: %d identities admitted past the burst of %d: %v", len(over), durableBurst, over)
	}
	checked := time.Now()
	res, _ := porcupine.CheckOperationsVerbose(durableModel(durableBurst), durableHistory(l.durable), 5*time.Minute)
	t.Logf("durable: porcupine says %s on %d operations in %v", res, durN, time.Since(checked).Round(time.Millisecond))
	if res != porcupine.Ok {
		h.violation("durable: the history of durable decisions is %s against the bucket model", res)
	}

	// 4. Rules: every acknowledged PUT is on every voter and gateway, and
	// the history has no gap.
	h.putMu.Lock()
	puts := slices.Clone(h.puts)
	h.putMu.Unlock()
	var acked, failed int
	maxAcked := map[string]int{}        // rule id -> newest acknowledged seq
	issued := map[string]map[int]bool{} // rule id -> every seq sent
	var top uint64
	for _, p := range puts {
		if issued[p.id] == nil {
			issued[p.id] = map[int]bool{}
		}
		issued[p.id][p.seq] = true
		if p.version == 0 {
			failed++
			continue
		}
		acked++
		maxAcked[p.id] = max(maxAcked[p.id], p.seq)
		top = max(top, p.version)
	}
	var final rulesDoc
	converged := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !converged; time.Sleep(200 * time.Millisecond) {
		lead, err := h.rules(h.voters[0], true)
		if err != nil {
			continue
		}
		converged = true
		for _, p := range h.all() {
			doc, err := h.rules(p, false)
			if err != nil || doc.Version != lead.Version {
				converged = false
				break
			}
		}
		final = lead
	}
	if !converged {
		h.violation("rules: the voters and gateways do not agree on the rule set version within 30s")
	}
	if final.Version < top {
		h.violation("rules: the group is at version %d, below the acknowledged version %d", final.Version, top)
	}
	for _, p := range h.all() {
		doc, err := h.rules(p, false)
		if err != nil {
			h.violation("rules on %s: %v", p.name, err)
			continue
		}
		have := map[string]int64{}
		for _, r := range doc.Rules {
			have[r.ID] = r.Limit
		}
		for id, seq := range maxAcked {
			got, ok := have[id]
			gotSeq := int(got - 1000)
			if !ok || gotSeq < seq || !issued[id][gotSeq] {
				h.violation("rules on %s: %s has limit %d (present %v), want the acknowledged PUT %d (limit %d) or a later one", p.name, id, got, ok, seq, 1000+seq)
			}
		}
	}
	// The voters apply the rules they store (rules.lease): their rule set
	// version is the group's.
	for _, v := range h.voters {
		ov, err := overview(v.current().addrs.HTTP)
		if err != nil || ov.Status.RulesVersion != final.Version {
			h.violation("%s enforces rule set version %d (%v), the group is at %d", v.name, ov.Status.RulesVersion, err, final.Version)
		}
	}
	hist := h.history()
	for i := 1; i < len(hist); i++ {
		if hist[i].Version != hist[i-1].Version+1 {
			h.violation("rules history: version %d follows %d", hist[i].Version, hist[i-1].Version)
		}
	}
	if n := len(hist); n == 0 || hist[n-1].Version != final.Version {
		h.violation("rules history of %d entries does not end at the version %d", n, final.Version)
	}
	byVersion := map[uint64]histEntry{}
	for _, e := range hist {
		byVersion[e.Version] = e
	}
	for _, p := range puts {
		if p.version == 0 {
			continue
		}
		e, ok := byVersion[p.version]
		if !ok || e.RuleID != p.id || e.After.Limit != int64(1000+p.seq) {
			h.violation("rules history: the acknowledged PUT %d of %s (v%d) is not there: %+v", p.seq, p.id, p.version, e)
		}
	}
	t.Logf("rules: %d PUTs, %d acknowledged, %d failed; version %d, history %d entries without a gap", len(puts), acked, failed, final.Version, len(hist))

	// 5. File descriptors, loosely against the baseline after warm-up.
	var fds []string
	for _, p := range h.all() {
		n, err := fdCount(p.current().cmd.Process.Pid)
		if err != nil {
			h.violation("fds of %s: %v", p.name, err)
			continue
		}
		fds = append(fds, fmt.Sprintf("%s %d→%d (%d starts)", p.name, p.baseFDs, n, p.starts))
		if n > 2*p.baseFDs+20 {
			h.violation("%s holds %d file descriptors, baseline %d", p.name, n, p.baseFDs)
		}
	}
	t.Logf("file descriptors, baseline→end: %s", strings.Join(fds, ", "))
}

func distinctIDs(recs []durableRec) map[uint32]bool {
	m := map[uint32]bool{}
	for _, r := range recs {
		m[r.ID] = true
	}
	return m
}

// histEntry is an entry of GET /v1/rules/history.
type histEntry struct {
	Version uint64 `json:"version"`
	Op      string `json:"op"`
	RuleID  string `json:"rule_id"`
	After   struct {
		Limit int64 `json:"limit"`
	} `json:"after"`
}

// history reads the whole rules history from the leader, page by page.
func (h *harness) history() []histEntry {
	var all []histEntry
	var since uint64
	for {
		code, b, err := h.admin(http.MethodGet, fmt.Sprintf("http://%s/v1/rules/history?since=%d&limit=1000", h.voters[0].current().addrs.HTTP, since), nil)
		if err != nil || code != http.StatusOK {
			h.violation("rules history: %d %v %.200s", code, err, b)
			return all
		}
		var doc struct {
			Version uint64      `json:"version"`
			Entries []histEntry `json:"entries"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			h.violation("rules history: %v", err)
			return all
		}
		all = append(all, doc.Entries...)
		if len(doc.Entries) == 0 || doc.Entries[len(doc.Entries)-1].Version >= doc.Version {
			return all
		}
		since = doc.Entries[len(doc.Entries)-1].Version
	}
}
