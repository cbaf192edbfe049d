package weir_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// trialRules: "one free trial per account" (1 per 30 days, burst 1,
// durable, fail closed) on POST /trial, with a per-IP local rule beside it
// on the same route, and an OTP rule that fails open.
var trialRules = []quota.Rule{
	{ID: "trial", Match: quota.Match{Methods: []string{"POST"}, Path: "/trial"},
		Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Account"}}, Limit: 1, Window: 30 * 24 * time.Hour, Burst: 1,
		Durable: true, OnFailure: quota.OnFailureClosed},
	{ID: "trial-per-ip", Match: quota.Match{Methods: []string{"POST"}, Path: "/trial"},
		Key: []quota.KeySource{{Kind: quota.KeyIP}}, Limit: 1000, Window: time.Minute, Mode: quota.ModeLocal},
	{ID: "otp", Match: quota.Match{Methods: []string{"POST"}, Path: "/otp"},
		Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Account"}}, Limit: 5, Window: 15 * time.Minute, Burst: 5,
		Durable: true, Mode: quota.ModeExact, OnFailure: quota.OnFailureOpen},
}

func trialReq(account string) weir.Request {
	return weir.Request{Method: "POST", Path: "/trial", Header: http.Header{"X-Account": {account}}, ClientIP: "192.0.2.1"}
}

// durableGroup is n gateways that are the voters of the lease group, in
// one cluster, with the rules above in their config, plus a gateway that is
// a client of the group. Nodes can be stopped and started again on their
// data directories.
type durableGroup struct {
	t      *testing.T
	mu     sync.Mutex
	rpc    map[string]string // name → lease RPC address, for forwarding
	voters []raftgroup.Voter
	dirs   map[string]string
	nodes  map[string]*weir.Node
	names  []string
	gossip string
	// rules, when set, replace trialRules; formats force the key format a
	// voter speaks when it starts (weir.SpeakKeyFormat; 0: the latest).
	rules   []quota.Rule
	formats map[string]uint32
}

func (g *durableGroup) resolve(name string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.rpc[name]
	return a, ok
}

func listenLocal(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func startDurableGroup(t *testing.T, n int) *durableGroup {
	t.Helper()
	return startDurableGroupWith(t, n, nil, nil)
}

// startDurableGroupWith is startDurableGroup with rules (nil: trialRules)
// and the key formats voters speak at their first start.
func startDurableGroupWith(t *testing.T, n int, rules []quota.Rule, formats map[string]uint32) *durableGroup {
	t.Helper()
	// Registered first, so it runs last: no goroutine outlives the nodes.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	g := &durableGroup{t: t, rpc: map[string]string{}, dirs: map[string]string{}, nodes: map[string]*weir.Node{},
		rules: rules, formats: formats}
	t.Cleanup(g.closeAll)
	raftLis := map[string]net.Listener{}
	for i := range n {
		name := fmt.Sprintf("gw-%d", i)
		raftLis[name] = listenLocal(t)
		g.voters = append(g.voters, raftgroup.Voter{Name: name, Addr: raftLis[name].Addr().String()})
		g.dirs[name] = t.TempDir()
		g.names = append(g.names, name)
	}
	for _, name := range g.names {
		g.start(name, raftLis[name])
	}
	g.leader()
	return g
}

