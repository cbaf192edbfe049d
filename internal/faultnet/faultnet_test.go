package faultnet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// echo serves l, echoing every connection, until l closes.
func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

func hosts(t *testing.T, n *Net, names ...string) []*Host {
	t.Helper()
	var out []*Host
	for i, name := range names {
		h, err := n.Host(name, net.IPv4(127, 0, 0, byte(100+i)).String())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func roundTrip(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	b := make([]byte, 1)
	_, err := io.ReadFull(c, b)
	return err
}

func TestPartitionClosesAndRefuses(t *testing.T) {
	n := New()
	hs := hosts(t, n, "a", "b", "c")
	a, b, c := hs[0], hs[1], hs[2]
	l, err := b.Listen("tcp", b.Addr(0))
	if err != nil {
		t.Skipf("cannot bind a second loopback address here: %v", err)
	}
	defer l.Close()
	go echo(l)
	ctx := context.Background()
	ab, err := a.DialContext(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer ab.Close()
	cb, err := c.DialContext(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if err := roundTrip(ab); err != nil {
		t.Fatalf("a→b before the cut: %v", err)
	}

	n.Isolate("a")
	if !n.Blocked("a", "b") || !n.Blocked("c", "a") || n.Blocked("b", "c") {
		t.Fatalf("Isolate(a): blocked a-b %v, c-a %v, b-c %v", n.Blocked("a", "b"), n.Blocked("c", "a"), n.Blocked("b", "c"))
	}
	if err := roundTrip(ab); err == nil {
		t.Fatal("a→b: the open connection still works across the cut")
	}
	if _, err := a.DialContext(ctx, l.Addr().String()); !errors.Is(err, ErrCut) {
		t.Fatalf("a→b dial across the cut: %v, want ErrCut", err)
	}
	if err := roundTrip(cb); err != nil {
		t.Fatalf("c→b is not cut: %v", err)
	}
	if s := n.Stats(); s.Closed == 0 || s.Refused == 0 {
		t.Fatalf("stats %+v: want a closed and a refused connection", s)
	}

	n.Heal()
	again, err := a.DialContext(ctx, l.Addr().String())
	if err != nil {
		t.Fatalf("a→b after Heal: %v", err)
	}
	defer again.Close()
	if err := roundTrip(again); err != nil {
		t.Fatalf("a→b after Heal: %v", err)
	}
}

func TestGossipDropsAcrossCut(t *testing.T) {
	n := New()
	hs := hosts(t, n, "a", "b")
	var ts []memberlist.NodeAwareTransport
	for _, h := range hs {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{h.IP()}, BindPort: 0})
		if err != nil {
			t.Skipf("cannot bind a second loopback address here: %v", err)
		}
		ts = append(ts, h.Gossip(nt))
	}
	defer func() {
		for _, tr := range ts {
			_ = tr.Shutdown()
		}
	}()
	_, port, err := ts[1].FinalAdvertiseAddr("", 0)
	if err != nil {
		t.Fatal(err)
	}
	to := memberlist.Address{Addr: hs[1].Addr(port)}
	recv := func() bool {
		select {
		case <-ts[1].PacketCh():
			return true
		case <-time.After(300 * time.Millisecond):
			return false
		}
	}
	if _, err := ts[0].WriteToAddress([]byte("ping"), to); err != nil {
		t.Fatal(err)
	}
	if !recv() {
		t.Fatal("a datagram a→b did not arrive with no cut")
	}
	n.Partition([]string{"a"}, []string{"b"})
	if _, err := ts[0].WriteToAddress([]byte("ping"), to); err != nil {
		t.Fatal(err)
	}
	if recv() {
		t.Fatal("a datagram crossed the cut")
	}
	if _, err := ts[0].DialAddressTimeout(to, time.Second); !errors.Is(err, ErrCut) {
		t.Fatalf("stream dial across the cut: %v, want ErrCut", err)
	}
	if s := n.Stats(); s.Dropped != 1 {
		t.Fatalf("dropped %d datagrams, want 1", s.Dropped)
	}
}
