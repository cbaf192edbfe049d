package raftgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/leasepb"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
)

// These tests run real Raft (hashicorp/raft on raft-boltdb in t.TempDir())
// and the real forwarding service on 127.0.0.1 with ephemeral ports. They
// wait on conditions, never on sleeps, with generous bounds for -race on a
// loaded machine.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitBound bounds every wait on a condition.
const waitBound = 20 * time.Second

var testMachineConfig = lease.Config{Regions: []string{"ap", "eu", "us"}, LeaseDuration: 10 * time.Second, MaxSkew: 500 * time.Millisecond}

// cluster is a test lease group: the nodes by name, with a shared
// name → forwarding address map that restarts update.
type cluster struct {
	t     testing.TB
	mu    sync.Mutex
	rpc   map[string]string
	nodes map[string]*Group
	cfgs  map[string]Config
	names []string
}

// newCluster starts n voters (n = 1, 3 or 5) named n1…; tune adjusts every
// node's config.
func newCluster(t testing.TB, n int, tune func(*Config)) *cluster {
	c := &cluster{t: t, rpc: map[string]string{}, nodes: map[string]*Group{}, cfgs: map[string]Config{}}
	var voters []Voter
	lis, rpcLis := map[string]net.Listener{}, map[string]net.Listener{}
	peers := map[string]string{} // the static map: the RPC listeners exist before the nodes
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		lis[name], rpcLis[name] = listen(), listen()
		peers[name] = rpcLis[name].Addr().String()
		voters = append(voters, Voter{Name: name, Addr: lis[name].Addr().String()})
		c.names = append(c.names, name)
	}
	for _, name := range c.names {
		cfg := c.baseConfig(name, t.TempDir())
		cfg.Voters, cfg.RPCPeers = voters, peers
		if tune != nil {
			tune(&cfg)
		}
		cfg.RaftListener, cfg.RPCListener = lis[name], rpcLis[name]
		c.start(cfg)
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *cluster) baseConfig(name, dir string) Config {
	return Config{Name: name, Dir: dir, RPCAddr: "127.0.0.1:0", Machine: testMachineConfig,
		// A 50ms timeout elects in tens of milliseconds, but under -race
		// with other test binaries on the same 2 cores it also deposed
		// healthy leaders: 150ms keeps the tests fast and the leaders put.
		HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
		LeaderLeaseTimeout: 75 * time.Millisecond, TickInterval: 100 * time.Millisecond,
		ProposeTimeout: waitBound, LeaderRPC: c.resolve}
}

func (c *cluster) resolve(name string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.rpc[name]
	return a, ok
}

// start starts a node; its config is kept (with its bound Raft address) for
// restart.
func (c *cluster) start(cfg Config) *Group {
	c.t.Helper()
	g, err := Start(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", cfg.Name, err)
	}
	// A restart binds the same Raft address (the others know it) and a
	// new forwarding port (the resolver learns it).
	cfg.RaftListener, cfg.RaftAddr = nil, g.RaftAddr()
	cfg.RPCListener, cfg.RPCAddr, cfg.RPCPeers = nil, "127.0.0.1:0", nil
	c.mu.Lock()
	c.rpc[cfg.Name] = g.RPCAddr()
	c.nodes[cfg.Name] = g
	c.cfgs[cfg.Name] = cfg
	c.mu.Unlock()
	return g
}

// stop closes a node (as a crash looks to the others: no handover).
func (c *cluster) stop(name string) {
	c.t.Helper()
	c.mu.Lock()
	g := c.nodes[name]
	delete(c.nodes, name)
	delete(c.rpc, name)
	c.mu.Unlock()
	if err := g.Close(); err != nil {
		c.t.Errorf("close %s: %v", name, err)
	}
}

// restart starts a stopped node again on its data directory and Raft
// address.
func (c *cluster) restart(name string) *Group {
	c.t.Helper()
	c.mu.Lock()
	cfg := c.cfgs[name]
	c.mu.Unlock()
	return c.start(cfg)
}

