package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir"
)

const testToken = "0123456789abcdef0123"

// cliRun runs one weir command line in process with WEIR_ADDR and
// WEIR_TOKEN set as env says, and returns its exit code and output.
func cliRun(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, strings.NewReader(""), &o, &e, func(k string) string { return env[k] })
	return code, o.String(), e.String()
}

// startTestDaemon starts an in-process daemon from the YAML in, with the
// defaults applied, and shuts it down at the end of the test.
func startTestDaemon(t *testing.T, in string) *daemon {
	t.Helper()
	c, err := parseConfig("weir.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.shutdown() })
	return d
}

// TestCommandsInProcess runs a one-voter node (cluster member, lease voter,
// rules from the group) in process and drives every client command
// against its admin API.
func TestCommandsInProcess(t *testing.T) {
	dir := testFiles(t)
	d := startTestDaemon(t, `
node: {name: solo, region: eu}
gossip: {bind: 127.0.0.1:0, local_timing: true, label: weir-cmd-test-inproc}
peer: {rpc: 127.0.0.1:0}
rules: {lease: true}
lease:
  voter: {data_dir: `+filepath.Join(dir, "data")+`, raft: 127.0.0.1:0, rpc: 127.0.0.1:0}
  check_interval: 200ms
http: {listen: 127.0.0.1:0}
admin_tokens: {file: `+filepath.Join(dir, "tokens")+`}
`)
	env := map[string]string{"WEIR_ADDR": d.addrs.HTTP, "WEIR_TOKEN": testToken}
	rule := filepath.Join(dir, "rule.yaml")
	if err := os.WriteFile(rule, []byte("key: [header:X-API-Key]\nlimit: 100\nwindow: 1m\nburst: 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The one voter elects itself within a second or two; until then the
	// rules API answers 503.
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out, errOut := cliRun(t, env, "rules", "put", "per-key", "-f", rule)
		if code == 0 {
			if !strings.Contains(out, "rule per-key stored: rule set version 1") {
				t.Fatalf("put: %q", out)
			}
			break
		}
		if !strings.Contains(errOut, "503") || time.Now().After(deadline) {
			t.Fatalf("put: exit %d: %s", code, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}

	code, out, errOut := cliRun(t, env, "rules", "get")
	if code != 0 || !strings.Contains(out, "per-key") || !strings.Contains(out, "header:X-Api-Key") {
		t.Fatalf("rules get: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = cliRun(t, env, "rules", "get", "per-key", "-o", "json")
	var one struct {
		Version uint64         `json:"version"`
		Rule    map[string]any `json:"rule"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &one) != nil || one.Version != 1 || one.Rule["burst"] != float64(20) {
		t.Fatalf("rules get per-key -o json: exit %d: %s%s", code, out, errOut)
	}
	// The text form is YAML that `rules put` takes back.
	code, out, _ = cliRun(t, env, "rules", "get", "per-key")
	if code != 0 || !strings.Contains(out, "limit: 100") {
		t.Fatalf("rules get per-key: %s", out)
	}

	// The node takes the new version from its group.
	for deadline := time.Now().Add(30 * time.Second); d.node.Status().RulesVersion < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the node never installed rule set version 1")
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, out, errOut = cliRun(t, env, "identity", "abc")
	if code != 0 || !strings.Contains(out, `identity "abc" on solo`) || !strings.Contains(out, "per-key") ||
		!strings.Contains(out, "owner solo") {
		t.Fatalf("identity: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cliRun(t, env, "identity", "abc", "-o", "json")
	var rep weir.IdentityReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Rules) != 1 || rep.Rules[0].Bucket.Remaining != 20 {
		t.Fatalf("identity -o json: %s", out)
	}

	code, out, errOut = cliRun(t, env, "rules", "history")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "put") || !strings.Contains(out, "per-key") {
		t.Fatalf("history: exit %d: %s%s", code, out, errOut)
	}

	// A wrong token: 401, the server's message on stderr, exit 1.
	bad := map[string]string{"WEIR_ADDR": d.addrs.HTTP, "WEIR_TOKEN": "wrong-wrong-wrong-wrong"}
	code, out, errOut = cliRun(t, bad, "rules", "get")
	if code != 1 || out != "" || !strings.Contains(errOut, "401") || !strings.Contains(errOut, "bearer token") {
		t.Fatalf("wrong token: exit %d: %q %q", code, out, errOut)
	}
	// --token overrides the environment.
	if code, _, errOut = cliRun(t, bad, "rules", "get", "--token", testToken); code != 0 {
		t.Fatalf("--token: exit %d: %s", code, errOut)
	}
	// A rule the server refuses: 422 with the field.
	badRule := filepath.Join(dir, "bad.json")
	os.WriteFile(badRule, []byte(`{"limit": 10, "window": "1m", "burst": 5, "cost": 50}`), 0o600)
	if code, _, errOut = cliRun(t, env, "rules", "put", "x", "-f", badRule); code != 1 || !strings.Contains(errOut, "422") || !strings.Contains(errOut, "cost") {
		t.Fatalf("bad rule: exit %d: %s", code, errOut)
	}

	code, out, errOut = cliRun(t, env, "rules", "delete", "per-key")
	if code != 0 || !strings.Contains(out, "rule per-key deleted: rule set version 2") {
		t.Fatalf("delete: exit %d: %s%s", code, out, errOut)
	}
	if code, _, errOut = cliRun(t, env, "rules", "get", "per-key"); code != 1 || !strings.Contains(errOut, "404") {
		t.Fatalf("get after delete: exit %d: %s", code, errOut)
	}

	code, out, errOut = cliRun(t, env, "status")
	if code != 0 || !strings.Contains(out, "node solo, region eu") || !strings.Contains(out, "degraded decisions: 0") {
		t.Fatalf("status: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cliRun(t, env, "status", "-o", "json")
	var ov weir.Overview
	if code != 0 || json.Unmarshal([]byte(out), &ov) != nil || ov.Node != "solo" || len(ov.Members) != 1 {
		t.Fatalf("status -o json: %s", out)
	}
	for _, k := range ov.Counts {
		if k.FailOpen != 0 {
			t.Fatalf("degraded decisions with no fault: %+v", k)
		}
	}

	// Usage: --help everywhere exits 0; unknown commands exit 2.
	for _, args := range [][]string{{"serve", "--help"}, {"rules", "--help"}, {"rules", "get", "--help"}, {"rules", "put", "--help"},
		{"rules", "delete", "--help"}, {"rules", "history", "--help"}, {"identity", "--help"}, {"status", "--help"}, {"help"}} {
		if code, _, errOut := cliRun(t, env, args...); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errOut)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"rules"}, {"rules", "frob"}, {"rules", "put", "x"}, {"identity"},
		{"status", "extra"}, {"status", "-o", "yaml"}, {"serve", "--bogus"}} {
		if code, _, _ := cliRun(t, env, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// An unreachable node: exit 1.
	if code, _, errOut := cliRun(t, map[string]string{"WEIR_ADDR": "127.0.0.1:1"}, "status", "--timeout", "5s"); code != 1 || errOut == "" {
		t.Errorf("unreachable: exit %d: %s", code, errOut)
	}

	// /healthz, /metrics and the status page are served.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "weir_decisions_total", "/ops/": "<html"} {
		b, err := httpGet("http://" + d.addrs.HTTP + path)
		if err != nil || !strings.Contains(b, want) {
			t.Errorf("GET %s: %v: %.200s", path, err, b)
		}
	}
	if err := d.shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// httpGet fetches url and returns its body (any status).
func httpGet(url string) (string, error) { return httpGetAuth(url, "") }

// httpGetAuth is httpGet with a bearer token (none when empty).
func httpGetAuth(url, token string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestEnvoyInProcess serves Envoy's rate-limit service from a descriptor
// file on one node and looks the charged descriptor up with `weir
// identity --raw` (the descriptor path is the bucket key; without --raw a
// keyless rule reports its one global bucket).
func TestEnvoyInProcess(t *testing.T) {
	dir := testFiles(t)
	// 100 a day: the 5 charged do not refill within the test.
	desc := filepath.Join(dir, "daily.yaml")
	if err := os.WriteFile(desc, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startTestDaemon(t, `
node: {name: edge-1, region: eu}
envoy: {listen: 127.0.0.1:0, descriptors: [`+desc+`]}
http: {listen: 127.0.0.1:0}
`)
	cc, err := grpc.NewClient(d.addrs.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := shouldRateLimit(ctx, rlsv3.NewRateLimitServiceClient(cc), "abc", 5)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 95 {
		t.Fatalf("ShouldRateLimit: %v %v", resp, err)
	}
	env := map[string]string{"WEIR_ADDR": d.addrs.HTTP}
	code, out, errOut := cliRun(t, env, "identity", "api_key=abc", "--raw", "-o", "json")
	var rep weir.IdentityReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Rules) != 1 || rep.Rules[0].Bucket.Remaining != 95 {
		t.Fatalf("identity --raw: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = cliRun(t, env, "identity", "api_key=abc", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Rules) != 1 || rep.Rules[0].Bucket.Remaining != 100 {
		t.Fatalf("identity without --raw: %s", out)
	}
	code, out, _ = cliRun(t, env, "status")
	if code != 0 || !strings.Contains(out, "envoy.edge.api_key") || !strings.Contains(out, "degraded decisions: 0") {
		t.Fatalf("status: %s", out)
	}
	// A node with no cluster: status names it as its ready line does.
	if d.addrs.Name != "edge-1" || d.addrs.Region != "eu" || !strings.Contains(out, "node edge-1, region eu, no cluster\n") {
		t.Fatalf("ready line %+v; status: %s", d.addrs, out)
	}
}
