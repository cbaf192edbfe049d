package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/internal/golabel"

	"github.com/hashicorp/memberlist"
)

// Membership reduces hashicorp/memberlist to a stream of membership events and
// a sorted member list; the ring is rebuilt from them (docs/design.md, "The
// rule"). It is the only code in weir that talks to memberlist.
//
// # Events
//
// Events returns a channel fed by the adapter's own goroutine. memberlist's
// callbacks run under its node lock, so they only decode the metadata and
// append the event to an unbounded queue; a slow consumer delays its own
// events, never memberlist's failure detection. Per member, events arrive in
// the order memberlist delivered them. The stream starts with the local node's
// own Join and includes its own Updates, so a consumer can rebuild the member
// set from the stream alone, or call Members after any event.
//
// A Leave event means the member left gracefully or was declared dead:
// memberlist cannot tell the two apart.
//
// # Encryption and key rotation
//
// With SecretKey or Keyring set, every gossip message is encrypted and
// authenticated (AES-GCM). A node without the cluster's key cannot join, and
// its packets are dropped. memberlist encrypts with the primary key and tries
// every installed key on receipt, so keys rotate without downtime:
//
//  1. Install the new key on every node: Keyring().AddKey(newKey).
//  2. When every node has it, make it primary on every node:
//     Keyring().UseKey(newKey). Nodes still sending with the old key are
//     understood because the old key is still installed.
//  3. When every node uses the new key, remove the old one everywhere:
//     Keyring().RemoveKey(oldKey).
//
// Skipping a step on some node splits the cluster until that node catches up.
// Restarted nodes must be configured with the keys in force at that moment.
//
// # Concurrency
//
// All methods are safe for concurrent use.
type Membership struct {
	ml       *memberlist.Memberlist
	name     string
	region   string
	addr     string // gossip address, "ip:port"
	keyring  *memberlist.Keyring
	closed   atomic.Bool
	once     sync.Once
	badMeta  atomic.Uint64
	out      chan Event
	stop     chan struct{}
	pumpDone chan struct{}

	setMu     sync.Mutex   // serializes SetMeta
	metaMu    sync.RWMutex // guards meta and metaBytes
	meta      cluster.Meta
	metaBytes []byte

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []Event
	stopped  bool
	members  map[string]MemberInfo // live members as of the last callback
	departed map[string]departed   // members that left or failed, to reconnect

	// rejoinMu is held by a reconnect attempt; Close and Leave take it
	// (after setting closed) so that no attempt runs once memberlist shuts
	// down: they may wait for one attempt in flight, at most memberlist's
	// TCPTimeout. reconDone is closed when the reconnect goroutine ends.
	rejoinMu  sync.Mutex
	reconDone chan struct{}

	// label marks the goroutines of memberlist and its transport
	// (internal/golabel); Close and Leave wait up to closeWait for them
	// to end: the longest probe (the probe interval at memberlist's
	// largest health scaling, and its timeout) and a second.
	label     string
	closeWait time.Duration
	log       *slog.Logger // nil: none
}

// departed is a member that left or was declared dead, and when.
type departed struct {
	addr         string
	since, tried time.Time
}

// Reconnect timing per profile: how often one departed member is tried
// again, and for how long after it departed.
const (
	reconnectEveryLAN   = 30 * time.Second
	reconnectForLAN     = 24 * time.Hour
	reconnectEveryLocal = 500 * time.Millisecond
	reconnectForLocal   = 5 * time.Minute
)

// ErrClosed is returned by methods called after Close or Leave.
var ErrClosed = errors.New("cluster: membership is closed")

// ErrBroadcastTimeout is wrapped by SetMeta's error when the new metadata is in
// force locally but was not gossiped within the wait. It still spreads by
// gossip and push/pull; callers may treat it as a warning.
var ErrBroadcastTimeout = errors.New("cluster: metadata update not broadcast in time")

// setMetaTimeout bounds how long SetMeta waits for its update to be gossiped.
const setMetaTimeout = 5 * time.Second

// eventBuffer is the capacity of the Events channel; the internal queue in
// front of it is unbounded.
const eventBuffer = 64

// Profile selects memberlist's timing. The zero value is ProfileLAN.
type Profile int

