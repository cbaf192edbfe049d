// Package faultnet is a fault-injecting network for tests that run several
// weir nodes in one process: a switchboard that cuts the links between named
// hosts (isolate one host, partition two groups, heal), and the pieces the
// nodes' network traffic goes through so that a cut takes effect: a TCP
// dialer and listener per host and a wrapper for memberlist's transport.
//
// Every host has its own loopback address (127.0.0.2, 127.0.0.3, … all reach
// the loopback interface on Linux), so the switchboard tells the hosts apart
// by IP, whichever port a connection uses. A host's dialer binds its own
// address as the source, so that the listener on the other side knows the
// caller too.
//
// A cut is symmetric and enforced at both ends: dials across it are
// refused, connections across it that are open when it starts are closed
// (both ends: every connection a host's dialer opened and every connection
// its listener accepted is registered), new connections across it are
// refused by the accepting listener, and gossip datagrams across it are
// dropped at the sender. That is what a partition looks like to TCP and UDP
// users on a real network, minus the timeouts: a refused dial fails at
// once instead of after the dial timeout, which only makes failure
// detection faster.
//
// Addresses that belong to no host (127.0.0.1, the test's own clients) are
// never cut. The zero Net is not usable: call New.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrCut is returned (wrapped) by a dial across a cut.
var ErrCut = errors.New("faultnet: link cut")

// Net is the switchboard. Its methods are safe for concurrent use.
type Net struct {
	mu    sync.Mutex
	byIP  map[string]string  // ip → host name
	ips   map[string]string  // host name → ip
	cut   map[[2]string]bool // unordered pair, smaller name first
	conns map[*conn]struct{} // open connections between two hosts

	refused, dropped, closed atomic.Uint64
}

// New returns an empty switchboard with no host and no cut.
func New() *Net {
	return &Net{byIP: map[string]string{}, ips: map[string]string{}, cut: map[[2]string]bool{}, conns: map[*conn]struct{}{}}
}

// Host registers (or returns again) the host name at ip, which must be an
// IPv4 or IPv6 literal not used by another host.
func (n *Net) Host(name, ip string) (*Host, error) {
	p := net.ParseIP(ip)
	if p == nil {
		return nil, fmt.Errorf("faultnet: host %q: %q is not an IP address", name, ip)
	}
	ip = p.String()
	n.mu.Lock()
	defer n.mu.Unlock()
	if other, ok := n.byIP[ip]; ok && other != name {
		return nil, fmt.Errorf("faultnet: host %q: %s is already host %q", name, ip, other)
	}
	if old, ok := n.ips[name]; ok && old != ip {
		return nil, fmt.Errorf("faultnet: host %q is already at %s", name, old)
	}
	n.byIP[ip], n.ips[name] = name, ip
	return &Host{net: n, name: name, ip: p}, nil
}

// Stats counts what the switchboard did since New.
type Stats struct {
	// Refused counts dials and accepted connections refused across a cut.
	Refused uint64
	// Dropped counts gossip datagrams dropped across a cut.
	Dropped uint64
	// Closed counts open connections closed when a cut began.
	Closed uint64
}

// Stats returns the counts so far.
func (n *Net) Stats() Stats {
	return Stats{Refused: n.refused.Load(), Dropped: n.dropped.Load(), Closed: n.closed.Load()}
}

