package rls_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/rls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func loadConfig(t testing.TB, opts envoyconf.Options) *envoyconf.Config {
	t.Helper()
	d, err := envoyconf.LoadFile("../envoyconf/testdata/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Compile(opts, d)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// client dials addr with the generated Envoy client.
func client(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func headers(hs []*corev3.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	return m
}

func noFailOpen(t *testing.T, node *weir.Node) {
	t.Helper()
	for _, c := range ops.Counts(node) {
		if c.FailOpen != 0 {
			t.Errorf("rule %s: %d fail-open decisions in a run with no fault", c.Rule, c.FailOpen)
		}
	}
}

func counts(node *weir.Node, prefix string) weir.RuleCounts {
	for _, c := range ops.Counts(node) {
		if strings.HasPrefix(c.Rule, prefix) {
			return c
		}
	}
	return weir.RuleCounts{}
}

// TestShouldRateLimit runs Envoy's generated client against the service on
// loopback, over a single weir node holding the imported rules.
func TestShouldRateLimit(t *testing.T) {
	cfg := loadConfig(t, envoyconf.Options{})
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	srv, err := rls.Listen("127.0.0.1:0", rls.New(node, cfg, rls.WithMaxIdentityBytes(64)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := client(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		return resp
	}
	OK, OVER := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	t.Run("allowed", func(t *testing.T) {
		resp := call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}})
		st := resp.Statuses[0]
		if resp.OverallCode != OK || st.Code != OK || st.CurrentLimit.GetRequestsPerUnit() != 50 ||
			st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || st.LimitRemaining != 49 {
			t.Fatalf("response %v", resp)
		}
		h := headers(resp.ResponseHeadersToAdd)
		if h["X-Ratelimit-Limit"] != "50" || h["X-Ratelimit-Remaining"] != "49" || !strings.Contains(h["Ratelimit-Policy"], ";q=50;w=1") ||
			h["Ratelimit"] == "" || h["Retry-After"] != "" {
			t.Fatalf("headers %v", h)
		}
	})

	t.Run("over limit", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 50, Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.2")}}
		if resp := call(req); resp.OverallCode != OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("first 50: %v", resp)
		}
		req.HitsAddend = 0 // one hit
		resp := call(req)
		st := resp.Statuses[0]
		if resp.OverallCode != OVER || st.Code != OVER || st.DurationUntilReset.AsDuration() <= 0 {
			t.Fatalf("51st: %v", resp)
		}
		if h := headers(resp.ResponseHeadersToAdd); h["Retry-After"] != "1" || h["X-Ratelimit-Remaining"] != "0" {
			t.Fatalf("headers %v", h)
		}
		// Another address has its own bucket.
		if resp := call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.3")}}); resp.OverallCode != OK {
			t.Fatalf("other address: %v", resp)
		}
	})

	t.Run("descriptor hits_addend", func(t *testing.T) {
		d := desc("remote_address", "10.0.0.4")
		d.HitsAddend = wrapperspb.UInt64(0) // look, no charge
		resp := call(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 40, Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if resp.Statuses[0].LimitRemaining != 50 {
			t.Fatalf("a zero descriptor hits_addend charged: %v", resp)
		}
		d.HitsAddend = wrapperspb.UInt64(30)
		resp = call(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 40, Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if resp.Statuses[0].LimitRemaining != 20 {
			t.Fatalf("descriptor hits_addend 30 over request 40: %v", resp)
		}
	})

	t.Run("shadow", func(t *testing.T) {
		for i := range 5 {
			resp := call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("export", "csv")}})
			if resp.OverallCode != OK || resp.Statuses[0].Code != OK {
				t.Fatalf("shadow call %d: %v", i, resp)
			}
		}
		if c := counts(node, "envoy.edge.export"); c.ShadowRejected != 2 || c.Allowed != 3 {
			t.Fatalf("shadow counts %+v, want 3 allowed and 2 shadow-rejected", c)
		}
	})

	t.Run("unlimited", func(t *testing.T) {
		for range 3 {
			resp := call(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 5000, Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", "partner-1")}})
			if st := resp.Statuses[0]; resp.OverallCode != OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
				t.Fatalf("unlimited: %v", resp)
			}
		}
	})

	t.Run("blocked", func(t *testing.T) {
		resp := call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address_blocked", "10.0.0.66")}})
		if resp.OverallCode != OVER || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("blocked: %v", resp)
		}
	})

	t.Run("replaces", func(t *testing.T) {
		before := counts(node, "envoy.edge.path")
		resp := call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
			desc("api_key", "k1", "path", "/search"), desc("path", "/search"), desc("path", "/other"), desc("remote_address", "10.0.0.9"),
		}})
		// Replaces works by name: every descriptor whose limit is per_path
		// is left out while per_key_search matched; other limits apply.
		if resp.OverallCode != OK || resp.Statuses[0].CurrentLimit.GetName() != "per_key_search" ||
			resp.Statuses[1].CurrentLimit != nil || resp.Statuses[2].CurrentLimit != nil ||
			resp.Statuses[3].CurrentLimit.GetRequestsPerUnit() != 50 {
			t.Fatalf("replaces: %v", resp)
		}
		if after := counts(node, "envoy.edge.path"); after.Allowed != before.Allowed {
			t.Fatalf("per_path counted %d times while replaced", after.Allowed-before.Allowed)
		}
		// Without the replacing limit, per_path applies.
		resp = call(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("path", "/search")}})
		if resp.Statuses[0].CurrentLimit.GetName() != "per_path" || counts(node, "envoy.edge.path").Allowed != before.Allowed+1 {
			t.Fatalf("per_path alone: %v", resp)
		}
	})

	t.Run("unknown domain", func(t *testing.T) {
		resp := call(&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1"), desc("a", "b")}})
		if resp.OverallCode != OK || len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("unknown domain: %v", resp)
		}
		for _, st := range resp.Statuses {
			if st.Code != OK || st.CurrentLimit != nil {
				t.Fatalf("unknown domain status %v", st)
			}
		}
	})

	t.Run("long values are hashed, still limited", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 50, Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", strings.Repeat("z", 100))}}
		if resp := call(req); resp.OverallCode != OK {
			t.Fatalf("first: %v", resp)
		}
		if resp := call(req); resp.OverallCode != OVER {
			t.Fatalf("second: %v", resp)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		for _, req := range []*rlsv3.RateLimitRequest{{Descriptors: []*commonv3.RateLimitDescriptor{desc("a", "b")}}, {Domain: "edge"}} {
			if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%v: %v, want InvalidArgument", req, err)
			}
		}
	})
	noFailOpen(t, node)
}

// TestNoConfig: a service with no configuration answers every descriptor
// OK, as for an unknown domain.
func TestNoConfig(t *testing.T) {
	node, err := weir.New(weir.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	resp, err := rls.New(node, nil).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 1 || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v, %v", resp, err)
	}
}
