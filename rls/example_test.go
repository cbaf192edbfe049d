package rls_test

import (
	"context"
	"fmt"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/rls"
)

// Example serves Envoy's rate-limit API from a weir node on loopback and
// asks it, as Envoy would, three times for one client address.
func Example() {
	d, err := envoyconf.Parse("ratelimit.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		panic(err)
	}
	cfg, err := envoyconf.Compile(envoyconf.Options{}, d)
	if err != nil {
		panic(err)
	}
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		panic(err)
	}
	defer node.Close()
	srv, err := rls.Listen("127.0.0.1:0", rls.New(node, cfg))
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	cc, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "edge",
			Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
				{Key: "remote_address", Value: "192.0.2.1"}}}},
		})
		if err != nil {
			panic(err)
		}
		st := resp.Statuses[0]
		fmt.Println(resp.OverallCode, st.CurrentLimit.GetRequestsPerUnit(), st.CurrentLimit.GetUnit(), st.LimitRemaining)
	}
	// Output:
	// OK 2 MINUTE 1
	// OK 2 MINUTE 0
	// OVER_LIMIT 2 MINUTE 0
}
