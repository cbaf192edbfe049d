package shell

import (
	"crypto/tls"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"github.com/weir-dev/weir/internal/testpki"
)

// TestGRPCRefusesExpiredCert completes TestGRPCMutualTLS's list (no
// certificate, another CA's, plaintext): a client certificate from the
// right CA that expired is refused too, and the handler never runs.
func TestGRPCRefusesExpiredCert(t *testing.T) {
	checkTransportLeaks(t)
	now := time.Now()
	ca := testpki.NewCA(t, "peer CA")
	pool := ca.Pool()
	good, expired := ca.Leaf(t, "peer", now.Add(time.Hour)), ca.Leaf(t, "peer", now.Add(-time.Hour))

	var calls atomic.Int64
	srv := newGRPC(t, "srv", echo(&calls), func(c *GRPCConfig) {
		c.ServerTLS = &tls.Config{Certificates: []tls.Certificate{good}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	})
	client := func(name string, cert tls.Certificate) *GRPCTransport {
		return newGRPC(t, name, echo(new(atomic.Int64)), func(c *GRPCConfig) {
			c.ClientTLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
		})
	}
	if _, err := client("expired", expired).Exchange(callCtx(t), srv.Addr(), &cluster.Message{}); err == nil {
		t.Error("an expired client certificate was served")
	} else {
		t.Logf("expired: %v", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("the handler ran %d times for an expired certificate", calls.Load())
	}
	// The control: the same CA's valid certificate is served.
	if _, err := client("valid", good).Exchange(callCtx(t), srv.Addr(), &cluster.Message{}); err != nil {
		t.Fatalf("a valid certificate: %v", err)
	}
}
