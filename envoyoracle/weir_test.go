package envoyoracle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

var (
	weirOnce sync.Once
	weirBin  string
	weirErr  error
)

// weirBinary builds cmd/weir from the root module once per test binary.
func weirBinary(t *testing.T) string {
	t.Helper()
	weirOnce.Do(func() {
		dir, err := os.MkdirTemp("", "envoyoracle-weir-")
		if err != nil {
			weirErr = err
			return
		}
		weirBin = filepath.Join(dir, "weir")
		cmd := exec.Command("go", "build", "-o", weirBin, "./cmd/weir")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			weirErr = fmt.Errorf("go build ./cmd/weir: %v\n%s", err, out)
		}
	})
	if weirErr != nil {
		t.Fatal(weirErr)
	}
	return weirBin
}

// weirMode is how `weir serve` imports the descriptors, and on how many
// nodes.
type weirMode string

const (
	weirDefault     weirMode = "default"         // token buckets (envoy.mode: shared), one node
	weirFixedWindow weirMode = "fixed_window"    // envoy.fixed_window: true, one node
	weirFixedX3     weirMode = "fixed_window x3" // envoy.fixed_window: true, a 3-node cluster
	weirFidelity    weirMode = "fidelity"        // envoy.fidelity: true, one node
	weirFidelityX3  weirMode = "fidelity x3"     // envoy.fidelity: true, a 3-node cluster
)

// allModes are the weir targets of the differential test, in order.
var allModes = []weirMode{weirDefault, weirFixedWindow, weirFixedX3, weirFidelity, weirFidelityX3}

// clustered reports whether the mode is a 3-node cluster.
func (m weirMode) clustered() bool { return m == weirFixedX3 || m == weirFidelityX3 }

// fidelity reports whether the mode is weir's fidelity mode.
func (m weirMode) fidelity() bool { return m == weirFidelity || m == weirFidelityX3 }

// envoyOptions is the envoy section's options of mode (after the
// descriptors), with envoy's response headers when headers is true and
// the mode can give them (fidelity: response_headers: envoy), and
// merge_domains when merge is true.
func (m weirMode) envoyOptions(headers, merge bool) string {
	var extra string
	switch {
	case m.fidelity():
		extra = ", fidelity: true"
		if headers {
			extra += ", response_headers: envoy"
		}
	case m == weirFixedWindow || m == weirFixedX3:
		extra = ", fixed_window: true"
	}
	if merge {
		extra += ", merge_domains: true"
	}
	return extra
}

// weirConfig writes a `weir serve` config serving the descriptor files on
// ephemeral loopback ports, with extra (weirMode.envoyOptions) in its envoy
// section; gossip, when not empty, is the node's gossip
// section (a cluster member).
func weirConfig(t *testing.T, files []string, extra, name, gossip string) string {
	t.Helper()
	quoted := make([]string, len(files))
	for i, f := range files {
		quoted[i] = fmt.Sprintf("%q", f)
	}
	body := fmt.Sprintf(`node: {name: %s, region: eu}
envoy: {listen: "127.0.0.1:0", descriptors: [%s]%s}
http: {listen: "127.0.0.1:0"}
log: {level: error}
`, name, strings.Join(quoted, ", "), extra)
	if gossip != "" {
		body += gossip + "\n" + `peer: {rpc: "127.0.0.1:0", decide_timeout: 5s, call_timeout: 5s}` + "\n"
	}
	p := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// weirChecks runs `weir serve --check` over the descriptor files, in
// fidelity mode (merge_domains when merge, as MERGE_DOMAIN_CONFIG): nil when
// weir accepts them, else its error output.
func weirChecks(t *testing.T, files []string, merge bool) error {
	t.Helper()
	cmd := exec.Command(weirBinary(t), "serve", "--check", "--config", weirConfig(t, files, weirFidelity.envoyOptions(false, merge), "oracle", ""))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatal(err)
		}
		return fmt.Errorf("%s", strings.TrimSpace(out.String()))
	}
	return nil
}

// weirServe is one `weir serve` process, or a cluster of them asked in
// turn.
type weirServe struct {
	mode    weirMode
	clients []pb.RateLimitServiceClient
	next    int
}

// client is the node to ask next.
func (w *weirServe) client() pb.RateLimitServiceClient {
	c := w.clients[w.next%len(w.clients)]
	w.next++
	return c
}

// weirAddrs is a `weir serve` ready line.
type weirAddrs struct {
	Ready  bool   `json:"ready"`
	RLS    string `json:"rls"`
	HTTP   string `json:"http"`
	Gossip string `json:"gossip"`
	// Pid is the process's id (not in the ready line).
	Pid int `json:"-"`
}

