package weir_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
)

// The global rule of these tests: L = 200 tokens per second, B = 40,
// accuracy 0.05 over 2 regions (slack ⌊0.05·200 ÷ (2·N)⌋ per node of a
// region of N).
const globalRuleYAML = `
rules:
  - id: world
    key: [header:X-Customer]
    limit: 200
    window: 1s
    burst: 40
    scope: global
    mode: shared
`

const (
	globalL = 200
	globalB = 40
	// globalExcess is Σ over regions of nodes × slack: region a (2 nodes)
	// 2 × 2, region b (1 node) 1 × 5; at most a·L = 10.
	globalExcess = 9
)

// globalRegions is two regions of one cluster's gossip, a (gw-a1, the one
// voter of the lease group, and gw-a2, a client) and b (gw-b1, a client),
// with the global rule in force on all three.
type globalRegions struct {
	a1, a2, b1 *weir.Node
	regs       map[*weir.Node]*prometheus.Registry
}

func (g *globalRegions) all() []*weir.Node { return []*weir.Node{g.a1, g.a2, g.b1} }

func startGlobalRegions(t *testing.T) *globalRegions {
	t.Helper()
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	raftLis, rpcLis := listen(), listen()
	machine := lease.Config{Regions: []string{"a", "b"}, LeaseDuration: 2 * time.Second, MaxSkew: 100 * time.Millisecond}
	g := &globalRegions{regs: map[*weir.Node]*prometheus.Registry{}}
	var nodes []*weir.Node
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	start := func(name, region string, lc *weir.LeaseConfig) *weir.Node {
		cc := &weir.ClusterConfig{Name: name, Region: region, LocalTiming: true, Label: "global-lease",
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second}
		if len(nodes) > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		lc.Rules, lc.RefreshInterval, lc.Machine = true, 200*time.Millisecond, machine
		reg := prometheus.NewRegistry()
		n, err := weir.New(weir.Config{Cluster: cc, Lease: lc, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		g.regs[n] = reg
		return n
	}
	g.a1 = start("gw-a1", "a", &weir.LeaseConfig{Voter: &raftgroup.Config{Name: "gw-a1", Dir: t.TempDir(),
		Voters: []raftgroup.Voter{{Name: "gw-a1"}}, RaftListener: raftLis, RPCListener: rpcLis, Machine: machine,
		HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond, LeaderLeaseTimeout: 75 * time.Millisecond},
		AdminTokens: map[string]string{adminToken: "alice"}})
	voters := []string{weir.LeaseGroupOf(g.a1).RPCAddr()}
	g.a2 = start("gw-a2", "a", &weir.LeaseConfig{Voters: voters, CheckInterval: 100 * time.Millisecond})
	g.b1 = start("gw-b1", "b", &weir.LeaseConfig{Voters: voters, CheckInterval: 100 * time.Millisecond})
	waitFor(t, func() bool {
		return len(ops.Members(g.a1)) == 2 && len(ops.Members(g.a2)) == 2 && len(ops.Members(g.b1)) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rules := parseRules(t, globalRuleYAML)
	if _, err := weir.LeaseGroupOf(g.a1).PutRule(ctx, "alice", rules[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, n := range g.all() {
			if n.Status().RulesVersion < 1 || !ops.GlobalStatus(n).Leasing {
				return false
			}
		}
		return true
	})
	return g
}

// drive sends requests of customer to each node every `every` until stop
// is closed, counting admissions per node.
func drive(nodes []*weir.Node, customer string, every time.Duration, stop <-chan struct{}, admitted []atomic.Int64, wg *sync.WaitGroup) {
	req := weir.Request{Method: "GET", Path: "/", Header: http.Header{"X-Customer": {customer}}}
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if n.Allow(context.Background(), req).Allowed {
						admitted[i].Add(1)
					}
				}
			}
		}()
	}
}