// start starts the voter name (again): on its data directory and its Raft
// address (lis, or the address again).
func (g *durableGroup) start(name string, lis net.Listener) *weir.Node {
	g.t.Helper()
	var raftAddr string
	for _, v := range g.voters {
		if v.Name == name {
			raftAddr = v.Addr
		}
	}
	rpcLis := listenLocal(g.t)
	cc := &weir.ClusterConfig{Name: name, Region: "eu", LocalTiming: true, Label: "durable-" + g.t.Name(),
		DecideTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}
	if g.gossip != "" {
		cc.Join = []string{g.gossip}
	}
	if f := g.formats[name]; f != 0 {
		weir.SpeakKeyFormat(cc, f)
	}
	rules := trialRules
	if g.rules != nil {
		rules = g.rules
	}
	vc := &raftgroup.Config{Name: name, Dir: g.dirs[name], Voters: g.voters, LeaderRPC: g.resolve,
		RPCListener: rpcLis, Machine: lease.Config{Regions: []string{"eu"}},
		HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond, LeaderLeaseTimeout: 75 * time.Millisecond}
	if lis != nil {
		vc.RaftListener = lis
	} else {
		vc.RaftAddr = raftAddr
	}
	node, err := weir.New(weir.Config{Rules: rules, Cluster: cc,
		// Generous: a run with no fault must see no fail-open decision,
		// elections included, under -race on a loaded machine.
		Lease: &weir.LeaseConfig{Voter: vc, DurableTimeout: 10 * time.Second}})
	if err != nil {
		g.t.Fatalf("start %s: %v", name, err)
	}
	g.mu.Lock()
	g.rpc[name] = rpcLis.Addr().String()
	g.nodes[name] = node
	if g.gossip == "" {
		g.gossip = ops.GossipAddr(node)
	}
	g.mu.Unlock()
	return node
}

// client starts a gateway that is a client of the voters.
func (g *durableGroup) client() *weir.Node {
	g.t.Helper()
	var rpcs []string
	g.mu.Lock()
	for _, a := range g.rpc {
		rpcs = append(rpcs, a)
	}
	g.mu.Unlock()
	node, err := weir.New(weir.Config{Rules: trialRules,
		Lease: &weir.LeaseConfig{Voters: rpcs, DurableTimeout: 10 * time.Second}})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { node.Close() })
	return node
}

func (g *durableGroup) stop(name string) {
	g.mu.Lock()
	node := g.nodes[name]
	delete(g.nodes, name)
	delete(g.rpc, name)
	if g.gossip == ops.GossipAddr(node) {
		g.gossip = ""
		for _, other := range g.nodes {
			g.gossip = ops.GossipAddr(other)
		}
	}
	g.mu.Unlock()
	if err := node.Close(); err != nil {
		g.t.Errorf("close %s: %v", name, err)
	}
}

func (g *durableGroup) closeAll() {
	for _, name := range g.names {
		if g.live(name) != nil {
			g.stop(name)
		}
	}
}

func (g *durableGroup) live(name string) *weir.Node {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.nodes[name]
}

// leader waits for a voter that leads and serves writes; it returns its
// name.
func (g *durableGroup) leader() string {
	g.t.Helper()
	var name string
	waitFor(g.t, func() bool {
		for _, n := range g.names {
			if node := g.live(n); node != nil && weir.LeaseGroupOf(node).Ready() {
				name = n
				return true
			}
		}
		return false
	})
	return name
}

// gateways returns the live voters' nodes and the extra ones.
func (g *durableGroup) gateways(extra ...*weir.Node) []*weir.Node {
	var out []*weir.Node
	for _, n := range g.names {
		if node := g.live(n); node != nil {
			out = append(out, node)
		}
	}
	return append(out, extra...)
}

