package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// lockedBuffer is a log destination safe for the daemon's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// configMap lays out a directory the way the kubelet writes a ConfigMap
// volume: the files in a timestamped dot directory, a "..data" symlink to
// it, and one top-level symlink per file into "..data". swap writes a new
// generation and re-points "..data" with a rename, atomically, then
// removes the old generation, as the kubelet's atomic writer does.
type configMap struct {
	t   *testing.T
	dir string
	gen int
}

func (m *configMap) swap(files map[string]string) {
	t := m.t
	t.Helper()
	m.gen++
	old := fmt.Sprintf("..2026_01_02_15_04_05.%03d", m.gen-1)
	ts := fmt.Sprintf("..2026_01_02_15_04_05.%03d", m.gen)
	if err := os.Mkdir(filepath.Join(m.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(m.dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(m.dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink(ts, filepath.Join(m.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(m.dir, "..data_tmp"), filepath.Join(m.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if m.gen > 1 {
		if err := os.RemoveAll(filepath.Join(m.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEnvoyDirectory runs `weir serve`'s loop in process over a
// ConfigMap-shaped envoy.directory, with no SIGHUP and no poll (envoy.poll
// negative), so that the directory's change notifications alone must
// bring each change in: a swap to a tighter limit and a second domain is
// served, a swap to a bad file is refused with an error naming the file,
// line and field while the last good limits stay, and a swap back to a
// good file is served again. The per-descriptor hit counters keep
// counting across the reloads, named by the configured path.
func TestEnvoyDirectory(t *testing.T) {
	dir := t.TempDir()
	m := &configMap{t: t, dir: dir}
	m.swap(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
	})
	// Not descriptor files: skipped with a warning.
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("not yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig("weir.yaml", []byte(`
envoy: {listen: 127.0.0.1:0, directory: `+dir+`, poll: -1s}
http: {listen: 127.0.0.1:0}
`))
	if err != nil {
		t.Fatal(err)
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, c, slog.New(slog.NewTextHandler(logs, nil)), func(a Addrs) { addrs <- a }, nil)
	}()
	var a Addrs
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon never served")
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	cc, err := grpc.NewClient(a.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	ask := func(domain, key, value string, hits uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := client.ShouldRateLimit(rctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits,
			Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit %s %s=%s: %v", domain, key, value, err)
		}
		return resp.Statuses[0]
	}
	metrics := func() string {
		t.Helper()
		resp, err := http.Get("http://" + a.HTTP + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	metric := func(line string) string {
		t.Helper()
		for l := range strings.SplitSeq(metrics(), "\n") {
			if strings.HasPrefix(l, line+" ") {
				return strings.Fields(l)[1]
			}
		}
		return ""
	}
	// waitFor waits until the counter reaches want: the daemon saw the swap.
	waitFor := func(line, want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); metric(line) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("%s is %q, want %s\nlog:\n%s", line, metric(line), want, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if st := ask("edge", "api_key", "abc", 5); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 95 {
		t.Fatalf("before any swap: %v", st)
	}
	if !strings.Contains(logs.String(), "README") {
		t.Errorf("the skipped README is not named in the log:\n%s", logs.String())
	}

	m.swap(map[string]string{
		"edge.yaml":  "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 50}\n",
		"admin.yaml": "domain: admin\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n",
	})
	waitFor(`weir_daemon_reloads_total{result="ok"}`, "1")
	if st := ask("edge", "api_key", "abc", 0); st.CurrentLimit.GetRequestsPerUnit() != 50 || st.LimitRemaining >= 50 {
		t.Fatalf("after the swap: %v, want 50 a day with abc's 5 spent kept", st)
	}
	if st := ask("admin", "user", "u1", 3); st.CurrentLimit.GetRequestsPerUnit() != 10 || st.LimitRemaining != 7 {
		t.Fatalf("the new file's domain: %v", st)
	}

	// A bad file: refused, named with its line and field, counted once;
	// the limits in force stay.
	m.swap(map[string]string{
		"edge.yaml":  "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"admin.yaml": "domain: admin\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n",
	})
	waitFor(`weir_daemon_reloads_total{result="error"}`, "1")
	want := filepath.Join(dir, "edge.yaml") + ":4: descriptors[0].rate_limit.unit"
	if log := logs.String(); !strings.Contains(log, want) || !strings.Contains(log, "fortnight") {
		t.Fatalf("the refusal's log should name %q and the bad unit:\n%s", want, log)
	}
	if st := ask("edge", "api_key", "abc", 0); st.CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("after a refused swap: %v, want 50 a day still", st)
	}

	// Back to a good file, with the admin file gone.
	m.swap(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 20}\n",
	})
	os.Remove(filepath.Join(dir, "admin.yaml")) // the kubelet removes the link of a key that went
	waitFor(`weir_daemon_reloads_total{result="ok"}`, "2")
	for metric(`weir_daemon_reloads_total{result="ok"}`) == "2" && ask("admin", "user", "u1", 0).CurrentLimit != nil {
		time.Sleep(20 * time.Millisecond) // the link's removal may come just after the swap's reload
	}
	if st := ask("edge", "api_key", "abc", 0); st.CurrentLimit.GetRequestsPerUnit() != 20 {
		t.Fatalf("after the swap back: %v, want 20 a day", st)
	}
	if got := metric(`weir_daemon_reloads_total{result="error"}`); got != "1" {
		t.Errorf("errors counted %s times, want once", got)
	}

	// The hit counters, by configured path, across the reloads: abc asked
	// 5, then three times with the request's hits_addend 0, which is 1.
	for line, want := range map[string]string{
		`weir_envoy_hits_total{descriptor="api_key",domain="edge"}`:              "8",
		`weir_envoy_within_limit_hits_total{descriptor="api_key",domain="edge"}`: "8",
		`weir_envoy_over_limit_hits_total{descriptor="api_key",domain="edge"}`:   "0",
		`weir_envoy_hits_total{descriptor="user",domain="admin"}`:                "3",
	} {
		if got := metric(line); got != want {
			t.Errorf("%s = %q, want %s", line, got, want)
		}
	}
	if strings.Contains(metrics(), `descriptor="api_key_abc"`) {
		t.Error("a request's value became a label")
	}
}
