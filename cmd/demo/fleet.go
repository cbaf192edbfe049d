package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/nodeops"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// gatewayMux builds one gateway's HTTP routes. It is THE place where every
// gateway's mux is built: to mount another handler on every node (a status
// page, say), add one line here, e.g. mux.Handle("/ui/", ops.UIHandler(n)).
//
//   - /api/ and /partner/: the toy upstream behind weir's middleware
//   - /admin/report: the node's JSON report (rules, counts, top throttled)
//   - /v1/rules...: the authenticated rules API of docs/rules-api.md (a 503
//     on a node with no lease group). In production serve it on an admin
//     listener over TLS, not beside the API.
func gatewayMux(n *weir.Node, upstream http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	api := n.Middleware(upstream)
	mux.Handle("/api/", api)
	mux.Handle("/partner/", api)
	mux.Handle("/admin/report", ops.AdminHandler(n))
	mux.Handle("/v1/rules", ops.RulesAdminHandler(n))
	mux.Handle("/v1/rules/", ops.RulesAdminHandler(n))
	// The status page, its JSON and the identity lookup, for operators.
	mux.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(n)))
	return mux
}

// Demo timings: memberlist on loopback timings, Raft's default timeouts, and
// leases short enough that shares visibly
// follow demand within a 20-second run.
const (
	leaseLife     = 6 * time.Second
	leaseRefresh  = time.Second // also bounds one report: a Raft commit, forwarded, under -race on a busy machine
	leaseSkew     = 100 * time.Millisecond
	ruleCheck     = time.Second
	raftTimeout   = time.Second // hashicorp/raft's defaults: a leader survives a loaded machine; elections take a second or two
	raftLeaderTTL = 500 * time.Millisecond
	stepBound     = 30 * time.Second // the longest any scheduled step waits (generous: -race on a busy machine)
	adminName     = "demo-operator"
	// demoCallTimeout is the peer call and decide timeout: generous on a
	// loaded 2-core machine, where a run with no fault must show no
	// fail-open decision. A graceful leave's fault term counts it.
	demoCallTimeout = 3 * time.Second
)

// gateway is one incarnation of a weir node serving HTTP in front of the
// upstream. A restarted node is a new gateway with the same name.
type gateway struct {
	name, region string
	voter        bool
	node         *weir.Node
	srv          *http.Server
	base         string
	admitted     atomic.Int64 // requests that reached the upstream
	served       atomic.Int64 // requests it answered
	incarnation  int          // 1 for the first start, 2 after a restart, …
	closing      atomic.Bool  // its node is closing: its error lines are expected
}

// fleet is the demo's gateways and lease group: regions of nodes, named
// <region>-<n>, the first three of them (round robin over the regions) the
// lease group's voters.
type fleet struct {
	host      string
	clustered bool
	regions   []string
	names     map[string][]string // region → node names, in order
	rules     []quota.Rule        // the initial rules
	upstream  http.Handler
	token     string // the admin API's bearer token
	dataDir   string // the voters' raft-boltdb directories live under it

	voters  []raftgroup.Voter // Raft ServerID and address
	rpc     map[string]string // voter → lease forwarding (gRPC) address
	raftLis map[string]net.Listener
	rpcLis  map[string]net.Listener
	machine lease.Config

	stderr    io.Writer   // the nodes' error log lines
	quiet     atomic.Bool // set while everything shuts down: errors then are expected
	logLines  atomic.Int64
	logHidden atomic.Int64
	expected  expected // the warnings the schedule's own steps cause

	// tag is the value of demoHeader on every request the demo itself
	// sends; a request without it came from outside (someone trying a
	// gateway address the demo printed) and is counted apart.
	tag     string
	outside atomic.Int64 // requests from outside the demo, to any gateway

	mu   sync.Mutex
	live map[string]*gateway
	past []*gateway        // stopped incarnations, for the counts
	next map[string]uint64 // per region: the round robin's position
}

