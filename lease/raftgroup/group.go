package raftgroup

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"

	"github.com/weir-dev/weir/internal/golabel"
	"github.com/weir-dev/weir/lease"
)

// This file is the lease group's thin shell: hashicorp/raft with
// raft-boltdb under a data directory, around the pure core (lease.Replica).
// It owns the goroutines, sockets and clock: it stamps every command with
// the proposing leader's clock, proposes Takeover when this node becomes leader (before it
// serves a write), then Tick every TickInterval, and forwards a follower's
// writes to the leader (rpc.go).

// Defaults of Config.
const (
	DefaultTickInterval   = time.Second
	DefaultProposeTimeout = 5 * time.Second
	DefaultBoltTimeout    = time.Second
	DefaultShutdownGrace  = 2 * time.Second
)

// Errors of the Group.
var (
	// ErrNoLeader: the group has no leader this node knows of (an election
	// is running, or quorum is lost). Propose retries until its deadline,
	// then returns an error wrapping it.
	ErrNoLeader = errors.New("lease: the group has no leader")
	// ErrNotLeader: the node asked is not the leader (any more). Propose
	// handles it by retrying; it reaches a caller only wrapped with the
	// deadline's error.
	ErrNotLeader = errors.New("lease: not the leader")
	// ErrClosed: the Group is closed.
	ErrClosed = errors.New("lease: group closed")
)

// Voter is a member of the group's initial configuration.
type Voter struct {
	// Name is the voter's ServerID (Config.Name on that node).
	Name string
	// Addr is its Raft address, host:port.
	Addr string
}

// Config configures a Group. Name, Dir, Machine, a Raft address, and
// Voters (or Join) are required; the zero value of every other field works.
type Config struct {
	// Name is this node's Raft ServerID; a gateway node uses its member
	// name, so that a follower finds the leader's RPC address from it.
	Name string
	// RaftAddr is the address the Raft transport binds, host:port (port 0
	// picks a free one; the bound address is then advertised, so bind a
	// concrete host such as 127.0.0.1, not 0.0.0.0). Ignored when
	// RaftListener is set.
	RaftAddr string
	// RaftListener, when set, is the listener the Raft transport uses
	// instead of binding RaftAddr (so that the address is known before the
	// group starts). The Group owns it from Start on.
	RaftListener net.Listener
	// Dir is the data directory: raft.db (raft-boltdb: the log and stable
	// store) and the snapshots live there. It is created if missing.
	Dir string
	// Voters is the initial configuration: 1, 3 or 5 voters, this node
	// among them. On first start the node bootstraps the group with it;
	// on a restart (existing state in Dir) it is not used again. This
	// node's own Addr may be empty: the address its transport bound is
	// used (handy for one voter on port 0).
	Voters []Voter
	// Join starts the node with no configuration, to be added by a voter's
	// AddVoter; Voters must then be empty.
	Join bool
	// Machine configures the lease machine; every voter must use the same.
	Machine lease.Config
	// Clock returns the time, unix ns; nil means the system clock. Every
	// command this node proposes as leader carries it.
	Clock func() int64
	// TickInterval is how often the leader proposes Tick; 0 means
	// DefaultTickInterval, negative means never.
	TickInterval time.Duration
	// Raft timeouts; 0 means hashicorp/raft's default. Tests on loopback
	// use 50ms, 50ms and 25ms.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// Snapshot policy; 0 means hashicorp/raft's default. Snapshot can
	// also be called directly.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// ProposeTimeout bounds a Propose or AddVoter whose ctx has no
	// deadline; 0 means DefaultProposeTimeout.
	ProposeTimeout time.Duration
	// BoltTimeout bounds the wait for raft.db's file lock (another process
	// holding it); 0 means DefaultBoltTimeout.
	BoltTimeout time.Duration

	// RaftDialer, when set, opens the Raft transport's connections to the
	// other voters instead of the system's TCP dialer (a test puts a
	// fault-injecting network here). Nil means the real network.
	RaftDialer func(addr string, timeout time.Duration) (net.Conn, error)

	// RPCAddr is the address the forwarding service binds, host:port (port
	// 0 picks a free one). Ignored when RPCListener is set.
	RPCAddr string
	// RPCListener, when set, is the forwarding service's listener. The
	// Group owns it from Start on.
	RPCListener net.Listener
	// LeaderRPC resolves a ServerID to that node's forwarding address
	// (RPCAddr), e.g. from gossip metadata. It is asked first; RPCPeers
	// is the fallback. With neither, a follower cannot forward.
	LeaderRPC func(name string) (addr string, ok bool)
	// RPCPeers is a static ServerID → forwarding address map.
	RPCPeers map[string]string
	// ServerTLS secures the forwarding service and the Raft port; nil
	// means plaintext. Set ClientAuth to tls.RequireAndVerifyClientCert
	// (and ClientCAs) for mutual TLS; the Raft port always requires a
	// verified client certificate naming a voter (VoterNames).
	ServerTLS *tls.Config
	// ClientTLS secures forwarded calls and, with ServerTLS, Raft's own
	// connections; nil means plaintext.
	ClientTLS *tls.Config
	// VoterNames, with ServerTLS, are the certificate names (subject
	// common name or DNS name) of the voters: only such a caller may use
	// the Raft port, add voters, propose any command and forward a
	// principal as is (docs/security.md). Empty means the names of
	// Voters; a Join node, or a group that will grow, must list them.
	VoterNames []string
	// ServerOptions are added to the forwarding server's options (e.g. an
	// interceptor that authenticates callers).
	ServerOptions []grpc.ServerOption
	// DialOptions are added to every forwarding connection's options.
	DialOptions []grpc.DialOption
	// ShutdownGrace is how long Close lets forwarded calls finish; 0 means
	// DefaultShutdownGrace.
	ShutdownGrace time.Duration

	// Logger receives the group's events; nil discards them.
	Logger *slog.Logger
	// RaftLogger receives hashicorp/raft's own log; nil discards it.
	RaftLogger hclog.Logger
}

