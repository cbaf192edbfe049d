package weir

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/cluster/shell"
	"github.com/weir-dev/weir/quota"
)

// ClusterConfig makes a Node a member of its region's cluster: nodes join a
// memberlist ring, every identity has an owner node, and `shared` and
// `exact` rules are decided together (see docs/cluster.md and docs/rules.md).
// Without it every rule is enforced per node, as `local`.
type ClusterConfig struct {
	// Name is this node's name, unique in the cluster. Required.
	Name string
	// Region is this node's region; only members of the same region share
	// buckets. Required.
	Region string
	// GossipAddr is the "ip:port" memberlist binds (TCP and UDP); port 0
	// picks a free one. Default "127.0.0.1:0".
	GossipAddr string
	// AdvertiseAddr is the gossip address other nodes reach, when it differs.
	AdvertiseAddr string
	// Join lists gossip addresses of members to join; empty starts a cluster.
	Join []string
	// SecretKey (16, 24 or 32 bytes) encrypts gossip; nodes without it
	// cannot join.
	SecretKey []byte
	// Keyring, instead of or with SecretKey, holds several gossip keys
	// (memberlist.NewKeyring). Keep a reference to rotate keys with no
	// downtime: AddKey(new) on every node, then UseKey(new) on every node,
	// then RemoveKey(old) (see shell.Membership and docs/cluster.md).
	Keyring *memberlist.Keyring
	// RPCAddr is the "ip:port" the peer gRPC server listens on; port 0 picks
	// a free one. Default "127.0.0.1:0".
	RPCAddr string
	// ServerTLS and ClientTLS secure peer RPC; set ServerTLS.ClientAuth to
	// tls.RequireAndVerifyClientCert for mutual TLS. Nil: plaintext.
	ServerTLS, ClientTLS *tls.Config
	// SyncInterval bounds how long admitted spend stays unreported to an
	// owner; zero means cluster.DefaultSyncInterval.
	SyncInterval time.Duration
	// DecideTimeout bounds how long a request waits for its owner before
	// on_failure decides it; zero means cluster.DefaultDecideTimeout.
	DecideTimeout time.Duration
	// CallTimeout bounds one peer exchange; zero means 200ms.
	CallTimeout time.Duration
	// HandoffTimeout bounds how long, after a ring change, a node that
	// became an identity's owner has the previous owner decide it while
	// it waits for that owner's handoff, before it trusts its own bucket;
	// zero means cluster.DefaultHandoffTimeout.
	HandoffTimeout time.Duration
	// Linger is the longest a batch to a peer waits behind an exchange in
	// flight before it is sent anyway (a batch leaves at once when no
	// exchange is in flight, else when the one in flight returns); zero
	// means 200µs. MaxBatch sends a batch at once when it has that many
	// items, and cuts larger ones; zero means 1024.
	Linger   time.Duration
	MaxBatch int
	// Shards is the number of independent decision cores the identities
	// are spread over, each behind its own lock (a power of two, at most
	// shell.MaxShards); 0 means shell.DefaultShards.
	Shards int
	// LocalTiming selects memberlist timings for a single machine (fast
	// failure detection, for tests and the demo) instead of LAN defaults.
	LocalTiming bool
	// Label isolates clusters that share a network (and tests in one
	// process): nodes with different labels ignore each other.
	Label string
	// MaxKeys caps the entries the coordinator keeps per rule on this node
	// (owner buckets and node entries together); zero or less means
	// cluster.DefaultMaxKeys. At the cap, entries equal to no entry go
	// first, then the one whose eviction forgives the least (counted in
	// the coordinator's stats; the key cap row of docs/overshoot.md's
	// fault terms).
	MaxKeys int

	// net, when set, is the network the node's gossip, peer RPC and lease
	// client go through instead of the real one: the chaos test
	// (chaos_test.go) puts a fault-injecting one here. Nil in production.
	net *netHooks
	// keyFormat, when set, is the highest bucket-key format the node
	// speaks instead of keyFormatLatest: a test sets 1 to stand for a node
	// that predates key formats. Zero in production.
	keyFormat uint32
}

