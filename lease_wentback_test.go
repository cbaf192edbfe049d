package weir_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/quota"
)

// TestRulesFollowGroupThatWentBack: a lease group whose only voter restarts
// from an older copy of its data directory loses the rule changes made
// after the copy, and its next changes reuse their versions. A gateway
// that follows the group's rules installs the group's older set when the
// group's leader confirms it, and then follows the group's new changes,
// instead of keeping its newer set and ignoring them.
func TestRulesFollowGroupThatWentBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "voter")
	raftAddr, rpcAddr := freeLoopback(t), freeLoopback(t)
	start := func(from string) *raftgroup.Group {
		t.Helper()
		g, err := raftgroup.Start(raftgroup.Config{Name: "v1", Dir: from, RaftAddr: raftAddr, RPCAddr: rpcAddr,
			Voters:           []raftgroup.Voter{{Name: "v1", Addr: raftAddr}},
			Machine:          lease.Config{Regions: []string{"eu"}},
			HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
			LeaderLeaseTimeout: 75 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, g.IsLeader)
		return g
	}
	put := func(g *raftgroup.Group, id string, limit int64) uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := g.PutRule(ctx, "test", quota.Rule{ID: id, Limit: limit, Window: time.Minute, Burst: limit,
			Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	g := start(dir)
	put(g, "a", 10)
	g.Close()
	stale := filepath.Join(t.TempDir(), "stale")
	if err := os.CopyFS(stale, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	g = start(dir)
	put(g, "b", 20)
	newest := put(g, "c", 30)

	n, err := weir.New(weir.Config{Lease: &weir.LeaseConfig{Voters: []string{rpcAddr}, Rules: true,
		CheckInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waitFor(t, func() bool { return n.Rules().Version() == newest })

	// The voter comes back from the stale copy: rules b and c are lost, and
	// the next change takes b's version.
	g.Close()
	g = start(stale)
	defer g.Close()
	again := put(g, "d", 40)
	if again >= newest {
		t.Fatalf("the group restarted from the copy is at version %d, not behind the node's %d", again, newest)
	}
	waitFor(t, func() bool { return n.Rules().Version() == again })
	ids := map[string]bool{}
	for _, r := range n.Rules().Rules() {
		ids[r.ID] = true
	}
	if !ids["a"] || !ids["d"] || ids["b"] || ids["c"] {
		t.Fatalf("the node enforces %v, want the group's set: a and d", ids)
	}
}

// freeLoopback returns a loopback address with a port free a moment ago,
// for a listener that must come back on the same address.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
