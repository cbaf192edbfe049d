package rls_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/internal/testpki"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/rls"
)

// loopbackTLS makes a certificate for 127.0.0.1 and the server and client
// configs that trust it.
func loopbackTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ca := testpki.NewCA(t, "weir-test CA")
	cert := ca.Leaf(t, "weir-test", time.Now().Add(time.Hour))
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
}

// TestPeerDown: a two-node cluster where the peer's RPC server accepts
// connections and never answers (its TLS handshake hangs: a stuck process,
// not a refused port, which would fail fast). Memberlist still sees the
// peer alive, so identities it owns are still sent to it. Every call must
// come back well before its deadline, answered by the rule's on_failure,
// marked degraded in the response and counted in weir_fail_open_total.
func TestPeerDown(t *testing.T) {
	cfg := loadConfig(t, envoyconf.Options{Mode: quota.ModeExact}) // every admission asks the owner
	serverTLS, clientTLS := loopbackTLS(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	stuckTLS := serverTLS.Clone()
	stuckTLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		<-release
		return nil, nil
	}
	label := fmt.Sprintf("rls-peer-down-%d", time.Now().UnixNano())
	mk := func(name string, stls *tls.Config, join []string) *weir.Node {
		n, err := weir.New(weir.Config{Rules: cfg.Rules(), Cluster: &weir.ClusterConfig{
			Name: name, Region: "eu", Label: label, LocalTiming: true, Join: join,
			DecideTimeout: 300 * time.Millisecond, CallTimeout: 200 * time.Millisecond,
			ServerTLS: stls, ClientTLS: clientTLS,
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a := mk("a", serverTLS, nil)
	mk("b", stuckTLS, []string{ops.GossipAddr(a)})
	// Cleanups run last-in first-out: the stuck handshakes are released
	// before the nodes close.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	deadline := time.Now().Add(10 * time.Second)
	for len(ops.Members(a)) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two nodes did not see each other within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	srv, err := rls.Listen("127.0.0.1:0", rls.New(a, cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := client(t, srv.Addr())

	const callDeadline = 10 * time.Second
	degraded := 0
	for i := 0; i < 40 && degraded == 0; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
		start := time.Now()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprintf("10.1.0.%d", i))}})
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v after %v: the call must be answered by on_failure, not time out", i, err, took)
		}
		if resp.GetDynamicMetadata().GetFields()["weir.degraded"].GetBoolValue() {
			degraded++
			// on_failure local: the limit ÷ live nodes (50/2) here, so a
			// first request passes.
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("degraded call %d: %v, want OK from on_failure local", i, resp)
			}
			t.Logf("call %d (owned by the stuck peer) answered by on_failure in %v; deadline %v", i, took, callDeadline)
		}
	}
	if degraded == 0 {
		t.Fatal("no call reached the stuck peer in 40 identities")
	}
	var failOpen uint64
	for _, rc := range ops.Counts(a) {
		failOpen += rc.FailOpen
	}
	if failOpen == 0 {
		t.Fatal("degraded answers were not counted in the fail-open counter")
	}
}
