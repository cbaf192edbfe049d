package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestEnvoyReload runs `weir serve`'s loop in process and sends it SIGHUP
// (through the channel cmdServe feeds from signal.Notify) after each change
// of its descriptor file: a changed limit is served with the identity's
// bucket kept, a new descriptor is served, an invalid file is refused with
// an error that names it while the old limits stay, and a removed
// descriptor's rule leaves the node.
func TestEnvoyReload(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "edge.yaml")
	write := func(body string) {
		t.Helper()
		// Via a rename, as config management tools do.
		tmp := desc + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, desc); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	c, err := parseConfig("weir.yaml", []byte(`
envoy: {listen: 127.0.0.1:0, descriptors: [`+desc+`]}
http: {listen: 127.0.0.1:0}
`))
	if err != nil {
		t.Fatal(err)
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal)
	addrs := make(chan Addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, c, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a Addrs) { addrs <- a }, hup)
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
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	ask := func(key, value string, hits uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := client.ShouldRateLimit(rctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits,
			Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit %s=%s: %v", key, value, err)
		}
		return resp.Statuses[0]
	}
	metric := func(result string) string {
		t.Helper()
		resp, err := http.Get("http://" + a.HTTP + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, `weir_daemon_reloads_total{result="`+result+`"} `) {
				return strings.Fields(line)[1]
			}
		}
		t.Fatalf("no weir_daemon_reloads_total{result=%q} in /metrics", result)
		return ""
	}
	// reload sends SIGHUP and waits until the counter of want moved.
	reload := func(want, count string) {
		t.Helper()
		hup <- syscall.SIGHUP
		for deadline := time.Now().Add(20 * time.Second); metric(want) != count; {
			if time.Now().After(deadline) {
				t.Fatalf("after SIGHUP: weir_daemon_reloads_total{result=%q} is %s, want %s", want, metric(want), count)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if st := ask("api_key", "abc", 5); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 95 || st.CurrentLimit.GetRequestsPerUnit() != 100 {
		t.Fatalf("before any reload: %v", st)
	}

	// A tighter limit and a new descriptor.
	write("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 50}\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n")
	reload("ok", "1")
	st := ask("api_key", "abc", 0)
	if st.CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("after the reload: limit %v, want 50 a day", st.CurrentLimit)
	}
	if st.LimitRemaining >= 50 {
		t.Fatalf("after the reload abc has %d of 50 left: its bucket (5 spent) was not kept", st.LimitRemaining)
	}
	if st := ask("user", "u1", 3); st.CurrentLimit.GetRequestsPerUnit() != 10 || st.LimitRemaining != 7 {
		t.Fatalf("the new descriptor: %v", st)
	}

	// An invalid file: refused, named, counted; the limits in force stay.
	write("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	reload("error", "1")
	if st := ask("api_key", "abc", 0); st.CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("after a refused reload: limit %v, want 50 a day still", st.CurrentLimit)
	}
	c2 := *c
	if _, err := c2.envoyConfig(); err == nil || !strings.Contains(err.Error(), "envoy.descriptors[0]") || !strings.Contains(err.Error(), "fortnight") {
		t.Fatalf("the refusal's error %v should name envoy.descriptors[0] and the bad unit", err)
	}

	// The user descriptor goes: its rule leaves the node, the request
	// matches nothing (OK, no limit), and api_key is still enforced.
	write("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 50}\n")
	reload("ok", "2")
	if st := ask("user", "u1", 1); st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
		t.Fatalf("a removed descriptor still limits: %v", st)
	}
	resp, err := http.Get("http://" + a.HTTP + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var ov struct {
		Rules []struct {
			ID string `json:"id"`
		} `json:"rules"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ov)
	resp.Body.Close()
	if err != nil || len(ov.Rules) != 1 || ov.Rules[0].ID != "envoy.edge.api_key" {
		t.Fatalf("/v1/status after the user descriptor went: rules %+v (%v), want envoy.edge.api_key alone", ov.Rules, err)
	}
}