// newFleet lays the fleet out and binds the voters' addresses (so that
// every voter and client knows them before the first one starts).
func newFleet(host string, regions, perRegion int, rules []quota.Rule, upstream http.Handler, stderr io.Writer) (*fleet, error) {
	all := []string{"eu", "us"}[:regions]
	f := &fleet{host: host, clustered: regions*perRegion > 1, regions: all, names: map[string][]string{},
		rules: rules, upstream: upstream, rpc: map[string]string{}, raftLis: map[string]net.Listener{},
		rpcLis: map[string]net.Listener{}, live: map[string]*gateway{}, next: map[string]uint64{}, stderr: &lockedWriter{w: stderr}}
	for _, r := range all {
		for i := range perRegion {
			f.names[r] = append(f.names[r], fmt.Sprintf("%s-%d", r, i+1))
		}
	}
	if !f.clustered {
		return f, nil
	}
	f.token = randomHex()
	dir, err := os.MkdirTemp("", "weir-demo-*")
	if err != nil {
		return nil, err
	}
	f.dataDir = dir
	f.machine = lease.Config{Regions: all, LeaseDuration: leaseLife, MaxSkew: leaseSkew}
	// Voters: round robin over the regions (eu-1, us-1, eu-2), three when
	// there are three nodes, else one.
	nv := 1
	if regions*perRegion >= 3 {
		nv = 3
	}
	for i := 0; len(f.voters) < nv; i++ {
		r := all[i%regions]
		k := i / regions
		if k >= perRegion {
			continue
		}
		name := f.names[r][k]
		raftLn, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			f.closeListeners()
			return nil, err
		}
		rpcLn, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			raftLn.Close()
			f.closeListeners()
			return nil, err
		}
		f.raftLis[name], f.rpcLis[name] = raftLn, rpcLn
		f.rpc[name] = rpcLn.Addr().String()
		f.voters = append(f.voters, raftgroup.Voter{Name: name, Addr: raftLn.Addr().String()})
	}
	return f, nil
}

func (f *fleet) closeListeners() {
	for _, l := range f.raftLis {
		l.Close()
	}
	for _, l := range f.rpcLis {
		l.Close()
	}
	f.raftLis, f.rpcLis = map[string]net.Listener{}, map[string]net.Listener{}
}

