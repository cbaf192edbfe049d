package rls_test

import (
	"context"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/rls"
)

// fuzzRequest builds a RateLimitRequest: descriptors are separated by
// "\n\n", entries by "\n", a key from its value by "=". descHits, when
// non-zero, is every descriptor's hits_addend; negative marks the last
// descriptor a refund.
func fuzzRequest(domain, descs string, hits uint32, descHits uint64, negative bool) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for d := range strings.SplitSeq(descs, "\n\n") {
		if len(req.Descriptors) == 64 {
			break
		}
		desc := &commonv3.RateLimitDescriptor{}
		for e := range strings.SplitSeq(d, "\n") {
			k, v, _ := strings.Cut(e, "=")
			desc.Entries = append(desc.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		if descHits != 0 {
			desc.HitsAddend = wrapperspb.UInt64(descHits)
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	if negative && len(req.Descriptors) > 0 {
		req.Descriptors[len(req.Descriptors)-1].IsNegativeHits = true
	}
	return req
}

// FuzzShouldRateLimit feeds the Envoy request mapping hostile requests,
// built from fields (domain, descriptors, entries, hits_addend) and, when
// raw decodes, from raw protobuf bytes, against a Service over a real
// single Node holding the imported rules. It must never panic; every
// error is InvalidArgument with a message; a served response has one
// status per descriptor; nothing is decided fail-open.
func FuzzShouldRateLimit(f *testing.F) {
	cfg := loadConfig(f, envoyconf.Options{})
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { node.Close() })
	svc := rls.New(node, cfg, rls.WithMaxIdentityBytes(64))

	seed, _ := proto.Marshal(fuzzRequest("edge", "api_key=k1\npath=/search", 1, 0, false))
	f.Add("edge", "remote_address=10.0.0.1", uint32(0), uint64(0), false, []byte(nil))
	f.Add("edge", "remote_address_blocked=10.0.0.66", uint32(1), uint64(0), false, []byte(nil))
	f.Add("edge", "api_key=k1\npath=/search\n\napi_key=partner-1\n\npath=/x", uint32(3), uint64(0), false, seed)
	f.Add("edge", "api_key="+strings.Repeat("k", 300), uint32(0), uint64(1<<63), true, []byte(nil))
	f.Add("", "", uint32(0), uint64(0), false, []byte{0x0a, 0x01})
	f.Add("other", "=\n=\n\n\n", ^uint32(0), ^uint64(0), true, []byte{0xff, 0xff})
	f.Add("edge", "remote_address=\xff\xfe", uint32(0), uint64(0), false, []byte(nil))
	ctx := context.Background()
	check := func(t *testing.T, req *rlsv3.RateLimitRequest) {
		resp, err := svc.ShouldRateLimit(ctx, req)
		if err != nil {
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || st.Message() == "" {
				t.Fatalf("error %v (code %v), want InvalidArgument with a message", err, st.Code())
			}
			return
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
	}
	f.Fuzz(func(t *testing.T, domain, descs string, hits uint32, descHits uint64, negative bool, raw []byte) {
		check(t, fuzzRequest(domain, descs, hits, descHits, negative))
		var req rlsv3.RateLimitRequest
		if len(raw) > 0 && proto.Unmarshal(raw, &req) == nil {
			check(t, &req)
		}
		for _, c := range ops.Counts(node) {
			if c.FailOpen != 0 {
				t.Fatalf("rule %s: %d fail-open decisions", c.Rule, c.FailOpen)
			}
		}
	})
}
