package shell

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/cluster/peerpb"
)

// newGRPC starts a GRPCTransport on 127.0.0.1:0, closed when tb ends.
func newGRPC(tb testing.TB, self string, h Handler, mod ...func(*GRPCConfig)) *GRPCTransport {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := GRPCConfig{Self: self, Listener: ln, Handler: h}
	for _, f := range mod {
		f(&cfg)
	}
	tr, err := NewGRPCTransport(cfg)
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := tr.Close(); err != nil {
			tb.Errorf("Close %s: %v", self, err)
		}
	})
	return tr
}

func TestGRPCRoundTrip(t *testing.T) {
	checkTransportLeaks(t)
	var gotFrom atomic.Value
	var gotMsg atomic.Pointer[cluster.Message]
	reply := &cluster.Message{Epoch: 5, Results: []cluster.ResultItem{{Ticket: 9, Allowed: true, Remaining: 1, Reset: 2, RetryAfter: 3, Debt: -4}}}
	b := newGRPC(t, "b", func(_ context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
		gotFrom.Store(from)
		gotMsg.Store(m)
		return reply, nil
	})
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	want := fullMessage()
	got, err := a.Exchange(callCtx(t), b.Addr(), want)
	if err != nil {
		t.Fatal(err)
	}
	if gotFrom.Load() != "a" {
		t.Errorf("handler saw from %v, want a", gotFrom.Load())
	}
	if m := gotMsg.Load(); !reflect.DeepEqual(m, want) {
		t.Errorf("delivered:\n got %+v\nwant %+v", m, want)
	}
	if !reflect.DeepEqual(got, reply) {
		t.Errorf("reply:\n got %+v\nwant %+v", got, reply)
	}
	// An echo of the full message comes back equal, on the cached connection.
	got, err = b.Exchange(callCtx(t), a.Addr(), want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("echo:\n got %+v\nwant %+v", got, want)
	}
	if a.Malformed()+b.Malformed() != 0 {
		t.Errorf("Malformed = %d, %d; want 0", a.Malformed(), b.Malformed())
	}
}

func TestGRPCHandlerErrorAndEmptyReply(t *testing.T) {
	checkTransportLeaks(t)
	bad := newGRPC(t, "bad", func(context.Context, string, *cluster.Message) (*cluster.Message, error) {
		return nil, errors.New("rule set not loaded")
	})
	empty := newGRPC(t, "empty", func(context.Context, string, *cluster.Message) (*cluster.Message, error) { return nil, nil })
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	_, err := a.Exchange(callCtx(t), bad.Addr(), &cluster.Message{Epoch: 1})
	if !errors.Is(err, ErrPeerHandler) || !strings.Contains(err.Error(), "rule set not loaded") {
		t.Errorf("handler error: err = %v, want ErrPeerHandler with the handler's text", err)
	}
	r, err := a.Exchange(callCtx(t), empty.Addr(), &cluster.Message{Epoch: 1})
	if err != nil || r == nil || !r.Empty() || r.Epoch != 0 {
		t.Errorf("nil reply: got %+v, %v; want an empty Message", r, err)
	}
}

// TestGRPCDeadline: a handler that blocks past the caller's deadline cannot
// hold the caller (the bound is generous for a loaded machine).
func TestGRPCDeadline(t *testing.T) {
	checkTransportLeaks(t)
	released := make(chan struct{}, 1)
	slow := newGRPC(t, "slow", func(ctx context.Context, _ string, m *cluster.Message) (*cluster.Message, error) {
		if m.Epoch == 0 {
			return m, nil // the warm-up call
		}
		<-ctx.Done() // the caller's deadline reaches the handler
		released <- struct{}{}
		return nil, ctx.Err()
	})
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	// Connect first so that the measured call is only the handler's wait.
	if _, err := a.Exchange(callCtx(t), slow.Addr(), &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := a.Exchange(ctx, slow.Addr(), &cluster.Message{Epoch: 1})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Exchange returned after %v with a 100ms deadline", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	select {
	case <-released:
	case <-time.After(callLimit):
		t.Error("the handler's ctx did not end with the caller's deadline")
	}
	// The stream the late answer was due on is dropped; the next exchange
	// gets a fresh one and its own answer.
	if got, err := a.Exchange(callCtx(t), slow.Addr(), &cluster.Message{}); err != nil || got.Epoch != 0 {
		t.Errorf("exchange after a deadline: %+v, %v; want the echo of epoch 0", got, err)
	}
}

// oldPeer is a peer from before Peer.Stream: only unary Exchange.
type oldPeer struct {
	peerpb.UnimplementedPeerServer
	calls atomic.Int64
}