// validate checks c and fills in defaults; errors name the field.
func (c *Config) validate() error {
	switch {
	case c.Name == "":
		return errors.New("lease: Config.Name is empty")
	case c.Dir == "":
		return errors.New("lease: Config.Dir is empty")
	case c.RaftAddr == "" && c.RaftListener == nil:
		return errors.New("lease: Config.RaftAddr is empty (and no RaftListener)")
	case c.RPCAddr == "" && c.RPCListener == nil:
		return errors.New("lease: Config.RPCAddr is empty (and no RPCListener)")
	case c.Join && len(c.Voters) > 0:
		return errors.New("lease: Config.Voters must be empty when Join is set")
	case !c.Join && len(c.Voters) != 1 && len(c.Voters) != 3 && len(c.Voters) != 5:
		return fmt.Errorf("lease: Config.Voters has %d voters, want 1, 3 or 5", len(c.Voters))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HeartbeatTimeout", c.HeartbeatTimeout}, {"ElectionTimeout", c.ElectionTimeout},
		{"LeaderLeaseTimeout", c.LeaderLeaseTimeout}, {"CommitTimeout", c.CommitTimeout},
		{"SnapshotInterval", c.SnapshotInterval}, {"ProposeTimeout", c.ProposeTimeout},
		{"BoltTimeout", c.BoltTimeout}, {"ShutdownGrace", c.ShutdownGrace}} {
		if d.v < 0 {
			return fmt.Errorf("lease: Config.%s is negative (%v)", d.name, d.v)
		}
	}
	names := map[string]bool{}
	self := false
	for i, v := range c.Voters {
		switch {
		case v.Name == "":
			return fmt.Errorf("lease: Config.Voters[%d].Name is empty", i)
		case v.Addr == "" && v.Name != c.Name:
			return fmt.Errorf("lease: Config.Voters[%d].Addr is empty", i)
		case names[v.Name]:
			return fmt.Errorf("lease: Config.Voters[%d]: %q appears twice", i, v.Name)
		}
		names[v.Name] = true
		self = self || v.Name == c.Name
	}
	if !c.Join && !self {
		return fmt.Errorf("lease: Config.Voters does not include this node %q (set Join to join an existing group)", c.Name)
	}
	if c.Clock == nil {
		c.Clock = func() int64 { return time.Now().UnixNano() }
	}
	if c.TickInterval == 0 {
		c.TickInterval = DefaultTickInterval
	}
	if c.ProposeTimeout == 0 {
		c.ProposeTimeout = DefaultProposeTimeout
	}
	if c.BoltTimeout == 0 {
		c.BoltTimeout = DefaultBoltTimeout
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.RaftLogger == nil {
		c.RaftLogger = hclog.NewNullLogger()
	}
	return nil
}

// Group is one voter (or joining node) of the lease group. Its methods are
// safe for concurrent use.
type Group struct {
	cfg  Config
	log  *slog.Logger
	fsm  *FSM
	raft *raft.Raft
	// raftSet is closed once raft is set: Raft may report leadership
	// before NewRaft returns, and the leader loop must not read raft
	// until then.
	raftSet chan struct{}
	trans   *raft.NetworkTransport
	// label marks the goroutines of Raft, its transport and the
	// forwarding connections (internal/golabel); accepted keeps the
	// transport's accepted connections. Close waits for the one and closes
	// the other.
	label    string
	accepted *acceptedConns
	store    *raftboltdb.BoltStore
	rpc      *rpcServer

	notify    chan bool
	done      chan struct{} // closed by Close
	malformed atomic.Uint64
	refused   atomic.Uint64 // callers refused by the doors of rpc.go
	wg        sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	leading *leadership // non-nil while this node leads
	conns   map[string]*grpc.ClientConn
}

// leadership is one term of this node's leadership.
type leadership struct {
	ready chan struct{} // closed once its Takeover is applied
	stop  chan struct{} // closed when it ends
}

// Start opens the data directory, starts Raft and the forwarding
// service, and bootstraps the group on first start. It does not wait for a
// leader: Propose does.
func Start(cfg Config) (_ *Group, err error) {
	if err := cfg.validate(); err != nil {
		closeListeners(cfg)
		return nil, err
	}
	m, err := lease.NewMachine(cfg.Machine)
	if err != nil {
		closeListeners(cfg)
		return nil, fmt.Errorf("lease: Config.Machine: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Group{cfg: cfg, log: log.With("component", "lease-group", "self", cfg.Name), fsm: NewFSM(m),
		notify: make(chan bool, 8), done: make(chan struct{}), raftSet: make(chan struct{}),
		conns: map[string]*grpc.ClientConn{}}
	g.fsm.applied = g.logGrants
	// On failure, undo what was started, in reverse.
	var undo []func()
	defer func() {
		if err != nil {
			closeListeners(cfg)
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()

	if err := mkdirAll(cfg.Dir); err != nil {
		return nil, err
	}
	g.store, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.Dir, "raft.db"),
		BoltOptions: &bbolt.Options{Timeout: cfg.BoltTimeout}})
	if err != nil {
		return nil, fmt.Errorf("lease: Config.Dir: opening raft.db: %w", err)
	}
	undo = append(undo, func() { _ = g.store.Close() })
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, cfg.RaftLogger)
	if err != nil {
		return nil, fmt.Errorf("lease: Config.Dir: snapshot store: %w", err)
	}

	lis := cfg.RaftListener
	if lis == nil {
		if lis, err = net.Listen("tcp", cfg.RaftAddr); err != nil {
			return nil, fmt.Errorf("lease: Config.RaftAddr: %w", err)
		}
	}
	g.cfg.RaftListener = nil // owned by the transport now
	// raft's transport and Raft itself start their goroutines under the
	// Group's label, and the listener keeps the connections it accepts:
	// the transport's Close stops accepting but leaves each accepted
	// connection's handler reading until the peer hangs up, so Close
	// closes them and waits for the label.
	g.label = golabel.New("raft")
	g.accepted = &acceptedConns{Listener: lis, conns: map[net.Conn]struct{}{}}
	golabel.Do(g.label, func() {
		g.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: g.raftStream(g.accepted, cfg.RaftDialer), MaxPool: 3, Timeout: 10 * time.Second, Logger: cfg.RaftLogger})
	})
	undo = append(undo, func() { _ = g.trans.Close(); g.trans.CloseStreams(); g.accepted.closeAll() })

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.Name)
	rc.Logger = cfg.RaftLogger
	rc.NotifyCh = g.notify
	setDur(&rc.HeartbeatTimeout, cfg.HeartbeatTimeout)
	setDur(&rc.ElectionTimeout, cfg.ElectionTimeout)
	setDur(&rc.LeaderLeaseTimeout, cfg.LeaderLeaseTimeout)
	setDur(&rc.CommitTimeout, cfg.CommitTimeout)
	setDur(&rc.SnapshotInterval, cfg.SnapshotInterval)
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.TrailingLogs > 0 {
		rc.TrailingLogs = cfg.TrailingLogs
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("lease: Config (Raft timeouts): %w", err)
	}

	if !cfg.Join {
		servers := make([]raft.Server, len(cfg.Voters))
		for i, v := range cfg.Voters {
			servers[i] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(v.Name), Address: raft.ServerAddress(v.Addr)}
			if v.Addr == "" { // this node: the address it bound
				servers[i].Address = g.trans.LocalAddr()
			}
		}
		err := raft.BootstrapCluster(rc, g.store, g.store, snaps, g.trans, raft.Configuration{Servers: servers})
		if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return nil, fmt.Errorf("lease: bootstrapping the group: %w", err)
		}
	}

	// The watcher must run before Raft, which blocks on NotifyCh.
	g.wg.Add(1)
	go g.watchLeadership()
	undo = append(undo, func() { close(g.done); g.wg.Wait() })

	golabel.Do(g.label, func() { g.raft, err = raft.NewRaft(rc, g.fsm, g.store, g.store, snaps, g.trans) })
	if err != nil {
		return nil, fmt.Errorf("lease: starting raft: %w", err)
	}
	close(g.raftSet)
	undo = append(undo, func() { _ = g.raft.Shutdown().Error() })

	g.rpc, err = startRPCServer(g)
	if err != nil {
		return nil, err
	}
	g.log.Info("lease group started", "raft", g.trans.LocalAddr(), "rpc", g.rpc.addr())
	return g, nil
}