func (c *cluster) closeAll() {
	c.mu.Lock()
	names := make([]string, 0, len(c.nodes))
	for n := range c.nodes {
		names = append(names, n)
	}
	c.mu.Unlock()
	for _, n := range names {
		c.stop(n)
	}
}

func (c *cluster) node(name string) *Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[name]
}

// live returns the running nodes, in name order.
func (c *cluster) live() []*Group {
	var gs []*Group
	for _, n := range c.names {
		if g := c.node(n); g != nil {
			gs = append(gs, g)
		}
	}
	return gs
}

// leader waits for a running node that leads and has applied its
// Takeover, and returns it.
func (c *cluster) leader() *Group {
	c.t.Helper()
	var l *Group
	waitFor(c.t, "a ready leader", func() bool {
		for _, g := range c.live() {
			if g.Ready() {
				l = g
				return true
			}
		}
		return false
	})
	return l
}

// follower returns a running node other than the leader.
func (c *cluster) follower(leader *Group) *Group {
	for _, g := range c.live() {
		if g != leader {
			return g
		}
	}
	c.t.Fatal("no follower")
	return nil
}

// converge waits until every running node's machine state equals the
// leader's, and returns it.
func (c *cluster) converge() []byte {
	c.t.Helper()
	var want []byte
	waitFor(c.t, "replicas to converge", func() bool {
		gs := c.live()
		want = gs[0].FSM().State()
		for _, g := range gs[1:] {
			if string(g.FSM().State()) != string(want) {
				return false
			}
		}
		return true
	})
	return want
}

// checkAll runs Machine.Check on every running replica.
func (c *cluster) checkAll(step string) {
	c.t.Helper()
	for _, g := range c.live() {
		if err := g.FSM().Check(); err != nil {
			c.t.Fatalf("%s: replica %s: %v", step, g.Name(), err)
		}
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func propose(t testing.TB, g *Group, c lease.Command) lease.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	res, err := g.Propose(ctx, c)
	if err != nil {
		t.Fatalf("propose on %s: %v", g.Name(), err)
	}
	return res
}

var rulesCmd = lease.Command{Rules: []lease.Rule{testRule}}

// TestGroupSingleVoter: one voter bootstraps, leads, proposes its Takeover
// with its own clock before serving writes, applies a rule set and
// reports, and refuses malformed commands with the machine's errors.
func TestGroupSingleVoter(t *testing.T) {
	var mu sync.Mutex
	clock := int64(time.Hour)
	c := newCluster(t, 1, func(cfg *Config) {
		cfg.TickInterval = -1
		cfg.Clock = func() int64 {
			mu.Lock()
			defer mu.Unlock()
			clock += int64(time.Millisecond)
			return clock
		}
	})
	g := c.leader()
	if !g.IsLeader() {
		t.Fatal("the ready node does not lead")
	}
	if name, _, ok := g.Leader(); !ok || name != "n1" {
		t.Fatalf("Leader() = %q, %v", name, ok)
	}
	propose(t, g, rulesCmd)
	res := propose(t, g, lease.Command{Now: 42, Report: &lease.Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: 600}}}})
	// No other region holds anything yet: eu's first lease meets its
	// whole demand.
	if len(res.Grants) != 1 || res.Grants[0].Share != 600 || res.Grants[0].Epoch == 0 {
		t.Fatalf("grants %+v, want one lease of 600", res.Grants)
	}
	// The Takeover came first, stamped with the node's clock: the guard
	// is its time plus the lease and the skew; Now 42 was overwritten.
	s, err := lease.ReadState(g.FSM().State())
	if err != nil {
		t.Fatal(err)
	}
	first := int64(time.Hour + time.Millisecond)
	if want := first + int64(10*time.Second+500*time.Millisecond); s.Guard != want {
		t.Fatalf("guard %d, want %d (the takeover at the first clock reading)", s.Guard, want)
	}
	if s.Now < first {
		t.Fatalf("machine time %d: the proposer's Now was used, not the leader's clock", s.Now)
	}
	for _, bad := range []struct {
		cmd  lease.Command
		want error
	}{
		{lease.Command{Tick: true, Takeover: true}, lease.ErrBadCommand},
		{lease.Command{Report: &lease.Report{Reporter: "x", Seq: 1, Region: "mars"}}, lease.ErrUnknownRegion},
		{lease.Command{Report: &lease.Report{Reporter: "x", Seq: 1, Region: "eu", Items: []lease.ReportItem{{Rule: "nope"}}}}, lease.ErrUnknownRule},
	} {
		if _, err := g.Propose(context.Background(), bad.cmd); !errors.Is(err, bad.want) {
			t.Errorf("propose %+v: %v, want %v", bad.cmd, err, bad.want)
		}
	}
	c.checkAll("end")
}