const (
	// ProfileLAN is memberlist.DefaultLANConfig: probe every 1 s, suspicion
	// multiplier 4, push/pull every 30 s. Use it in production on one LAN. A
	// crashed node is declared dead after several seconds (about 19 s measured
	// with three nodes).
	ProfileLAN Profile = iota
	// ProfileLocal is for tests and single-host demos: probe every 100 ms
	// (timeout 50 ms), gossip every 20 ms, push/pull every 1 s, suspicion
	// multiplier 2 (max timeout multiplier 2), retransmit multiplier 4, TCP
	// timeout 500 ms, gossip to the dead for 1 s. Three nodes converge in tens
	// of milliseconds and a crashed node is declared dead in about half a
	// second (0.3 to 0.5 s measured with three nodes under -race). It is
	// aggressive: on a badly overloaded machine live nodes may be declared
	// dead and rejoin (a Leave then a Join).
	ProfileLocal
)

// String returns "lan" or "local".
func (p Profile) String() string {
	switch p {
	case ProfileLAN:
		return "lan"
	case ProfileLocal:
		return "local"
	}
	return "Profile(" + strconv.Itoa(int(p)) + ")"
}

// memberlistConfig returns memberlist's configuration for the profile.
func (p Profile) memberlistConfig() (*memberlist.Config, error) {
	switch p {
	case ProfileLAN:
		return memberlist.DefaultLANConfig(), nil
	case ProfileLocal:
		c := memberlist.DefaultLocalConfig()
		c.ProbeInterval = 100 * time.Millisecond
		c.ProbeTimeout = 50 * time.Millisecond
		c.GossipInterval = 20 * time.Millisecond
		c.PushPullInterval = time.Second
		c.SuspicionMult = 2
		c.SuspicionMaxTimeoutMult = 2
		c.RetransmitMult = 4
		c.TCPTimeout = 500 * time.Millisecond
		c.GossipToTheDeadTime = time.Second
		return c, nil
	}
	return nil, fmt.Errorf("cluster: MembershipConfig.Profile %d is unknown (want ProfileLAN or ProfileLocal)", int(p))
}

// MembershipConfig configures StartMembership. Name and Region are required;
// every other zero value works.
type MembershipConfig struct {
	// Name is the node's name, unique in the cluster. Required.
	Name string
	// Region is the node's region, gossiped in its Meta. Required.
	Region string
	// BindAddr is the "ip:port" gossip listens on, TCP and UDP. Port 0 picks
	// a free port (read it back with GossipAddr). Default "127.0.0.1:0":
	// production nodes must set a reachable address.
	BindAddr string
	// AdvertiseAddr is the "ip:port" other nodes reach this one at, when it
	// differs from BindAddr (NAT, containers). Default: the bound address.
	AdvertiseAddr string
	// Join lists "host:port" addresses of existing members to join at start.
	// Empty starts a new cluster.
	Join []string
	// SecretKey, 16, 24 or 32 bytes, turns on gossip encryption and becomes
	// the primary key (it is added to Keyring if both are set). Nodes without
	// it cannot join. Nil: no encryption unless Keyring is set.
	SecretKey []byte
	// Keyring holds several keys for rotation: its primary key encrypts,
	// every key decrypts. Build it with memberlist.NewKeyring; Membership
	// uses it (and memberlist may modify it) in place. Nil: SecretKey alone.
	Keyring *memberlist.Keyring
	// RPCAddr is the peer RPC address gossiped in this node's Meta.
	RPCAddr string
	// RulesVersion is the initial rule-set version gossiped in Meta.
	RulesVersion uint64
	// KeyFormat is the highest bucket-key format this node speaks (the
	// embedding node's versioning of how identities name buckets),
	// gossiped to every member as MemberInfo.KeyFormat. Zero gossips none:
	// the members read it as 1, as they read nodes that predate key
	// formats.
	KeyFormat uint8
	// Label is prepended to every gossip packet; nodes with different labels
	// ignore each other. Tests give each cluster its own label. At most 255
	// bytes. Default: none.
	Label string
	// Profile selects memberlist's timing. Default ProfileLAN.
	Profile Profile
	// Logger receives memberlist's own log lines at their level (DEBUG, INFO,
	// WARN, ERR mapped to slog levels). Nil discards them.
	Logger *slog.Logger
	// WrapTransport, when set, wraps the UDP and TCP transport (bound on
	// BindAddr) before memberlist uses it: a test puts a fault-injecting
	// network here. Nil: the transport unwrapped. It is memberlist's
	// NetTransport inside one that closes every connection it handed out at
	// Shutdown (gossip_transport.go).
	WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
}

