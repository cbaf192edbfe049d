package shell

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/cluster"
)

// This file is the peer transport's interface and its in-memory
// implementation (the hashicorp/raft pattern: an interface at the I/O edge,
// a real implementation in transport_grpc.go and an in-memory one here for
// tests). Batching is the caller's job: the coordinator accumulates one
// Message per peer per round and the adapter sends it with one Exchange.

// Handler processes one batch from the peer named from and returns the reply
// batch for that peer (may be empty; nil is taken as empty). It is called
// concurrently, and must return soon after ctx is done: a transport's Close
// waits for running handlers.
type Handler func(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error)

// Transport sends one batch to a peer and returns the peer's reply.
type Transport interface {
	// Exchange sends m to the peer at addr and returns its reply. It honours
	// ctx's deadline. Exchange may be called concurrently; it does not keep
	// or modify m.
	Exchange(ctx context.Context, addr string, m *cluster.Message) (*cluster.Message, error)
	// Close stops serving and releases every connection. Exchange after
	// Close returns ErrTransportClosed.
	Close() error
}

var (
	// ErrUnreachable is wrapped by Exchange errors that mean the peer could
	// not be reached (down, refused, cut): nothing was delivered.
	ErrUnreachable = errors.New("cluster: peer unreachable")
	// ErrTransportClosed is returned by Exchange after Close.
	ErrTransportClosed = errors.New("cluster: transport closed")
	// ErrPeerHandler is wrapped by Exchange errors that the peer's Handler
	// returned (the batch was delivered and may have been acted on).
	ErrPeerHandler = errors.New("cluster: peer handler failed")
)

var (
	_ Transport = (*InmemTransport)(nil)
	_ Transport = (*GRPCTransport)(nil)
)

// InmemNetwork connects InmemTransports in one process. Every batch goes
// through the same encoding and validation as on the wire (encodeBatch,
// decodeBatch), so a malformed Message fails here as it would over gRPC.
// Faults are injected deterministically: Cut makes every call to or from an
// address fail at once with ErrUnreachable until Heal; SetDelay adds a fixed
// delay before each call is delivered. The zero value is not usable: use
// NewInmemNetwork.
type InmemNetwork struct {
	mu        sync.Mutex
	nodes     map[string]*InmemTransport
	cut       map[string]bool
	delay     map[string]time.Duration // by destination; "" = every call
	delivered atomic.Uint64
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{nodes: map[string]*InmemTransport{}, cut: map[string]bool{},
		delay: map[string]time.Duration{}}
}

// Transport registers a node under the name and address self (replacing any
// earlier one of that name) and returns its transport; h answers the batches
// sent to self.
func (n *InmemNetwork) Transport(self string, h Handler) *InmemTransport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &InmemTransport{net: n, self: self, h: h, ctx: ctx, cancel: cancel}
	n.mu.Lock()
	n.nodes[self] = t
	n.mu.Unlock()
	return t
}

// Cut makes every Exchange to or from addr fail with ErrUnreachable, before
// anything is delivered, until Heal(addr). Calls already delivered complete.
func (n *InmemNetwork) Cut(addr string) {
	n.mu.Lock()
	n.cut[addr] = true
	n.mu.Unlock()
}

// Heal undoes Cut(addr).
func (n *InmemNetwork) Heal(addr string) {
	n.mu.Lock()
	delete(n.cut, addr)
	n.mu.Unlock()
}

// SetDelay delays every call to addr by d before delivery (addr "" sets the
// delay of calls to addresses without their own). d = 0 removes it. A caller
// whose ctx ends during the delay gets ctx's error and nothing is delivered.
func (n *InmemNetwork) SetDelay(addr string, d time.Duration) {
	n.mu.Lock()
	if d <= 0 {
		delete(n.delay, addr)
	} else {
		n.delay[addr] = d
	}
	n.mu.Unlock()
}

// Delivered is the number of batches handed to a handler so far.
func (n *InmemNetwork) Delivered() uint64 { return n.delivered.Load() }