// netHooks replace the real network under a node, for tests that inject
// faults. Every field is required when the struct is set.
type netHooks struct {
	// listen binds a TCP listener (the peer RPC server).
	listen func(network, addr string) (net.Listener, error)
	// dial opens a connection to addr (peer RPC, the lease client).
	dial func(ctx context.Context, addr string) (net.Conn, error)
	// gossip wraps memberlist's transport.
	gossip func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
}

// clusterPart is a node's cluster machinery.
type clusterPart struct {
	mem   *shell.Membership
	tr    *shell.GRPCTransport
	shell *shell.Node
	epoch atomic.Uint64
	done  chan struct{}
	wg    sync.WaitGroup

	lastLog atomic.Int64 // unix ns of the last fail-open log line

	region  string
	version chan uint64 // rule-set versions to gossip, newest wins
	speaks  uint32      // the highest bucket-key format this node speaks (keys.go)
}

// startCluster starts the transport, the shell and membership.
func (n *Node) startCluster(cc *ClusterConfig) error {
	if cc.Name == "" {
		return errors.New("weir: Config.Cluster.Name: required")
	}
	if cc.Region == "" {
		return errors.New("weir: Config.Cluster.Region: required")
	}
	rpc := cc.RPCAddr
	if rpc == "" {
		rpc = "127.0.0.1:0"
	}
	listen, dial := net.Listen, (func(context.Context, string) (net.Conn, error))(nil)
	var wrapGossip func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	if h := cc.net; h != nil {
		listen, dial, wrapGossip = h.listen, h.dial, h.gossip
	}
	ln, err := listen("tcp", rpc)
	if err != nil {
		return fmt.Errorf("weir: Config.Cluster.RPCAddr: %w", err)
	}
	cp := &clusterPart{done: make(chan struct{}), region: cc.Region, version: make(chan uint64, 1)}
	tr, err := shell.NewGRPCTransport(shell.GRPCConfig{
		Self: cc.Name, Listener: ln, ServerTLS: cc.ServerTLS, ClientTLS: cc.ClientTLS, Logger: n.log, Dialer: dial,
		Handler: func(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
			return cp.shell.Handle(ctx, from, m)
		},
	})
	if err != nil {
		ln.Close()
		return fmt.Errorf("weir: Config.Cluster: peer RPC: %w", err)
	}
	cp.tr = tr
	sh, err := shell.New(shell.Config{
		Coordinator: cluster.CoordinatorConfig{Self: cc.Name, SyncInterval: cc.SyncInterval, DecideTimeout: cc.DecideTimeout, HandoffTimeout: cc.HandoffTimeout,
			Shares: n.shares(), MaxKeys: cc.MaxKeys, SketchSeed: n.hasher.Sum("\x00seed: cluster sketch")},
		Transport: tr, CallTimeout: cc.CallTimeout, Linger: cc.Linger, MaxBatch: cc.MaxBatch, Shards: cc.Shards, Clock: n.now, Logger: n.log,
		Hasher: n.hasher, // per process unless Config.HashSeed: chosen identities cannot crowd one shard
	})
	if err != nil {
		tr.Close()
		return fmt.Errorf("weir: Config.Cluster: %w", err)
	}
	cp.shell = sh
	// A ring of just this node until membership says otherwise.
	self, _ := cluster.NewRing(0, []cluster.Member{{Name: cc.Name, Addr: tr.Addr()}})
	sh.SetRing(self)
	profile := shell.ProfileLAN
	if cc.LocalTiming {
		profile = shell.ProfileLocal
	}
	gossip := cc.GossipAddr
	if gossip == "" {
		gossip = "127.0.0.1:0"
	}
	cp.speaks = keyFormatLatest
	if cc.keyFormat != 0 {
		cp.speaks = cc.keyFormat
	}
	mem, err := shell.StartMembership(shell.MembershipConfig{
		Name: cc.Name, Region: cc.Region, BindAddr: gossip, AdvertiseAddr: cc.AdvertiseAddr, Join: cc.Join,
		SecretKey: cc.SecretKey, Keyring: cc.Keyring, RPCAddr: tr.Addr(), Label: cc.Label, Profile: profile, Logger: n.log,
		WrapTransport: wrapGossip, KeyFormat: uint8(cp.speaks),
	})
	if err != nil {
		sh.Close()
		tr.Close()
		return fmt.Errorf("weir: Config.Cluster: membership: %w", err)
	}
	cp.mem = mem
	n.cluster = cp
	n.noteKeyFormat(mem.Members())
	cp.wg.Add(2)
	go n.watchMembers(cc.Region)
	go n.publishVersions()
	if len(cc.Join) > 0 {
		n.awaitRing(cc.Region, joinRingWait)
	}
	return nil
}