// EventKind says what happened to a member.
type EventKind int

const (
	// EventJoin: the member is alive, new or back after a Leave.
	EventJoin EventKind = iota + 1
	// EventLeave: the member left gracefully or was declared dead.
	EventLeave
	// EventUpdate: the member's metadata changed.
	EventUpdate
)

// String returns "join", "leave" or "update".
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventUpdate:
		return "update"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one membership change.
type Event struct {
	Kind   EventKind
	Member MemberInfo
}

// MemberInfo describes a member as gossiped.
type MemberInfo struct {
	// Name is the member's unique node name.
	Name string
	// Addr is the member's gossip address, "ip:port".
	Addr string
	// Meta is the member's decoded metadata; the zero Meta if it was
	// malformed (counted by MalformedMeta).
	Meta cluster.Meta
	// KeyFormat is the highest bucket-key format the member speaks
	// (MembershipConfig.KeyFormat), at least 1: nodes that predate key
	// formats gossip none and speak format 1. It travels in memberlist's
	// own node metadata, as the delegate protocol's maximum version, not
	// in Meta: a Meta with a field more is malformed to the nodes that
	// predate it (they would drop the member from their ring), while every
	// memberlist node gossips and ignores that version. The current
	// delegate protocol version stays 0 on every node, so memberlist's
	// compatibility check (each member's current version within every
	// member's range) passes in any mix.
	KeyFormat uint8
}

// StartMembership validates cfg, starts memberlist and joins cfg.Join. When
// cfg.Join is not empty and no address in it could be reached, it shuts
// memberlist down and returns an error: a node configured to join should not
// silently start a cluster of its own. Reaching one address is enough.
// Retrying is the caller's job (or start with an empty Join and call Join).
func StartMembership(cfg MembershipConfig) (*Membership, error) {
	mlc, meta, err := cfg.memberlistConfig()
	if err != nil {
		return nil, err
	}
	encoded, err := meta.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("cluster: MembershipConfig.Region and RPCAddr do not fit in node metadata: %w", err)
	}
	m := &Membership{
		closeWait: mlc.ProbeInterval*time.Duration(max(mlc.AwarenessMaxMultiplier, 1)) + mlc.ProbeTimeout + time.Second,
		log:       cfg.Logger,
		name:      cfg.Name,
		region:    cfg.Region,
		out:       make(chan Event, eventBuffer),
		stop:      make(chan struct{}),
		pumpDone:  make(chan struct{}),
		meta:      meta,
		metaBytes: encoded,
	}
	m.cond = sync.NewCond(&m.mu)
	m.members = make(map[string]MemberInfo)
	m.departed = make(map[string]departed)
	m.reconDone = make(chan struct{})
	mlc.Delegate = metaDelegate{m}
	mlc.Events = eventDelegate{m}

	// memberlist, its transport and every goroutine they start carry the
	// label Close waits on.
	var ml *memberlist.Memberlist
	m.label = golabel.New("memberlist")
	golabel.Do(m.label, func() {
		var gt *gossipTransport
		if gt, err = newGossipTransport(mlc.BindAddr, mlc.BindPort, mlc.Logger); err != nil {
			err = fmt.Errorf("cluster: start memberlist for node %q: transport: %w", cfg.Name, err)
			return
		}
		mlc.BindPort = gt.port()
		mlc.Transport = gt
		if cfg.WrapTransport != nil {
			mlc.Transport = cfg.WrapTransport(gt)
		}
		if ml, err = memberlist.Create(mlc); err != nil {
			_ = mlc.Transport.Shutdown()
			err = fmt.Errorf("cluster: start memberlist for node %q: %w", cfg.Name, err)
		}
	})
	if err != nil {
		golabel.Wait(m.label, m.closeWait)
		return nil, err
	}
	m.ml = ml
	// Create reported this node's own join; its address is the bound one.
	m.mu.Lock()
	m.addr = m.members[cfg.Name].Addr
	m.mu.Unlock()
	if m.addr == "" { // not expected; LocalNode is safe to read before any gossip
		m.addr = ml.LocalNode().Address()
	}
	m.keyring = mlc.Keyring
	go m.pump()
	every, forget := reconnectEveryLAN, reconnectForLAN
	if cfg.Profile == ProfileLocal {
		every, forget = reconnectEveryLocal, reconnectForLocal
	}
	go m.reconnect(every, forget)

	if len(cfg.Join) > 0 {
		if _, err := ml.Join(cfg.Join); err != nil {
			_ = m.Close()
			return nil, fmt.Errorf("cluster: node %q could not join any of %v: %w", cfg.Name, cfg.Join, oneLine{err})
		}
	}
	return m, nil
}