// route returns the destination of a call from→to and its delay.
func (n *InmemNetwork) route(from, to string) (*InmemTransport, time.Duration, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[from] || n.cut[to] {
		return nil, 0, fmt.Errorf("%w: %s: cut", ErrUnreachable, to)
	}
	dst := n.nodes[to]
	if dst == nil || dst.ctx.Err() != nil {
		return nil, 0, fmt.Errorf("%w: %s: no such node", ErrUnreachable, to)
	}
	d, ok := n.delay[to]
	if !ok {
		d = n.delay[""]
	}
	return dst, d, nil
}

// InmemTransport is one node's Transport on an InmemNetwork.
type InmemTransport struct {
	net       *InmemNetwork
	self      string
	h         Handler
	ctx       context.Context // done when closed
	cancel    context.CancelFunc
	running   sync.WaitGroup // handler goroutines
	mu        sync.Mutex     // orders running.Add against Close's Wait
	closed    bool
	malformed atomic.Uint64
}

// Addr is the address others reach this node at: its name.
func (t *InmemTransport) Addr() string { return t.self }

// Malformed is the number of batches this node rejected as malformed.
func (t *InmemTransport) Malformed() uint64 { return t.malformed.Load() }

// Exchange implements Transport. The handler runs on its own goroutine with
// a context that ends when the caller's does or either node closes, so a
// caller never waits past its deadline.
func (t *InmemTransport) Exchange(ctx context.Context, addr string, m *cluster.Message) (*cluster.Message, error) {
	if t.ctx.Err() != nil {
		return nil, ErrTransportClosed
	}
	dst, delay, err := t.net.route(t.self, addr)
	if err != nil {
		return nil, err
	}
	if delay > 0 {
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("cluster: exchange with %s: %w", addr, ctx.Err())
		case <-t.ctx.Done():
			timer.Stop()
			return nil, ErrTransportClosed
		}
		// A deadline that passed during the delay ends the call even when
		// the delay's timer won the race (a late-scheduled goroutine sees
		// both ready), as a network would have.
		if ctx.Err() != nil {
			return nil, fmt.Errorf("cluster: exchange with %s: %w", addr, ctx.Err())
		}
		// Faults injected during the delay apply to this call.
		if dst, _, err = t.net.route(t.self, addr); err != nil {
			return nil, err
		}
	}
	from, in, err := decodeBatch(encodeBatch(t.self, m))
	if err != nil {
		dst.malformed.Add(1)
		return nil, fmt.Errorf("cluster: exchange with %s: rejected: %w", addr, err)
	}
	type answer struct {
		m   *cluster.Message
		err error
	}
	done := make(chan answer, 1)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(dst.ctx, cancel)
	defer stop()
	if !dst.start() {
		return nil, fmt.Errorf("%w: %s: closed", ErrUnreachable, addr)
	}
	t.net.delivered.Add(1)
	go func() {
		defer dst.running.Done()
		r, err := dst.h(hctx, from, in)
		done <- answer{r, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			return nil, fmt.Errorf("cluster: exchange with %s: %w: %w", addr, ErrPeerHandler, a.err)
		}
		if a.m == nil {
			a.m = &cluster.Message{}
		}
		_, reply, err := decodeBatch(encodeBatch(addr, a.m))
		if err != nil {
			t.malformed.Add(1)
			return nil, fmt.Errorf("cluster: exchange with %s: malformed reply: %w", addr, err)
		}
		return reply, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("cluster: exchange with %s: %w", addr, ctx.Err())
	}
}

// start registers a handler goroutine unless t is closed.
func (t *InmemTransport) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.running.Add(1)
	return true
}

// Close implements Transport: it unregisters the node, cancels its running
// handlers and waits for them to return.
func (t *InmemTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.net.mu.Lock()
	if t.net.nodes[t.self] == t {
		delete(t.net.nodes, t.self)
	}
	t.net.mu.Unlock()
	t.running.Wait()
	return nil
}