// TestGroupForwarding: three voters elect a leader; commands proposed on a
// follower are forwarded to the leader and applied on every replica, and
// the leader's refusals reach the follower's caller as the same sentinel
// errors.
func TestGroupForwarding(t *testing.T) {
	// The leader's forwarding address comes from the static map alone.
	c := newCluster(t, 3, func(cfg *Config) { cfg.LeaderRPC = nil })
	l := c.leader()
	f := c.follower(l)
	propose(t, f, rulesCmd)
	res := propose(t, f, lease.Command{Report: &lease.Report{Reporter: "us-1", Seq: 1, Region: "us",
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust\x00bytes", Demand: 300}}}})
	if len(res.Grants) != 1 || res.Grants[0].Share != 300 || res.Grants[0].Identity != "cust\x00bytes" {
		t.Fatalf("forwarded grants %+v, want one lease of 300", res.Grants)
	}
	if _, err := f.Propose(context.Background(), lease.Command{Report: &lease.Report{Reporter: "x", Seq: 1, Region: "eu",
		Items: []lease.ReportItem{{Rule: "nope"}}}}); !errors.Is(err, lease.ErrUnknownRule) {
		t.Fatalf("forwarded unknown rule: %v, want ErrUnknownRule", err)
	}
	if _, err := f.Propose(context.Background(), lease.Command{}); !errors.Is(err, lease.ErrBadCommand) {
		t.Fatalf("empty command: %v, want ErrBadCommand", err)
	}
	// A malformed command on the wire is refused and counted.
	rep, err := (&rpcServer{g: l}).Propose(context.Background(), &grouppb.ProposeRequest{From: "x", Command: &leasepb.Command{}})
	if err != nil || rep.GetCode() != grouppb.Code_BAD_COMMAND || l.Malformed() != 1 {
		t.Fatalf("malformed command: %v, %v, counted %d", rep, err, l.Malformed())
	}
	state := c.converge()
	s, err := lease.ReadState(state)
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys != 1 || s.Seqs["us-1"] != 1 {
		t.Fatalf("replicated state: %d keys, seqs %v", s.Keys, s.Seqs)
	}
	c.checkAll("end")
}

// TestGroupNoLeader: with quorum lost (one voter of three running), a
// Propose gives up at its deadline with an error naming the cause.
func TestGroupNoLeader(t *testing.T) {
	c := &cluster{t: t, rpc: map[string]string{}, nodes: map[string]*Group{}, cfgs: map[string]Config{}}
	t.Cleanup(c.closeAll)
	cfg := c.baseConfig("n1", t.TempDir())
	// n1 listens first, so that the two closed addresses cannot be its port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Two voters that never start: nothing listens on these addresses.
	down := closedAddrs(t, 2)
	cfg.Voters = []Voter{{"n1", l.Addr().String()}, {"n2", down[0]}, {"n3", down[1]}}
	cfg.RaftListener = l
	c.names = []string{"n1"}
	g := c.start(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = g.Propose(ctx, rulesCmd)
	if !errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("propose without quorum: %v, want ErrNoLeader and the deadline", err)
	}
	if !strings.Contains(err.Error(), "no leader") {
		t.Fatalf("error %q does not say there is no leader", err)
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	return closedAddrs(t, 1)[0]
}

// closedAddrs returns n distinct loopback addresses nothing listens on. The
// listeners are held open together until all are picked, so the kernel cannot
// hand the same ephemeral port out twice.
func closedAddrs(t *testing.T, n int) []string {
	addrs := make([]string, n)
	ls := make([]net.Listener, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i], addrs[i] = l, l.Addr().String()
	}
	for _, l := range ls {
		l.Close()
	}
	return addrs
}

// regionSide is a region's side of the lease on (global, cust) in the
// tests: its holder and report sequence, reporting through a node.
type regionSide struct {
	name string
	h    lease.Holder
	seq  uint64
}

func newRegions() []*regionSide {
	var rs []*regionSide
	for _, r := range testMachineConfig.Regions {
		rs = append(rs, &regionSide{name: r, h: lease.NewHolder(testRule, len(testMachineConfig.Regions), int64(testMachineConfig.MaxSkew))})
	}
	return rs
}

// report sends region r's demand through node g and hands the grant to its
// holder, counting the lifetime from when the report was sent.
func (r *regionSide) report(t testing.TB, g *Group, demand int64) {
	t.Helper()
	r.seq++
	sent := time.Now().UnixNano()
	res := propose(t, g, lease.Command{Report: &lease.Report{Reporter: r.name + "-owner", Seq: r.seq, Region: r.name,
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: demand, AckEpoch: r.h.Epoch()}}}})
	if len(res.Grants) != 1 {
		t.Fatalf("region %s: %d grants", r.name, len(res.Grants))
	}
	r.h.Accept(sent, res.Grants[0])
}

// enforced checks what the regions really enforce: the sum is within L,
// and (no lease should run out in these tests) none is on its fallback.
func enforced(t testing.TB, step string, rs []*regionSide) map[string]int64 {
	t.Helper()
	now := time.Now().UnixNano()
	out := map[string]int64{}
	var sum int64
	for _, r := range rs {
		s, _, fallback := r.h.At(now)
		if fallback && r.h.Epoch() != 0 {
			t.Fatalf("%s: region %s fell back (a lease ran out in a test that expires none)", step, r.name)
		}
		out[r.name] = s
		sum += s
	}
	if sum > testRule.Limit {
		t.Fatalf("%s: regions enforce %v = %d in all, above L = %d", step, out, sum, testRule.Limit)
	}
	return out
}

// TestGroupLeaderKill: the leader is killed while regions hold leases; a
// new leader is elected and proposes its Takeover; through the change no
// lease is double-allocated: every replica's Check passes after every step,
// and the shares the regions enforce, from grants issued before and after,
// never sum above L. Demand moving to another region while the old holder
// is silent is not served out of that holder's lease.
func TestGroupLeaderKill(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader()
	propose(t, l, rulesCmd)
	rs := newRegions() // ap, eu, us
	demand := map[string]int64{"ap": 0, "eu": 900, "us": 50}
	for round := range 4 {
		for i, r := range rs {
			r.report(t, c.live()[(round+i)%3], demand[r.name]) // through every node in turn
			c.checkAll(fmt.Sprintf("round %d %s", round, r.name))
			enforced(t, fmt.Sprintf("round %d %s", round, r.name), rs)
		}
	}
	before := enforced(t, "before the kill", rs)
	if before["eu"] != 900 {
		t.Fatalf("eu enforces %d before the kill, want 900", before["eu"])
	}

	killed := time.Now().UnixNano()
	c.stop(l.Name())
	nl := c.leader()
	if nl == l {
		t.Fatal("the killed node still leads")
	}
	// The new leader proposed Takeover: every lease counts as unexpired
	// until its takeover plus the longest lease plus the skew.
	s, err := lease.ReadState(nl.FSM().State())
	if err != nil {
		t.Fatal(err)
	}
	if least := killed + int64(testMachineConfig.LeaseDuration+testMachineConfig.MaxSkew); s.Guard < least {
		t.Fatalf("guard %d is before the kill plus a lease (%d): no takeover by the new leader", s.Guard, least)
	}
	c.checkAll("after the election")
	enforced(t, "after the election", rs)

	// eu goes silent; its demand moves to ap. ap may get only what eu's
	// unexpired lease leaves.
	demand["eu"], demand["ap"] = 0, 900
	for round := range 4 {
		for i, r := range rs {
			if r.name == "eu" {
				continue
			}
			r.report(t, c.live()[(round+i)%2], demand[r.name])
			step := fmt.Sprintf("after round %d %s", round, r.name)
			c.checkAll(step)
			enforced(t, step, rs)
		}
	}
	after := enforced(t, "end", rs)
	if after["ap"]+900 > testRule.Limit {
		t.Fatalf("ap got %d while eu's lease of 900 is unexpired", after["ap"])
	}
	// eu reports again: it takes its smaller share, then acknowledges it
	// with nothing to repay, and capacity follows demand to ap.
	rs[1].report(t, c.live()[0], 0)
	rs[1].report(t, c.live()[1], 0)
	for range 3 {
		rs[0].report(t, c.live()[1], 900)
		enforced(t, "after eu's ack", rs)
		c.checkAll("after eu's ack")
	}
	if got := enforced(t, "final", rs); got["ap"] <= after["ap"] {
		t.Fatalf("ap stays at %d after eu released its share", got["ap"])
	}
}

// TestGroupRestartAll: every voter stops and starts again on its data
// directory; the lease table (rules, leases, report sequences) is intact.
func TestGroupRestartAll(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.TickInterval = -1 })
	l := c.leader()
	propose(t, l, rulesCmd)
	rs := newRegions()
	for i, r := range rs {
		r.report(t, c.live()[i], int64(100*(i+1)))
	}
	before, err := lease.ReadState(c.converge())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names {
		c.stop(n)
	}
	for _, n := range c.names {
		c.restart(n)
	}
	c.leader()
	// The log is replayed once the new leader commits in its term; the
	// Takeover moves only the machine's time and guard.
	waitFor(t, "the lease table to come back on every replica", func() bool {
		for _, g := range c.live() {
			s, err := lease.ReadState(g.FSM().State())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(s.Leases, before.Leases) || !reflect.DeepEqual(s.Rules, before.Rules) ||
				!reflect.DeepEqual(s.Seqs, before.Seqs) {
				return false
			}
		}
		return true
	})
	c.checkAll("after the restart")
	// A retry of a report applied before the restart is recognised.
	r := rs[0]
	res := propose(t, c.live()[2], lease.Command{Report: &lease.Report{Reporter: r.name + "-owner", Seq: r.seq, Region: r.name,
		Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: 999}}}})
	if res.Grants[0].Epoch != r.h.Epoch() {
		t.Fatalf("a retried report after the restart changed the lease: epoch %d, held %d", res.Grants[0].Epoch, r.h.Epoch())
	}
}