// randomHex returns 16 random bytes in hex: the admin token, the demo's
// tag.
func randomHex() string {
	b := make([]byte, 16)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// isVoter reports whether name is one of the lease group's voters.
func (f *fleet) isVoter(name string) bool {
	return slices.ContainsFunc(f.voters, func(v raftgroup.Voter) bool { return v.Name == name })
}

// nodeNames returns every node's name, region by region.
func (f *fleet) nodeNames() []string {
	var out []string
	for _, r := range f.regions {
		out = append(out, f.names[r]...)
	}
	return out
}

func (f *fleet) regionOf(name string) string {
	for _, r := range f.regions {
		if slices.Contains(f.names[r], name) {
			return r
		}
	}
	return ""
}

// start starts node name (again, after a stop: same name, same data
// directory and lease addresses for a voter, fresh gossip and peer ports)
// and its HTTP gateway. It does not put it in the clients' rotation: see
// enter.
func (f *fleet) start(name string) (*gateway, error) {
	region := f.regionOf(name)
	cfg := weir.Config{
		// The demo's clients play the load balancer: they connect from
		// loopback and name the client in X-Forwarded-For.
		TrustedProxies: []string{"127.0.0.0/8", "::1/128"},
		// The canary probes weir-canary (rules.yaml) 4 times a second and
		// exports whether it still sees rejections (weir_canary_ok).
		Canary: &weir.CanaryConfig{Rule: "weir-canary"},
	}
	g := &gateway{name: name, region: region, voter: f.isVoter(name), incarnation: 1}
	f.mu.Lock()
	for _, p := range f.past {
		if p.name == name {
			g.incarnation = max(g.incarnation, p.incarnation+1)
		}
	}
	f.mu.Unlock()
	cfg.Logger = slog.New(&quietHandler{Handler: slog.NewTextHandler(f.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}),
		quiet: &f.quiet, closing: &g.closing, lines: &f.logLines, hidden: &f.logHidden, expected: &f.expected})
	if !f.clustered {
		cfg.Rules = f.rules
	} else {
		cc := &weir.ClusterConfig{Name: name, Region: region, LocalTiming: true, Label: "weir-demo-" + region,
			GossipAddr: net.JoinHostPort(f.host, "0"), RPCAddr: net.JoinHostPort(f.host, "0"),
			DecideTimeout: demoCallTimeout, CallTimeout: demoCallTimeout}
		f.mu.Lock()
		for _, other := range f.names[region] {
			if o := f.live[other]; o != nil && other != name {
				cc.Join = []string{ops.GossipAddr(o.node)}
				break
			}
		}
		f.mu.Unlock()
		lc := &weir.LeaseConfig{Rules: true, CheckInterval: ruleCheck, RefreshInterval: leaseRefresh,
			Machine: f.machine, AdminTokens: map[string]string{f.token: adminName}}
		if g.voter {
			vc := &raftgroup.Config{Name: name, Dir: filepath.Join(f.dataDir, name), Voters: f.voters,
				RPCPeers: f.rpc, Machine: f.machine, HeartbeatTimeout: raftTimeout, ElectionTimeout: raftTimeout,
				LeaderLeaseTimeout: raftLeaderTTL}
			// First start: the listeners bound in newFleet; a restart
			// binds the same addresses again (the others know them).
			if l := f.raftLis[name]; l != nil {
				vc.RaftListener, vc.RPCListener = l, f.rpcLis[name]
				delete(f.raftLis, name)
				delete(f.rpcLis, name)
			} else {
				for _, v := range f.voters {
					if v.Name == name {
						vc.RaftAddr = v.Addr
					}
				}
				vc.RPCAddr = f.rpc[name]
			}
			lc.Voter = vc
		} else {
			for _, v := range f.voters {
				lc.Voters = append(lc.Voters, f.rpc[v.Name])
			}
		}
		cfg.Cluster, cfg.Lease = cc, lc
	}
	node, err := weir.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	g.node = node
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.ours(r) {
			g.admitted.Add(1)
		}
		f.upstream.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, "0"))
	if err != nil {
		node.Close()
		return nil, fmt.Errorf("starting %s's gateway: %w", name, err)
	}
	mux := gatewayMux(node, counting)
	g.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.ours(r) {
			g.served.Add(1)
		} else {
			f.outside.Add(1)
		}
		mux.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	go g.srv.Serve(ln)
	g.base = "http://" + ln.Addr().String()
	return g, nil
}

// enter puts g in the clients' rotation.
func (f *fleet) enter(g *gateway) {
	f.mu.Lock()
	f.live[g.name] = g
	f.mu.Unlock()
}

// stop takes node name out of the rotation, drains its gateway and closes
// the node: weir's Close is graceful for the ring (it hands the buckets it
// owns to their next owners and reports its unconfirmed spend before it
// leaves), while a voter's Raft simply stops (no leadership transfer: the
// other voters see a crash and elect).
func (f *fleet) stop(name string) error {
	f.mu.Lock()
	g := f.live[name]
	delete(f.live, name)
	if g != nil {
		f.past = append(f.past, g)
	}
	f.mu.Unlock()
	if g == nil {
		return fmt.Errorf("%s is not running", name)
	}
	g.closing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	return g.node.Close()
}

// stopAll stops every live node, in parallel.
func (f *fleet) stopAll() {
	f.quiet.Store(true)
	f.mu.Lock()
	var names []string
	for n := range f.live {
		names = append(names, n)
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Go(func() { _ = f.stop(n) })
	}
	wg.Wait()
	f.closeListeners()
	if f.dataDir != "" {
		os.RemoveAll(f.dataDir)
	}
}

// gateways returns the live gateways, in name order of the layout.
func (f *fleet) gateways() []*gateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*gateway
	for _, n := range f.nodeNames() {
		if g := f.live[n]; g != nil {
			out = append(out, g)
		}
	}
	return out
}

