package raftgroup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/internal/testpki"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/leasepb"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// doorPKI is a CA that issues voter, gateway and expired certificates,
// and a second, unrelated CA: everything the door tests present.
type doorPKI struct {
	pool     *x509.CertPool
	voter    tls.Certificate // names n1..n5 (the voters of newCluster)
	gateway  tls.Certificate // "gw-1": a gateway's certificate
	expired  tls.Certificate // a voter's name, expired an hour ago
	stranger tls.Certificate // a voter's name, from another CA
}

func newDoorPKI(t *testing.T) doorPKI {
	t.Helper()
	ca, other := testpki.NewCA(t, "weir voters CA"), testpki.NewCA(t, "another CA")
	voters := []string{"n1", "n2", "n3", "n4", "n5"}
	hour := time.Now().Add(time.Hour)
	return doorPKI{
		pool:     ca.Pool(),
		voter:    ca.Leaf(t, "lease voter", hour, voters...),
		gateway:  ca.Leaf(t, "gw-1", hour),
		expired:  ca.Leaf(t, "lease voter", time.Now().Add(-time.Hour), voters...),
		stranger: other.Leaf(t, "lease voter", hour, voters...),
	}
}

// tune secures a group with the PKI. Elections are slower than
// baseConfig's: every new Raft connection is a TLS handshake, which under
// -race on a busy machine can outlast a 150ms heartbeat.
func (p doorPKI) tune(cfg *Config) {
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond
	cfg.ServerTLS = &tls.Config{Certificates: []tls.Certificate{p.voter}, ClientCAs: p.pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	cfg.ClientTLS = &tls.Config{Certificates: []tls.Certificate{p.voter}, RootCAs: p.pool, MinVersion: tls.VersionTLS13}
}

// rpcAs dials a group's forwarding service presenting certs (none: nil).
func rpcAs(t *testing.T, p doorPKI, addr string, certs ...tls.Certificate) grouppb.LeaseGroupClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: p.pool, Certificates: certs, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return grouppb.NewLeaseGroupClient(cc)
}