// memberlistConfig validates cfg and translates it.
func (cfg MembershipConfig) memberlistConfig() (*memberlist.Config, cluster.Meta, error) {
	if cfg.Name == "" {
		return nil, cluster.Meta{}, errors.New("cluster: MembershipConfig.Name is required")
	}
	if cfg.Region == "" {
		return nil, cluster.Meta{}, errors.New("cluster: MembershipConfig.Region is required")
	}
	c, err := cfg.Profile.memberlistConfig()
	if err != nil {
		return nil, cluster.Meta{}, err
	}
	c.Name = cfg.Name

	bind := cfg.BindAddr
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	if c.BindAddr, c.BindPort, err = parseIPPort("BindAddr", bind); err != nil {
		return nil, cluster.Meta{}, err
	}
	c.AdvertiseAddr, c.AdvertisePort = "", 0
	if cfg.AdvertiseAddr != "" {
		if c.AdvertiseAddr, c.AdvertisePort, err = parseIPPort("AdvertiseAddr", cfg.AdvertiseAddr); err != nil {
			return nil, cluster.Meta{}, err
		}
		if c.AdvertisePort == 0 {
			return nil, cluster.Meta{}, fmt.Errorf("cluster: MembershipConfig.AdvertiseAddr %q: port must not be 0", cfg.AdvertiseAddr)
		}
	}

	if cfg.SecretKey != nil {
		if err := memberlist.ValidateKey(cfg.SecretKey); err != nil {
			return nil, cluster.Meta{}, fmt.Errorf("cluster: MembershipConfig.SecretKey: %w", err)
		}
		c.SecretKey = cfg.SecretKey
	}
	c.Keyring = cfg.Keyring

	if len(cfg.Label) > 255 {
		return nil, cluster.Meta{}, fmt.Errorf("cluster: MembershipConfig.Label is %d bytes, over 255", len(cfg.Label))
	}
	c.Label = cfg.Label
	c.DelegateProtocolMin, c.DelegateProtocolMax, c.DelegateProtocolVersion = 0, cfg.KeyFormat, 0

	c.LogOutput = nil
	if cfg.Logger != nil {
		c.Logger = log.New(slogWriter{cfg.Logger.With("node", cfg.Name)}, "", 0)
	} else {
		c.Logger = log.New(io.Discard, "", 0)
	}
	return c, cluster.Meta{Region: cfg.Region, RPCAddr: cfg.RPCAddr, RulesVersion: cfg.RulesVersion}, nil
}

// parseIPPort splits "ip:port"; memberlist binds and advertises IP addresses
// only, not host names.
func parseIPPort(field, s string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: MembershipConfig.%s %q: %w", field, s, err)
	}
	if net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("cluster: MembershipConfig.%s %q: host must be an IP address", field, s)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("cluster: MembershipConfig.%s %q: bad port: %w", field, s, err)
	}
	return host, int(port), nil
}

// Events returns the membership event stream. The same channel is returned
// on every call. It is closed by Close and Leave; events not yet received by
// then are discarded.
func (m *Membership) Events() <-chan Event { return m.out }