// closeListeners closes the caller's listeners when Start fails before
// it took them over (closing one twice is harmless).
func closeListeners(cfg Config) {
	if cfg.RaftListener != nil {
		_ = cfg.RaftListener.Close()
	}
	if cfg.RPCListener != nil {
		_ = cfg.RPCListener.Close()
	}
}

func setDur(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// Close stops the forwarding service and Raft, and closes the transport
// and raft.db. It returns once no goroutine of the Group runs: its own,
// Raft's, the transport's (the handlers of the connections it accepted
// included) and the forwarding connections'. It does not hand leadership
// over: the other voters elect a new leader, as after a crash. Calling
// Close again does nothing.
func (g *Group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	conns := g.conns
	g.conns = nil
	g.mu.Unlock()

	close(g.done)
	var errs []error
	if err := g.raft.Shutdown().Error(); err != nil {
		errs = append(errs, fmt.Errorf("lease: raft shutdown: %w", err))
	}
	g.rpc.stop(g.cfg.ShutdownGrace)
	g.wg.Wait()
	for _, cc := range conns {
		_ = cc.Close()
	}
	if err := g.trans.Close(); err != nil {
		errs = append(errs, err)
	}
	g.trans.CloseStreams()
	g.accepted.closeAll()
	if n := golabel.Wait(g.label, closeWait); n > 0 {
		g.log.Warn("raft or lease RPC goroutines still running after close", "goroutines", n, "waited", closeWait)
	}
	if err := g.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("lease: closing raft.db: %w", err))
	}
	g.log.Info("lease group closed")
	return errors.Join(errs...)
}