// trials sends each times the account's trial request to every gateway at
// once and returns how many were admitted; a degraded decision fails the
// test.
func trials(t *testing.T, gws []*weir.Node, account string, each int) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i, gw := range gws {
		for range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := gw.Allow(context.Background(), trialReq(account))
				if d.Degraded {
					t.Errorf("gateway %d: a degraded decision in a run with no fault: %+v", i, d.Results())
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	return int(admitted.Load())
}

// failOpen sums the fail-open count of rule over nodes.
func failOpen(nodes []*weir.Node, rule string) uint64 {
	var sum uint64
	for _, node := range nodes {
		for _, rc := range ops.Counts(node) {
			if rc.Rule == rule {
				sum += rc.FailOpen
			}
		}
	}
	return sum
}

// TestDurableTrial: "one free trial per account" across three gateways
// that are the lease group's voters and one that is its client, with
// concurrent requests: exactly one admitted per account. Killing the
// leader, and then restarting every voter, never hands out a second one
// (docs/durable.md).
func TestDurableTrial(t *testing.T) {
	g := startDurableGroup(t, 3)
	cl := g.client()
	var all []*weir.Node
	collect := func(nodes []*weir.Node) {
		for _, n := range nodes {
			if !contains(all, n) {
				all = append(all, n)
			}
		}
	}
	gws := g.gateways(cl)
	collect(gws)
	for _, acct := range []string{"acct-1", "acct-2"} {
		if n := trials(t, gws, acct, 5); n != 1 {
			t.Fatalf("%s: %d trials admitted of %d concurrent requests, want exactly 1", acct, n, 5*len(gws))
		}
	}
	// Check decides through the group too.
	if r, err := cl.Check(context.Background(), "acct-1", "trial", 0); err != nil || r.Allowed {
		t.Fatalf("Check of a used trial: %+v, %v", r, err)
	}
	if r, err := gws[0].Check(context.Background(), "acct-check", "trial", 0); err != nil || !r.Allowed {
		t.Fatalf("Check of a new account's trial: %+v, %v", r, err)
	}
	if n := trials(t, gws, "acct-check", 1); n != 0 {
		t.Fatalf("%d trials admitted after Check took acct-check's", n)
	}
	// The buckets live in the group's replicated state, not in the ring.
	waitFor(t, func() bool {
		for _, name := range g.names {
			if _, ok := weir.LeaseGroupOf(g.live(name)).FSM().DurableTAT("trial", "acct-2"); !ok {
				return false
			}
		}
		return true
	})
	// The OTP rule (mode exact on a cluster node) is decided by the group
	// too, not by the ring: 5 per account in all, whatever the gateway.
	otp := 0
	for i := range 12 {
		d := gws[i%len(gws)].Allow(context.Background(), weir.Request{Method: "POST", Path: "/otp", Header: http.Header{"X-Account": {"acct-1"}}})
		if d.Allowed {
			otp++
		}
	}
	if otp != 5 {
		t.Fatalf("otp: %d admitted of 12 across the gateways, want 5", otp)
	}

	leader := g.leader()
	g.stop(leader)
	if g.leader() == leader {
		t.Fatal("the stopped voter still leads")
	}
	gws = g.gateways(cl)
	if n := trials(t, gws, "acct-1", 3); n != 0 {
		t.Fatalf("after the leader's death: %d more trials for acct-1", n)
	}
	if n := trials(t, gws, "acct-3", 3); n != 1 {
		t.Fatalf("after the leader's death: %d trials for a new account, want 1", n)
	}
	g.start(leader, nil)

	for _, name := range g.names {
		g.stop(name)
	}
	for _, name := range g.names {
		g.start(name, nil)
	}
	g.leader()
	gws = g.gateways(g.client())
	collect(gws)
	for _, acct := range []string{"acct-1", "acct-2", "acct-3"} {
		if n := trials(t, gws, acct, 2); n != 0 {
			t.Fatalf("after restarting every voter: %d more trials for %s", n, acct)
		}
	}
	if n := trials(t, gws, "acct-4", 2); n != 1 {
		t.Fatalf("after restarting every voter: %d trials for a new account, want 1", n)
	}
	if n := failOpen(all, "trial") + failOpen(all, "otp"); n != 0 {
		t.Fatalf("%d fail-open decisions in a run with no fault", n)
	}
}

func contains(nodes []*weir.Node, n *weir.Node) bool {
	for _, x := range nodes {
		if x == n {
			return true
		}
	}
	return false
}

// TestDurableGroupUnreachable: a gateway whose lease group cannot be
// reached decides durable rules by on_failure within DurableTimeout:
// closed rejects, open admits, and local rejects too (a node-local bucket
// would hand out the free window durable exists to prevent); every such
// decision is marked degraded and counted as fail-open.
func TestDurableGroupUnreachable(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	dead := listenLocal(t)
	addr := dead.Addr().String()
	dead.Close() // nothing listens there: every call is refused at once
	rules := append([]quota.Rule(nil), trialRules...)
	local := rules[0]
	local.ID, local.OnFailure, local.Match.Path = "trial-local", quota.OnFailureLocal, "/trial-local"
	rules = append(rules, local)
	const timeout = 300 * time.Millisecond
	node, err := weir.New(weir.Config{Rules: rules, Lease: &weir.LeaseConfig{Voters: []string{addr}, DurableTimeout: timeout}})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	for _, tc := range []struct {
		path, rule string
		allowed    bool
	}{{"/trial", "trial", false}, {"/otp", "otp", true}, {"/trial-local", "trial-local", false}} {
		for i := range 2 {
			start := time.Now()
			d := node.Allow(context.Background(), weir.Request{Method: "POST", Path: tc.path, Header: http.Header{"X-Account": {"acct"}}})
			t.Logf("%s: decided by on_failure in %v (DurableTimeout %v)", tc.rule, time.Since(start), timeout)
			if d.Allowed != tc.allowed || !d.Degraded {
				t.Fatalf("%s, request %d: allowed %v, degraded %v; want allowed %v, degraded", tc.rule, i, d.Allowed, d.Degraded, tc.allowed)
			}
			if !tc.allowed && d.RetryAfter() <= 0 {
				t.Fatalf("%s: a degraded rejection with no Retry-After", tc.rule)
			}
		}
		if n := failOpen([]*weir.Node{node}, tc.rule); n != 2 {
			t.Fatalf("%s: %d fail-open decisions counted, want 2", tc.rule, n)
		}
	}
	// A caller's ctx bounds the wait too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if d := node.Allow(ctx, trialReq("acct")); d.Allowed || !d.Degraded {
		t.Fatalf("with a spent ctx: %+v", d)
	}
}