// TestGroupSnapshotRestore: a snapshot is taken, the log behind it is
// compacted, and a restarted node restores its state from the snapshot.
func TestGroupSnapshotRestore(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.TickInterval = -1; cfg.TrailingLogs = 1 })
	l := c.leader()
	propose(t, l, rulesCmd)
	rs := newRegions()
	for i, r := range rs {
		r.report(t, l, int64(200*(i+1)))
	}
	want := c.converge()
	f := c.follower(l)
	if err := f.Snapshot(); err != nil {
		t.Fatal(err)
	}
	name := f.Name()
	c.stop(name)
	g := c.restart(name)
	if g.FSM().Restores() != 1 {
		t.Fatalf("the restarted node restored %d snapshots, want 1", g.FSM().Restores())
	}
	// Straight from the snapshot, before any log entry is replayed.
	if got := g.FSM().State(); string(got) != string(want) {
		s, _ := lease.ReadState(got)
		t.Fatalf("restored state differs from the snapshotted one (%d keys)", s.Keys)
	}
	c.leader()
	c.converge()
	c.checkAll("after the restore")
}

// TestGroupAddVoter: a fourth node joins through AddVoter sent to a
// follower (forwarded to the leader), catches up (by snapshot: the log
// behind the leader's snapshot is compacted), votes, and serves proposals
// by forwarding them.
func TestGroupAddVoter(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.TrailingLogs = 1 })
	l := c.leader()
	propose(t, l, rulesCmd)
	rs := newRegions()
	rs[0].report(t, l, 500)
	if err := l.Snapshot(); err != nil {
		t.Fatal(err)
	}
	cfg := c.baseConfig("n4", t.TempDir())
	cfg.Join, cfg.RaftAddr = true, "127.0.0.1:0"
	g4 := c.start(cfg)
	c.names = append(c.names, "n4")
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := c.follower(l).AddVoter(ctx, "n4", g4.RaftAddr()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n4 in the configuration as a voter", func() bool {
		f := l.raft.GetConfiguration()
		if f.Error() != nil {
			return false
		}
		for _, s := range f.Configuration().Servers {
			if s.ID == "n4" && s.Suffrage == raft.Voter {
				return true
			}
		}
		return false
	})
	rs[1].report(t, g4, 200)
	c.converge()
	c.checkAll("after the join")
	if g4.FSM().Restores() == 0 {
		t.Fatal("n4 caught up without the leader's snapshot, though the log behind it was compacted")
	}
}

