package cluster

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/quota"
)

// testNode is one shell over the real gRPC transport on loopback.
type testNode struct {
	name  string
	shell *Shell
	tr    *GRPCTransport
}

func startGRPCCluster(t *testing.T, n int, rules ...quota.Rule) []*testNode {
	t.Helper()
	var nodes []*testNode
	var members []Member
	for i := range n {
		name := fmt.Sprintf("gw-%d", i)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tn := &testNode{name: name}
		tr, err := NewGRPCTransport(GRPCConfig{Self: name, Listener: ln,
			Handler: func(ctx context.Context, from string, m *Message) (*Message, error) {
				return tn.shell.Handle(ctx, from, m)
			}})
		if err != nil {
			t.Fatal(err)
		}
		tn.tr = tr
		// Generous timeouts: CI runs this with -race on a loaded 2-core box.
		sh, err := NewShell(ShellConfig{Coordinator: CoordinatorConfig{Self: name, DecideTimeout: time.Second},
			Transport: tr, CallTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		tn.shell = sh
		nodes = append(nodes, tn)
		members = append(members, Member{Name: name, Addr: tr.Addr()})
	}
	ring, err := NewRing(1, members)
	if err != nil {
		t.Fatal(err)
	}
	params := ruleParams(t, rules)
	for _, tn := range nodes {
		tn.shell.SetRules(params)
		tn.shell.SetRing(ring)
	}
	t.Cleanup(func() {
		for _, tn := range nodes {
			tn.shell.Close()
			tn.tr.Close()
		}
	})
	return nodes
}

// TestShellOverGRPC: three nodes on loopback gRPC limit one identity as one
// limiter: a client spread round-robin at about 3× the rate is admitted no
// more than B + r·Δ + S over the run (and close to r·Δ), and nothing is
// degraded when no fault is injected.
func TestShellOverGRPC(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, mode := range []quota.Mode{quota.ModeShared, quota.ModeExact} {
		t.Run(string(mode), func(t *testing.T) {
			rule := gcraRule("api", mode, 200, time.Second, 20)
			nodes := startGRPCCluster(t, 3, rule)
			p, _ := NewRuleParams(&rule, 1)
			var S int64
			if mode == quota.ModeShared {
				S = 2 * p.Slack(3)
			}
			const run = 1500 * time.Millisecond
			var mu sync.Mutex
			admitted := 0
			var wg sync.WaitGroup
			start := time.Now()
			for _, tn := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(5 * time.Millisecond) // 200/s per node: 3× the rate in all
					defer tick.Stop()
					for time.Since(start) < run {
						<-tick.C
						o, err := tn.shell.Decide(context.Background(), "api", "customer-7", 1)
						if err != nil {
							t.Error(err)
							return
						}
						if o.Allowed {
							mu.Lock()
							admitted++
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			upper := float64(rule.Burst+S) + 200*elapsed.Seconds()
			if float64(admitted) > upper+1 {
				t.Errorf("admitted %d in %v, above B + r·Δ + S = %.0f", admitted, elapsed, upper)
			}
			// A loose lower bound only: wall-clock scheduling on a loaded
			// machine is not the simulator.
			if float64(admitted) < 0.7*200*run.Seconds() {
				t.Errorf("admitted %d in %v: far below r·Δ = %.0f", admitted, elapsed, 200*run.Seconds())
			}
			for _, tn := range nodes {
				st, sent, failed := tn.shell.Stats()
				if st.Degraded != 0 || failed != 0 {
					t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", tn.name, st.Degraded, failed)
				}
				t.Logf("%s: local %d, forwarded %d, view rejects %d, syncs %d, exchanges %d", tn.name, st.LocalAdmits, st.Forwarded, st.ViewRejects, st.SyncsSent, sent)
			}
			t.Logf("admitted %d in %v (r·Δ = %.0f, bound %.0f)", admitted, elapsed, 200*elapsed.Seconds(), upper)
		})
	}
}

// TestShellOwnerDown: when the owner stops answering, callers get no error:
// after the breaker opens, decisions are made by on_failure and marked
// degraded; the degraded count equals the decisions made so.
func TestShellOwnerDown(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the cluster's own cleanup
	rule := gcraRule("api", quota.ModeExact, 300, time.Second, 30)
	nodes := startGRPCCluster(t, 3, rule)
	id := "customer-9"
	owner := nodes[0].shell.Ring().OwnerName(id)
	var caller *testNode
	for _, tn := range nodes {
		if tn.name == owner {
			tn.shell.Close()
			tn.tr.Close()
		} else {
			caller = tn
		}
	}
	degraded, admitted := 0, 0
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 200 && time.Now().Before(deadline); i++ {
		o, err := caller.shell.Decide(context.Background(), "api", id, 1)
		if err != nil {
			t.Fatalf("decision %d: %v (callers must see no error)", i, err)
		}
		if o.Degraded {
			degraded++
		}
		if o.Allowed {
			admitted++
		}
	}
	st, _, failed := caller.shell.Stats()
	if degraded == 0 || failed == 0 {
		t.Fatalf("owner down: %d degraded decisions, %d failed exchanges", degraded, failed)
	}
	if uint64(degraded) != st.Degraded {
		t.Errorf("degraded decisions seen %d, counted %d", degraded, st.Degraded)
	}
	// on_failure local: limit ÷ 3 nodes = 100/s with burst 10 on this node.
	if admitted > 10+100*5 {
		t.Errorf("admitted %d while the owner was down", admitted)
	}
	t.Logf("owner down: %d decisions degraded, %d admitted, %d exchanges failed", degraded, admitted, failed)
}