// TestDurableNeedsLease: a durable rule without Config.Lease is refused
// with an error naming the rule: by New (inline rules, a rule file, the
// default rules), by SetRules, and on a rule file's reload, which keeps the
// last good set in force.
func TestDurableNeedsLease(t *testing.T) {
	if _, err := weir.New(weir.Config{Rules: trialRules}); !errors.Is(err, weir.ErrDurableNeedsLease) || !strings.Contains(err.Error(), `"trial"`) {
		t.Fatalf("New with a durable rule and no lease group: %v", err)
	}
	if _, err := weir.New(weir.Config{RulesFile: filepath.Join(t.TempDir(), "missing.yaml"), DefaultRules: trialRules}); !errors.Is(err, weir.ErrDurableNeedsLease) {
		t.Fatalf("New with durable default rules and no lease group: %v", err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(body string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	const durableYAML = `rules:
  - id: trial
    key: [header:X-Account]
    limit: 1
    window: 720h
    durable: true
`
	write(durableYAML)
	if _, err := weir.New(weir.Config{RulesFile: file}); !errors.Is(err, weir.ErrDurableNeedsLease) || !strings.Contains(err.Error(), `"trial"`) {
		t.Fatalf("New with a durable rule in the file and no lease group: %v", err)
	}
	write(`rules:
  - id: per-account
    key: [header:X-Account]
    limit: 3
    window: 1m
`)
	node, err := weir.New(weir.Config{RulesFile: file, ReloadPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if err := node.SetRules(trialRules); !errors.Is(err, weir.ErrDurableNeedsLease) {
		t.Fatalf("SetRules with a durable rule: %v", err)
	}
	if id := node.Rules().Rule(0).ID; id != "per-account" {
		t.Fatalf("after a refused SetRules the node runs %q", id)
	}
	write(durableYAML)
	waitFor(t, func() bool { return strings.Contains(node.Status().LastReloadError, "trial") })
	if st := node.Status(); st.RulesVersion != 1 || node.Rules().Rule(0).ID != "per-account" {
		t.Fatalf("after a refused reload: %+v, rule %q", st, node.Rules().Rule(0).ID)
	}
}