// joinRingWait bounds how long New waits for the ring to hold the members
// its join learned of.
const joinRingWait = 2 * time.Second

// awaitRing waits, at most limit, until the ring holds every member of the
// region that memberlist knows: the join merged their list, and the ring is
// rebuilt from its events on another goroutine. Until then this node's ring
// is itself alone, so it would own every identity, with full buckets: a
// node that joins must not decide before (the demo measured such a node
// admitting a hot key's burst again).
func (n *Node) awaitRing(region string, limit time.Duration) {
	cp := n.cluster
	deadline := time.Now().Add(limit)
	for {
		want := 0
		for _, mi := range cp.mem.Members() {
			if mi.Meta.Region == region && mi.Meta.RPCAddr != "" {
				want++
			}
		}
		if r := cp.shell.Ring(); r != nil && r.Len() >= want {
			return
		}
		if time.Now().After(deadline) {
			n.log.Warn("the ring does not hold every member the join found yet; deciding anyway", "members", want)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// publishVersions gossips the rule-set version in force in this node's
// metadata, so that every member can tell which version each one runs.
func (n *Node) publishVersions() {
	cp := n.cluster
	defer cp.wg.Done()
	for {
		select {
		case <-cp.done:
			return
		case v := <-cp.version:
			meta := cp.mem.LocalMeta()
			meta.RulesVersion = v
			if err := cp.mem.SetMeta(meta); err != nil && !errors.Is(err, shell.ErrBroadcastTimeout) {
				n.log.Warn("could not gossip the rule version", "version", v, "err", err)
			}
		}
	}
}

// announceVersion queues v for gossip, replacing a queued older one.
func (cp *clusterPart) announceVersion(v uint64) {
	for {
		select {
		case cp.version <- v:
			return
		default:
		}
		select {
		case <-cp.version:
		default:
		}
	}
}

// Peer is one live member of the cluster, of any region, as gossip reports
// it.
type Peer struct {
	Name         string `json:"name"`
	Region       string `json:"region"`
	RPCAddr      string `json:"rpc_addr"`
	RulesVersion uint64 `json:"rules_version"`
}

// peers returns every live member of the cluster (all regions), sorted by
// name, with the rule-set version each one runs; nil without a cluster.
func (n *Node) peers() []Peer {
	if n.cluster == nil {
		return nil
	}
	var out []Peer
	for _, mi := range n.cluster.mem.Members() {
		out = append(out, Peer{Name: mi.Name, Region: mi.Meta.Region, RPCAddr: mi.Meta.RPCAddr, RulesVersion: mi.Meta.RulesVersion})
	}
	return out
}

// watchMembers rebuilds the ring from the live members of this region on
// every membership event and swaps it in whole.
func (n *Node) watchMembers(region string) {
	cp := n.cluster
	defer cp.wg.Done()
	for {
		select {
		case <-cp.done:
			return
		case _, ok := <-cp.mem.Events():
			if !ok {
				return
			}
			// Coalesce a burst of events into one ring.
			for drained := false; !drained; {
				select {
				case _, ok := <-cp.mem.Events():
					if !ok {
						return
					}
				default:
					drained = true
				}
			}
			var members []cluster.Member
			all := cp.mem.Members()
			n.noteKeyFormat(all)
			for _, mi := range all {
				if n.cfg.Lease != nil && n.cfg.Lease.Rules {
					n.noteRulesVersion(mi.Meta.RulesVersion)
				}
				if mi.Meta.Region == region && mi.Meta.RPCAddr != "" {
					members = append(members, cluster.Member{Name: mi.Name, Addr: mi.Meta.RPCAddr})
				}
			}
			slices.SortFunc(members, func(a, b cluster.Member) int { return strings.Compare(a.Name, b.Name) })
			if cur := cp.shell.Ring(); cur != nil && slices.Equal(cur.Members(), members) {
				continue // a metadata change (a rule version): same ring
			}
			ring, err := cluster.NewRing(cp.epoch.Add(1), members)
			if err != nil {
				n.log.Error("membership gave an invalid ring; keeping the last one", "err", err)
				continue
			}
			cp.shell.SetRing(ring)
			n.log.Info("ring changed", "epoch", ring.Epoch(), "members", ring.Len())
		}
	}
}

// region is this node's region: ClusterConfig.Region, or "" without a
// cluster.
func (n *Node) region() string {
	if n.cfg.Cluster == nil {
		return ""
	}
	return n.cfg.Cluster.Region
}

// members returns the names of the live members of this node's region as
// the ring sees them (just this node without a cluster).
func (n *Node) members() []string {
	if n.cluster == nil {
		return nil
	}
	var out []string
	for _, m := range n.cluster.shell.Ring().Members() {
		out = append(out, m.Name)
	}
	return out
}

// gossipAddr returns the memberlist address other nodes join ("" without a
// cluster).
func (n *Node) gossipAddr() string {
	if n.cluster == nil {
		return ""
	}
	return n.cluster.mem.GossipAddr()
}

// stopCluster leaves the ring gracefully and stops the machinery.
func (n *Node) stopCluster() error {
	cp := n.cluster
	if cp == nil {
		return nil
	}
	// Hand owned buckets to their next owners and report unconfirmed spend
	// while the peers are still reachable.
	cp.shell.Leave()
	err := cp.mem.Leave(2 * time.Second)
	close(cp.done)
	cp.wg.Wait()
	cp.shell.Close()
	if e := cp.tr.Close(); err == nil {
		err = e
	}
	return err
}

// crash stops the node as a process crash would, for tests of owner
// failure: gossip stops without a leave (the others declare the node dead
// after their failure-detection timeout), nothing is handed off or
// reported, and the peer server goes away. The node counts as closed.
func (n *Node) crash() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	if cp := n.cluster; cp != nil {
		cp.mem.Close()
		close(cp.done)
		cp.wg.Wait()
		cp.shell.Close()
		cp.tr.Close()
	}
	// What is not the cluster stops too, so that a crashed node leaves no
	// goroutine behind (its lease connection closes like a dead process's).
	if n.ops.canary != nil {
		n.ops.canary.close()
	}
	n.stopGlobal()
	n.stopLease()
	if n.watcher != nil {
		n.watcher.Close()
	}
	n.unregister()
}

// clusterRules registers the shared and exact rules of a set, and their
// override and tier variants, with the coordinator, and marks each limit
// spec with the coordinator rule id that decides it. The coordinator decides
// gcra rules (shared or exact), and fixed_window, sliding_window,
// sliding_log, leaky_bucket and concurrency rules in exact mode (the owner
// holds the window, the log, the queue or the slots in flight).
func (n *Node) clusterRules(e *engine) {
	if n.cluster == nil {
		return
	}
	var params []cluster.RuleParams
	add := func(c *crule, spec *limitSpec, suffix string, limit, burst int64, sketch *quota.Sketch) {
		r := *c.r
		r.Limit, r.Burst, r.Sketch = limit, burst, sketch // a leaky variant's default max_delay follows them
		r.ID = c.r.ID + suffix
		if gp := n.global; gp != nil && suffix == "" && gp.Leases(c.r.ID) {
			r.Accuracy = gp.slackAccuracy(c.r.Accuracy)
		}
		p, err := cluster.NewRuleParams(&r, e.set.Version())
		if err != nil {
			n.log.Error("rule cannot be decided by the cluster; enforcing it per node", "rule", c.r.ID, "err", err)
			return
		}
		params = append(params, p)
		spec.cid = r.ID
	}
	for i := range e.rules {
		c := &e.rules[i]
		if (c.r.Mode != quota.ModeShared && c.r.Mode != quota.ModeExact) || c.r.Durable {
			continue // durable rules are decided by the lease group
		}
		add(c, &c.base, "", c.base.limit, c.base.burst, c.r.Sketch)
		for src, m := range c.overrides {
			for id, o := range m {
				// An override's variant decides one identity: a sketch
				// (Width × Depth bytes) would gate nothing.
				add(c, &o.limitSpec, overrideSuffix(c, src, id), o.limit, o.burst, nil)
				for i, s := range o.tiers {
					if s.limit == o.limit && s.burst == o.burst {
						s.cid = o.cid // the tier changes none of its limits
						continue
					}
					add(c, s, overrideSuffix(c, src, id)+"#tier:"+c.r.Tiers[i].Name, s.limit, s.burst, nil)
				}
			}
		}
		for name, s := range c.tiers {
			add(c, s, "#tier:"+name, s.limit, s.burst, c.r.Sketch)
		}
	}
	n.cluster.shell.SetRules(params)
	n.cluster.announceVersion(e.set.Version())
}

// decideCluster asks the coordinator for a cluster rule's decision.
func (n *Node) decideCluster(ctx context.Context, p *pending, now int64) (bucket.Decision, bool) {
	// The Shell's Hasher is n.hasher (startCluster): p.idh is its hash.
	o, err := n.cluster.shell.DecideHashedAt(ctx, now, p.idh, p.spec.cid, p.wid, p.cost)
	conc := p.spec.rel != nil // a concurrency rule: the owner holds its slots
	switch {
	case !conc || o.Ticket == 0:
	case err != nil || o.Source == cluster.SourceFailure:
		// Given up on, or decided by on_failure: the owner may still grant
		// the ticket a slot, which is released at once.
		n.cluster.shell.Release(p.spec.cid, p.wid, o.Ticket, p.cost)
	case o.Allowed:
		// The owner holds the slot until the request ends.
		p.slot = &clusterSlot{shell: n.cluster.shell, rule: p.spec.cid, identity: p.wid, ticket: o.Ticket, cost: p.cost}
	}
	if conc && err == nil && o.Source == cluster.SourceFailure && p.c.r.OnFailure == quota.OnFailureLocal {
		// on_failure local holds the slot on this node, at the rule's
		// limit (its releaser frees it).
		o.Decision = p.spec.lim.take(p.key, p.ident(), now, p.cost)
	}
	if err != nil {
		// The caller gave up (ctx) or the rule is unknown mid-reload: the
		// rule's local fallback decides, degraded.
		o.Decision = p.spec.lim.take(p.key, p.ident(), now, p.cost)
		o.Degraded = true
		o.Source = cluster.SourceFailure
	}
	p.src = o.Source
	return o.Decision, o.Degraded
}

// refundCluster gives back a cluster rule's admission of a request that
// another rule then rejected.
func (n *Node) refundCluster(p *pending) {
	if p.spec.rel != nil {
		// A concurrency rule: its slot is released, on the owner or here
		// (on_failure local).
		if p.slot != nil {
			p.slot.release()
		} else if p.src == cluster.SourceFailure && p.c.r.OnFailure == quota.OnFailureLocal {
			p.spec.rel.release(p.key, n.now(), p.cost)
		}
		return
	}
	n.cluster.shell.Refund(p.spec.cid, p.wid, p.cost, p.src)
}

// clusterSlot is a concurrency slot that an identity's owner holds for a
// request of this node: released once, by the request's end or a refund.
type clusterSlot struct {
	shell    *shell.Node
	rule     string
	identity string
	ticket   uint64
	cost     int64
	released atomic.Bool
}

// release frees the slot on its owner (once; nil: nothing held).
func (s *clusterSlot) release() {
	if s == nil || s.released.Swap(true) {
		return
	}
	s.shell.Release(s.rule, s.identity, s.ticket, s.cost)
}

// noteDegraded counts and logs (at most once a second) a decision made by
// on_failure because the owner could not be reached.
func (n *Node) noteDegraded(c *crule, p *pending, now int64) {
	c.stats.degraded.add(p.key)
	cp := n.cluster
	if last := cp.lastLog.Load(); now-last >= int64(time.Second) && cp.lastLog.CompareAndSwap(last, now) {
		n.log.Warn("owner unreachable: decided by on_failure", "rule", c.r.ID, "on_failure", c.r.OnFailure)
	}
}