// Members returns the live members (alive or suspected), this node included,
// sorted by name. A member with malformed metadata has the zero Meta. After
// Close it returns the last view.
//
// The list is kept from memberlist's callbacks, not read from
// memberlist.Members: that returns pointers into memberlist's node table,
// which it goes on mutating under its own lock (a data race under -race).
// It may run ahead of the Events not yet received.
func (m *Membership) Members() []MemberInfo {
	m.mu.Lock()
	out := make([]MemberInfo, 0, len(m.members))
	for _, info := range m.members {
		out = append(out, info)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b MemberInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// LocalName returns this node's name.
func (m *Membership) LocalName() string { return m.name }

// GossipAddr returns the "ip:port" other nodes reach this node's gossip at;
// with BindAddr port 0 it carries the port actually bound.
func (m *Membership) GossipAddr() string { return m.addr }

// LocalMeta returns the metadata this node currently gossips.
func (m *Membership) LocalMeta() cluster.Meta {
	m.metaMu.RLock()
	defer m.metaMu.RUnlock()
	return m.meta
}

// Keyring returns the gossip keyring, for key rotation (see the type's doc),
// or nil if gossip is not encrypted.
func (m *Membership) Keyring() *memberlist.Keyring { return m.keyring }

// MalformedMeta returns how many membership events carried metadata that did
// not decode. Such events are still delivered, with the zero Meta.
func (m *Membership) MalformedMeta() uint64 { return m.badMeta.Load() }

// SetMeta replaces this node's metadata and gossips it; the other nodes see
// an EventUpdate. meta.Region must equal the configured region (a node does
// not move), so the usual call is: meta := m.LocalMeta(); meta.RulesVersion =
// v; m.SetMeta(meta). It waits until the update has been gossiped, at most
// 5 s; past that it returns an error wrapping ErrBroadcastTimeout, and the
// update is in force locally and still spreads. An invalid meta changes
// nothing.
func (m *Membership) SetMeta(meta cluster.Meta) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if meta.Region != m.region {
		return fmt.Errorf("cluster: SetMeta: region %q differs from the node's region %q", meta.Region, m.region)
	}
	b, err := meta.MarshalBinary()
	if err != nil {
		return fmt.Errorf("cluster: SetMeta: %w", err)
	}
	// setMu orders concurrent SetMeta calls so that the last meta stored is
	// the last one advertised. metaMu is not held across UpdateNode, which
	// calls NodeMeta, which takes it.
	m.setMu.Lock()
	defer m.setMu.Unlock()
	m.metaMu.Lock()
	m.meta, m.metaBytes = meta, b
	m.metaMu.Unlock()
	err = m.ml.UpdateNode(setMetaTimeout)
	if err != nil && strings.Contains(err.Error(), "timeout") {
		// memberlist's only timeout error: the update is queued, not lost.
		return fmt.Errorf("%w (waited %v)", ErrBroadcastTimeout, setMetaTimeout)
	}
	if err != nil {
		return fmt.Errorf("cluster: SetMeta: %w", err)
	}
	return nil
}

// currentMetaBytes returns the encoded local Meta.
func (m *Membership) currentMetaBytes() []byte {
	m.metaMu.RLock()
	defer m.metaMu.RUnlock()
	return m.metaBytes
}

// updateNode asks memberlist to re-advertise the local node. Called with
// metaMu held for writing.
func (m *Membership) updateNode() error {
	err := m.ml.UpdateNode(setMetaTimeout)
	if err != nil && strings.Contains(err.Error(), "timeout") {
		return fmt.Errorf("%w after %v: %v", ErrBroadcastTimeout, setMetaTimeout, err)
	}
	if err != nil {
		return fmt.Errorf("cluster: SetMeta: %w", err)
	}
	return nil
}

// Join contacts the given "host:port" addresses and merges their member
// lists into this node's. It returns how many were reached, and an error
// only if none was.
func (m *Membership) Join(addrs []string) (int, error) {
	if m.closed.Load() {
		return 0, ErrClosed
	}
	n, err := m.ml.Join(addrs)
	if err != nil {
		return n, fmt.Errorf("cluster: node %q could not join any of %v: %w", m.name, addrs, oneLine{err})
	}
	return n, nil
}

// Leave tells the cluster this node is leaving, waits up to timeout (0:
// forever) for that to be gossiped, then shuts memberlist down and closes the
// Events channel. The other nodes see an EventLeave within a gossip round or
// two instead of a failure timeout. It shuts down even if the broadcast timed
// out, and returns once every goroutine memberlist started has ended, as
// Close does. After Close or Leave it returns ErrClosed.
func (m *Membership) Leave(timeout time.Duration) error {
	err := ErrClosed
	m.once.Do(func() {
		m.closed.Store(true)
		m.rejoinMu.Lock() // no reconnect attempt in flight from here on
		m.rejoinMu.Unlock()
		leaveErr := m.ml.Leave(timeout) // before Shutdown: the reverse panics
		if leaveErr != nil {
			leaveErr = fmt.Errorf("cluster: leave: %w", leaveErr)
		}
		err = errors.Join(leaveErr, m.ml.Shutdown())
		m.stopPump()
		m.waitMemberlist()
	})
	return err
}

// Close shuts memberlist down without a leave message, as a crash would: the
// other nodes declare this one dead after their failure-detection timeout.
// It stops the event goroutine, closes the Events channel, and returns once
// every goroutine memberlist started has ended (within a probe interval; see
// waitMemberlist). Close is idempotent and returns nil after the first call
// or after Leave.
func (m *Membership) Close() error {
	var err error
	m.once.Do(func() {
		m.closed.Store(true)
		m.rejoinMu.Lock() // no reconnect attempt in flight from here on
		m.rejoinMu.Unlock()
		err = m.ml.Shutdown()
		m.stopPump()
		m.waitMemberlist()
	})
	return err
}

// waitMemberlist waits for memberlist's goroutines to end after its
// Shutdown, which does not wait for them. The transport has closed every
// connection and refuses every send, so the wait is for what is timed inside
// memberlist: a probe waiting out its interval for an ack, at most.
//
// memberlist's suspicion timers are not goroutines until they fire: one set
// before Close may still fire after it and mark a member failed in
// memberlist's own table, with no I/O (the transport is shut) and no event
// (the stream is closed).
func (m *Membership) waitMemberlist() {
	if n := golabel.Wait(m.label, m.closeWait); n > 0 && m.log != nil {
		m.log.Warn("memberlist goroutines still running after shutdown", "node", m.name,
			"goroutines", n, "waited", m.closeWait)
	}
}

// enqueue is called from memberlist's callbacks, under its lock, the only
// place n may be read: it must not block beyond this short critical section.
func (m *Membership) enqueue(kind EventKind, n *memberlist.Node) {
	info, ok := memberInfo(n)
	if !ok {
		m.badMeta.Add(1)
	}
	m.mu.Lock()
	if kind == EventLeave {
		delete(m.members, info.Name)
		if info.Name != m.name {
			m.departed[info.Name] = departed{addr: info.Addr, since: time.Now()}
		}
	} else {
		m.members[info.Name] = info
		delete(m.departed, info.Name)
	}
	if !m.stopped {
		m.queue = append(m.queue, Event{Kind: kind, Member: info})
		m.cond.Signal()
	}
	m.mu.Unlock()
}

// pump moves events from the queue to the channel, one at a time, in order.
func (m *Membership) pump() {
	defer close(m.pumpDone)
	defer close(m.out)
	for {
		m.mu.Lock()
		for len(m.queue) == 0 && !m.stopped {
			m.cond.Wait()
		}
		if m.stopped {
			m.mu.Unlock()
			return
		}
		ev := m.queue[0]
		m.queue[0] = Event{}
		m.queue = m.queue[1:]
		if len(m.queue) == 0 {
			m.queue = nil // let a burst's backing array go
		}
		m.mu.Unlock()
		select {
		case m.out <- ev:
		case <-m.stop:
			return
		}
	}
}

// stopPump ends pump and waits for it; queued events are dropped.
func (m *Membership) stopPump() {
	m.mu.Lock()
	m.stopped = true
	m.queue = nil
	m.cond.Broadcast()
	m.mu.Unlock()
	close(m.stop)
	<-m.pumpDone
	<-m.reconDone
}

// reconnect tries, every `every`, to join one member that left or was
// declared dead within `forget` (the one tried longest ago), as Serf does.
// memberlist alone never does: once two sides of a partition have declared
// each other dead, neither gossips to the other again (beyond
// GossipToTheDeadTime), so a healed partition would stay split for good,
// each side owning every identity of its region with full buckets. A join
// to a node that really is gone fails and costs one dial; a member that
// left gracefully is tried too (memberlist's leave callback cannot tell a
// leave from a failure) until `forget` passes.
func (m *Membership) reconnect(every, forget time.Duration) {
	defer close(m.reconDone)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tk.C:
		}
		addr, ok := m.nextDeparted(time.Now(), forget)
		if !ok {
			continue
		}
		m.rejoinMu.Lock()
		if !m.closed.Load() {
			// The departed member's Join event (if it answers) clears
			// its entry; a failure just waits for the next turn.
			_, _ = m.ml.Join([]string{addr})
		}
		m.rejoinMu.Unlock()
	}
}