// Name is this node's ServerID.
func (g *Group) Name() string { return g.cfg.Name }

// RaftAddr is the address the Raft transport listens on (give it to
// AddVoter to join this node).
func (g *Group) RaftAddr() string { return string(g.trans.LocalAddr()) }

// RPCAddr is the address the forwarding service listens on.
func (g *Group) RPCAddr() string { return g.rpc.addr() }

// Leader returns the current leader's ServerID and Raft address as this
// node knows them; ok is false when it knows of none.
func (g *Group) Leader() (name, addr string, ok bool) {
	a, id := g.raft.LeaderWithID()
	return string(id), string(a), id != ""
}

// IsLeader reports whether this node is the Raft leader. A new leader
// serves writes only once its Takeover is applied (Ready).
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// Ready reports whether this node leads and its Takeover is applied, so
// that it serves writes.
func (g *Group) Ready() bool {
	l := g.lead()
	if l == nil {
		return false
	}
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// Snapshot takes a Raft snapshot now and waits for it.
func (g *Group) Snapshot() error {
	if err := g.raft.Snapshot().Error(); err != nil {
		return fmt.Errorf("lease: snapshot: %w", err)
	}
	return nil
}

// AppliedIndex is the index of the last log entry applied to this node's
// machine.
func (g *Group) AppliedIndex() uint64 { return g.raft.AppliedIndex() }

// Malformed is the number of malformed commands the forwarding service
// refused.
func (g *Group) Malformed() uint64 { return g.malformed.Load() }

// FSM returns the node's FSM, to read its machine's state (Check, State).
func (g *Group) FSM() *FSM { return g.fsm }

// Propose applies c through the leader's Raft log and returns its Result:
// on the leader directly, from a follower through the leader's forwarding
// service. c.Now is ignored: the leader stamps the command with its own
// clock. A refused command returns an error wrapping ErrBadCommand,
// ErrUnknownRule or ErrUnknownRegion.
//
// While there is no leader, or leadership moves, Propose retries until ctx
// ends (or ProposeTimeout, when ctx has no deadline), then returns an error
// wrapping both the last failure (ErrNoLeader, ErrNotLeader, an unreachable
// leader) and ctx's error. Retrying is safe: a Report with a Seq already
// applied changes nothing and returns the current leases, and Takeover,
// Tick and a rule set are idempotent. A command may have been applied even
// when Propose fails (the reply was lost). Once the rule store has a
// version (PutRule, DeleteRule), it owns the machine's rules and a
// Command{Rules} is refused with ErrBadCommand.
func (g *Group) Propose(ctx context.Context, c lease.Command) (lease.Result, error) {
	resp, err := g.propose(ctx, lease.Entry{Command: &c})
	return resp.Result, err
}

// propose applies a log entry of either kind through the leader, retrying
// as Propose describes.
func (g *Group) propose(ctx context.Context, e lease.Entry) (lease.ApplyResponse, error) {
	if _, err := lease.EntryToPB(e); err != nil {
		return lease.ApplyResponse{}, err
	}
	var resp lease.ApplyResponse
	err := g.retry(ctx, "propose", func(ctx context.Context) (bool, error) {
		var err error
		var retry bool
		if l := g.lead(); l != nil {
			resp, retry, err = g.proposeLocal(ctx, l, e)
			return retry, err
		}
		name, rpcAddr, err := g.leaderRPC()
		if err != nil {
			return true, err
		}
		resp, retry, err = g.forwardPropose(ctx, name, rpcAddr, e)
		return retry, err
	})
	return resp, err
}

// AddVoter adds a voter (its ServerID and Raft address) to the group, on the
// leader (from a follower through the leader's forwarding service), and
// waits until the configuration change is committed. It retries like
// Propose; adding a voter that is already one with the same address
// changes nothing.
func (g *Group) AddVoter(ctx context.Context, name, addr string) error {
	if name == "" || addr == "" {
		return errors.New("lease: AddVoter: empty name or address")
	}
	return g.retry(ctx, "add voter", func(ctx context.Context) (bool, error) {
		if g.IsLeader() {
			return g.addVoterLocal(ctx, name, addr)
		}
		leader, rpcAddr, err := g.leaderRPC()
		if err != nil {
			return true, err
		}
		return g.forwardAddVoter(ctx, leader, rpcAddr, name, addr)
	})
}

// retry runs once until it succeeds, fails for good, or ctx (bounded by
// ProposeTimeout) ends.
func (g *Group) retry(ctx context.Context, what string, once func(context.Context) (retry bool, err error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.ProposeTimeout)
		defer cancel()
	}
	wait := 5 * time.Millisecond
	for {
		if g.isClosed() {
			return ErrClosed
		}
		retry, err := once(ctx)
		if err == nil || !retry {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lease: %s gave up: %w (%w)", what, err, ctx.Err())
		case <-g.done:
			t.Stop()
			return ErrClosed
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// proposeLocal applies e on this leader once its Takeover is applied.
func (g *Group) proposeLocal(ctx context.Context, l *leadership, e lease.Entry) (lease.ApplyResponse, bool, error) {
	if retry, err := g.waitReady(ctx, l); err != nil {
		return lease.ApplyResponse{}, retry, err
	}
	return g.apply(ctx, e)
}

// waitReady waits until leadership l has applied its Takeover.
func (g *Group) waitReady(ctx context.Context, l *leadership) (retry bool, err error) {
	select {
	case <-l.ready:
		return false, nil
	case <-l.stop:
		return true, ErrNotLeader
	case <-g.done:
		return false, ErrClosed
	case <-ctx.Done():
		return true, fmt.Errorf("lease: waiting for the takeover: %w", ErrNotLeader)
	}
}

// apply stamps e with this node's clock and applies it through Raft. retry
// is true for failures another attempt may cure (leadership lost). The
// response's Err, the machine's or the rule store's refusal, is returned
// as the error too.
func (g *Group) apply(ctx context.Context, e lease.Entry) (lease.ApplyResponse, bool, error) {
	now := g.cfg.Clock()
	if e.Command != nil {
		c := *e.Command
		c.Now = now
		e.Command = &c
	}
	if e.Rule != nil {
		rc := *e.Rule
		rc.Now = now
		e.Rule = &rc
	}
	if e.Durable != nil {
		dc := *e.Durable
		dc.Now = now
		e.Durable = &dc
	}
	data, err := lease.EncodeLogEntry(e)
	if err != nil {
		return lease.ApplyResponse{}, false, err
	}
	timeout := g.cfg.ProposeTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	f := g.raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		return lease.ApplyResponse{}, raftRetryable(err), g.raftError(err)
	}
	resp, _ := f.Response().(lease.ApplyResponse)
	return resp, false, resp.Err
}

// logGrants writes, at debug level, each lease a report got as the group
// counts it: the report's reporter and sequence number, granted at now (the
// machine's time when it applied the report, from which the lifetime is
// counted: the entry's time, the leader's clock when it proposed it, unless
// an entry stamped later was applied first), expiring at now + lifetime
// (unix ns; capacity is handed on only after that plus the skew). Every
// voter logs the reports it applies, from its FSM, so that a grant
// committed after its proposer gave up on it (a timeout, a lost
// leadership) is logged too, and a report applied again (a retry whose
// first attempt was committed) is logged with the leases it got back.
func (g *Group) logGrants(e lease.Entry, resp lease.ApplyResponse, now int64) {
	if resp.Err != nil || e.Command == nil || e.Command.Report == nil || !g.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	rep := e.Command.Report
	for _, gr := range resp.Result.Grants {
		if gr.Epoch == 0 {
			continue
		}
		g.log.Debug("lease granted", "region", rep.Region, "reporter", rep.Reporter, "seq", rep.Seq,
			"rule", gr.Rule, "identity", gr.Identity, "epoch", gr.Epoch, "share", gr.Share,
			"at", now, "proposed", e.Command.Now, "expiry", now+gr.Lifetime)
	}
}

// addVoterLocal adds a voter on this leader.
func (g *Group) addVoterLocal(ctx context.Context, name, addr string) (bool, error) {
	timeout := g.cfg.ProposeTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	if err := g.raft.AddVoter(raft.ServerID(name), raft.ServerAddress(addr), 0, timeout).Error(); err != nil {
		return raftRetryable(err), fmt.Errorf("lease: adding voter %q at %s: %w", name, addr, g.raftError(err))
	}
	g.log.Info("voter added", "name", name, "addr", addr)
	return false, nil
}

// raftRetryable reports whether a Raft error may pass on another attempt.
func raftRetryable(err error) bool {
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout)
}

// raftError maps Raft's errors onto the Group's.
func (g *Group) raftError(err error) error {
	switch {
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return fmt.Errorf("lease: raft: %w", err)
}

// leaderRPC returns the leader's name and forwarding address.
func (g *Group) leaderRPC() (name, addr string, err error) {
	name, _, ok := g.Leader()
	if !ok {
		return "", "", ErrNoLeader
	}
	if name == g.cfg.Name {
		// Raft made this node leader a moment ago and the watcher has
		// not caught up yet.
		return "", "", ErrNotLeader
	}
	if g.cfg.LeaderRPC != nil {
		if addr, ok := g.cfg.LeaderRPC(name); ok && addr != "" {
			return name, addr, nil
		}
	}
	if addr, ok := g.cfg.RPCPeers[name]; ok && addr != "" {
		return name, addr, nil
	}
	return "", "", fmt.Errorf("%w: no forwarding address for the leader %q (Config.LeaderRPC, RPCPeers)", ErrNoLeader, name)
}

func (g *Group) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// lead returns the current leadership, or nil.
func (g *Group) lead() *leadership {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leading
}

// watchLeadership follows Raft's leadership notifications: on gaining
// leadership it starts a leader loop, on losing it stops it.
func (g *Group) watchLeadership() {
	defer g.wg.Done()
	for {
		select {
		case <-g.done:
			g.setLeading(false)
			return
		case leader := <-g.notify:
			g.setLeading(leader)
		}
	}
}

func (g *Group) setLeading(leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leading != nil {
		close(g.leading.stop)
		g.leading = nil
	}
	if leader && !g.closed {
		l := &leadership{ready: make(chan struct{}), stop: make(chan struct{})}
		g.leading = l
		g.wg.Add(1)
		go g.leaderLoop(l)
		g.log.Info("became leader")
	}
}

// leaderLoop runs for one term of leadership: it proposes Takeover first,
// marks the leadership ready to serve writes once that is applied, then
// proposes Tick every TickInterval.
func (g *Group) leaderLoop(l *leadership) {
	defer g.wg.Done()
	select {
	case <-g.raftSet:
	case <-l.stop:
		return
	}
	wait := 5 * time.Millisecond
	for {
		_, retry, err := g.apply(context.Background(), lease.Entry{Command: &lease.Command{Takeover: true}})
		if err == nil {
			close(l.ready)
			break
		}
		if !retry {
			g.log.Error("takeover failed", "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-l.stop:
			t.Stop()
			return
		case <-g.done:
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
	g.log.Info("takeover applied: serving writes")
	if g.cfg.TickInterval < 0 {
		return
	}
	tk := time.NewTicker(g.cfg.TickInterval)
	defer tk.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-g.done:
			return
		case <-tk.C:
			if _, _, err := g.apply(context.Background(), lease.Entry{Command: &lease.Command{Tick: true}}); err != nil {
				g.log.Warn("tick failed", "err", err)
			}
		}
	}
}

// closeWait bounds how long Close waits for the goroutines of Raft, its
// transport and the forwarding connections once it has closed them: they
// end at once (every connection is closed), so reaching it means a bug,
// which Close logs.
const closeWait = 5 * time.Second

// acceptedConns is the Raft listener, keeping every connection it accepted
// until the connection closes, so that Close can close those the transport
// leaves open.
type acceptedConns struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Accept implements net.Listener.
func (l *acceptedConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	ac := &acceptedConn{Conn: c, l: l}
	l.conns[ac] = struct{}{}
	return ac, nil
}

// closeAll closes every accepted connection still open, and any accepted
// from now on.
func (l *acceptedConns) closeAll() {
	l.mu.Lock()
	l.closed = true
	open := make([]net.Conn, 0, len(l.conns))
	for c := range l.conns {
		open = append(open, c)
	}
	l.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// acceptedConn is an accepted connection, forgotten when it closes.
type acceptedConn struct {
	net.Conn
	l    *acceptedConns
	once sync.Once
}

func (c *acceptedConn) Close() error {
	var err error
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// tcpStream is raft's StreamLayer over a TCP listener the Group owns.
type tcpStream struct {
	net.Listener
	dial func(addr string, timeout time.Duration) (net.Conn, error) // nil: net.DialTimeout
}

// Dial implements raft.StreamLayer.
func (s tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.dial != nil {
		return s.dial(string(addr), timeout)
	}
	return net.DialTimeout("tcp", string(addr), timeout)
}

// mkdirAll creates the data directory, readable by its owner only.
func mkdirAll(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lease: Config.Dir: %w", err)
	}
	return nil
}