// run drives nodes for d and returns the admissions per node and the time
// it really took.
func run(nodes []*weir.Node, customer string, d time.Duration) ([]int64, time.Duration) {
	admitted := make([]atomic.Int64, len(nodes))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	drive(nodes, customer, 2*time.Millisecond, stop, admitted, &wg)
	time.Sleep(d)
	close(stop)
	wg.Wait()
	el := time.Since(t0)
	out := make([]int64, len(nodes))
	for i := range admitted {
		out[i] = admitted[i].Load()
	}
	return out, el
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// envelope is the global envelope over elapsed: B + L·Δ/W + Σ nodes × slack.
func envelope(elapsed time.Duration) int64 {
	return globalB + int64(float64(globalL)*elapsed.Seconds()) + 1 + globalExcess
}

// regionStatus sums the world rule's status over a region's nodes (the
// customer's owner holds it).
func regionStatus(nodes ...*weir.Node) (leased, fallback int, share int64) {
	for _, n := range nodes {
		for _, r := range ops.GlobalStatus(n).Rules {
			if r.Rule == "world" {
				leased += r.Leased
				fallback += r.Fallback
				share += r.Share
			}
		}
	}
	return
}

func noFailOpen(t *testing.T, nodes []*weir.Node) {
	t.Helper()
	if n := failOpen(nodes, "world"); n != 0 {
		t.Fatalf("%d decisions failed open in a run with no fault", n)
	}
}

// TestGlobalLeaseTwoRegions drives one customer of a global rule in two
// regions: the total admitted stays inside the global envelope; then the
// demand moves to region b alone and b's share grows to take the limit.
func TestGlobalLeaseTwoRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a lease group and three gateways")
	}
	g := startGlobalRegions(t)
	nodes := g.all()

	// Both regions ask 500/s per node, far above L = 200/s.
	r0 := ops.GlobalStatus(g.a1).Reports + ops.GlobalStatus(g.a2).Reports + ops.GlobalStatus(g.b1).Reports
	adm, el := run(nodes, "c1", 3*time.Second)
	r1 := ops.GlobalStatus(g.a1).Reports + ops.GlobalStatus(g.a2).Reports + ops.GlobalStatus(g.b1).Reports
	t.Logf("lease refresh traffic: %d reports from 3 nodes in %v = %.1f per second per region (refresh 200ms, one identity)",
		r1-r0, el.Round(time.Millisecond), float64(r1-r0)/el.Seconds()/2)
	total := sum(adm)
	t.Logf("both regions: admitted %v = %d in %v; envelope %d (B + L·Δ/W + Σ N·s)", adm, total, el.Round(time.Millisecond), envelope(el))
	if total > envelope(el) {
		t.Fatalf("admitted %d > envelope %d over %v", total, envelope(el), el)
	}
	if lo := int64(globalL * el.Seconds() / 2); total < lo {
		t.Fatalf("admitted %d < %d: the regions hardly enforce a share", total, lo)
	}
	if adm[0]+adm[1] == 0 || adm[2] == 0 {
		t.Fatalf("a region admitted nothing: %v", adm)
	}
	la, _, sa := regionStatus(g.a1, g.a2)
	lb, _, sb := regionStatus(g.b1)
	t.Logf("shares: a %d, b %d (leased keys %d, %d)", sa, sb, la, lb)
	if la != 1 || lb != 1 || sa+sb > globalL {
		t.Fatalf("leases: a %d keys share %d, b %d keys share %d", la, sa, lb, sb)
	}
	noFailOpen(t, nodes)

	// The demand moves to b: b's share grows to (nearly) the whole limit.
	admitted := make([]atomic.Int64, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	drive([]*weir.Node{g.b1}, "c1", 2*time.Millisecond, stop, admitted, &wg)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, sb := regionStatus(g.b1); sb >= globalL*9/10 {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			_, _, sb := regionStatus(g.b1)
			t.Fatalf("b's share is %d after 20s alone in demand, want ≥ %d", sb, globalL*9/10)
		}
		time.Sleep(20 * time.Millisecond)
	}
	follow := time.Since(t0)
	close(stop)
	wg.Wait()
	_, _, sb = regionStatus(g.b1)
	t.Logf("capacity followed demand: b's share %d (≥ 0.9 L) %v after the demand moved (refresh 200ms, lease 2s)", sb, follow.Round(time.Millisecond))
	if v := gatherValue(t, g.regs[g.b1], "weir_global_share", map[string]string{"rule": "world"}); v < globalL*9/10 {
		t.Fatalf("weir_global_share{rule=world} on b = %v", v)
	}
	if v := gatherValue(t, g.regs[g.b1], "weir_global_reports_total", map[string]string{"outcome": "ok"}); v == 0 {
		t.Fatal("b, a client of the lease group, reported nothing through Client.Report")
	}
	// The status page's view of it (ops.LeaseShares): b's share as a rate.
	var rate float64
	for _, gl := range ops.LeaseShares(g.b1) {
		for _, sh := range gl.Shares {
			if gl.Rule == "world" && sh.Region == "b" {
				rate = sh.Rate
			}
		}
	}
	if rate < globalL*9/10 {
		t.Fatalf("the page shows b's share of world at %v/s, want ≥ 0.9 L", rate)
	}
	noFailOpen(t, nodes)
}

// TestGlobalLeaseGroupStopped stops the lease group: every region falls back
// (the metric shows it) and the total stays within Σ fallback ≤ L.
func TestGlobalLeaseGroupStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a lease group and three gateways")
	}
	g := startGlobalRegions(t)
	nodes := g.all()
	adm, el := run(nodes, "c2", 1500*time.Millisecond)
	if total := sum(adm); total > envelope(el) {
		t.Fatalf("before the stop: admitted %d > envelope %d", total, envelope(el))
	}
	if err := weir.LeaseGroupOf(g.a1).Close(); err != nil {
		t.Fatal(err)
	}
	// Keep the demand up until the leases (2s) have expired everywhere.
	admitted := make([]atomic.Int64, len(nodes))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	drive(nodes, "c2", 2*time.Millisecond, stop, admitted, &wg)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, fa, _ := regionStatus(g.a1, g.a2)
		_, fb, _ := regionStatus(g.b1)
		if fa == 1 && fb == 1 {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("regions not on their fallback 20s after the lease group stopped: a %d, b %d", fa, fb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if v := gatherValue(t, g.regs[g.b1], "weir_global_fallback", map[string]string{"rule": "world"}); v != 1 {
		t.Fatalf("weir_global_fallback{rule=world} on b = %v, want 1", v)
	}
	if v := gatherValue(t, g.regs[g.b1], "weir_global_reports_total", map[string]string{"outcome": "failed"}); v == 0 {
		t.Fatal("no failed report counted while the lease group is down")
	}
	// On the fallback: Σ fallbackᵣ ≤ L, so the envelope still holds.
	adm, el = run(nodes, "c2", 2*time.Second)
	total := sum(adm)
	t.Logf("on the fallback: admitted %v = %d in %v; envelope %d", adm, total, el.Round(time.Millisecond), envelope(el))
	if total > envelope(el) {
		t.Fatalf("on the fallback: admitted %d > envelope %d", total, envelope(el))
	}
	if adm[2] == 0 {
		t.Fatal("b admitted nothing on its fallback: min(safe, last share) > 0")
	}
	// The status page's event list shows it (the owner of c2 in b is b1).
	seen := false
	for _, ev := range ops.Events(g.b1) {
		seen = seen || (ev.Kind == weir.EventFallback && ev.Rule == "world")
	}
	if !seen {
		t.Errorf("no fallback event on b's owner: %+v", ops.Events(g.b1))
	}
}