// Exchange answers with an empty batch from "old".
func (o *oldPeer) Exchange(_ context.Context, b *peerpb.Batch) (*peerpb.Batch, error) {
	o.calls.Add(1)
	return &peerpb.Batch{From: "old", Epoch: b.Epoch}, nil
}

// TestGRPCStreamFallsBackToUnary: a peer without Peer.Stream is answered
// through unary calls, the first exchange included.
func TestGRPCStreamFallsBackToUnary(t *testing.T) {
	checkTransportLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	old := &oldPeer{}
	s := grpc.NewServer()
	peerpb.RegisterPeerServer(s, old)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })

	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	for i := range 3 {
		got, err := a.Exchange(callCtx(t), ln.Addr().String(), &cluster.Message{Epoch: uint64(i + 1)})
		if err != nil || got.Epoch != uint64(i+1) {
			t.Fatalf("exchange %d with an old peer: %+v, %v", i, got, err)
		}
	}
	if !a.isUnary(ln.Addr().String()) {
		t.Error("the old peer is not marked unary")
	}
	if n := old.calls.Load(); n != 3 {
		t.Errorf("old peer answered %d unary calls, want 3", n)
	}
}

// TestGRPCStreamReusedAndRestarted: exchanges to a peer share one stream;
// after the peer restarts on the same address, the idle stream of the old
// connection is dropped, not tried, so the exchange does not fail.
func TestGRPCStreamReusedAndRestarted(t *testing.T) {
	checkTransportLeaks(t)
	var calls atomic.Int64
	b := newGRPC(t, "b", echo(&calls))
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	addr := b.Addr()
	for i := range 5 {
		if _, err := a.Exchange(callCtx(t), addr, &cluster.Message{Epoch: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	idle, cc := len(a.idle[addr]), a.conns[addr]
	a.mu.Unlock()
	if idle != 1 {
		t.Errorf("%d idle streams after 5 sequential exchanges, want 1", idle)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Wait until a has seen the connection end, so that its idle stream is
	// known dead (the case this checks) rather than possibly mid-flight.
	ctx := callCtx(t)
	for cc.GetState() == connectivity.Ready {
		if !cc.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("the connection to the closed peer stayed ready")
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	b2, err := NewGRPCTransport(GRPCConfig{Self: "b", Listener: ln, Handler: echo(&calls)})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close() })
	// Let the connection come back first: a call while it is in its
	// reconnect backoff fails at once by design (ErrUnreachable), and the
	// idle stream it would then drop unused is not the case checked here.
	cc.Connect()
	for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("the connection to the restarted peer did not come back (%v)", st)
		}
	}
	if got, err := a.Exchange(callCtx(t), addr, &cluster.Message{Epoch: 9}); err != nil || got.Epoch != 9 {
		t.Errorf("first exchange after the peer restarted: %+v, %v", got, err)
	}
}

// TestGRPCCloseEndsIdleStreams: peers' idle streams do not hold Close up
// for the shutdown grace.
func TestGRPCCloseEndsIdleStreams(t *testing.T) {
	checkTransportLeaks(t)
	b := newGRPC(t, "b", echo(new(atomic.Int64)), func(c *GRPCConfig) { c.ShutdownGrace = time.Hour })
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(callLimit):
		t.Fatal("Close waited for an idle stream (its grace is an hour)")
	}
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("after the peer closed: err = %v, want ErrUnreachable", err)
	}
}

// TestGRPCPeerDown: a peer whose listener is closed fails at once, not at
// the caller's deadline.
func TestGRPCPeerDown(t *testing.T) {
	checkTransportLeaks(t)
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	for i := range 2 { // the first call dials; the second finds the connection failed
		start := time.Now()
		_, err := a.Exchange(callCtx(t), down, &cluster.Message{})
		if !errors.Is(err, ErrUnreachable) {
			t.Errorf("call %d: err = %v, want ErrUnreachable", i, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("call %d: failing took %v, want fast", i, d)
		}
	}

	// A peer that was up and closes is the same.
	b := newGRPC(t, "b", echo(new(atomic.Int64)))
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("after the peer closed: err = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("after the peer closed: failing took %v, want fast", d)
	}
}

func TestGRPCClosed(t *testing.T) {
	checkTransportLeaks(t)
	b := newGRPC(t, "b", echo(new(atomic.Int64)))
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{}); !errors.Is(err, ErrTransportClosed) {
		t.Errorf("after Close: err = %v, want ErrTransportClosed", err)
	}
}

func TestGRPCConfigErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := echo(new(atomic.Int64))
	for _, c := range []struct {
		cfg  GRPCConfig
		want string
	}{
		{GRPCConfig{Listener: ln, Handler: h}, "Self"},
		{GRPCConfig{Self: "a", Handler: h}, "Listener"},
		{GRPCConfig{Self: "a", Listener: ln}, "Handler"},
		{GRPCConfig{Self: "a", Listener: ln, Handler: h, MaxMessageBytes: -1}, "MaxMessageBytes"},
	} {
		if _, err := NewGRPCTransport(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want one naming %s", err, c.want)
		}
	}
}

// TestGRPCMalformed sends batches the decoder must refuse with the raw
// generated client: each is answered codes.InvalidArgument, counted, and
// never reaches the Handler.
func TestGRPCMalformed(t *testing.T) {
	checkTransportLeaks(t)
	var calls atomic.Int64
	b := newGRPC(t, "b", echo(&calls))
	cc, err := grpc.NewClient("passthrough:///"+b.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	raw := peerpb.NewPeerClient(cc)
	bad := []*peerpb.Batch{
		{From: "x", Decides: []*peerpb.DecideItem{{Ticket: 1, Rule: "r", Identity: []byte("i"), Cost: -5}}},
		{From: "x", Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte(strings.Repeat("i", cluster.MaxIdentityBytes+1))}}},
		{Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte("i")}}},
	}
	for i, batch := range bad {
		_, err := raw.Exchange(callCtx(t), batch)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("batch %d: err = %v, want InvalidArgument", i, err)
		}
	}
	if got := b.Malformed(); got != uint64(len(bad)) {
		t.Errorf("Malformed = %d, want %d", got, len(bad))
	}
	if calls.Load() != 0 {
		t.Errorf("the handler ran %d times on malformed batches", calls.Load())
	}
	// A valid batch on the same connection still works.
	if _, err := raw.Exchange(callCtx(t), &peerpb.Batch{From: "x"}); err != nil {
		t.Errorf("valid batch after malformed ones: %v", err)
	}
}

// testPKI is a CA with a server and a client certificate, all for 127.0.0.1.
type testPKI struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

func newTestPKI(t *testing.T, name string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name + " CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return testPKI{pool: pool,
		server: leaf(2, name+" server", x509.ExtKeyUsageServerAuth),
		client: leaf(3, name+" client", x509.ExtKeyUsageClientAuth)}
}

func TestGRPCMutualTLS(t *testing.T) {
	checkTransportLeaks(t)
	pki := newTestPKI(t, "weir")
	other := newTestPKI(t, "other")
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientCAs:    pki.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
	var calls atomic.Int64
	b := newGRPC(t, "b", echo(&calls), func(c *GRPCConfig) { c.ServerTLS = serverTLS })
	client := func(name string, certs []tls.Certificate) *GRPCTransport {
		return newGRPC(t, name, echo(new(atomic.Int64)), func(c *GRPCConfig) {
			c.ClientTLS = &tls.Config{RootCAs: pki.pool, Certificates: certs, MinVersion: tls.VersionTLS13}
		})
	}
	good := client("good", []tls.Certificate{pki.client})
	want := fullMessage()
	got, err := good.Exchange(callCtx(t), b.Addr(), want)
	if err != nil {
		t.Fatalf("valid client certificate: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reply over mTLS differs:\n got %+v\nwant %+v", got, want)
	}
	for name, certs := range map[string][]tls.Certificate{
		"no certificate":         nil,
		"certificate of another": {other.client},
	} {
		c := client(strings.ReplaceAll(name, " ", "-"), certs)
		_, err := c.Exchange(callCtx(t), b.Addr(), &cluster.Message{})
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		t.Logf("%s: %v", name, err)
	}
	// A plaintext client is refused too.
	plain := client("plain", nil)
	plain.cfg.ClientTLS = nil
	_, err = plain.Exchange(callCtx(t), b.Addr(), &cluster.Message{})
	if err == nil {
		t.Error("plaintext client: accepted")
	}
	t.Logf("plaintext client: %v", err)
	if calls.Load() != 1 {
		t.Errorf("handler calls = %d, want 1 (the valid client's)", calls.Load())
	}
}

// smallBatch is a typical linger's batch to one peer.
func smallBatch() *cluster.Message {
	return &cluster.Message{
		Epoch: 3,
		Syncs: []cluster.SyncItem{
			{Rule: "api", Identity: "user:1", Gen: 1, Total: 12},
			{Rule: "api", Identity: "user:2", Gen: 1, Total: 3},
		},
		Decides: []cluster.DecideItem{{Ticket: 41, Rule: "login", Identity: "10.1.2.3", Cost: 1}},
		Acks:    []cluster.AckItem{{Rule: "api", Identity: "user:9", Gen: 2, Total: 40, Debt: -1_000_000}},
	}
}

