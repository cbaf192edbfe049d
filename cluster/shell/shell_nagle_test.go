package shell

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/quota"
)

// countingTransport delays every exchange by delay before passing it on and
// counts the exchanges and the decides they carry.
type countingTransport struct {
	Transport
	delay              time.Duration
	exchanges, decides atomic.Int64
}

func (c *countingTransport) Exchange(ctx context.Context, addr string, m *cluster.Message) (*cluster.Message, error) {
	c.exchanges.Add(1)
	c.decides.Add(int64(len(m.Decides)))
	if c.delay > 0 {
		t := time.NewTimer(c.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	return c.Transport.Exchange(ctx, addr, m)
}

// nagleCluster starts two nodes over gRPC on loopback whose linger and tick
// interval are far longer than the test, so that only the Node's Nagle
// sending can carry a forwarded decision (neither the flusher's linger nor
// the ticker's flush ever fires). Exchanges from gw-0 go through a
// countingTransport with the given delay.
func nagleCluster(t *testing.T, delay time.Duration) ([]*testNode, *countingTransport, []string) {
	t.Helper()
	var ct *countingTransport
	rule := gcraRule("api", quota.ModeExact, 1_000_000, time.Second, 1_000_000)
	nodes := startGRPCClusterWith(t, 2, func(c *Config) {
		c.Linger = time.Hour
		c.TickInterval = time.Hour
		if c.Coordinator.Self == "gw-0" {
			ct = &countingTransport{Transport: c.Transport, delay: delay}
			c.Transport = ct
		}
	}, rule)
	// Each node's SetRing sent the other a handed-over marker; a reply may
	// carry what the replying node had queued, so the test starts once
	// both exchanges are done, and counts from there.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, sent0, _ := nodes[0].shell.Stats()
		_, sent1, _ := nodes[1].shell.Stats()
		if sent0 >= 1 && sent1 >= 1 && idleLinks(nodes[0].shell) && idleLinks(nodes[1].shell) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the nodes' first exchanges did not complete")
		}
		time.Sleep(time.Millisecond)
	}
	ct.exchanges.Store(0)
	ct.decides.Store(0)
	ring := nodes[0].shell.Ring()
	var theirs []string
	for i := 0; len(theirs) < 64; i++ {
		if id := fmt.Sprintf("id-%d", i); ring.OwnerName(id) == "gw-1" {
			theirs = append(theirs, id)
		}
	}
	return nodes, ct, theirs
}

// TestShellSendsAtOnceWhenIdle: with no exchange in flight, a decision that
// needs its owner is sent at once, not after the linger.
func TestShellSendsAtOnceWhenIdle(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the nodes' cleanup
	nodes, ct, theirs := nagleCluster(t, 0)
	for _, id := range theirs[:5] {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		o, err := nodes[0].shell.Decide(ctx, "api", id, 1)
		cancel()
		if err != nil || !o.Allowed || o.Degraded || o.Source != cluster.SourceRemote {
			t.Fatalf("%s: allowed=%v degraded=%v source=%v err=%v", id, o.Allowed, o.Degraded, o.Source, err)
		}
	}
	if n := ct.exchanges.Load(); n != 5 {
		t.Errorf("%d exchanges for 5 sequential forwarded decisions, want 5 (one each)", n)
	}
	for _, tn := range nodes {
		if st, _, failed := tn.shell.Stats(); st.Degraded != 0 || failed != 0 {
			t.Errorf("%s: %d degraded, %d failed exchanges with no fault", tn.name, st.Degraded, failed)
		}
	}
}

// TestShellBatchesWhileInFlight: decisions that queue while an exchange is
// in flight leave together when it returns (not after the linger), so a
// burst costs fewer exchanges than decisions.
func TestShellBatchesWhileInFlight(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	nodes, ct, theirs := nagleCluster(t, 50*time.Millisecond)
	var wg sync.WaitGroup
	for _, id := range theirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			o, err := nodes[0].shell.Decide(ctx, "api", id, 1)
			if err != nil || !o.Allowed || o.Degraded || o.Source != cluster.SourceRemote {
				t.Errorf("%s: allowed=%v degraded=%v source=%v err=%v", id, o.Allowed, o.Degraded, o.Source, err)
			}
		}()
	}
	wg.Wait()
	ex, dec := ct.exchanges.Load(), ct.decides.Load()
	if dec != int64(len(theirs)) {
		t.Errorf("%d decides sent for %d forwarded decisions", dec, len(theirs))
	}
	if ex >= dec {
		t.Errorf("%d exchanges for %d decides: nothing was batched behind the exchange in flight", ex, dec)
	}
	t.Logf("%d decisions in %d exchanges", dec, ex)
	for _, tn := range nodes {
		if st, _, failed := tn.shell.Stats(); st.Degraded != 0 || failed != 0 {
			t.Errorf("%s: %d degraded, %d failed exchanges with no fault", tn.name, st.Degraded, failed)
		}
	}
}

// idleLinks reports whether sh has no exchange in flight.
func idleLinks(sh *Node) bool {
	sh.lkMu.Lock()
	defer sh.lkMu.Unlock()
	return sh.lk.Busy() == 0
}
