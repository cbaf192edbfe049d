package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/cluster/peerpb"
)

// DefaultMaxMessageBytes is the largest batch sent or received, when
// GRPCConfig.MaxMessageBytes is 0.
const DefaultMaxMessageBytes = 4 << 20

// DefaultExchangeTimeout bounds an Exchange whose ctx has no deadline, when
// GRPCConfig.ExchangeTimeout is 0.
const DefaultExchangeTimeout = 5 * time.Second

// DefaultShutdownGrace bounds Close's graceful stop, when
// GRPCConfig.ShutdownGrace is 0.
const DefaultShutdownGrace = 2 * time.Second

// GRPCConfig configures a GRPCTransport. Self, Listener and Handler are
// required; the zero value of every other field works.
type GRPCConfig struct {
	// Self is this node's member name, sent as Batch.from.
	Self string
	// Listener is where the server listens (the caller creates it, e.g. on
	// 127.0.0.1:0). The transport owns it once NewGRPCTransport succeeds:
	// Close closes it.
	Listener net.Listener
	// Handler answers the batches peers send.
	Handler Handler
	// ServerTLS secures the server; nil means plaintext. Set ClientAuth to
	// tls.RequireAndVerifyClientCert (and ClientCAs) for mutual TLS.
	ServerTLS *tls.Config
	// ClientTLS secures the calls to peers; nil means plaintext. An empty
	// ServerName is taken from the peer address's host.
	ClientTLS *tls.Config
	// MaxMessageBytes caps a batch in either direction; 0 means
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// ExchangeTimeout bounds an Exchange whose ctx has no deadline; 0 means
	// DefaultExchangeTimeout.
	ExchangeTimeout time.Duration
	// ShutdownGrace is how long Close lets running handlers finish before
	// it cancels them; 0 means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger receives connection and rejection events; nil discards them.
	Logger *slog.Logger
}

// GRPCTransport is the Transport over gRPC: a Peer service answering with
// the Handler, and one cached client connection per peer address.
type GRPCTransport struct {
	cfg       GRPCConfig
	log       *slog.Logger
	srv       *grpc.Server
	serveDone chan struct{}
	serveErr  error
	malformed atomic.Uint64

	mu     sync.Mutex
	closed bool
	conns  map[string]*grpc.ClientConn
}

// LAN keepalive: a client pings a connection idle for 10 s and drops it when
// no answer comes in 3 s; the server allows pings every 5 s, also with no
// call running, and pings its own idle clients every 30 s.
var (
	clientKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}
	serverKeepalive = keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}
	serverEnforce   = keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}
	// Reconnect quickly after a peer restarts: 100 ms doubling to 2 s,
	// instead of gRPC's 1 s to 120 s.
	connectParams = grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: 2 * time.Second,
	}
)

// NewGRPCTransport validates cfg and starts serving on cfg.Listener.
func NewGRPCTransport(cfg GRPCConfig) (*GRPCTransport, error) {
	switch {
	case cfg.Self == "":
		return nil, errors.New("cluster: GRPCConfig.Self is empty")
	case len(cfg.Self) > MaxNodeNameBytes:
		return nil, fmt.Errorf("cluster: GRPCConfig.Self is longer than %d bytes", MaxNodeNameBytes)
	case cfg.Listener == nil:
		return nil, errors.New("cluster: GRPCConfig.Listener is nil")
	case cfg.Handler == nil:
		return nil, errors.New("cluster: GRPCConfig.Handler is nil")
	case cfg.MaxMessageBytes < 0:
		return nil, fmt.Errorf("cluster: GRPCConfig.MaxMessageBytes is negative (%d)", cfg.MaxMessageBytes)
	case cfg.ExchangeTimeout < 0:
		return nil, fmt.Errorf("cluster: GRPCConfig.ExchangeTimeout is negative (%v)", cfg.ExchangeTimeout)
	case cfg.ShutdownGrace < 0:
		return nil, fmt.Errorf("cluster: GRPCConfig.ShutdownGrace is negative (%v)", cfg.ShutdownGrace)
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.ExchangeTimeout == 0 {
		cfg.ExchangeTimeout = DefaultExchangeTimeout
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &GRPCTransport{cfg: cfg, log: log.With("component", "peer-transport", "self", cfg.Self),
		serveDone: make(chan struct{}), conns: map[string]*grpc.ClientConn{}}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.KeepaliveParams(serverKeepalive),
		grpc.KeepaliveEnforcementPolicy(serverEnforce),
		grpc.WaitForHandlers(true), // Close returns with no handler running
	}
	if cfg.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.ServerTLS)))
	}
	t.srv = grpc.NewServer(opts...)
	peerpb.RegisterPeerServer(t.srv, peerServer{t: t})
	go func() {
		defer close(t.serveDone)
		if err := t.srv.Serve(cfg.Listener); err != nil {
			t.serveErr = err
			t.log.Error("peer server stopped", "err", err)
		}
	}()
	return t, nil
}

