package weir

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/weir-dev/weir/internal/faultnet"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/quota"
)

// The chaos test (docs/reliability.md): a 5-node,
// 2-region cluster whose three lease-group voters are gateways too, under
// steady load, through a schedule of faults injected by internal/faultnet
// (every node on its own loopback address; gossip, peer RPC, Raft and the
// lease RPC all go through it): a gateway crash and restart, one node
// isolated, region a cut from region b, the Raft leader killed, and every
// voter restarted in turn. It records every decision and checks the
// accuracy contract of docs/overshoot.md in and out of the fault windows.
//
//	WEIR_CHAOS=short go test -run TestChaos -v .   (about 90 s; what CI runs)
//	WEIR_CHAOS=long  go test -run TestChaos -v -timeout 30m .
//
// Without WEIR_CHAOS it is skipped, so that `go test ./...` stays fast.

// chaosRulesYAML: a shared per-identity rule, an exact rule, a `scope:
// global` rule leased across both regions, and a durable rule, each on
// its own path so that every request is decided by exactly one rule.
const chaosRulesYAML = `
rules:
  - id: api
    match: {path: /api}
    key: [header:X-Key]
    limit: 100
    window: 1s
    burst: 20
    mode: shared
  - id: exact
    match: {path: /exact}
    key: [header:X-Key]
    limit: 50
    window: 1s
    burst: 10
    mode: exact
  - id: world
    match: {path: /global}
    key: [header:X-Key]
    limit: 200
    window: 1s
    burst: 40
    scope: global
    mode: shared
  - id: trial
    match: {path: /trial}
    key: [header:X-Key]
    limit: 5
    window: 1h
    burst: 5
    durable: true
    on_failure: closed
`

// chaosRule indexes the rules above in the decision records.
const (
	ruleAPI = iota
	ruleExact
	ruleWorld
	ruleTrial
	numChaosRules
)

var chaosRuleIDs = [numChaosRules]string{"api", "exact", "world", "trial"}
var chaosPaths = [numChaosRules]string{"/api", "/exact", "/global", "/trial"}

// chaosNodeSpec is one node of the topology.
type chaosNodeSpec struct {
	name, region string
	voter        bool
	host         *faultnet.Host
}

// chaosRec is one recorded decision.
type chaosRec struct {
	at       int64 // ns since the run's start, taken before Allow
	node     int8
	rule     int8
	identity int32
	admitted bool
	degraded bool
}

// chaosFault is one injected fault: the time it began and ended (ns since
// the run's start) and what it was.
type chaosFault struct {
	what       string
	start, end int64
}

type chaosCluster struct {
	t       *testing.T
	fn      *faultnet.Net
	specs   []*chaosNodeSpec
	voters  []raftgroup.Voter
	rpc     map[string]string // voter → lease RPC address (fixed across restarts)
	dirs    map[string]string
	machine lease.Config
	t0      time.Time
	version uint64 // the rule set's version once put

	mu       sync.Mutex
	live     map[string]*Node
	gates    map[string]*sync.RWMutex // held for reading by a call in flight
	pastFail [numChaosRules]uint64    // fail-open counts of the stopped incarnations
	restarts int
}

func (c *chaosCluster) since() int64 { return int64(time.Since(c.t0)) }