// get returns the live gateway name, or nil.
func (f *fleet) get(name string) *gateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[name]
}

// all returns every gateway that ran, stopped incarnations first.
func (f *fleet) all() []*gateway {
	live := f.gateways()
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(append([]*gateway(nil), f.past...), live...)
}

// label is g's name, with its incarnation after a restart ("eu-2#2").
func (g *gateway) label() string {
	if g.incarnation > 1 {
		return fmt.Sprintf("%s#%d", g.name, g.incarnation)
	}
	return g.name
}

// pick returns the base URL of the next live gateway of region, round
// robin ("" when the region has none).
func (f *fleet) pick(region string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var l []string
	for _, n := range f.names[region] {
		if g := f.live[n]; g != nil {
			l = append(l, g.base)
		}
	}
	if len(l) == 0 {
		return ""
	}
	f.next[region]++
	return l[int(f.next[region]%uint64(len(l)))]
}

// converged reports whether every live node sees exactly the live nodes of
// its region in its ring.
func (f *fleet) converged() bool { return f.convergedWith(nil) }

// convergedWith is converged with extra, a node not yet in the rotation,
// counted among the live ones.
func (f *fleet) convergedWith(extra *gateway) bool {
	if !f.clustered {
		return true
	}
	gs := f.gateways()
	if extra != nil {
		gs = append(gs, extra)
	}
	for _, g := range gs {
		want := 0
		for _, o := range gs {
			if o.region == g.region {
				want++
			}
		}
		if len(ops.Members(g.node)) != want {
			return false
		}
	}
	return true
}

// leader returns the lease group's leader as a live voter sees it.
func (f *fleet) leader() (string, bool) {
	for _, g := range f.gateways() {
		if lg := leaseGroup(g.node); lg != nil {
			if name, _, ok := lg.Leader(); ok {
				return name, true
			}
		}
	}
	return "", false
}

