package shell

import (
	"context"
	"errors"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// errGossipClosed is what gossipTransport answers once it is shut down.
var errGossipClosed = errors.New("cluster: gossip transport is shut down")

// gossipTransport is memberlist's UDP and TCP transport (a NetTransport)
// with what memberlist's own lacks for a Close that waits: it keeps every
// TCP connection it hands memberlist, dialed or accepted, and on Shutdown
// closes them and refuses new dials and sends, so that memberlist's stream
// handlers, push/pulls and TCP pings end at once instead of at their
// TCPTimeout deadlines. Its one goroutine (handing accepted connections on)
// has ended when Shutdown returns.
type gossipTransport struct {
	nt *memberlist.NetTransport

	ctx    context.Context // cancelled by Shutdown: dials in flight stop
	cancel context.CancelFunc
	shut   atomic.Bool
	once   sync.Once

	mu    sync.Mutex
	conns map[*gossipConn]struct{} // open connections handed to memberlist

	streams chan net.Conn // accepted connections, to memberlist
	down    chan struct{} // closed when Shutdown begins
	fwdDone chan struct{} // closed when the forwarding goroutine ends
	ntDone  chan struct{} // closed when the NetTransport has shut down
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)

// newGossipTransport binds a NetTransport on ip:port; port 0 picks a free
// port for TCP and UDP both, retried as memberlist does when the port it got
// for TCP is taken for UDP.
func newGossipTransport(ip string, port int, logger *log.Logger) (*gossipTransport, error) {
	tries := 1
	if port == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{ip}, BindPort: port, Logger: logger})
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &gossipTransport{nt: nt, ctx: ctx, cancel: cancel,
		conns:   make(map[*gossipConn]struct{}),
		streams: make(chan net.Conn),
		down:    make(chan struct{}),
		fwdDone: make(chan struct{}),
		ntDone:  make(chan struct{}),
	}
	go t.forward()
	return t, nil
}

// port returns the port bound, TCP and UDP.
func (t *gossipTransport) port() int { return t.nt.GetAutoBindPort() }

// FinalAdvertiseAddr is the NetTransport's.
func (t *gossipTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.nt.FinalAdvertiseAddr(ip, port)
}

// WriteTo sends a packet; after Shutdown it fails without touching a socket.
func (t *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends a packet; after Shutdown it fails without touching a
// socket.
func (t *gossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.shut.Load() {
		return time.Now(), errGossipClosed
	}
	return t.nt.WriteToAddress(b, a)
}

// PacketCh is the NetTransport's.
func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet { return t.nt.PacketCh() }

// DialTimeout opens a stream; see DialAddressTimeout.
func (t *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream to a.Addr within timeout. A dial in
// flight when Shutdown begins fails at once, and so does every dial after.
func (t *gossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.shut.Load() {
		return nil, errGossipClosed
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.ctx, "tcp", a.Addr)
	if err != nil {
		if t.shut.Load() {
			return nil, errGossipClosed
		}
		return nil, err
	}
	gc, ok := t.track(c)
	if !ok {
		return nil, errGossipClosed
	}
	return gc, nil
}

// StreamCh delivers accepted connections.
func (t *gossipTransport) StreamCh() <-chan net.Conn { return t.streams }

// forward hands the NetTransport's accepted connections to memberlist,
// tracked. It drains the NetTransport until that has shut down (its
// listener blocks handing a connection over), closing what arrives once
// Shutdown has begun.
func (t *gossipTransport) forward() {
	defer close(t.fwdDone)
	for {
		select {
		case c := <-t.nt.StreamCh():
			gc, ok := t.track(c)
			if !ok {
				continue
			}
			select {
			case t.streams <- gc:
			case <-t.down:
				_ = gc.Close()
			}
		case <-t.ntDone:
			return
		}
	}
}

// track registers c as open, or closes it if Shutdown has begun.
func (t *gossipTransport) track(c net.Conn) (*gossipConn, bool) {
	gc := &gossipConn{Conn: c, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.shut.Load() {
		_ = c.Close()
		return nil, false
	}
	t.conns[gc] = struct{}{}
	return gc, true
}

// Shutdown stops the listeners, cancels dials in flight, closes every
// connection handed out and waits for the transport's goroutines. It is
// idempotent. memberlist calls it first in its own Shutdown, while its
// goroutines still run; they then end quickly, as every read, write and dial
// of theirs fails.
func (t *gossipTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		t.mu.Lock()
		t.shut.Store(true)
		open := make([]*gossipConn, 0, len(t.conns))
		for c := range t.conns {
			open = append(open, c)
		}
		t.mu.Unlock()
		close(t.down)
		t.cancel()
		for _, c := range open {
			_ = c.Close()
		}
		err = t.nt.Shutdown() // waits for its listener goroutines
		close(t.ntDone)
		<-t.fwdDone
	})
	return err
}

// gossipConn is a connection memberlist holds, untracked when it closes.
type gossipConn struct {
	net.Conn
	t    *gossipTransport
	once sync.Once
}

func (c *gossipConn) Close() error {
	var err error
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}
