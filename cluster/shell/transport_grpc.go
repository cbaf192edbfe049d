package shell

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/internal/golabel"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
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
	// Dialer, when set, opens the connections to peers instead of the
	// system's TCP dialer (a test puts a fault-injecting network here).
	// Nil means the real network.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// GRPCTransport is the Transport over gRPC: a Peer service answering with
// the Handler, and one cached client connection per peer address. Exchanges
// travel on long-lived Peer.Stream streams, kept idle between exchanges (one
// exchange at a time on each), so that an exchange costs two messages and
// not a call's setup; a peer whose server has no Stream method gets unary
// Peer.Exchange calls instead.
type GRPCTransport struct {
	cfg       GRPCConfig
	log       *slog.Logger
	srv       *grpc.Server
	serveDone chan struct{}
	serveErr  error
	malformed atomic.Uint64
	inspect   atomic.Pointer[Inspector] // answers Peer.Inspect; nil: Unimplemented

	mu      sync.Mutex
	closed  bool
	conns   map[string]*grpc.ClientConn
	idle    map[string][]*peerStream // streams ready for an exchange, by address
	unary   map[string]bool          // addresses whose server has no Stream method
	active  int                      // batches the server is handling
	drained chan struct{}            // closed when active reaches 0 during Close

	// label marks the goroutines of the client connections (internal/golabel):
	// Close waits for them, as ClientConn.Close does not for all of them.
	label string
}

// connWait bounds how long Close waits for the client connections'
// goroutines after closing them; they end at once (every dial and stream
// is cancelled), so reaching it means a bug, which Close logs.
const connWait = 5 * time.Second

// maxIdleStreams is how many idle streams to one address are kept: the
// Node has one exchange in flight per peer, so one is the usual need.
const maxIdleStreams = 4

// peerStream is a client's Peer.Stream to one address.
type peerStream struct {
	cs     peerpb.Peer_StreamClient
	cancel context.CancelFunc
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
	case len(cfg.Self) > cluster.MaxNodeNameBytes:
		return nil, fmt.Errorf("cluster: GRPCConfig.Self is longer than %d bytes", cluster.MaxNodeNameBytes)
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
		serveDone: make(chan struct{}), conns: map[string]*grpc.ClientConn{}, label: golabel.New("grpc"),
		idle: map[string][]*peerStream{}, unary: map[string]bool{}}
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
		// ErrServerStopped: Close ran before Serve started, which is no failure.
		if err := t.srv.Serve(cfg.Listener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
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

// Exchange implements Transport: one batch and its reply on an idle
// Peer.Stream to addr (opened on the cached connection when none is idle),
// or one unary Peer.Exchange call to a peer without Stream. A peer that is
// down fails at once with an error wrapping ErrUnreachable (calls do not
// wait for a connection); an exchange past ctx's deadline fails wrapping
// context.DeadlineExceeded, and its stream is dropped; a Handler error on
// the peer wraps ErrPeerHandler.
func (t *GRPCTransport) Exchange(ctx context.Context, addr string, m *cluster.Message) (*cluster.Message, error) {
	cc, err := t.conn(addr)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.ExchangeTimeout)
		defer cancel()
	}
	in := encodeBatch(t.cfg.Self, m)
	var b *peerpb.Batch
	if t.isUnary(addr) {
		b, err = peerpb.NewPeerClient(cc).Exchange(ctx, in)
	} else {
		b, err = t.streamExchange(ctx, cc, addr, in)
	}
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

// streamExchange sends in on a stream to addr and returns the answer. An
// idle stream that turns out to have ended before it could carry the batch
// (the peer restarted while it was idle: the send fails, or see
// staleStream) is replaced by a new one once: the batch cannot have been
// delivered on it. A failed exchange drops its
// stream, since its answer may still be on the way; a peer without Stream
// is marked and answered by a unary call.
func (t *GRPCTransport) streamExchange(ctx context.Context, cc *grpc.ClientConn, addr string, in *peerpb.Batch) (*peerpb.Batch, error) {
	for attempt := 0; ; attempt++ {
		ps, reused := t.takeIdle(addr, cc)
		if ps == nil {
			ps = &peerStream{}
		}
		b, sent, ok, err := ps.roundTrip(ctx, cc, in)
		if err == nil {
			if ok {
				t.putIdle(addr, ps)
			}
			return b, nil
		}
		ps.close()
		switch {
		case status.Code(err) == codes.Unimplemented:
			t.mu.Lock()
			t.unary[addr] = true
			t.mu.Unlock()
			t.log.Info("peer has no Peer.Stream: exchanges use unary calls", "addr", addr)
			return peerpb.NewPeerClient(cc).Exchange(ctx, in)
		case reused && attempt == 0 && ctx.Err() == nil && (!sent || staleStream(err, cc)):
			continue
		}
		return nil, err
	}
}