func (c *chaosCluster) spec(name string) *chaosNodeSpec {
	for _, s := range c.specs {
		if s.name == name {
			return s
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// start starts node name (again): a voter on its data directory and its
// fixed Raft and lease RPC addresses, every node on fresh gossip and peer
// ports of its own loopback address.
func (c *chaosCluster) start(name string) {
	c.t.Helper()
	s := c.spec(name)
	h := s.host
	cc := &ClusterConfig{Name: name, Region: s.region, LocalTiming: true, Label: "weir-chaos",
		GossipAddr: h.Addr(0), RPCAddr: h.Addr(0),
		// Generous on a loaded 2-core machine under -race: a decision
		// outside the fault windows must not time out.
		DecideTimeout: 3 * time.Second, CallTimeout: 3 * time.Second,
		net: &netHooks{listen: h.Listen, dial: h.DialContext, gossip: h.Gossip}}
	c.mu.Lock()
	for _, other := range c.specs {
		if n := c.live[other.name]; n != nil && other.name != name {
			cc.Join = append(cc.Join, n.gossipAddr())
		}
	}
	c.mu.Unlock()
	lc := &LeaseConfig{Rules: true, CheckInterval: 500 * time.Millisecond, RefreshInterval: 200 * time.Millisecond,
		Machine: c.machine, DurableTimeout: 5 * time.Second}
	if s.voter {
		var raftAddr string
		for _, v := range c.voters {
			if v.Name == name {
				raftAddr = v.Addr
			}
		}
		raftLis, err := h.Listen("tcp", raftAddr)
		if err != nil {
			c.t.Fatalf("%s: Raft address: %v", name, err)
		}
		rpcLis, err := h.Listen("tcp", c.rpc[name])
		if err != nil {
			raftLis.Close()
			c.t.Fatalf("%s: lease RPC address: %v", name, err)
		}
		lc.Voter = &raftgroup.Config{Name: name, Dir: c.dirs[name], Voters: c.voters, RPCPeers: c.rpc,
			Machine: c.machine, RaftListener: raftLis, RPCListener: rpcLis, RaftDialer: h.DialTimeout,
			DialOptions:      []grpc.DialOption{grpc.WithContextDialer(h.DialContext)},
			HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond, LeaderLeaseTimeout: 150 * time.Millisecond}
	} else {
		for _, v := range c.voters {
			lc.Voters = append(lc.Voters, c.rpc[v.Name])
		}
	}
	n, err := New(Config{Cluster: cc, Lease: lc, HashSeed: 7})
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	// Readiness, as a load balancer's probe would check it: a node enters
	// the clients' rotation once it runs the rule set (until its first
	// fetch from the group succeeds it enforces DefaultRules: none here).
	if c.version != 0 {
		chaosWait(c.t, 30*time.Second, name+" to run the rules", func() bool {
			return n.Status().RulesVersion >= c.version
		})
	}
	c.mu.Lock()
	c.live[name] = n
	c.mu.Unlock()
}

// stop takes node name out of the clients' rotation, waits for its calls in
// flight, records its fail-open counts and closes it (gracefully, or as a
// crash).
func (c *chaosCluster) stop(name string, crash bool) {
	c.mu.Lock()
	n := c.live[name]
	delete(c.live, name)
	gate := c.gates[name]
	c.mu.Unlock()
	if n == nil {
		return
	}
	gate.Lock() // no call in flight on n from here on
	c.addFailOpen(n)
	if crash {
		n.crash()
	} else {
		n.Close()
	}
	gate.Unlock()
}

// addFailOpen adds n's fail-open counts to the stopped incarnations'.
func (c *chaosCluster) addFailOpen(n *Node) {
	for _, rc := range n.counts() {
		if i := slices.Index(chaosRuleIDs[:], rc.Rule); i >= 0 {
			c.mu.Lock()
			c.pastFail[i] += rc.FailOpen
			c.mu.Unlock()
		}
	}
}

func (c *chaosCluster) node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live[name]
}

// leader returns the live voter that leads the lease group, waiting for one.
func (c *chaosCluster) leader() (string, *Node) {
	c.t.Helper()
	var name string
	var ln *Node
	chaosWait(c.t, 60*time.Second, "a lease-group leader", func() bool {
		for _, s := range c.specs {
			if n := c.node(s.name); n != nil && s.voter && n.leaseGroup() != nil && n.leaseGroup().IsLeader() {
				name, ln = s.name, n
				return true
			}
		}
		return false
	})
	return name, ln
}

func chaosWait(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// converged reports whether every live node's ring holds every live node
// of its region.
func (c *chaosCluster) converged() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.specs {
		n := c.live[s.name]
		if n == nil {
			continue
		}
		want := 0
		for _, o := range c.specs {
			if o.region == s.region && c.live[o.name] != nil {
				want++
			}
		}
		if len(n.members()) != want {
			return false
		}
	}
	return true
}

func TestChaos(t *testing.T) {
	mode := os.Getenv("WEIR_CHAOS")
	if mode == "" {
		t.Skip("the chaos test runs only with WEIR_CHAOS=short (about 90 s) or WEIR_CHAOS=long (several minutes)")
	}
	long := mode == "long"
	if testing.Short() {
		t.Skip("-short")
	}
	ignore := goleak.IgnoreCurrent()
	baseGoroutines := runtime.NumGoroutine()

	c := &chaosCluster{t: t, fn: faultnet.New(), rpc: map[string]string{}, dirs: map[string]string{},
		live: map[string]*Node{}, gates: map[string]*sync.RWMutex{},
		machine: lease.Config{Regions: []string{"a", "b"}, LeaseDuration: 2 * time.Second, MaxSkew: 100 * time.Millisecond}}
	layout := []struct {
		name, region string
		voter        bool
	}{{"a1", "a", true}, {"a2", "a", true}, {"a3", "a", false}, {"b1", "b", true}, {"b2", "b", false}}
	for i, l := range layout {
		h, err := c.fn.Host(l.name, net.IPv4(127, 0, 0, byte(20+i)).String())
		if err != nil {
			t.Fatal(err)
		}
		probe, err := net.Listen("tcp", h.Addr(0))
		if err != nil {
			t.Skipf("this machine cannot bind %s (one loopback address per node): %v", h.IP(), err)
		}
		probe.Close()
		c.specs = append(c.specs, &chaosNodeSpec{name: l.name, region: l.region, voter: l.voter, host: h})
		c.gates[l.name] = &sync.RWMutex{}
		if l.voter {
			// Fixed addresses: the voters know each other by them across
			// restarts. Bound once to learn a free port, then released.
			raft, err := net.Listen("tcp", h.Addr(0))
			if err != nil {
				t.Fatal(err)
			}
			rpc, err := net.Listen("tcp", h.Addr(0))
			if err != nil {
				t.Fatal(err)
			}
			c.voters = append(c.voters, raftgroup.Voter{Name: l.name, Addr: raft.Addr().String()})
			c.rpc[l.name] = rpc.Addr().String()
			c.dirs[l.name] = t.TempDir()
			raft.Close()
			rpc.Close()
		}
	}
	defer func() {
		for _, s := range c.specs {
			c.stop(s.name, false)
		}
	}()
	for _, s := range c.specs {
		c.start(s.name)
	}
	chaosWait(t, 30*time.Second, "the rings to converge", c.converged)
	_, ln := c.leader()
	rules, err := quota.Parse("chaos.yaml", []byte(chaosRulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	var version uint64
	for _, r := range rules {
		// Retried with whichever voter leads: under -race on a loaded
		// machine an election may come between finding the leader and
		// the proposal.
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			version, err = ln.leaseGroup().PutRule(ctx, "chaos", r)
			cancel()
			if err == nil {
				break
			}
			if attempt == 5 {
				t.Fatalf("put rule %s: %v", r.ID, err)
			}
			_, ln = c.leader()
		}
	}
	c.version = version
	chaosWait(t, 30*time.Second, "every node to run the rules and lease", func() bool {
		for _, s := range c.specs {
			n := c.node(s.name)
			if n.Status().RulesVersion != version || !n.globalStatus().Leasing {
				return false
			}
		}
		return true
	})

	// The load: per node, two clients over many identities with a few hot
	// ones, and one client of the durable rule; each client plays a load
	// balancer bound to its node and skips it while it is down.
	const cold, hot = 200, 3
	c.t0 = time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var recs []chaosRec
	var callErrs []string
	var skipped atomic.Int64
	client := func(ni int, seed uint64, durable bool) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 99))
		name := c.specs[ni].name
		local := make([]chaosRec, 0, 1<<14)
		hdr := map[string][]string{}
		pause := 2 * time.Millisecond
		if durable {
			pause = 100 * time.Millisecond
		}
		for {
			select {
			case <-stop:
				mu.Lock()
				recs = append(recs, local...)
				mu.Unlock()
				return
			default:
			}
			time.Sleep(pause)
			var rule, id int
			switch {
			case durable:
				// A new set of trial accounts every 2 s: admissions of
				// the durable rule happen throughout, faults included.
				rule, id = ruleTrial, int(c.since()/int64(2*time.Second))*4+rng.IntN(4)
			default:
				rule = rng.IntN(3)
				if rng.IntN(2) == 0 {
					id = cold + rng.IntN(hot) // hot: saturating
				} else {
					id = rng.IntN(cold)
				}
			}
			hdr["X-Key"] = []string{fmt.Sprintf("k%d", id)}
			c.mu.Lock()
			n, gate := c.live[name], c.gates[name]
			c.mu.Unlock()
			if n == nil {
				skipped.Add(1)
				continue
			}
			gate.RLock()
			if c.node(name) != n { // stopped meanwhile
				gate.RUnlock()
				continue
			}
			at := c.since()
			d := n.Allow(context.Background(), Request{Method: "GET", Path: chaosPaths[rule], Header: hdr})
			gate.RUnlock()
			if d.Err != nil {
				mu.Lock()
				callErrs = append(callErrs, fmt.Sprintf("%s %s k%d: %v", name, chaosRuleIDs[rule], id, d.Err))
				mu.Unlock()
				continue
			}
			res := d.Results()
			if len(res) != 1 || res[0].Rule != chaosRuleIDs[rule] {
				mu.Lock()
				callErrs = append(callErrs, fmt.Sprintf("%s %s: results %+v", name, chaosRuleIDs[rule], res))
				mu.Unlock()
				continue
			}
			local = append(local, chaosRec{at: at, node: int8(ni), rule: int8(rule), identity: int32(id),
				admitted: res[0].Allowed, degraded: res[0].Degraded})
		}
	}
	for i := range c.specs {
		wg.Add(3)
		go client(i, uint64(i)*3+1, false)
		go client(i, uint64(i)*3+2, false)
		go client(i, uint64(i)*3+3, true)
	}

	// Ring sizes per node, sampled, for the per-node fallback bound.
	samples := ringSamples{}
	sampleStop := make(chan struct{})
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-sampleStop:
				return
			case <-tk.C:
				for i, s := range c.specs {
					if n := c.node(s.name); n != nil {
						samples[i] = append(samples[i], [2]int64{c.since(), int64(len(n.members()))})
					}
				}
			}
		}
	}()

	// The fault schedule.
	var faults []chaosFault
	quiet := 8 * time.Second
	if long {
		quiet = 20 * time.Second
	}
	fault := func(what string, hold time.Duration, inject, heal func()) {
		t.Helper()
		f := chaosFault{what: what, start: c.since()}
		inject()
		time.Sleep(hold)
		heal()
		f.end = c.since()
		faults = append(faults, f)
		t.Logf("fault %-34s %6.1fs – %6.1fs", what, float64(f.start)/1e9, float64(f.end)/1e9)
		// Heal completes: the rings converge again before the next one.
		chaosWait(t, 30*time.Second, "the rings to converge after "+what, c.converged)
		time.Sleep(quiet)
	}
	// leases counts the global identities held on a lease and on the
	// fallback over the live nodes (each node counts those it owns).
	var leaseState string
	leases := func() (leased, fallback int) {
		leaseState = ""
		for _, s := range c.specs {
			gs := c.node(s.name).globalStatus()
			leaseState += fmt.Sprintf(" %s:%+v(reports %d, failed %d)", s.name, gs.Rules, gs.Reports, gs.ReportFailures)
			for _, rs := range gs.Rules {
				if rs.Rule == "world" {
					leased += rs.Leased
					fallback += rs.Fallback
				}
			}
		}
		return leased, fallback
	}
	time.Sleep(6 * time.Second)
	warmLeased, warmFallback := leases()
	t.Logf("after warm-up: global identities leased %d, on fallback %d:%s", warmLeased, warmFallback, leaseState)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	warmHeap, warmGoroutines := ms.HeapAlloc, runtime.NumGoroutine()

	rounds := 1
	if long {
		rounds = 3
	}
	for round := range rounds {
		gw := []string{"a3", "b2"}[round%2]
		fault("crash gateway "+gw+", restart", 4*time.Second,
			func() { c.stop(gw, true) }, func() { c.start(gw) })
		iso := []string{"a2", "b1", "a1"}[round%3]
		fault("isolate "+iso+", heal", 5*time.Second,
			func() { c.fn.Isolate(iso) }, func() { c.fn.Heal() })
		fault("cut region a from b, heal", 5*time.Second,
			func() { c.fn.Partition([]string{"a1", "a2", "a3"}, []string{"b1", "b2"}) }, func() { c.fn.Heal() })
		var killed string
		fault("kill the Raft leader, restart it", 5*time.Second,
			func() { killed, _ = c.leader(); c.stop(killed, true) }, func() { c.start(killed) })
		faults[len(faults)-1].what = "kill the Raft leader (" + killed + "), restart"
		start := c.since()
		for _, v := range c.voters {
			c.stop(v.Name, false)
			time.Sleep(time.Second)
			c.start(v.Name)
			c.leader()
			chaosWait(t, 30*time.Second, "the rings to converge after restarting "+v.Name, c.converged)
			time.Sleep(2 * time.Second)
		}
		f := chaosFault{what: "restart every voter in turn", start: start, end: c.since()}
		faults = append(faults, f)
		t.Logf("fault %-34s %6.1fs – %6.1fs", f.what, float64(f.start)/1e9, float64(f.end)/1e9)
		time.Sleep(quiet)
	}

	// Leases are held again (under load): of the global identities the
	// nodes hold, the share on a lease is at least 4/5 of the share after
	// the warm-up, before any fault. Shares, not counts: how many
	// identities a node holds at a moment follows how many calls the
	// clients made lately, which a loaded machine slows.
	endLeased, endFallback := leases()
	leasedAgain := func(leased, fallback int) bool {
		return leased >= 1 && leased*(warmLeased+warmFallback)*5 >= warmLeased*(leased+fallback)*4
	}
	for deadline := time.Now().Add(30 * time.Second); !leasedAgain(endLeased, endFallback); endLeased, endFallback = leases() {
		if time.Now().After(deadline) {
			t.Errorf("after 30s, %d global identities are leased and %d on the fallback, against %d and %d at warm-up:%s",
				endLeased, endFallback, warmLeased, warmFallback, leaseState)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("at the end: global identities leased %d, on fallback %d:%s", endLeased, endFallback, leaseState)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	endHeap, endGoroutines := ms.HeapAlloc, runtime.NumGoroutine()
	end := c.since()
	close(stop)
	wg.Wait()
	close(sampleStop)
	<-sampleDone

	for _, s := range c.specs {
		n := c.node(s.name)
		if v := n.Status().RulesVersion; v != version {
			t.Errorf("%s runs rules version %d, want %d", s.name, v, version)
		}
		if g := n.leaseGroup(); g != nil {
			v, rs := g.Rules()
			var ids []string
			for _, r := range rs {
				ids = append(ids, r.ID)
			}
			sort.Strings(ids)
			if v != version || strings.Join(ids, ",") != "api,exact,trial,world" {
				t.Errorf("voter %s holds rules version %d %v, want %d [api exact trial world]", s.name, v, ids, version)
			}
		}
	}

	// Fail-open counts: the test's degraded decisions against the nodes'.
	var failOpen, degraded [numChaosRules]uint64
	c.mu.Lock()
	failOpen = c.pastFail
	c.mu.Unlock()
	for _, s := range c.specs {
		for _, rc := range c.node(s.name).counts() {
			if i := slices.Index(chaosRuleIDs[:], rc.Rule); i >= 0 {
				failOpen[i] += rc.FailOpen
			}
		}
	}
	for _, r := range recs {
		if r.degraded {
			degraded[r.rule]++
		}
	}
	if failOpen != degraded {
		t.Errorf("fail-open counters per rule %v, degraded decisions recorded %v: they must be equal", failOpen, degraded)
	}

	// The durable counters: what the group holds is what the admissions
	// imply. With T = 1h/5 = 12 min far above the run, an identity's TAT
	// after n admissions is its first admission's time + n·T.
	_, ln = c.leader()
	a := analyzeChaos(recs, faults, samples, end)
	T := int64(time.Hour / 5)
	durableChecked := 0
	for id, st := range a.trial {
		tat, ok := ln.leaseGroup().FSM().DurableTAT("trial", fmt.Sprintf("k%d", id))
		var implied int64
		if ok {
			implied = (tat - c.t0.UnixNano()) / T
		}
		// A timed-out call may still have been applied (and then
		// rejected, closed): the group may hold up to that many more.
		if implied < st.admitted || implied > st.admitted+st.degradedRejected || st.admitted > 5 {
			t.Errorf("durable k%d: the group's bucket implies %d admissions (TAT %d), the callers saw %d admitted (+%d degraded rejections), burst 5",
				id, implied, tat, st.admitted, st.degradedRejected)
		}
		durableChecked++
	}

	// Envelopes.
	for _, v := range a.violations {
		t.Error(v)
	}
	if a.degradedOutside > 0 {
		// Reported, not asserted: on a loaded 2-core machine memberlist's
		// ProfileLocal may suspect a live node, and a Raft voter back from
		// isolation may force an election, after the widened window
		// (docs/reliability.md, "Findings").
		t.Logf("%d degraded decisions outside the (widened) fault windows; the first: %s", a.degradedOutside, strings.Join(a.outsideSamples, "; "))
	}
	if len(callErrs) > 0 {
		t.Errorf("%d calls returned an error; first: %s", len(callErrs), callErrs[0])
	}

	// Close everything; goroutines back to the baseline.
	for _, s := range c.specs {
		c.stop(s.name, false)
	}
	stats := c.fn.Stats()
	var report strings.Builder
	fmt.Fprintf(&report, "chaos report (%s): %d nodes in 2 regions, 3 voters, %.1f s of load\n", mode, len(c.specs), float64(end)/1e9)
	fmt.Fprintf(&report, "faults injected:\n")
	for _, f := range faults {
		fmt.Fprintf(&report, "  %6.1fs – %6.1fs  %s\n", float64(f.start)/1e9, float64(f.end)/1e9, f.what)
	}
	fmt.Fprintf(&report, "network: %d dials/accepts refused, %d gossip datagrams dropped, %d connections cut\n", stats.Refused, stats.Dropped, stats.Closed)
	fmt.Fprintf(&report, "decisions: %d (admitted %d), degraded %d (fail-open counters %v), outside fault windows %d; calls skipped on a down node %d; call errors %d\n",
		len(recs), a.admitted, a.degraded, failOpen, a.degradedOutside, skipped.Load(), len(callErrs))
	fmt.Fprintf(&report, "fault windows widened by %v after each heal (failure detection, handoff, lease expiry)\n", time.Duration(chaosWiden))
	fmt.Fprintf(&report, "%-6s %-8s %8s %14s %14s %16s\n", "rule", "scope", "windows", "worst out/env", "excess out", "worst node in/bnd")
	for r := range numChaosRules {
		w := a.worst[r]
		fmt.Fprintf(&report, "%-6s %-8s %8d %14.3f %14.1f %16.3f\n", chaosRuleIDs[r], chaosScope(r), w.windows, w.outFrac, w.outExcess, w.inFrac)
	}
	fmt.Fprintf(&report, "global identities on a lease / on fallback: %d / %d after warm-up, %d / %d at the end\n", warmLeased, warmFallback, endLeased, endFallback)
	fmt.Fprintf(&report, "durable identities checked against the group's counters: %d\n", durableChecked)
	fmt.Fprintf(&report, "heap after GC: %.1f MiB after warm-up, %.1f MiB at the end; goroutines %d → %d (baseline %d before the nodes)\n",
		float64(warmHeap)/(1<<20), float64(endHeap)/(1<<20), warmGoroutines, endGoroutines, baseGoroutines)
	t.Log("\n" + report.String())

	// Bounded: the heap may grow by what the test itself records (about
	// 40 bytes a decision) plus 64 MiB; goroutines by half.
	if lim := 2*warmHeap + 64<<20 + uint64(len(recs))*64; endHeap > lim {
		t.Errorf("heap after GC grew from %d to %d bytes, over the bound %d", warmHeap, endHeap, lim)
	}
	if endGoroutines > warmGoroutines*3/2 {
		t.Errorf("goroutines grew from %d after warm-up to %d at the end, over the bound ×1.5", warmGoroutines, endGoroutines)
	}
	goleak.VerifyNone(t, ignore)
}

// chaosWiden is how long after a fault healed its window lasts: memberlist's
// failure detection with ProfileLocal (about 0.5 s, more under -race), the
// coordinator's HandoffTimeout (1 s), a lease's lifetime (2 s) and a
// second's margin.
const chaosWiden = int64(4500 * time.Millisecond)

func chaosScope(rule int) string {
	if rule == ruleWorld || rule == ruleTrial {
		return "global"
	}
	return "region"
}

// chaosParams are the rules' figures: rate per ns, burst and slack bound
// S ≤ a·L (a = 0.05 by default); durable rules have no slack.
func chaosParams(rule int) (perNs float64, burst, slack float64) {
	switch rule {
	case ruleAPI:
		return 100 / 1e9, 20, 5
	case ruleExact:
		return 50 / 1e9, 10, 0
	case ruleWorld:
		return 200 / 1e9, 40, 10
	default:
		return 5 / float64(time.Hour), 5, 0
	}
}

type ringSamples map[int][][2]int64 // node → (at, size), in time order

// minRing is the smallest ring node saw in [from, to] (1 if none sampled).
func (rs ringSamples) minRing(node int, from, to int64) int64 {
	m := int64(0)
	for _, s := range rs[node] {
		if s[0] >= from-int64(100*time.Millisecond) && s[0] <= to {
			if m == 0 || s[1] < m {
				m = s[1]
			}
		}
	}
	return max(m, 1)
}

type chaosWorst struct {
	windows   int
	outFrac   float64 // worst count ÷ envelope outside the fault windows
	outExcess float64 // worst tokens over the reference B + r·Δ outside
	inFrac    float64 // worst count ÷ per-node bound inside
}

type trialStat struct{ admitted, degradedRejected int64 }

type chaosAnalysis struct {
	admitted, degraded, degradedOutside int
	worst                               [numChaosRules]chaosWorst
	trial                               map[int32]*trialStat
	violations, outsideSamples          []string
}

// analyzeChaos checks the envelopes over sliding intervals of 1 s and 3 s
// starting at each admission:
//   - outside the widened fault windows, every identity (per region for
//     region-scoped rules, across both for global and durable ones) admits
//     at most B + r·Δ + S + c (the envelope of docs/overshoot.md, plus one cost for
//     a closed interval measured on the callers' clocks);
//   - inside them, each node admits for an identity at most its on_failure
//     local share (limit ÷ the fewest live nodes its ring saw, burst
//     likewise) plus the envelope.
//
// Durable rules are exact, faults or not: at most B + r·Δ + c everywhere.
func analyzeChaos(recs []chaosRec, faults []chaosFault, rings ringSamples, end int64) chaosAnalysis {
	a := chaosAnalysis{trial: map[int32]*trialStat{}}
	inFault := func(from, to int64) bool {
		for _, f := range faults {
			if from <= f.end+chaosWiden && to >= f.start-int64(200*time.Millisecond) {
				return true
			}
		}
		return false
	}
	regionOf := func(node int8) int8 {
		if node < 3 {
			return 0
		}
		return 1
	}
	type key struct {
		scope, rule int8
		id          int32
	}
	type nkey struct {
		node, rule int8
		id         int32
	}
	groups := map[key][]int64{}
	nodes := map[nkey][]int64{}
	for _, r := range recs {
		if r.degraded {
			a.degraded++
			if !inFault(r.at, r.at) {
				a.degradedOutside++
				if len(a.outsideSamples) < 8 {
					a.outsideSamples = append(a.outsideSamples, fmt.Sprintf("%.2fs node %d %s k%d admitted %v",
						float64(r.at)/1e9, r.node, chaosRuleIDs[r.rule], r.identity, r.admitted))
				}
			}
		}
		if r.rule == ruleTrial {
			st := a.trial[r.identity]
			if st == nil {
				st = &trialStat{}
				a.trial[r.identity] = st
			}
			switch {
			case r.admitted && !r.degraded:
				st.admitted++
			case r.degraded && !r.admitted:
				st.degradedRejected++
			}
		}
		if !r.admitted {
			continue
		}
		a.admitted++
		k := key{scope: -1, rule: r.rule, id: r.identity}
		if chaosScope(int(r.rule)) == "region" {
			k.scope = regionOf(r.node)
		}
		groups[k] = append(groups[k], r.at)
		nodes[nkey{r.node, r.rule, r.identity}] = append(nodes[nkey{r.node, r.rule, r.identity}], r.at)
	}
	deltas := []int64{int64(time.Second), int64(3 * time.Second)}
	keys := make([]key, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.rule < b.rule || a.rule == b.rule && (a.scope < b.scope || a.scope == b.scope && a.id < b.id)
	})
	for _, k := range keys {
		ts := groups[k]
		slices.Sort(ts)
		perNs, burst, slack := chaosParams(int(k.rule))
		w := &a.worst[k.rule]
		for _, d := range deltas {
			j := 0
			for i := range ts {
				if ts[i]+d > end {
					break
				}
				for j < len(ts) && ts[j] <= ts[i]+d {
					j++
				}
				count := float64(j - i)
				ref := burst + perNs*float64(d)
				env := ref + slack + 1
				if k.rule == ruleTrial || !inFault(ts[i], ts[i]+d) {
					w.windows++
					w.outFrac = max(w.outFrac, count/env)
					w.outExcess = max(w.outExcess, count-ref)
					if count > env {
						a.violations = append(a.violations, fmt.Sprintf("%s k%d (scope %d): %v from %.2fs admitted %.0f, envelope %.1f",
							chaosRuleIDs[k.rule], k.id, k.scope, time.Duration(d), float64(ts[i])/1e9, count, env))
					}
				}
			}
		}
	}
	nks := make([]nkey, 0, len(nodes))
	for k := range nodes {
		nks = append(nks, k)
	}
	sort.Slice(nks, func(i, j int) bool {
		a, b := nks[i], nks[j]
		return a.rule < b.rule || a.rule == b.rule && (a.node < b.node || a.node == b.node && a.id < b.id)
	})
	for _, k := range nks {
		if k.rule == ruleTrial {
			continue
		}
		ts := nodes[k]
		slices.Sort(ts)
		perNs, burst, slack := chaosParams(int(k.rule))
		w := &a.worst[k.rule]
		for _, d := range deltas {
			j := 0
			for i := range ts {
				if ts[i]+d > end {
					break
				}
				for j < len(ts) && ts[j] <= ts[i]+d {
					j++
				}
				if !inFault(ts[i], ts[i]+d) {
					continue
				}
				n := float64(rings.minRing(int(k.node), ts[i], ts[i]+d))
				share := max(burst/n, 1) + perNs/n*float64(d)
				bound := share + burst + perNs*float64(d) + slack + 1
				count := float64(j - i)
				w.inFrac = max(w.inFrac, count/bound)
				if count > bound {
					a.violations = append(a.violations, fmt.Sprintf("%s k%d on node %d during a fault: %v from %.2fs admitted %.0f, bound %.1f",
						chaosRuleIDs[k.rule], k.id, k.node, time.Duration(d), float64(ts[i])/1e9, count, bound))
				}
			}
		}
	}
	if len(a.violations) > 20 {
		a.violations = append(a.violations[:20], fmt.Sprintf("… and %d more", len(a.violations)-20))
	}
	return a
}