// Addr is the address the server listens on.
func (t *GRPCTransport) Addr() string { return t.cfg.Listener.Addr().String() }

// Malformed is the number of malformed batches rejected: batches peers sent
// (answered with codes.InvalidArgument) and replies peers returned.
func (t *GRPCTransport) Malformed() uint64 { return t.malformed.Load() }

// Exchange implements Transport: one unary Peer.Exchange call on the cached
// connection to addr. A peer that is down fails at once with an error
// wrapping ErrUnreachable (calls do not wait for a connection); a call past
// ctx's deadline fails wrapping context.DeadlineExceeded; a Handler error on
// the peer wraps ErrPeerHandler.
func (t *GRPCTransport) Exchange(ctx context.Context, addr string, m *Message) (*Message, error) {
	cc, err := t.conn(addr)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.ExchangeTimeout)
		defer cancel()
	}
	b, err := peerpb.NewPeerClient(cc).Exchange(ctx, encodeBatch(t.cfg.Self, m))
	if err != nil {
		return nil, t.callError(ctx, addr, err)
	}
	_, reply, err := decodeBatch(b)
	if err != nil {
		t.malformed.Add(1)
		return nil, fmt.Errorf("cluster: exchange with %s: malformed reply: %w", addr, err)
	}
	return reply, nil
}

// callError maps a gRPC status to the transport's errors.
func (t *GRPCTransport) callError(ctx context.Context, addr string, err error) error {
	st := status.Convert(err)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("cluster: exchange with %s: %w", addr, ctx.Err())
	case st.Code() == codes.DeadlineExceeded:
		// The deadline fired on the wire (the server's copy of it, or
		// gRPC's own timer) a moment before the caller's ctx noticed.
		return fmt.Errorf("cluster: exchange with %s: %w", addr, context.DeadlineExceeded)
	case st.Code() == codes.Unavailable:
		return fmt.Errorf("%w: %s: %s", ErrUnreachable, addr, st.Message())
	case st.Code() == codes.Unknown && st.Message() != "":
		return fmt.Errorf("cluster: exchange with %s: %w: %s", addr, ErrPeerHandler, st.Message())
	case st.Code() == codes.Canceled && t.isClosed():
		return ErrTransportClosed
	}
	return fmt.Errorf("cluster: exchange with %s: %s: %s", addr, st.Code(), st.Message())
}

func (t *GRPCTransport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// conn returns the cached connection to addr, creating it on first use. It
// does not dial: gRPC connects on the first call.
func (t *GRPCTransport) conn(addr string) (*grpc.ClientConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrTransportClosed
	}
	if cc := t.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if t.cfg.ClientTLS != nil {
		creds = credentials.NewTLS(t.cfg.ClientTLS)
	}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(clientKeepalive),
		grpc.WithConnectParams(connectParams),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(t.cfg.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(t.cfg.MaxMessageBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("cluster: peer address %q: %w", addr, err)
	}
	t.conns[addr] = cc
	t.log.Debug("peer connection created", "addr", addr)
	return cc, nil
}

// Disconnect closes the cached connection to addr, if any (for a peer that
// left or moved); the next Exchange to addr opens a new one.
func (t *GRPCTransport) Disconnect(addr string) {
	t.mu.Lock()
	cc := t.conns[addr]
	delete(t.conns, addr)
	t.mu.Unlock()
	if cc != nil {
		_ = cc.Close()
	}
}

// Close implements Transport: it stops the server gracefully (running calls
// get ShutdownGrace to finish, then are cancelled), closes the listener and
// every client connection, and returns once no goroutine of the transport
// runs. Exchange calls in flight fail.
func (t *GRPCTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()

	var errs []error
	for _, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	graceful := make(chan struct{})
	go func() {
		t.srv.GracefulStop()
		close(graceful)
	}()
	timer := time.NewTimer(t.cfg.ShutdownGrace)
	select {
	case <-graceful:
		timer.Stop()
	case <-timer.C:
		t.srv.Stop()
		<-graceful
	}
	<-t.serveDone
	if t.serveErr != nil {
		errs = append(errs, t.serveErr)
	}
	return errors.Join(errs...)
}

// peerServer is the Peer service.
type peerServer struct {
	peerpb.UnimplementedPeerServer
	t *GRPCTransport
}

// Exchange validates the batch, runs the Handler and encodes its reply.
func (s peerServer) Exchange(ctx context.Context, b *peerpb.Batch) (*peerpb.Batch, error) {
	from, m, err := decodeBatch(b)
	if err != nil {
		s.t.malformed.Add(1)
		s.t.log.Debug("malformed batch rejected", "from", b.GetFrom(), "err", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	reply, err := s.t.cfg.Handler(ctx, from, m)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		return nil, status.Error(codes.Unknown, err.Error())
	}
	if reply == nil {
		reply = &Message{}
	}
	return encodeBatch(s.t.cfg.Self, reply), nil
}