// staleStream reports whether an idle stream whose batch went out and whose
// answer failed (err) had ended with its connection before it was taken: the
// connection failed under it (Unavailable) and the client connection is
// ready again on a new one. A send on such a stream can succeed (it is
// buffered for a connection already closing), but the batch cannot have
// been delivered. A connection that dies during an exchange answers the
// failure at once, before a new one can be ready; should one be ready that
// fast, the batch goes again, which a peer takes as a second forward (charged
// twice: tokens lost, never an extra admission) or a repeated sync (reports
// are cumulative).
func staleStream(err error, cc *grpc.ClientConn) bool {
	return status.Code(err) == codes.Unavailable && cc.GetState() == connectivity.Ready
}

// roundTrip sends in and receives the answer, opening the stream first if
// it has none. ctx bounds the whole exchange: when it ends first, the stream
// is cancelled. It reports whether in went out (sent; false means the
// stream had ended before) and whether the stream may carry another
// exchange (ok).
func (ps *peerStream) roundTrip(ctx context.Context, cc *grpc.ClientConn, in *peerpb.Batch) (b *peerpb.Batch, sent, ok bool, err error) {
	if ps.cs == nil {
		// The stream outlives this exchange; ctx bounds only its opening.
		sctx, cancel := context.WithCancel(context.Background())
		ps.cancel = cancel
		stop := context.AfterFunc(ctx, cancel)
		ps.cs, err = peerpb.NewPeerClient(cc).Stream(sctx)
		if !stop() || err != nil {
			if err == nil {
				err = ctx.Err()
			}
			return nil, false, false, err
		}
	}
	stop := context.AfterFunc(ctx, ps.cancel)
	if err = ps.cs.Send(in); err == io.EOF {
		// The stream ended; Recv returns its status.
		_, err = ps.cs.Recv()
		stop()
		if err == nil || err == io.EOF {
			err = status.Error(codes.Unavailable, "peer stream ended")
		}
		return nil, false, false, err
	} else if err == nil {
		sent = true
		b, err = ps.cs.Recv()
		if err == io.EOF {
			err = status.Error(codes.Unavailable, "peer stream ended")
		}
	}
	if !stop() {
		// ctx ended while the exchange ran, and cancelled the stream.
		if err == nil {
			return b, sent, false, nil
		}
		return nil, sent, false, err
	}
	return b, sent, err == nil, err
}

// close ends the stream.
func (ps *peerStream) close() {
	if ps.cancel != nil {
		ps.cancel()
	}
}

// takeIdle returns an idle stream to addr and true, or nil and false. When
// the connection is not ready, the idle streams were on a connection that
// has ended (they cannot outlive it), and are dropped.
func (t *GRPCTransport) takeIdle(addr string, cc *grpc.ClientConn) (*peerStream, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.idle[addr]
	if len(q) == 0 {
		return nil, false
	}
	if cc.GetState() != connectivity.Ready {
		for i, ps := range q {
			ps.close()
			q[i] = nil
		}
		t.idle[addr] = q[:0]
		return nil, false
	}
	ps := q[len(q)-1]
	q[len(q)-1] = nil
	t.idle[addr] = q[:len(q)-1]
	return ps, true
}

// putIdle keeps ps for the next exchange to addr, or closes it when enough
// are kept or the transport is closed.
func (t *GRPCTransport) putIdle(addr string, ps *peerStream) {
	t.mu.Lock()
	if !t.closed && t.conns[addr] != nil && len(t.idle[addr]) < maxIdleStreams {
		t.idle[addr] = append(t.idle[addr], ps)
		ps = nil
	}
	t.mu.Unlock()
	if ps != nil {
		ps.close()
	}
}

// isUnary reports whether addr's server has no Stream method.
func (t *GRPCTransport) isUnary(addr string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unary[addr]
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
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(clientKeepalive),
		grpc.WithConnectParams(connectParams),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(t.cfg.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(t.cfg.MaxMessageBytes)),
	}
	if t.cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(t.cfg.Dialer))
	}
	// Without idleness the goroutines of the connection (its balancer's and
	// resolver's serializers, which start the connect attempts and
	// transports) are all started here, under the label Close waits on; a
	// connection leaving idle would start new ones elsewhere. A peer's
	// connection is dropped by Disconnect when it leaves, not by idleness.
	opts = append(opts, grpc.WithIdleTimeout(0))
	var cc *grpc.ClientConn
	var err error
	golabel.Do(t.label, func() { cc, err = grpc.NewClient("passthrough:///"+addr, opts...) })
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
	idle := t.idle[addr]
	delete(t.idle, addr)
	delete(t.unary, addr)
	t.mu.Unlock()
	for _, ps := range idle {
		ps.close()
	}
	if cc != nil {
		_ = cc.Close()
	}
}