// startWeir starts `weir serve` over the descriptor files in mode (on one
// node, or a cluster of 3 for a clustered mode); headers: envoy's response
// headers are compared.
func startWeir(t *testing.T, files []string, mode weirMode, headers bool) *weirServe {
	t.Helper()
	if mode.clustered() {
		return startWeirCluster(t, files, mode, headers)
	}
	a := startWeirProc(t, weirConfig(t, files, mode.envoyOptions(headers, false), "oracle", ""))
	return &weirServe{mode: mode, clients: []pb.RateLimitServiceClient{dial(t, a.RLS)}}
}

// startWeirCluster starts a 3-node cluster of `weir serve` with fixed
// windows (each identity's owner counts its window) and waits until every
// node sees the three members.
func startWeirCluster(t *testing.T, files []string, mode weirMode, headers bool) *weirServe {
	t.Helper()
	label := fmt.Sprintf("oracle-%d-%d", os.Getpid(), time.Now().UnixNano())
	gossip := func(join string) string {
		g := fmt.Sprintf(`gossip: {bind: "127.0.0.1:0", local_timing: true, label: %s`, label)
		if join != "" {
			g += fmt.Sprintf(", join: [%q]", join)
		}
		return g + "}"
	}
	extra := mode.envoyOptions(headers, false)
	first := startWeirProc(t, weirConfig(t, files, extra, "n1", gossip("")))
	nodes := []weirAddrs{first}
	for _, name := range []string{"n2", "n3"} {
		nodes = append(nodes, startWeirProc(t, weirConfig(t, files, extra, name, gossip(first.Gossip))))
	}
	deadline := time.Now().Add(60 * time.Second)
	for !allSeeMembers(nodes, 3) {
		if time.Now().After(deadline) {
			t.Fatalf("the 3 weir nodes did not all see 3 members within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	w := &weirServe{mode: mode}
	for _, n := range nodes {
		w.clients = append(w.clients, dial(t, n.RLS))
	}
	return w
}

// allSeeMembers reads every node's /v1/status.
func allSeeMembers(nodes []weirAddrs, n int) bool {
	for _, a := range nodes {
		resp, err := http.Get("http://" + a.HTTP + "/v1/status")
		if err != nil {
			return false
		}
		var ov struct {
			Members []struct {
				InRing bool `json:"in_ring"`
			} `json:"members"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ov)
		resp.Body.Close()
		if err != nil || len(ov.Members) != n {
			return false
		}
	}
	return true
}

// startWeirProc starts `weir serve --config cfg` and waits for its ready
// line. It is killed when the test ends. A node that could not join its
// cluster (memberlist's join timed out on an overloaded machine) exits 1, as
// it should; it is started again, up to 3 times.
func startWeirProc(t *testing.T, cfg string) weirAddrs {
	t.Helper()
	return startWeirProcWith(t, weirBinary(t), cfg, nil)
}

// startWeirProcWith is startWeirProc of the weir binary bin, with env added
// to the test's environment.
func startWeirProcWith(t *testing.T, bin, cfg string, env []string) weirAddrs {
	t.Helper()
	for attempt := 1; ; attempt++ {
		a, log, err := startWeirProcOnce(t, bin, cfg, env)
		if err == nil {
			return a
		}
		if attempt == 3 || !strings.Contains(log, "could not join") {
			t.Fatalf("weir serve --config %s: %v\n%s", filepath.Base(cfg), err, log)
		}
		t.Logf("weir serve: attempt %d could not join (overloaded machine); again", attempt)
	}
}

func startWeirProcOnce(t *testing.T, bin, cfg string, env []string) (weirAddrs, string, error) {
	var a weirAddrs
	cmd := exec.Command(bin, "serve", "--config", cfg)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr := &lockedBuf{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return a, "", err
	}
	if err := cmd.Start(); err != nil {
		return a, "", err
	}
	done := make(chan struct{})
	ready := make(chan []byte, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			ready <- append([]byte(nil), sc.Bytes()...)
		}
		for sc.Scan() {
		}
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the process this test started
		<-done
	})
	select {
	case line := <-ready:
		if err := json.Unmarshal(line, &a); err != nil || a.RLS == "" {
			return a, stderr.String(), fmt.Errorf("ready line %q: %v", line, err)
		}
		a.Pid = cmd.Process.Pid
		return a, "", nil
	case <-done:
		return a, stderr.String(), fmt.Errorf("exited before its ready line")
	case <-time.After(60 * time.Second):
		return a, stderr.String(), fmt.Errorf("no ready line within 60s")
	}
}

// lockedBuf collects a child's output.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
