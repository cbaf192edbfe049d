package shell

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

// These tests run real memberlist on 127.0.0.1 with ephemeral ports and the
// local profile. Each
// test labels its gossip with its own name, so clusters never mix. Waits are
// on conditions with deadlines; the deadlines are generous because CI runs
// with -race on two loaded cores, and the measured times are logged, not
// asserted.

// waitLimit bounds every wait for a membership condition.
const waitLimit = 10 * time.Second

// checkLeaks verifies, after every other cleanup has closed the test's nodes,
// that no goroutine is left behind. Close waits for memberlist's goroutines
// (TestMembershipCloseWaits checks that with no retry window); goleak's
// retries are for the tests' own event recorders, which end when the closed
// Events channel reaches them.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// testLabel is the gossip label isolating t's cluster.
func testLabel(t *testing.T) string { return "weir-test/" + t.Name() }

// node is a started Membership with a recorder of its events.
type node struct {
	*Membership
	rec *recorder
}

// startNode starts a member named name with the local profile and t's label,
// joining join (if any), and closes it when t ends.
func startNode(t *testing.T, name string, join []string, mod func(*MembershipConfig)) node {
	t.Helper()
	cfg := MembershipConfig{
		Name:    name,
		Region:  "eu",
		RPCAddr: name + ".rpc:7000",
		Join:    join,
		Label:   testLabel(t),
		Profile: ProfileLocal,
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := StartMembership(cfg)
	if err != nil {
		t.Fatalf("StartMembership(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return node{m, record(m)}
}

// startCluster starts n nodes named a, b, c, ... each joining the first.
func startCluster(t *testing.T, n int, mod func(*MembershipConfig)) []node {
	t.Helper()
	nodes := []node{startNode(t, "a", nil, mod)}
	for i := 1; i < n; i++ {
		nodes = append(nodes, startNode(t, string(rune('a'+i)), []string{nodes[0].GossipAddr()}, mod))
	}
	return nodes
}

// recorder keeps every event a Membership delivers until its channel closes.
type recorder struct {
	mu     sync.Mutex
	cond   *sync.Cond
	events []Event
	closed bool
}

func record(m *Membership) *recorder {
	r := &recorder{}
	r.cond = sync.NewCond(&r.mu)
	go func() {
		for ev := range m.Events() {
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.cond.Broadcast()
			r.mu.Unlock()
		}
		r.mu.Lock()
		r.closed = true
		r.cond.Broadcast()
		r.mu.Unlock()
	}()
	return r
}

// snapshot returns the events so far and whether the channel has closed.
func (r *recorder) snapshot() ([]Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...), r.closed
}

// waitEvent waits up to waitLimit for an event matching pred and returns it.
func (r *recorder) waitEvent(t *testing.T, what string, pred func(Event) bool) Event {
	t.Helper()
	var found *Event
	ok := r.waitUntil(waitLimit, func(evs []Event, _ bool) bool {
		for i := range evs {
			if pred(evs[i]) {
				found = &evs[i]
				return true
			}
		}
		return false
	})
	if !ok {
		evs, _ := r.snapshot()
		t.Fatalf("no %s within %v; events: %+v", what, waitLimit, evs)
	}
	return *found
}

// waitUntil waits up to limit for cond over the recorded events.
func (r *recorder) waitUntil(limit time.Duration, cond func([]Event, bool) bool) bool {
	timer := time.AfterFunc(limit, func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(limit)
	r.mu.Lock()
	defer r.mu.Unlock()
	for !cond(r.events, r.closed) {
		if !time.Now().Before(deadline) {
			return false
		}
		r.cond.Wait()
	}
	return true
}

func isEvent(kind EventKind, name string) func(Event) bool {
	return func(ev Event) bool { return ev.Kind == kind && ev.Member.Name == name }
}

// eventually polls cond every 10 ms until it holds or limit passes.
func eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func memberNames(ms []MemberInfo) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return strings.Join(names, ",")
}

// setMeta calls SetMeta and fails t unless it succeeded or only timed out
// waiting for the broadcast (the update still spreads; that happens when a
// loaded machine makes the local profile's failure detector flap).
func setMeta(t *testing.T, n node, meta cluster.Meta) {
	t.Helper()
	err := n.SetMeta(meta)
	if errors.Is(err, ErrBroadcastTimeout) {
		t.Logf("%s: %v", n.LocalName(), err)
		return
	}
	if err != nil {
		t.Fatalf("SetMeta on %s: %v", n.LocalName(), err)
	}
}

// waitVersions waits until every node lists every node at rules version v.
func waitVersions(t *testing.T, nodes []node, v uint64) {
	t.Helper()
	ok := eventually(waitLimit, func() bool {
		for _, n := range nodes {
			ms := n.Members()
			if len(ms) != len(nodes) {
				return false
			}
			for _, mi := range ms {
				if mi.Meta.RulesVersion != v {
					return false
				}
			}
		}
		return true
	})
	if !ok {
		for _, n := range nodes {
			t.Logf("%s sees %+v", n.LocalName(), n.Members())
		}
		t.Fatalf("not every node saw every node at version %d within %v", v, waitLimit)
	}
}

// waitMembers waits until every node lists exactly want (names, sorted).
func waitMembers(t *testing.T, nodes []node, want string) {
	t.Helper()
	ok := eventually(waitLimit, func() bool {
		for _, n := range nodes {
			if memberNames(n.Members()) != want {
				return false
			}
		}
		return true
	})
	if !ok {
		for _, n := range nodes {
			t.Logf("%s sees %s", n.LocalName(), memberNames(n.Members()))
		}
		t.Fatalf("members did not converge to %s within %v", want, waitLimit)
	}
}

func TestMembershipConverges(t *testing.T) {
	checkLeaks(t)
	start := time.Now()
	nodes := startCluster(t, 3, nil)
	waitMembers(t, nodes, "a,b,c")
	t.Logf("3 nodes converged %v after the first started", time.Since(start))

	for _, n := range nodes {
		got := n.Members()
		for _, mi := range got {
			want := cluster.Meta{Region: "eu", RPCAddr: mi.Name + ".rpc:7000"}
			if mi.Meta != want {
				t.Errorf("%s sees %s with meta %+v, want %+v", n.LocalName(), mi.Name, mi.Meta, want)
			}
			if _, _, err := net.SplitHostPort(mi.Addr); err != nil || !strings.HasPrefix(mi.Addr, "127.0.0.1:") {
				t.Errorf("%s sees %s at %q, want 127.0.0.1:port", n.LocalName(), mi.Name, mi.Addr)
			}
		}
		// The event stream alone tells every node about all three, itself first.
		for _, name := range []string{"a", "b", "c"} {
			ev := n.rec.waitEvent(t, n.LocalName()+" join of "+name, isEvent(EventJoin, name))
			if ev.Member.Meta.Region != "eu" {
				t.Errorf("join event for %s has meta %+v", name, ev.Member.Meta)
			}
		}
		if evs, _ := n.rec.snapshot(); evs[0] != (Event{EventJoin, MemberInfo{n.LocalName(), n.GossipAddr(), n.LocalMeta(), 1}}) {
			t.Errorf("%s: first event %+v, want its own join", n.LocalName(), evs[0])
		}
		if n.MalformedMeta() != 0 {
			t.Errorf("%s counted %d malformed metas", n.LocalName(), n.MalformedMeta())
		}
	}
}

func TestMembershipDetectsFailure(t *testing.T) {
	checkLeaks(t)
	nodes := startCluster(t, 3, nil)
	waitMembers(t, nodes, "a,b,c")

	killed := time.Now()
	if err := nodes[2].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, n := range nodes[:2] {
		n.rec.waitEvent(t, n.LocalName()+" leave of c", isEvent(EventLeave, "c"))
		t.Logf("%s saw c fail %v after it was killed", n.LocalName(), time.Since(killed))
	}
	waitMembers(t, nodes[:2], "a,b")

	// The killed node's stream is closed and its methods refuse work.
	if !nodes[2].rec.waitUntil(waitLimit, func(_ []Event, closed bool) bool { return closed }) {
		t.Fatal("Events channel not closed after Close")
	}
	if err := nodes[2].Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := nodes[2].Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Leave after Close = %v, want ErrClosed", err)
	}
	if err := nodes[2].SetMeta(nodes[2].LocalMeta()); !errors.Is(err, ErrClosed) {
		t.Errorf("SetMeta after Close = %v, want ErrClosed", err)
	}
	if _, err := nodes[2].Join([]string{nodes[0].GossipAddr()}); !errors.Is(err, ErrClosed) {
		t.Errorf("Join after Close = %v, want ErrClosed", err)
	}
}

func TestMembershipGracefulLeave(t *testing.T) {
	checkLeaks(t)
	nodes := startCluster(t, 3, nil)
	waitMembers(t, nodes, "a,b,c")

	left := time.Now()
	if err := nodes[2].Leave(5 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	for _, n := range nodes[:2] {
		n.rec.waitEvent(t, n.LocalName()+" leave of c", isEvent(EventLeave, "c"))
		t.Logf("%s saw c leave %v after Leave began", n.LocalName(), time.Since(left))
	}
	waitMembers(t, nodes[:2], "a,b")
	if !nodes[2].rec.waitUntil(waitLimit, func(_ []Event, closed bool) bool { return closed }) {
		t.Fatal("Events channel not closed after Leave")
	}
	if err := nodes[2].Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("second Leave = %v, want ErrClosed", err)
	}
	if err := nodes[2].Close(); err != nil {
		t.Errorf("Close after Leave = %v, want nil", err)
	}
}

func TestMembershipLeaveAlone(t *testing.T) {
	checkLeaks(t)
	n := startNode(t, "solo", nil, nil)
	if err := n.Leave(time.Second); err != nil {
		t.Fatalf("Leave of a lone node: %v", err)
	}
}

func TestMembershipSetMetaPropagates(t *testing.T) {
	checkLeaks(t)
	nodes := startCluster(t, 3, nil)
	waitMembers(t, nodes, "a,b,c")

	meta := nodes[1].LocalMeta()
	meta.RulesVersion = 7
	set := time.Now()
	setMeta(t, nodes[1], meta)
	for _, n := range nodes {
		// An Update, or a Join if a loaded machine made b flap meanwhile.
		n.rec.waitEvent(t, n.LocalName()+" update of b", func(ev Event) bool {
			return ev.Member.Name == "b" && ev.Kind != EventLeave && ev.Member.Meta == meta
		})
		t.Logf("%s saw b's update %v after SetMeta began", n.LocalName(), time.Since(set))
	}
	ok := eventually(waitLimit, func() bool {
		for _, n := range nodes {
			if ms := n.Members(); len(ms) != 3 || ms[1].Name != "b" || ms[1].Meta != meta {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Errorf("Members does not list b with %+v everywhere", meta)
	}

	// Invalid metadata changes nothing.
	if err := nodes[1].SetMeta(cluster.Meta{Region: "us", RulesVersion: 8}); err == nil || !strings.Contains(err.Error(), "region") {
		t.Errorf("SetMeta with another region = %v, want a region error", err)
	}
	if err := nodes[1].SetMeta(cluster.Meta{Region: "eu", RPCAddr: strings.Repeat("x", cluster.MetaMaxSize)}); err == nil {
		t.Error("SetMeta with an oversized meta succeeded")
	}
	if got := nodes[1].LocalMeta(); got != meta {
		t.Errorf("LocalMeta after failed SetMeta = %+v, want %+v", got, meta)
	}
}

// TestMembershipSlowConsumer checks that a consumer that does not read
// delays only itself: memberlist's callbacks never block, memberlist keeps
// working, nothing is lost, and each member's events arrive in order.
func TestMembershipSlowConsumer(t *testing.T) {
	checkLeaks(t)
	a := startNode(t, "a", nil, nil)
	// b's events are not read until the end.
	cfg := MembershipConfig{Name: "b", Region: "eu", Join: []string{a.GossipAddr()}, Label: testLabel(t), Profile: ProfileLocal}
	b, err := StartMembership(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	// Fill the channel and then some, through the callbacks memberlist calls
	// under its lock: each must return at once.
	const injected = 3 * eventBuffer
	ghost := func(v uint64) *memberlist.Node {
		meta, err := cluster.Meta{Region: "eu", RulesVersion: v}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: "ghost", Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: meta}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := uint64(1); v <= injected; v++ {
			eventDelegate{b}.NotifyUpdate(ghost(v))
		}
	}()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("callbacks blocked on an unread Events channel")
	}

	// Real gossip still flows into b while nobody reads it.
	const real = 5
	meta := a.LocalMeta()
	for v := uint64(1); v <= real; v++ {
		meta.RulesVersion = v
		setMeta(t, a, meta)
		ok := eventually(waitLimit, func() bool {
			ms := b.Members() // a, b and the injected ghost
			return len(ms) == 3 && ms[0].Name == "a" && ms[0].Meta.RulesVersion == v
		})
		if !ok {
			t.Fatalf("b did not see a's version %d within %v while its events went unread", v, waitLimit)
		}
	}

	// a's versions arrive as Updates, or with a Join if a loaded machine
	// made a flap; either way in order, ending at the last one.
	var ghosts, versions []uint64
	timeout := time.After(waitLimit)
	for len(ghosts) < injected || len(versions) == 0 || versions[len(versions)-1] != real {
		select {
		case ev := <-b.Events():
			switch {
			case ev.Member.Name == "ghost":
				ghosts = append(ghosts, ev.Member.Meta.RulesVersion)
			case ev.Member.Name == "a" && ev.Kind != EventLeave:
				versions = append(versions, ev.Member.Meta.RulesVersion)
			}
		case <-timeout:
			t.Fatalf("events missing after %v: ghost %v, a %v", waitLimit, ghosts, versions)
		}
	}
	for i, v := range ghosts {
		if v != uint64(i+1) {
			t.Fatalf("injected updates lost or out of order: %v", ghosts)
		}
	}
	for i := 1; i < len(versions); i++ {
		if versions[i] < versions[i-1] {
			t.Fatalf("a's updates out of order: %v", versions)
		}
	}
}

func TestMembershipWrongKeyCannotJoin(t *testing.T) {
	checkLeaks(t)
	key := bytes.Repeat([]byte{1}, 32)
	nodes := startCluster(t, 2, func(c *MembershipConfig) { c.SecretKey = key })
	waitMembers(t, nodes, "a,b")

	for _, tc := range []struct {
		name string
		key  []byte
	}{
		{"x-wrong-key", bytes.Repeat([]byte{2}, 32)},
		{"y-no-key", nil},
	} {
		cfg := MembershipConfig{
			Name: tc.name, Region: "eu", SecretKey: tc.key, Label: testLabel(t), Profile: ProfileLocal,
			Join: []string{nodes[0].GossipAddr()},
		}
		m, err := StartMembership(cfg)
		if err == nil {
			_ = m.Close()
			t.Errorf("%s joined a cluster with another key", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// Nor does it sneak in later through gossip.
	ok := eventually(500*time.Millisecond, func() bool {
		return memberNames(nodes[0].Members()) != "a,b" || memberNames(nodes[1].Members()) != "a,b"
	})
	if ok {
		t.Fatalf("an intruder appeared: a sees %s, b sees %s", memberNames(nodes[0].Members()), memberNames(nodes[1].Members()))
	}
}

// TestMembershipKeyRotation follows the rotation in Membership's doc: add the
// new key everywhere, make it primary node by node, remove the old one. After
// each step the cluster must still gossip both ways.
func TestMembershipKeyRotation(t *testing.T) {
	checkLeaks(t)
	oldKey := bytes.Repeat([]byte{1}, 16)
	newKey := bytes.Repeat([]byte{2}, 16)
	nodes := startCluster(t, 3, func(c *MembershipConfig) { c.SecretKey = oldKey })
	waitMembers(t, nodes, "a,b,c")

	version := uint64(0)
	// gossips checks that an update from each node reaches the others.
	gossips := func(step string) {
		t.Helper()
		version++
		t.Logf("step: %s", step)
		for _, from := range nodes {
			meta := from.LocalMeta()
			meta.RulesVersion = version
			setMeta(t, from, meta)
		}
		waitVersions(t, nodes, version)
	}

	for _, n := range nodes {
		if err := n.Keyring().AddKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	gossips("new key installed")

	// One node switches first: the others still understand it.
	if err := nodes[0].Keyring().UseKey(newKey); err != nil {
		t.Fatal(err)
	}
	gossips("a uses the new key")
	for _, n := range nodes[1:] {
		if err := n.Keyring().UseKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	gossips("all use the new key")

	for _, n := range nodes {
		if err := n.Keyring().RemoveKey(oldKey); err != nil {
			t.Fatal(err)
		}
	}
	gossips("old key removed")

	// Only the new key opens the door now.
	cfg := MembershipConfig{Name: "z-old", Region: "eu", SecretKey: oldKey, Label: testLabel(t), Profile: ProfileLocal,
		Join: []string{nodes[0].GossipAddr()}}
	if m, err := StartMembership(cfg); err == nil {
		_ = m.Close()
		t.Fatal("a node with only the removed key joined")
	}
	kr, err := memberlist.NewKeyring(nil, newKey)
	if err != nil {
		t.Fatal(err)
	}
	d := startNode(t, "d", []string{nodes[0].GossipAddr()}, func(c *MembershipConfig) { c.Keyring = kr })
	waitMembers(t, append(nodes, d), "a,b,c,d")
}

// badMetaDelegate is a raw memberlist peer that gossips undecodable metadata.
type badMetaDelegate struct{}

func (badMetaDelegate) NodeMeta(int) []byte                 { return []byte{0xff, 0x00} }
func (badMetaDelegate) NotifyMsg([]byte)                    {}
func (badMetaDelegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (badMetaDelegate) LocalState(bool) []byte              { return nil }
func (badMetaDelegate) MergeRemoteState(buf []byte, _ bool) {}

func TestMembershipMalformedMeta(t *testing.T) {
	checkLeaks(t)
	a := startNode(t, "a", nil, nil)

	c := memberlist.DefaultLocalConfig()
	c.Name = "bad"
	c.BindAddr, c.BindPort = "127.0.0.1", 0
	c.AdvertisePort = 0
	c.Label = testLabel(t)
	c.LogOutput = nil
	c.Logger = slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)
	c.Delegate = badMetaDelegate{}
	bad, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bad.Shutdown() })
	if _, err := bad.Join([]string{a.GossipAddr()}); err != nil {
		t.Fatal(err)
	}

	ev := a.rec.waitEvent(t, "join of the bad peer", isEvent(EventJoin, "bad"))
	if ev.Member.Meta != (cluster.Meta{}) {
		t.Errorf("bad peer's join carries %+v, want the zero Meta", ev.Member.Meta)
	}
	joined := a.MalformedMeta()
	if joined == 0 {
		t.Error("MalformedMeta = 0 after the bad peer joined")
	}
	if err := bad.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	ev = a.rec.waitEvent(t, "leave of the bad peer", isEvent(EventLeave, "bad"))
	if ev.Member.Meta != (cluster.Meta{}) {
		t.Errorf("bad peer's leave carries %+v, want the zero Meta", ev.Member.Meta)
	}
	if got := a.MalformedMeta(); got <= joined {
		t.Errorf("MalformedMeta = %d after the leave, want more than %d", got, joined)
	}
	if ms := a.Members(); memberNames(ms) != "a" {
		t.Errorf("members after the bad peer left: %+v", ms)
	}
}

func TestMembershipConfigErrors(t *testing.T) {
	checkLeaks(t)
	// A port nobody listens on, for an unreachable join.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	l.Close()

	cases := []struct {
		name string
		mod  func(*MembershipConfig)
		want string
	}{
		{"no name", func(c *MembershipConfig) { c.Name = "" }, "Name is required"},
		{"no region", func(c *MembershipConfig) { c.Region = "" }, "Region is required"},
		{"bind not host:port", func(c *MembershipConfig) { c.BindAddr = "127.0.0.1" }, "BindAddr"},
		{"bind host name", func(c *MembershipConfig) { c.BindAddr = "localhost:0" }, "BindAddr \"localhost:0\": host must be an IP"},
		{"bind bad port", func(c *MembershipConfig) { c.BindAddr = "127.0.0.1:99999" }, "BindAddr"},
		{"advertise port 0", func(c *MembershipConfig) { c.AdvertiseAddr = "127.0.0.1:0" }, "AdvertiseAddr"},
		{"short key", func(c *MembershipConfig) { c.SecretKey = []byte("short") }, "SecretKey"},
		{"profile", func(c *MembershipConfig) { c.Profile = 9 }, "Profile 9 is unknown"},
		{"label", func(c *MembershipConfig) { c.Label = strings.Repeat("l", 256) }, "Label"},
		{"meta too big", func(c *MembershipConfig) { c.RPCAddr = strings.Repeat("x", cluster.MetaMaxSize) }, "512-byte limit"},
		{"join unreachable", func(c *MembershipConfig) { c.Join = []string{deadAddr} }, "could not join"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := MembershipConfig{Name: "n", Region: "eu", Label: testLabel(t), Profile: ProfileLocal}
			tc.mod(&cfg)
			m, err := StartMembership(cfg)
			if err == nil {
				_ = m.Close()
				t.Fatalf("StartMembership succeeded, want an error mentioning %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestMembershipJoinLater(t *testing.T) {
	checkLeaks(t)
	a := startNode(t, "a", nil, nil)
	b := startNode(t, "b", nil, nil)
	n, err := b.Join([]string{a.GossipAddr()})
	if err != nil || n != 1 {
		t.Fatalf("Join = %d, %v; want 1, nil", n, err)
	}
	waitMembers(t, []node{a, b}, "a,b")
}

// TestMembershipLANProfile starts the production profile on loopback: only
// start, join and graceful leave, which do not depend on its slow timers.
func TestMembershipLANProfile(t *testing.T) {
	checkLeaks(t)
	lan := func(c *MembershipConfig) { c.Profile = ProfileLAN }
	nodes := startCluster(t, 2, lan)
	waitMembers(t, nodes, "a,b")
	if err := nodes[1].Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	nodes[0].rec.waitEvent(t, "leave of b", isEvent(EventLeave, "b"))
}

// captureHandler records slog records.
type captureHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captureHandler) WithGroup(string) slog.Handler      { return h }

func TestMembershipLogLevels(t *testing.T) {
	h := &captureHandler{}
	w := slogWriter{slog.New(h)}
	for _, line := range []string{
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:1\n",
		"[WARN] memberlist: Was able to connect to x over TCP but UDP probes failed\n",
		"[ERR] memberlist: Failed to send\n",
		"[INFO] memberlist: Marking x as failed\n",
		"no prefix\n",
	} {
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelDebug, "Stream connection from=127.0.0.1:1"},
		{slog.LevelWarn, "Was able to connect to x over TCP but UDP probes failed"},
		{slog.LevelError, "Failed to send"},
		{slog.LevelInfo, "Marking x as failed"},
		{slog.LevelInfo, "no prefix"},
	}
	if len(h.records) != len(want) {
		t.Fatalf("got %d records, want %d", len(h.records), len(want))
	}
	for i, w := range want {
		if r := h.records[i]; r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}
}

func TestMembershipLoggerReceivesMemberlistLogs(t *testing.T) {
	checkLeaks(t)
	h := &captureHandler{}
	a := startNode(t, "a", nil, func(c *MembershipConfig) { c.Logger = slog.New(h) })
	startNode(t, "b", []string{a.GossipAddr()}, nil)
	ok := eventually(waitLimit, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.records) > 0
	})
	if !ok {
		t.Fatal("no memberlist log line reached the slog logger")
	}
}