// nextDeparted returns the address of the departed member tried longest
// ago (ties by name), marking it tried, and forgets members departed
// before now − forget.
func (m *Membership) nextDeparted(now time.Time, forget time.Duration) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	best := ""
	for name, d := range m.departed {
		if now.Sub(d.since) > forget {
			delete(m.departed, name)
			continue
		}
		if b, ok := m.departed[best]; best == "" || !ok || d.tried.Before(b.tried) || d.tried.Equal(b.tried) && name < best {
			best = name
		}
	}
	if best == "" {
		return "", false
	}
	d := m.departed[best]
	d.tried = now
	m.departed[best] = d
	return d.addr, true
}

// memberInfo converts a memberlist node; ok is false if its metadata did not
// decode, and then Meta is zero.
func memberInfo(n *memberlist.Node) (MemberInfo, bool) {
	info := MemberInfo{Name: n.Name, Addr: n.Address(), KeyFormat: max(n.DMax, 1)}
	if err := info.Meta.UnmarshalBinary(n.Meta); err != nil {
		info.Meta = cluster.Meta{}
		return info, false
	}
	return info, true
}

// metaDelegate gives memberlist the local node's metadata. It carries no user
// messages or state: those belong to the peer RPC layer.
type metaDelegate struct{ m *Membership }

