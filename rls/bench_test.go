package rls_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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

// BenchmarkServeFidelity measures calls over gRPC on loopback to a node in
// fidelity mode, 64 callers at once, to a server with the options rls.Serve
// sets (stream workers) and to a plain grpc.NewServer (a goroutine per
// call, whose stack grows on every call), in turns of 1000 calls each so
// that both see the same machine. Each op is one call to each; the metrics
// are the process's CPU (client and server) per call of each, and their
// ratio. Read the ratio.
func BenchmarkServeFidelity(b *testing.B) {
	cfg := loadConfig(b, envoyconf.Options{Fidelity: true})
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	svc := rls.New(node, cfg)
	const keys = 1000
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256))}}
	}
	clients := make([]rlsv3.RateLimitServiceClient, 2)
	for i, opts := range [][]grpc.ServerOption{nil, {grpc.NumStreamWorkers(0)}} {
		srv, err := rls.Listen("127.0.0.1:0", svc, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer srv.Close()
		cc, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	ctx := context.Background()
	var next atomic.Int64
	turn := func(c rlsv3.RateLimitServiceClient, n int) {
		var wg sync.WaitGroup
		var left atomic.Int64
		left.Store(int64(n))
		for range 64 {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					if _, err := c.ShouldRateLimit(ctx, reqs[next.Add(1)%keys]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	for _, c := range clients {
		turn(c, 1000) // warm up
	}
	var cpu [2]int64
	b.ResetTimer()
	for done := 0; done < b.N; done += 1000 {
		n := min(1000, b.N-done)
		for i, c := range clients {
			start := processCPU()
			turn(c, n)
			cpu[i] += processCPU() - start
		}
	}
	b.ReportMetric(float64(cpu[0])/float64(b.N), "serve-cpu-ns/call")
	b.ReportMetric(float64(cpu[1])/float64(b.N), "plain-cpu-ns/call")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "serve/plain")
}

// BenchmarkShouldRateLimitFidelity is BenchmarkShouldRateLimit's call in
// fidelity mode (in process, no network), beside the same call in the
// default mode, in the same run.
func BenchmarkShouldRateLimitFidelity(b *testing.B) {
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256))}}
	}
	for _, opts := range []envoyconf.Options{{}, {Fidelity: true}} {
		b.Run(fmt.Sprintf("fidelity=%v", opts.Fidelity), func(b *testing.B) {
			cfg := loadConfig(b, opts)
			node, err := weir.New(weir.Config{Rules: cfg.Rules()})
			if err != nil {
				b.Fatal(err)
			}
			defer node.Close()
			svc := rls.New(node, cfg)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
