package envoyoracle

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The processes of the side-by-side measurement (side_test.go): the
// envoyproxy/ratelimit service binary, `weir serve` clusters with their
// defaults, and the CPU time each process has used.

// envoyServiceCmd is envoyproxy/ratelimit's service main at the version in
// go.mod (the module's `tool` line keeps its dependencies in go.sum).
const envoyServiceCmd = "github.com/envoyproxy/ratelimit/src/service_cmd"

// buildEnvoyService builds envoyproxy/ratelimit's service binary, the one its
// Dockerfile ships, into dir.
func buildEnvoyService(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, envoyServiceCmd).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", envoyServiceCmd, err, out)
	}
	return bin
}

// buildWeirProfiled builds cmd/weir from the root module with one file
// added at build time (go build -overlay, the repository unchanged):
// testdata/weirpprof/pprof.go, which serves the CPU profile on
// WEIR_PPROF_LISTEN when that is set.
func buildWeirProfiled(t *testing.T, dir string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs(filepath.Join("testdata", "weirpprof", "pprof.go"))
	if err != nil {
		t.Fatal(err)
	}
	overlay := map[string]any{"Replace": map[string]string{
		filepath.Join(root, "cmd", "weir", "zz_side_pprof.go"): src,
	}}
	b, _ := json.Marshal(overlay)
	ov := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ov, b, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "weir-pprof")
	cmd := exec.Command("go", "build", "-overlay", ov, "-o", bin, "./cmd/weir")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -overlay ./cmd/weir: %v\n%s", err, out)
	}
	return bin
}

// sideSystem is one system of three instances, as the load generator and
// the CPU meter see it.
type sideSystem struct {
	name    string
	clients []pb.RateLimitServiceClient // the instances, asked in turn
	pids    []int                       // every process of the system (Redis included)
}

// startEnvoyProcs starts n envoyproxy/ratelimit service processes on the
// descriptor file, sharing the Redis at redisAddr, with pinnedSettings
// (ports and hosts are each process's own loopback ones), then extra
// (KEY=value settings, which win). It waits until each answers a
// ShouldRateLimit call.
func startEnvoyProcs(t *testing.T, bin, redisAddr, descriptors string, n int, extra []string) (clients []pb.RateLimitServiceClient, pids []int) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(descriptors)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(descriptors)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		grpcPort := freePort(t)
		env := os.Environ()
		for k, v := range pinnedSettings {
			env = append(env, k+"="+v)
		}
		env = append(env,
			"HOST=127.0.0.1", "PORT="+strconv.Itoa(freePort(t)),
			"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(freePort(t)),
			"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(grpcPort),
			"RUNTIME_ROOT="+root, "REDIS_URL="+redisAddr,
		)
		env = append(env, extra...)
		cmd := exec.Command(bin)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		logs := &lockedBuf{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill() // the process this test started
			<-done
		})
		c := dial(t, fmt.Sprintf("127.0.0.1:%d", grpcPort))
		if err := waitAnswers(c, done); err != nil {
			t.Fatalf("envoyproxy/ratelimit instance %d: %v\n%s", i+1, err, logs.String())
		}
		clients = append(clients, c)
		pids = append(pids, cmd.Process.Pid)
	}
	return clients, pids
}

// waitAnswers waits up to a minute for c to answer a ShouldRateLimit call
// of the side-by-side domain, or for done (the process exited).
func waitAnswers(c pb.RateLimitServiceClient, done <-chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	req := &pb.RateLimitRequest{Domain: sideDomain, HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: sideKey, Value: "ready-probe"}}},
	}}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("exited before it answered: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sideMode is one of the weir modes the side-by-side measurement runs.
type sideMode int

const (
	sideModeDefault  sideMode = iota // token buckets, shared mode
	sideModeFixed                    // envoy.fixed_window: true
	sideModeFidelity                 // envoy.fidelity: true
)

// envoyOption is the mode's setting in the envoy section of weir serve's
// config, with its leading comma, or "" for the default.
func (m sideMode) envoyOption() string {
	switch m {
	case sideModeFixed:
		return ", fixed_window: true"
	case sideModeFidelity:
		return ", fidelity: true"
	}
	return ""
}

// sideWeirConfig writes a `weir serve` config for one member of a cluster
// serving the descriptor file in mode with the daemon's defaults (peer
// timeouts, gossip timing), on ephemeral loopback ports.
func sideWeirConfig(t *testing.T, descriptors string, mode sideMode, name, label, join string) string {
	t.Helper()
	extra := mode.envoyOption()
	gossip := fmt.Sprintf(`gossip: {bind: "127.0.0.1:0", label: %s`, label)
	if join != "" {
		gossip += fmt.Sprintf(", join: [%q]", join)
	}
	body := fmt.Sprintf(`node: {name: %s, region: eu}
envoy: {listen: "127.0.0.1:0", descriptors: [%q]%s}
http: {listen: "127.0.0.1:0"}
peer: {rpc: "127.0.0.1:0"}
log: {level: error}
%s}
`, name, descriptors, extra, gossip)
	p := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startSideWeir starts a 3-node `weir serve` cluster of binary bin on the
// descriptor file in mode and waits until every node sees the three members;
// envFor, when not nil, gives node i's extra environment.
func startSideWeir(t *testing.T, bin, descriptors string, mode sideMode, envFor func(i int) []string) (clients []pb.RateLimitServiceClient, pids []int) {
	t.Helper()
	label := fmt.Sprintf("side-%d-%d", os.Getpid(), time.Now().UnixNano())
	var nodes []weirAddrs
	for i, name := range []string{"n1", "n2", "n3"} {
		join := ""
		if i > 0 {
			join = nodes[0].Gossip
		}
		var env []string
		if envFor != nil {
			env = envFor(i)
		}
		nodes = append(nodes, startWeirProcWith(t, bin, sideWeirConfig(t, descriptors, mode, name, label, join), env))
	}
	deadline := time.Now().Add(60 * time.Second)
	for !allSeeMembers(nodes, 3) {
		if time.Now().After(deadline) {
			t.Fatalf("the 3 weir nodes did not all see 3 members within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range nodes {
		clients = append(clients, dial(t, n.RLS))
		pids = append(pids, n.Pid)
	}
	return clients, pids
}

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPU is the CPU time (user and system, all threads) process pid has
// used so far, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces: the
	// fields after it start past the last ')'. utime and stime are fields
	// 14 and 15, so the 12th and 13th after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * clockTick, nil
}

// pidsCPU is the CPU time each process has used so far.
func pidsCPU(t *testing.T, pids []int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, len(pids))
	for i, p := range pids {
		d, err := procCPU(p)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = d
	}
	return out
}

// selfCPU is the CPU time this process (the load generator) has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the busy CPU time of the whole machine so far (every
// process of every user: user, nice, system, irq, softirq and steal time
// from /proc/stat), to show what else ran beside a measurement.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var sum int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system (idle iowait) irq softirq steal
		v, _ := strconv.ParseInt(f[i], 10, 64)
		sum += v
	}
	return time.Duration(sum) * clockTick
}

// machineLoad is the first line of /proc/loadavg, to show what else ran.
func machineLoad() string {
	f, err := os.Open("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		return sc.Text()
	}
	return "unknown"
}
