package rls_test

import (
	"context"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/rls"
)

// fidelityDescriptors: 10 an hour per key, a zero limit, a quota_mode
// limit of 2 a day, and value_to_metric accepted.
const fidelityDescriptors = `
domain: fid
descriptors:
  - key: key
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
`

// fidelityServer serves fidelityDescriptors compiled with opts on one node.
func fidelityServer(t *testing.T, opts envoyconf.Options, svcOpts ...rls.Option) rlsv3.RateLimitServiceClient {
	t.Helper()
	d, err := envoyconf.Parse("fid.yaml", []byte(fidelityDescriptors))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Compile(opts, d)
	if err != nil {
		t.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	srv, err := rls.Listen("127.0.0.1:0", rls.New(node, cfg, svcOpts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return client(t, srv.Addr())
}

func hitsDesc(hits uint64, kv ...string) *commonv3.RateLimitDescriptor {
	d := desc(kv...)
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

// TestFidelity: envoyconf.Options.Fidelity answers as envoyproxy/ratelimit
// does: rejected hits are counted (an OVER_LIMIT's remaining is 0, a small
// request after a large rejected one is refused, check-then-charge is
// limited), a check that charges nothing passes a zero limit and gets its
// time to reset, no headers unless asked.
func TestFidelity(t *testing.T) {
	c := fidelityServer(t, envoyconf.Options{Fidelity: true}, rls.WithHeaders(rls.HeadersNone))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	call := func(ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fid", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.ResponseHeadersToAdd) != 0 {
			t.Errorf("headers with HeadersNone: %v", resp.ResponseHeadersToAdd)
		}
		return resp
	}
	if r := call(hitsDesc(15, "key", "a")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("15 on 10: %v", r)
	}
	if r := call(hitsDesc(1, "key", "a")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1 after a rejected 15 (counted): %v", r)
	}
	looks := 0
	for range 12 {
		if r := call(hitsDesc(0, "key", "b")); r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			looks++
		}
		call(hitsDesc(1, "key", "b"))
	}
	if looks != 1 {
		t.Errorf("check-then-charge ×12 on 10: %d looks over the limit, want 1", looks)
	}
	z := call(hitsDesc(0, "zero", "x"))
	if z.OverallCode != rlsv3.RateLimitResponse_OK || z.Statuses[0].DurationUntilReset == nil || z.Statuses[0].DurationUntilReset.Seconds > 60 {
		t.Errorf("a 0-hit check on a zero limit: %v, want OK with a duration until reset", z)
	}
	if z := call(desc("zero", "x")); z.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || z.Statuses[0].LimitRemaining != 0 {
		t.Errorf("a hit on a zero limit: %v", z)
	}
	// The hit was counted: a check after it is over the zero limit too.
	if z := call(hitsDesc(0, "zero", "x")); z.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || z.Statuses[0].DurationUntilReset == nil {
		t.Errorf("a 0-hit check on a zero limit after a hit: %v", z)
	}
	for i := range 3 {
		q := call(desc("quota", "q"))
		st := q.Statuses[0]
		if q.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit == nil {
			t.Fatalf("quota_mode hit %d: %v, want OK", i+1, q)
		}
		if over := i == 2; over != (st.DurationUntilReset == nil) || (over && st.LimitRemaining != 0) {
			t.Errorf("quota_mode hit %d: %v (over the limit: OK, remaining 0, no duration until reset)", i+1, st)
		}
	}
}

// TestEnvoyHeaders: HeadersEnvoy adds envoyproxy/ratelimit's three headers
// of the descriptor closest to its limit, under the names given; the
// global shadow mode answers OK overall and keeps the statuses.
func TestEnvoyHeaders(t *testing.T) {
	c := fidelityServer(t, envoyconf.Options{Fidelity: true}, rls.WithHeaders(rls.HeadersEnvoy),
		rls.WithEnvoyHeaderNames("", "X-Left", ""), rls.WithGlobalShadow(true))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fid", Descriptors: []*commonv3.RateLimitDescriptor{
		hitsDesc(3, "key", "h"), desc("quota", "h")}})
	if err != nil {
		t.Fatal(err)
	}
	h := headers(r.ResponseHeadersToAdd)
	if h["RateLimit-Limit"] != "2" || h["X-Left"] != "1" || h["RateLimit-Reset"] == "" || len(h) != 3 {
		t.Errorf("headers %v: want the quota limit's (2, 1 left)", h)
	}
	r, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "fid", Descriptors: []*commonv3.RateLimitDescriptor{desc("zero", "z")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		headers(r.ResponseHeadersToAdd)["X-Left"] != "0" {
		t.Errorf("global shadow over a zero limit: %v", r)
	}
}