// TestRaftPortMutualTLS: with ServerTLS the Raft port speaks mutual TLS
// and serves only a voter's certificate. A real Raft RPC (RequestVote, from
// raft's own transport) sent with no certificate, an expired one, one from
// another CA, a gateway's (right CA, no voter name), or in plaintext is
// refused and counted; the group replicates over the same port
// throughout.
func TestRaftPortMutualTLS(t *testing.T) {
	p := newDoorPKI(t)
	c := newCluster(t, 3, p.tune)
	l := c.leader()
	propose(t, c.follower(l), rulesCmd) // forwarded and replicated over TLS
	raftAddr := raft.ServerAddress(c.cfgs[l.Name()].RaftAddr)
	if raftAddr == "" {
		raftAddr = raft.ServerAddress(l.trans.LocalAddr())
	}

	vote := func(stream raft.StreamLayer) error {
		tr := raft.NewNetworkTransport(stream, 1, 5*time.Second, io.Discard)
		defer tr.Close()
		var resp raft.RequestVoteResponse
		return tr.RequestVote("intruder", raftAddr, &raft.RequestVoteRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte("127.0.0.1:1")}, Term: 0}, &resp)
	}
	stream := func(certs ...tls.Certificate) raft.StreamLayer {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return &tlsStream{Listener: lis, client: &tls.Config{RootCAs: p.pool, Certificates: certs, MinVersion: tls.VersionTLS13}}
	}
	before := l.Refused()
	cases := []struct {
		name   string
		stream raft.StreamLayer
	}{
		{"no certificate", stream()},
		{"expired certificate", stream(p.expired)},
		{"another CA", stream(p.stranger)},
		{"gateway certificate", stream(p.gateway)},
	}
	plainLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		name   string
		stream raft.StreamLayer
	}{"plaintext", tcpStream{Listener: plainLis}})
	for _, tc := range cases {
		if err := vote(tc.stream); err == nil {
			t.Errorf("%s: a RequestVote was served", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// The intruder may read the refusal before the voter has counted it.
	waitFor(t, "every refusal counted", func() bool { return l.Refused()-before == uint64(len(cases)) })
	// The positive control: a voter's certificate is served (the vote is
	// denied, a term-0 candidate being stale, but the RPC is answered).
	if err := vote(stream(p.voter)); err != nil {
		t.Fatalf("a voter's RequestVote: %v", err)
	}
	propose(t, c.follower(c.leader()), lease.Command{Tick: true})
	noDegradation(t, c)
}

// TestRPCDoors: over mutual TLS the forwarding service refuses callers
// without a valid certificate; a gateway's certificate may propose reports
// and change rules, but not add voters or propose other commands, and the
// principal it forwards is recorded with its certificate's name, so that
// it cannot forge another's. A voter's certificate is trusted as before.
func TestRPCDoors(t *testing.T) {
	p := newDoorPKI(t)
	c := newCluster(t, 1, p.tune)
	g := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	propose(t, g, rulesCmd)

	tick, err := lease.EntryToPB(lease.Entry{Command: &lease.Command{Tick: true}})
	if err != nil {
		t.Fatal(err)
	}
	report, err := lease.EntryToPB(lease.Entry{Command: &lease.Command{Report: &lease.Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: 10}}}}})
	if err != nil {
		t.Fatal(err)
	}
	put := func(principal, body string) *grouppb.ChangeRuleRequest {
		return &grouppb.ChangeRuleRequest{From: "x", Change: &grouppb.ChangeRuleRequest_Put{Put: &leasepb.RulePut{
			Principal: principal, Rule: []byte(body), RequestId: principal}}}
	}
	rule := func(limit string) string {
		r, err := DecodeRuleBody("login", []byte(`{"limit":`+limit+`,"window":"1m","on_failure":"closed"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, err := lease.EncodeRuleJSON(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// Refused before anything is read: no certificate, expired, another CA.
	for name, certs := range map[string][]tls.Certificate{
		"no certificate": nil, "expired": {p.expired}, "another CA": {p.stranger},
	} {
		cl := rpcAs(t, p, g.RPCAddr(), certs...)
		if _, err := cl.ChangeRule(ctx, put("mallory", rule("1"))); err == nil {
			t.Errorf("%s: ChangeRule served", name)
		}
		if _, err := cl.Propose(ctx, &grouppb.ProposeRequest{From: "x", Command: report}); err == nil {
			t.Errorf("%s: Propose served", name)
		}
	}
	if v, _ := g.Rules(); v != 0 {
		t.Fatalf("rule version %d after refused calls, want 0", v)
	}

	gw := rpcAs(t, p, g.RPCAddr(), p.gateway)
	before := g.Refused()
	if _, err := gw.AddVoter(ctx, &grouppb.AddVoterRequest{Name: "evil", Address: "127.0.0.1:1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gateway AddVoter: %v, want PermissionDenied", err)
	}
	if _, err := gw.Propose(ctx, &grouppb.ProposeRequest{From: "gw-1", Command: tick}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gateway Propose(tick): %v, want PermissionDenied", err)
	}
	// A rule-store entry with a principal of its choosing, proposed raw.
	forged, err := lease.EntryToPB(lease.Entry{Rule: &lease.RuleChange{Principal: "alice", Delete: "login"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.Propose(ctx, &grouppb.ProposeRequest{From: "gw-1", Command: forged}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("gateway Propose(rule change): %v, want PermissionDenied", err)
	}
	if got := g.Refused() - before; got != 3 {
		t.Errorf("refused %d gateway calls, want 3", got)
	}
	if rep, err := gw.Propose(ctx, &grouppb.ProposeRequest{From: "gw-1", Command: report}); err != nil || rep.GetCode() != grouppb.Code_OK {
		t.Errorf("gateway report: %v %v", rep, err)
	}
	if rep, err := gw.ChangeRule(ctx, put("alice", rule("5"))); err != nil || rep.GetCode() != grouppb.Code_OK {
		t.Fatalf("gateway ChangeRule: %v %v", rep, err)
	}
	voter := rpcAs(t, p, g.RPCAddr(), p.voter)
	if rep, err := voter.ChangeRule(ctx, put("bob", rule("6"))); err != nil || rep.GetCode() != grouppb.Code_OK {
		t.Fatalf("voter ChangeRule: %v %v", rep, err)
	}
	h := g.History(0)
	if len(h) != 2 || h[0].Principal != "alice via gw-1" || h[1].Principal != "bob" {
		t.Fatalf("history principals: %+v", h)
	}
	for _, m := range g.cfg.Voters {
		if m.Name == "evil" {
			t.Fatal("the gateway added a voter")
		}
	}
	noDegradation(t, c)
}

// TestViaPrincipal: the proven name is never cut, the result stays within
// MaxPrincipalBytes and valid UTF-8.
func TestViaPrincipal(t *testing.T) {
	long := strings.Repeat("é", lease.MaxPrincipalBytes)
	got := viaPrincipal(long, "gw-1")
	if len(got) > lease.MaxPrincipalBytes || !strings.HasSuffix(got, " via gw-1") {
		t.Fatalf("viaPrincipal: %d bytes, %q", len(got), got[len(got)-12:])
	}
	if err := (lease.RuleChange{Principal: got, Delete: "x"}).Check(); err != nil {
		t.Fatal(err)
	}
	if got := viaPrincipal("alice", "gw-1"); got != "alice via gw-1" {
		t.Fatalf("viaPrincipal = %q", got)
	}
}

// TestRPCDoorCertIfGiven: with a ServerTLS that lets a caller without a
// certificate finish the handshake (tls.VerifyClientCertIfGiven), every
// method still refuses it (Durable included) with Unauthenticated.
func TestRPCDoorCertIfGiven(t *testing.T) {
	p := newDoorPKI(t)
	c := newCluster(t, 1, func(cfg *Config) {
		p.tune(cfg)
		cfg.ServerTLS.ClientAuth = tls.VerifyClientCertIfGiven
	})
	g := c.leader()
	propose(t, g, rulesCmd)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	anon := rpcAs(t, p, g.RPCAddr())
	before := g.Refused()
	_, err := anon.Durable(ctx, &grouppb.DurableRequest{From: "x", Decide: &leasepb.DurableDecide{Rule: "d", Limit: 1,
		Window: int64(time.Second), Burst: 1, Identity: []byte("a"), Cost: 1, RequestId: "r1"}})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Durable without a certificate: %v, want Unauthenticated", err)
	}
	if _, err := anon.ReadRules(ctx, &grouppb.ReadRulesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ReadRules without a certificate: %v, want Unauthenticated", err)
	}
	if got := g.Refused() - before; got != 2 {
		t.Errorf("refused %d, want 2", got)
	}
	// A gateway's certificate is served.
	if _, err := rpcAs(t, p, g.RPCAddr(), p.gateway).ReadRules(ctx, &grouppb.ReadRulesRequest{}); err != nil {
		t.Errorf("ReadRules with a gateway certificate: %v", err)
	}
	noDegradation(t, c)
}
