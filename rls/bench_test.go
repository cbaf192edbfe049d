package rls_test

import (
	"context"
	"fmt"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/rls"
)

// BenchmarkShouldRateLimit measures the service's own work per request (in
// process, no network) beside the reference: Node.Check of the same rule
// and identity, measured in the same run. Read the ratio.
func BenchmarkShouldRateLimit(b *testing.B) {
	d, err := envoyconf.LoadFile("../envoyconf/testdata/ratelimit.yaml")
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := envoyconf.Compile(envoyconf.Options{}, d)
	if err != nil {
		b.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	svc := rls.New(node, cfg)
	ctx := context.Background()
	const keys = 1000
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256))}}
	}
	b.Run("reference=Node.Check", func(b *testing.B) {
		ids := make([]string, keys)
		for i := range ids {
			ids[i] = fmt.Sprintf("remote_address=10.0.%d.%d", i/256, i%256)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := node.Check(ctx, ids[i%keys], "envoy.edge.remote_address", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("descriptors=1", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := svc.ShouldRateLimit(ctx, reqs[i%keys]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