// Close implements Transport: it stops the server gracefully (batches being
// handled get ShutdownGrace to finish, then are cancelled; new ones are
// refused with Unavailable; peers' idle streams end), closes the listener
// and every client connection, and returns once no goroutine of the
// transport runs. Exchange calls in flight fail.
func (t *GRPCTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns, idle := t.conns, t.idle
	t.conns, t.idle = nil, nil
	var drained chan struct{}
	if t.active > 0 {
		t.drained = make(chan struct{})
		drained = t.drained
	}
	t.mu.Unlock()

	var errs []error
	for _, q := range idle {
		for _, ps := range q {
			ps.close()
		}
	}
	for _, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if drained != nil {
		timer := time.NewTimer(t.cfg.ShutdownGrace)
		select {
		case <-drained:
			timer.Stop()
		case <-timer.C:
		}
	}
	// No batch is being handled (or the grace is over): Stop ends the
	// connections, peers' idle streams with them, and waits for the
	// handlers to return (grpc.WaitForHandlers).
	t.srv.Stop()
	<-t.serveDone
	if t.serveErr != nil {
		errs = append(errs, t.serveErr)
	}
	if n := golabel.Wait(t.label, connWait); n > 0 {
		t.log.Warn("peer connection goroutines still running after close", "goroutines", n, "waited", connWait)
	}
	return errors.Join(errs...)
}

// SetInspector sets what answers peers' Inspect calls (an operator's
// identity lookup, Node.Inspect); until it is set they are answered
// Unimplemented. It is safe to call at any time.
func (t *GRPCTransport) SetInspector(f Inspector) { t.inspect.Store(&f) }

// Inspect asks the peer at addr for its BucketState of identity under
// rule (Coordinator.Inspect), bounded by ctx (or the ExchangeTimeout when
// ctx has no deadline). A peer that does not decide the rule answers with
// an error wrapping ErrUnknownRule; the other errors are Exchange's.
func (t *GRPCTransport) Inspect(ctx context.Context, addr, rule, identity string) (cluster.BucketState, error) {
	if err := checkKey("inspect", 0, rule, identity); err != nil {
		return cluster.BucketState{}, err
	}
	cc, err := t.conn(addr)
	if err != nil {
		return cluster.BucketState{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.ExchangeTimeout)
		defer cancel()
	}
	r, err := peerpb.NewPeerClient(cc).Inspect(ctx, &peerpb.InspectRequest{From: t.cfg.Self, Rule: rule, Identity: []byte(identity)})
	if err != nil {
		if st := status.Convert(err); st.Code() == codes.NotFound {
			return cluster.BucketState{}, fmt.Errorf("cluster: inspect at %s: %w: %s", addr, cluster.ErrUnknownRule, st.Message())
		}
		return cluster.BucketState{}, t.callError(ctx, addr, err)
	}
	st, err := decodeInspect(r)
	if err != nil {
		t.malformed.Add(1)
		return cluster.BucketState{}, fmt.Errorf("cluster: inspect at %s: %w: %w", addr, ErrMalformed, err)
	}
	return st, nil
}

// peerServer is the Peer service.
type peerServer struct {
	peerpb.UnimplementedPeerServer
	t *GRPCTransport
}

// Exchange validates the batch, runs the Handler and encodes its reply.
func (s peerServer) Exchange(ctx context.Context, b *peerpb.Batch) (*peerpb.Batch, error) {
	return s.t.serve(ctx, b)
}

// Stream answers each batch of the stream, in order, as Exchange would; an
// error (a malformed batch, a Handler error, the transport closing) ends
// the stream with its status.
func (s peerServer) Stream(ss peerpb.Peer_StreamServer) error {
	for {
		b, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		reply, err := s.t.serve(ss.Context(), b)
		if err != nil {
			return err
		}
		if err := ss.Send(reply); err != nil {
			return err
		}
	}
}

// Inspect answers an operator's lookup of one bucket with the Inspector.
func (s peerServer) Inspect(ctx context.Context, in *peerpb.InspectRequest) (*peerpb.InspectReply, error) {
	f := s.t.inspect.Load()
	if f == nil || *f == nil {
		return nil, status.Error(codes.Unimplemented, "cluster: this node answers no inspect calls")
	}
	if p := checkName("from", in.GetFrom(), cluster.MaxNodeNameBytes); p != "" {
		s.t.malformed.Add(1)
		return nil, status.Error(codes.InvalidArgument, "cluster: inspect: "+p)
	}
	if err := checkKey("inspect", 0, in.GetRule(), string(in.GetIdentity())); err != nil {
		s.t.malformed.Add(1)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st, err := (*f)(ctx, in.GetFrom(), in.GetRule(), string(in.GetIdentity()))
	if errors.Is(err, cluster.ErrUnknownRule) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Unknown, err.Error())
	}
	return encodeInspect(st), nil
}

// serve validates one batch, runs the Handler and encodes its reply; it
// refuses batches once Close has begun, and Close waits for those it let in.
func (t *GRPCTransport) serve(ctx context.Context, b *peerpb.Batch) (*peerpb.Batch, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "cluster: transport closing")
	}
	t.active++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.active--
		if t.active == 0 && t.drained != nil {
			close(t.drained)
			t.drained = nil
		}
		t.mu.Unlock()
	}()
	from, m, err := decodeBatch(b)
	if err != nil {
		t.malformed.Add(1)
		t.log.Debug("malformed batch rejected", "from", b.GetFrom(), "err", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	reply, err := t.cfg.Handler(ctx, from, m)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		return nil, status.Error(codes.Unknown, err.Error())
	}
	if reply == nil {
		reply = &cluster.Message{}
	}
	return encodeBatch(t.cfg.Self, reply), nil
}