// TestGroupConfigErrors: a bad config is refused with an error naming the
// field, before anything starts.
func TestGroupConfigErrors(t *testing.T) {
	base := Config{Name: "n1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		Machine: testMachineConfig, Voters: []Voter{{"n1", "127.0.0.1:1"}}}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Name", func(c *Config) { c.Name = "" }},
		{"Dir", func(c *Config) { c.Dir = "" }},
		{"RaftAddr", func(c *Config) { c.RaftAddr = "" }},
		{"RPCAddr", func(c *Config) { c.RPCAddr = "" }},
		{"Voters", func(c *Config) { c.Voters = append(c.Voters, Voter{"n2", "127.0.0.1:2"}) }},
		{"Voters", func(c *Config) { c.Voters = nil }},
		{"Voters", func(c *Config) { c.Name = "n9" }},
		{"Voters", func(c *Config) { c.Join = true }},
		{"Voters[1].Name", func(c *Config) { c.Voters = []Voter{{"n1", "a:1"}, {"", "b:1"}, {"n3", "c:1"}} }},
		{"Voters[2]", func(c *Config) { c.Voters = []Voter{{"n1", "a:1"}, {"n2", "b:1"}, {"n1", "c:1"}} }},
		{"ElectionTimeout", func(c *Config) { c.ElectionTimeout = -1 }},
		{"Machine", func(c *Config) { c.Machine.Regions = nil }},
		{"Raft timeouts", func(c *Config) {
			c.HeartbeatTimeout = 100 * time.Millisecond
			c.ElectionTimeout = 50 * time.Millisecond
		}},
	} {
		cfg := base
		tc.edit(&cfg)
		g, err := Start(cfg)
		if err == nil {
			g.Close()
			t.Errorf("%s: no error", tc.field)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("error %q does not name %s", err, tc.field)
		}
	}
}
