package shell

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"go.uber.org/goleak"
)

// callLimit bounds every call that should succeed (CI is a loaded 2-core
// machine running -race).
const callLimit = 5 * time.Second

// checkTransportLeaks verifies, after every other cleanup of t has run, that
// no goroutine is left behind, retrying for a while first: gRPC's transport
// goroutines end shortly after Close returns.
func checkTransportLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for goleak.Find() != nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		goleak.VerifyNone(t)
	})
}

// echo answers every batch with the batch itself and counts the calls.
func echo(calls *atomic.Int64) Handler {
	return func(_ context.Context, _ string, m *cluster.Message) (*cluster.Message, error) {
		calls.Add(1)
		return m, nil
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestInmemRoundTrip(t *testing.T) {
	checkTransportLeaks(t)
	n := NewInmemNetwork()
	var gotFrom atomic.Value
	a := n.Transport("a", echo(new(atomic.Int64)))
	b := n.Transport("b", func(_ context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
		gotFrom.Store(from)
		return m, nil
	})
	t.Cleanup(func() { a.Close(); b.Close() })
	want := fullMessage()
	got, err := a.Exchange(callCtx(t), b.Addr(), want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reply:\n got %+v\nwant %+v", got, want)
	}
	if gotFrom.Load() != "a" {
		t.Errorf("handler saw from %v, want a", gotFrom.Load())
	}
	if n.Delivered() != 1 {
		t.Errorf("Delivered = %d, want 1", n.Delivered())
	}
}

func TestInmemCutHeal(t *testing.T) {
	n, a, _, calls := inmemPair(t)
	m := &cluster.Message{Epoch: 1}

	for _, cut := range []string{"b", "a"} { // cutting either end cuts the link
		n.Cut(cut)
		start := time.Now()
		_, err := a.Exchange(callCtx(t), "b", m)
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("cut %s: err = %v, want ErrUnreachable", cut, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("cut %s: failing took %v, want at once", cut, d)
		}
		if calls.Load() != 0 {
			t.Fatalf("cut %s: handler ran", cut)
		}
		n.Heal(cut)
	}
	if _, err := a.Exchange(callCtx(t), "b", m); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	if calls.Load() != 1 {
		t.Errorf("handler calls = %d, want 1", calls.Load())
	}
	if _, err := a.Exchange(callCtx(t), "nobody", m); !errors.Is(err, ErrUnreachable) {
		t.Errorf("unknown address: err = %v, want ErrUnreachable", err)
	}
}

func TestInmemDelay(t *testing.T) {
	n, a, b, calls := inmemPair(t)

	n.SetDelay("b", 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := a.Exchange(ctx, "b", &cluster.Message{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline inside the delay: err = %v, want DeadlineExceeded", err)
	}
	if calls.Load() != 0 {
		t.Fatal("a call that timed out during its delay was delivered")
	}
	start := time.Now()
	if _, err := a.Exchange(callCtx(t), "b", &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("delayed call took %v, want >= 50ms", d)
	}
	// The delay is per destination: calls to a are not delayed.
	start = time.Now()
	if _, err := b.Exchange(callCtx(t), "a", &cluster.Message{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= 50*time.Millisecond {
		t.Errorf("undelayed call took %v", d)
	}
}

func TestInmemHandlerErrorAndDeadline(t *testing.T) {
	checkTransportLeaks(t)
	n := NewInmemNetwork()
	boom := errors.New("boom")
	a := n.Transport("a", echo(new(atomic.Int64)))
	bad := n.Transport("bad", func(context.Context, string, *cluster.Message) (*cluster.Message, error) { return nil, boom })
	slow := n.Transport("slow", func(ctx context.Context, _ string, _ *cluster.Message) (*cluster.Message, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	empty := n.Transport("empty", func(context.Context, string, *cluster.Message) (*cluster.Message, error) { return nil, nil })
	t.Cleanup(func() { a.Close(); bad.Close(); slow.Close(); empty.Close() })

	if _, err := a.Exchange(callCtx(t), "bad", &cluster.Message{}); !errors.Is(err, ErrPeerHandler) || !errors.Is(err, boom) {
		t.Errorf("handler error: err = %v, want ErrPeerHandler and boom", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := a.Exchange(ctx, "slow", &cluster.Message{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("blocking handler: err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("blocking handler: Exchange returned after %v", d)
	}
	r, err := a.Exchange(callCtx(t), "empty", &cluster.Message{Epoch: 3})
	if err != nil || r == nil || !r.Empty() {
		t.Errorf("nil reply: got %+v, %v; want an empty Message", r, err)
	}
}

func TestInmemMalformedAndClose(t *testing.T) {
	_, a, b, calls := inmemPair(t)

	bad := &cluster.Message{Decides: []cluster.DecideItem{{Ticket: 1, Rule: "r", Identity: "i", Cost: -1}}}
	if _, err := a.Exchange(callCtx(t), "b", bad); !errors.Is(err, ErrMalformed) {
		t.Errorf("negative cost: err = %v, want ErrMalformed", err)
	}
	if b.Malformed() != 1 || calls.Load() != 0 {
		t.Errorf("Malformed = %d, handler calls = %d; want 1, 0", b.Malformed(), calls.Load())
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exchange(callCtx(t), "b", &cluster.Message{}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("to a closed node: err = %v, want ErrUnreachable", err)
	}
	if _, err := b.Exchange(callCtx(t), "a", &cluster.Message{}); !errors.Is(err, ErrTransportClosed) {
		t.Errorf("from a closed node: err = %v, want ErrTransportClosed", err)
	}
}

// TestInmemCloseCancelsHandlers: Close ends a handler blocked on its ctx and
// the blocked caller gets an error, not a hang.
func TestInmemCloseCancelsHandlers(t *testing.T) {
	checkTransportLeaks(t)
	n := NewInmemNetwork()
	started := make(chan struct{})
	a := n.Transport("a", echo(new(atomic.Int64)))
	b := n.Transport("b", func(ctx context.Context, _ string, _ *cluster.Message) (*cluster.Message, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	t.Cleanup(func() { a.Close() })
	errc := make(chan error, 1)
	go func() {
		_, err := a.Exchange(callCtx(t), "b", &cluster.Message{})
		errc <- err
	}()
	<-started
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Exchange succeeded against a closed node")
		}
	case <-time.After(callLimit):
		t.Fatal("Exchange hung after the peer closed")
	}
}

// inmemPair starts two echoing in-memory transports, "a" and "b", on a new
// network, checks for leaked goroutines at the end, and returns the network,
// both transports, and the count of handler calls on either.
func inmemPair(t *testing.T) (*InmemNetwork, *InmemTransport, *InmemTransport, *atomic.Int64) {
	t.Helper()
	checkTransportLeaks(t)
	n := NewInmemNetwork()
	calls := new(atomic.Int64)
	a := n.Transport("a", echo(calls))
	b := n.Transport("b", echo(calls))
	t.Cleanup(func() { a.Close(); b.Close() })
	return n, a, b, calls
}