// reportLatency adds p50 and p99 of the per-call latencies to b's output.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// bareServer is the reference: the generated service with an empty handler,
// no conversion and no validation.
type bareServer struct{ peerpb.UnimplementedPeerServer }

func (bareServer) Exchange(context.Context, *peerpb.Batch) (*peerpb.Batch, error) {
	return &peerpb.Batch{}, nil
}

// BenchmarkExchange is one sequential round trip of a small batch over
// loopback gRPC (reply: an ack and a result), against the bare gRPC round
// trip of an empty unary call and the in-memory transport. Run with
// -benchmem; p50-ns and p99-ns are per-call latencies.
func BenchmarkExchange(b *testing.B) {
	m := smallBatch()
	reply := &cluster.Message{Epoch: 3,
		Acks:    []cluster.AckItem{{Rule: "api", Identity: "user:1", Gen: 1, Total: 12, Debt: 5}},
		Results: []cluster.ResultItem{{Ticket: 41, Allowed: true, Remaining: 9, Reset: 100}}}
	h := func(context.Context, string, *cluster.Message) (*cluster.Message, error) { return reply, nil }

	// transport=grpc is the transport as it runs (exchanges on a Peer.Stream);
	// transport=grpc-unary the same with unary Peer.Exchange calls, as to a
	// peer without Stream.
	for _, unary := range []bool{false, true} {
		name := "transport=grpc"
		if unary {
			name += "-unary"
		}
		b.Run(name, func(b *testing.B) {
			srv := newGRPC(b, "srv", h)
			cli := newGRPC(b, "cli", h)
			if unary {
				cli.unary[srv.Addr()] = true
			}
			ctx := context.Background()
			if _, err := cli.Exchange(ctx, srv.Addr(), m); err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := cli.Exchange(ctx, srv.Addr(), m); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}

	b.Run("transport=bare-grpc", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		s := grpc.NewServer()
		peerpb.RegisterPeerServer(s, bareServer{})
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Serve(ln) }()
		defer func() { s.Stop(); <-done }()
		cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		c := peerpb.NewPeerClient(cc)
		ctx := context.Background()
		in := &peerpb.Batch{}
		if _, err := c.Exchange(ctx, in); err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if _, err := c.Exchange(ctx, in); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportLatency(b, lat)
	})

	b.Run("transport=inmem", func(b *testing.B) {
		n := NewInmemNetwork()
		srv := n.Transport("srv", h)
		cli := n.Transport("cli", h)
		defer srv.Close()
		defer cli.Close()
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if _, err := cli.Exchange(ctx, "srv", m); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}

// TestGRPCConcurrentClose: calls on one cached connection run concurrently,
// and Close while calls are in flight (a blocked handler on the peer, too)
// returns, fails those calls and leaves no goroutine behind.
func TestGRPCConcurrentClose(t *testing.T) {
	checkTransportLeaks(t)
	var calls atomic.Int64
	b := newGRPC(t, "b", func(ctx context.Context, _ string, m *cluster.Message) (*cluster.Message, error) {
		calls.Add(1)
		if m.Epoch == 1 {
			<-ctx.Done() // blocks until the caller gives up or b closes
			return nil, ctx.Err()
		}
		return m, nil
	}, func(c *GRPCConfig) { c.ShutdownGrace = 200 * time.Millisecond })
	a := newGRPC(t, "a", echo(new(atomic.Int64)))
	const workers = 8
	errc := make(chan error, workers)
	for i := range workers {
		go func() {
			for j := range 20 {
				m := &cluster.Message{Epoch: 2, Syncs: []cluster.SyncItem{{Rule: "r", Identity: "i", Gen: uint64(i), Total: int64(j)}}}
				got, err := a.Exchange(callCtx(t), b.Addr(), m)
				if err != nil || !reflect.DeepEqual(got, m) {
					errc <- fmt.Errorf("worker %d call %d: %+v, %v", i, j, got, err)
					return
				}
			}
			errc <- nil
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	blocked := make(chan error, 1)
	go func() {
		_, err := a.Exchange(callCtx(t), b.Addr(), &cluster.Message{Epoch: 1})
		blocked <- err
	}()
	for calls.Load() < workers*20+1 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case err := <-blocked:
		if err == nil {
			t.Error("a call blocked in a closed peer succeeded")
		}
	case <-time.After(callLimit):
		t.Fatal("a call blocked in a closed peer hung")
	}
}
