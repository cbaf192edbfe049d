package envoyoracle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
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

// weirMode is how `weir serve` imports the descriptors.
type weirMode string

const (
	weirDefault     weirMode = "default"      // token buckets (envoy.mode: shared)
	weirFixedWindow weirMode = "fixed_window" // envoy.fixed_window: true
)

// weirConfig writes a `weir serve` config serving the descriptor files on
// ephemeral loopback ports.
func weirConfig(t *testing.T, files []string, mode weirMode) string {
	t.Helper()
	quoted := make([]string, len(files))
	for i, f := range files {
		quoted[i] = fmt.Sprintf("%q", f)
	}
	extra := ""
	if mode == weirFixedWindow {
		extra = ", fixed_window: true"
	}
	body := fmt.Sprintf(`node: {name: oracle}
envoy: {listen: "127.0.0.1:0", descriptors: [%s]%s}
http: {listen: "127.0.0.1:0"}
log: {level: error}
`, strings.Join(quoted, ", "), extra)
	p := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// weirChecks runs `weir serve --check` over the descriptor files: nil when
// weir accepts them, else its error output.
func weirChecks(t *testing.T, files []string) error {
	t.Helper()
	cmd := exec.Command(weirBinary(t), "serve", "--check", "--config", weirConfig(t, files, weirDefault))
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

// weirServe is one `weir serve` process.
type weirServe struct {
	mode   weirMode
	client pb.RateLimitServiceClient
}

// startWeir starts `weir serve` over the descriptor files and waits for its
// ready line. It is killed when the test ends.
func startWeir(t *testing.T, files []string, mode weirMode) *weirServe {
	t.Helper()
	cmd := exec.Command(weirBinary(t), "serve", "--config", weirConfig(t, files, mode))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
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
	var addrs struct {
		Ready bool   `json:"ready"`
		RLS   string `json:"rls"`
	}
	select {
	case line := <-ready:
		if err := json.Unmarshal(line, &addrs); err != nil || addrs.RLS == "" {
			t.Fatalf("weir serve ready line %q: %v", line, err)
		}
	case <-done:
		t.Fatalf("weir serve exited before its ready line:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("weir serve: no ready line within 60s:\n%s", stderr.String())
	}
	return &weirServe{mode: mode, client: dial(t, addrs.RLS)}
}