func pair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Partition cuts every link between a host of a and a host of b (adding to
// the cuts in force) and closes the connections open across them.
func (n *Net) Partition(a, b []string) {
	n.mu.Lock()
	for _, x := range a {
		for _, y := range b {
			if x != y {
				n.cut[pair(x, y)] = true
			}
		}
	}
	var doomed []*conn
	for c := range n.conns {
		if n.cut[pair(c.local, c.remote)] {
			doomed = append(doomed, c)
			delete(n.conns, c)
		}
	}
	n.mu.Unlock()
	for _, c := range doomed {
		n.closed.Add(1)
		_ = c.Conn.Close()
	}
}

// Isolate cuts host name from every other host.
func (n *Net) Isolate(name string) {
	n.Partition([]string{name}, n.Hosts())
}

// Heal removes every cut. Connections closed by a cut stay closed; their
// users dial again.
func (n *Net) Heal() {
	n.mu.Lock()
	clear(n.cut)
	n.mu.Unlock()
}

// Hosts returns the registered host names, sorted.
func (n *Net) Hosts() []string {
	n.mu.Lock()
	out := make([]string, 0, len(n.ips))
	for name := range n.ips {
		out = append(out, name)
	}
	n.mu.Unlock()
	sort.Strings(out)
	return out
}

// Blocked reports whether the link between hosts a and b is cut.
func (n *Net) Blocked(a, b string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[pair(a, b)]
}

// hostOf returns the host at addr's IP ("ip:port" or a bare IP), or "".
func (n *Net) hostOf(addr string) string {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if p := net.ParseIP(host); p != nil {
		host = p.String()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.byIP[host]
}

// admit registers the connection c between local and remote, or closes it
// and reports false when their link is cut. A connection to or from an
// address of no host is not registered (it is never cut).
func (n *Net) admit(c net.Conn, local, remote string) (net.Conn, bool) {
	if remote == "" || local == "" {
		return c, true
	}
	n.mu.Lock()
	if n.cut[pair(local, remote)] {
		n.mu.Unlock()
		n.refused.Add(1)
		_ = c.Close()
		return nil, false
	}
	w := &conn{Conn: c, net: n, local: local, remote: remote}
	n.conns[w] = struct{}{}
	n.mu.Unlock()
	return w, true
}

// conn is a registered connection between two hosts.
type conn struct {
	net.Conn
	net           *Net
	local, remote string
	once          sync.Once
}

// Close unregisters the connection and closes it.
func (c *conn) Close() error {
	c.once.Do(func() {
		c.net.mu.Lock()
		delete(c.net.conns, c)
		c.net.mu.Unlock()
	})
	return c.Conn.Close()
}

// Host is one named host of a Net, at its own IP address.
type Host struct {
	net  *Net
	name string
	ip   net.IP
}

// Name returns the host's name.
func (h *Host) Name() string { return h.name }

// IP returns the host's address as a string.
func (h *Host) IP() string { return h.ip.String() }

// Addr returns "ip:port" on the host's address (port 0 picks a free one
// when bound).
func (h *Host) Addr(port int) string {
	return net.JoinHostPort(h.ip.String(), fmt.Sprint(port))
}

// DialContext opens a TCP connection from the host's address to addr,
// refused with an error wrapping ErrCut when the link to addr's host is
// cut.
func (h *Host) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	remote := h.net.hostOf(addr)
	if remote != "" && h.net.Blocked(h.name, remote) {
		h.net.refused.Add(1)
		return nil, fmt.Errorf("faultnet: dial %s from %s: %w", addr, h.name, ErrCut)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: h.ip}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	w, ok := h.net.admit(c, h.name, remote)
	if !ok {
		return nil, fmt.Errorf("faultnet: dial %s from %s: %w", addr, h.name, ErrCut)
	}
	return w, nil
}

// DialTimeout is DialContext bounded by timeout (Raft's stream layer).
func (h *Host) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return h.DialContext(ctx, addr)
}

// Listen binds a TCP listener at addr (normally Addr(0)); the connections
// it accepts from a host whose link to this one is cut are closed at once,
// and the others are registered so that a later cut closes them.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: l, h: h}, nil
}

type listener struct {
	net.Listener
	h *Host
}

// Accept returns the next connection from a host not cut off.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if w, ok := l.h.net.admit(c, l.h.name, l.h.net.hostOf(c.RemoteAddr().String())); ok {
			return w, nil
		}
	}
}

// Gossip wraps the host's memberlist transport: datagrams to a host across
// a cut are dropped (reported as sent, as UDP would), stream dials to it are
// refused, and the streams it opens are registered so that a cut closes
// them.
func (h *Host) Gossip(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	return &gossip{NodeAwareTransport: t, h: h}
}

type gossip struct {
	memberlist.NodeAwareTransport
	h *Host
}

// WriteTo implements memberlist.Transport.
func (g *gossip) WriteTo(b []byte, addr string) (time.Time, error) {
	return g.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (g *gossip) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	if r := g.h.net.hostOf(addr.Addr); r != "" && g.h.net.Blocked(g.h.name, r) {
		g.h.net.dropped.Add(1)
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteToAddress(b, addr)
}

// DialTimeout implements memberlist.Transport.
func (g *gossip) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (g *gossip) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	r := g.h.net.hostOf(addr.Addr)
	if r != "" && g.h.net.Blocked(g.h.name, r) {
		g.h.net.refused.Add(1)
		return nil, fmt.Errorf("faultnet: gossip dial %s from %s: %w", addr.Addr, g.h.name, ErrCut)
	}
	c, err := g.NodeAwareTransport.DialAddressTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	w, ok := g.h.net.admit(c, g.h.name, r)
	if !ok {
		return nil, fmt.Errorf("faultnet: gossip dial %s from %s: %w", addr.Addr, g.h.name, ErrCut)
	}
	return w, nil
}