// NodeMeta returns the encoded Meta, or nothing if it exceeds limit (it never
// does with memberlist's 512-byte limit, which MarshalBinary enforces).
func (d metaDelegate) NodeMeta(limit int) []byte {
	b := d.m.currentMetaBytes()
	if len(b) > limit {
		return nil
	}
	return b
}

func (metaDelegate) NotifyMsg([]byte)                           {}
func (metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (metaDelegate) LocalState(join bool) []byte                { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool)     {}

// eventDelegate forwards memberlist's callbacks to the queue.
type eventDelegate struct{ m *Membership }

func (d eventDelegate) NotifyJoin(n *memberlist.Node)   { d.m.enqueue(EventJoin, n) }
func (d eventDelegate) NotifyLeave(n *memberlist.Node)  { d.m.enqueue(EventLeave, n) }
func (d eventDelegate) NotifyUpdate(n *memberlist.Node) { d.m.enqueue(EventUpdate, n) }

var (
	_ memberlist.Delegate      = metaDelegate{}
	_ memberlist.EventDelegate = eventDelegate{}
)

// slogWriter turns memberlist's "[LEVEL] memberlist: message" lines into slog
// records at the matching level.
type slogWriter struct{ l *slog.Logger }

var memberlistLevels = []struct {
	prefix string
	level  slog.Level
}{
	{"[DEBUG] ", slog.LevelDebug},
	{"[INFO] ", slog.LevelInfo},
	{"[WARN] ", slog.LevelWarn},
	{"[ERR] ", slog.LevelError},
	{"[ERROR] ", slog.LevelError},
}

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\r\n")
	level := slog.LevelInfo
	for _, l := range memberlistLevels {
		if rest, ok := strings.CutPrefix(msg, l.prefix); ok {
			msg, level = rest, l.level
			break
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	if strings.Contains(msg, "use of closed network connection") || strings.Contains(msg, errGossipClosed.Error()) {
		// This node's own sockets, closed as it leaves: not a fault.
		level = slog.LevelDebug
	}
	w.l.Log(context.Background(), level, msg, "component", "memberlist")
	return len(p), nil
}

// oneLine prints memberlist's multi-line multierror on one line; the error
// itself stays reachable through errors.Is and errors.As.
type oneLine struct{ err error }

func (e oneLine) Error() string {
	multi, ok := e.err.(interface{ WrappedErrors() []error })
	if !ok {
		return e.err.Error()
	}
	parts := make([]string, 0, len(multi.WrappedErrors()))
	for _, err := range multi.WrappedErrors() {
		parts = append(parts, err.Error())
	}
	return strings.Join(parts, "; ")
}

func (e oneLine) Unwrap() error { return e.err }