// rulesVersion returns the lowest and highest rule version the live nodes
// run.
func (f *fleet) rulesVersion() (lo, hi uint64) {
	for i, g := range f.gateways() {
		v := g.node.Status().RulesVersion
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return lo, hi
}

// waitFor polls cond every 20ms until it holds or limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// seed writes the initial rules into the lease group through a voter
// (PutRule forwards to the leader) and waits until every node runs them and
// leases its global rules.
func (f *fleet) seed(limit time.Duration) (uint64, error) {
	var lg *raftgroup.Group
	for _, g := range f.gateways() {
		if lg = leaseGroup(g.node); lg != nil {
			break
		}
	}
	if lg == nil {
		return 0, errors.New("no voter is running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var v uint64
	for _, r := range f.rules {
		var err error
		for {
			if v, err = lg.PutRule(ctx, adminName, r); err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // no leader elected yet
		}
		if err != nil {
			return 0, fmt.Errorf("writing rule %s into the lease group: %w", r.ID, err)
		}
	}
	ok := waitFor(limit, func() bool {
		for _, g := range f.gateways() {
			if g.node.Status().RulesVersion < v || !ops.GlobalStatus(g.node).Leasing {
				return false
			}
		}
		return true
	})
	if !ok {
		return v, fmt.Errorf("not every node runs rule version %d and leases its global rules within %v", v, limit)
	}
	return v, nil
}

// regionIndex returns the index of region in f.regions.
func (f *fleet) regionIndex(region string) int {
	return max(slices.Index(f.regions, region), 0)
}

// retire closes g, a gateway that never entered the rotation, and keeps it
// for the counts.
func (f *fleet) retire(g *gateway) {
	f.mu.Lock()
	f.past = append(f.past, g)
	f.mu.Unlock()
	g.closing.Store(true)
	_ = g.srv.Close()
	_ = g.node.Close()
}

// demoHeader marks the requests the demo itself sends, with the fleet's
// tag as its value.
const demoHeader = "X-Weir-Demo"

// ours reports whether r was sent by the demo itself (its clients or its
// schedule), not from outside.
func (f *fleet) ours(r *http.Request) bool {
	return f.tag != "" && r.Header.Get(demoHeader) == f.tag
}

// quietHandler passes a node's error records to Handler (stderr, or above
// the live table on a terminal), the first maxLogLines of the fleet's
// only; the others are counted in hidden. A node that closes, and the
// fleet as it shuts down, log nothing: their errors are expected. Nor do
// the warnings a scheduled step expects (see expected): they are counted
// there and the summary explains them.
type quietHandler struct {
	slog.Handler
	quiet    *atomic.Bool // the whole fleet shuts down
	closing  *atomic.Bool // this node closes
	lines    *atomic.Int64
	hidden   *atomic.Int64
	expected *expected
}

// maxLogLines is how many of the nodes' error lines reach stderr.
const maxLogLines = 10

// Enabled implements slog.Handler.
func (h *quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return !h.quiet.Load() && !h.closing.Load() && h.Handler.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.expected.match(r.Message, r.Time) {
		return nil
	}
	if h.lines.Add(1) > maxLogLines {
		h.hidden.Add(1)
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{Handler: h.Handler.WithAttrs(as), quiet: h.quiet, closing: h.closing, lines: h.lines, hidden: h.hidden, expected: h.expected}
}

// WithGroup implements slog.Handler.
func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{Handler: h.Handler.WithGroup(name), quiet: h.quiet, closing: h.closing, lines: h.lines, hidden: h.hidden, expected: h.expected}
}

// expected is the warnings the schedule's own steps cause (a refused
// request it sends on purpose, reports failing while it has killed the
// lease leader): while one is open, and for a grace period after it ends,
// the nodes' records with its message are counted instead of shown.
type expected struct {
	mu   sync.Mutex
	list []*expectation
}

// expectation is one kind of expected warning.
type expectation struct {
	prefix    string    // the start of the records' message
	one, many string    // what the summary calls one of them, and several
	until     time.Time // zero while the step runs; then the end of the grace
	n         int
}

// expect opens an expectation of records whose message starts with prefix;
// one and many say, in the summary, what one of them is and what several
// are.
func (e *expected) expect(prefix, one, many string) *expectation {
	x := &expectation{prefix: prefix, one: one, many: many}
	e.mu.Lock()
	e.list = append(e.list, x)
	e.mu.Unlock()
	return x
}

// end closes x: records that match it are still expected for grace (one
// already in flight when the step ended).
func (e *expected) end(x *expectation, grace time.Duration) {
	e.mu.Lock()
	x.until = time.Now().Add(grace)
	e.mu.Unlock()
}

// match reports whether a record with message msg, made at t, is expected,
// and counts it if so.
func (e *expected) match(msg string, t time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.list {
		if strings.HasPrefix(msg, x.prefix) && (x.until.IsZero() || !t.After(x.until)) {
			x.n++
			return true
		}
	}
	return false
}

// counts returns "n what" for every expectation that matched a record.
func (e *expected) counts() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, x := range e.list {
		if x.n > 0 {
			out = append(out, plural(x.n, x.one, x.many))
		}
	}
	return out
}

// globalKeys counts, over the live nodes, the global identities enforcing
// a lease and those on their fallback.
func (f *fleet) globalKeys() (leased, fallback int) {
	for _, g := range f.gateways() {
		for _, r := range ops.GlobalStatus(g.node).Rules {
			leased += r.Leased
			fallback += r.Fallback
		}
	}
	return leased, fallback
}

// lockedWriter serialises the writes of the nodes' loggers (one handler
// each) to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write implements io.Writer.
func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// leaseGroup is the lease group n is a voter of, or nil: the demo writes its
// rules into the group and watches its leader, which a gateway never does,
// so it reads the node through the operator's passage (internal/nodeops)
// rather than through weir.Node's API.
func leaseGroup(n *weir.Node) *raftgroup.Group {
	return nodeops.Of(n).(interface{ LeaseGroup() *raftgroup.Group }).LeaseGroup()
}
