package raftgroup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/weir-dev/weir/internal/testpki"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// testCerts makes a CA and one certificate for 127.0.0.1 usable by servers
// and clients.
func testCerts(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	ca := testpki.NewCA(t, "lease test CA")
	// The voters' names (Config.VoterNames).
	return ca.Pool(), ca.Leaf(t, "lease voter", time.Now().Add(time.Hour), "n1", "n2", "n3", "n4", "n5")
}

// TestGroupMutualTLS: with ServerTLS requiring client certificates and
// ClientTLS presenting one, a follower's write is forwarded over mutual
// TLS; a caller with no certificate is refused by the leader's service.
func TestGroupMutualTLS(t *testing.T) {
	pool, cert := testCerts(t)
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
		cfg.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
	})
	l := c.leader()
	f := c.follower(l)
	propose(t, f, rulesCmd)
	res := propose(t, f, lease.Command{Report: &lease.Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: 100}}}})
	if len(res.Grants) != 1 || res.Grants[0].Share != 100 {
		t.Fatalf("grants over mTLS %+v", res.Grants)
	}

	cc, err := grpc.NewClient("passthrough:///"+l.RPCAddr(), grpc.WithTransportCredentials(
		credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	pc, err := lease.EntryToPB(lease.Entry{Command: &lease.Command{Tick: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grouppb.NewLeaseGroupClient(cc).Propose(ctx, &grouppb.ProposeRequest{From: "intruder", Command: pc}); err == nil {
		t.Fatal("a caller with no client certificate was served")
	}
	c.checkAll("end")
	for _, g := range c.live() {
		if g.Malformed() != 0 {
			t.Errorf("%s counted %d malformed commands", g.Name(), g.Malformed())
		}
	}
}
