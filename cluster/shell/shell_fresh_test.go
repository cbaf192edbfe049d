package shell

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"pgregory.net/rapid"

	"github.com/weir-dev/weir/quota"
)

// TestEachPartMatchesSplit: the parts eachPart hands out, windows on the
// message's arrays, are Message.Split's parts item for item (handed-over
// marker and epoch included), and a part that fails stops the rest.
func TestEachPartMatchesSplit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := randomMessage(t)
		n := rapid.IntRange(1, 30).Draw(t, "n")
		want := m.Split(n)
		stop := rapid.IntRange(0, len(want)).Draw(t, "stop") // the part that fails (len: none)
		var got []cluster.Message
		eachPart(&m, n, func(p *cluster.Message) bool {
			got = append(got, cloneMessage(p))
			if p.Items() > 0 && (cap(p.Syncs) > len(p.Syncs) || cap(p.Acks) > len(p.Acks) || cap(p.Blinds) > len(p.Blinds)) && p != &m {
				t.Fatalf("part %d leaves room to append into the message's items", len(got)-1)
			}
			return len(got)-1 != stop
		})
		if stop < len(want) {
			want = want[:stop+1]
		}
		if len(got) != len(want) {
			t.Fatalf("%d parts, Split makes %d (stop at %d)", len(got), len(want), stop)
		}
		for i := range want {
			if !reflect.DeepEqual(normal(got[i]), normal(want[i])) {
				t.Fatalf("part %d\n%+v\nSplit's\n%+v", i, got[i], want[i])
			}
		}
	})
}

// freshRule is a shared rule that refills nothing within a test (a token
// an hour) and leaves each node slack for a decision of cost 1 (S = 0.05 ·
// 300 / 3 = 5): each identity decided once is admitted locally, reported
// to its owner, and its bucket there holds Burst − 1.
func freshRule() quota.Rule {
	return gcraRule("fresh", quota.ModeShared, 300, 300*time.Hour, 100)
}

// TestShellFreshIdentitiesAllCharged: three nodes on loopback gRPC, with a
// small batch so that what queues for a busy peer goes through its Backlog
// and leaves in several parts, decide thousands of identities once each
// (never the same twice, as the saturation bench draws them); every
// identity ends charged exactly once on its owner, whichever node decided,
// and nothing is degraded. Tracked, each non-owner's admission is a sync
// charged to an owner bucket; blind (the default of a shared rule), it is
// an item of a blind report, split over the owner's shards and charged to
// their sketches, and no node keeps an entry or a bucket.
func TestShellFreshIdentitiesAllCharged(t *testing.T) {
	for _, tracked := range []bool{true, false} {
		t.Run(map[bool]string{true: "tracked", false: "blind"}[tracked], func(t *testing.T) {
			testFreshIdentities(t, tracked)
		})
	}
}

func testFreshIdentities(t *testing.T, tracked bool) {
	rule := freshRule()
	if !tracked {
		// A token back in 10 ms: within the owners' sketch horizon (a
		// token an hour would give every identity a bucket at once).
		rule = gcraRule("fresh", quota.ModeShared, 300, 3*time.Second, 100)
	}
	params := ruleParams(t, []quota.Rule{rule})
	params[0].TrackAll = tracked
	nodes := startGRPCClusterParams(t, 3, func(c *Config) { c.MaxBatch = 64; c.Shards = 4 }, params)
	const callers, each = 6, 500
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tn := nodes[(c+i)%len(nodes)]
				o, err := tn.shell.Decide(context.Background(), "fresh", fmt.Sprintf("c%d-id%d", c, i), 1)
				if err != nil || !o.Allowed {
					t.Errorf("decision %d of caller %d: %+v, %v", i, c, o, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, tn := range nodes {
		tn.shell.Flush()
	}
	owner := func(id string) *Node {
		st, err := nodes[0].shell.Inspect("fresh", id)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range nodes {
			if tn.name == st.Owner {
				return tn.shell
			}
		}
		t.Fatalf("no node owns %q", id)
		return nil
	}
	// Tracked, the owner's bucket holds the identity's one token (blind,
	// the token is back within 10 ms: the counts below show the charges).
	charged := func(id string) bool {
		st, err := owner(id).Inspect("fresh", id)
		return err == nil && st.Held && st.Remaining == rule.Burst-1 && st.Debt == 0
	}
	for c := range callers {
		for i := range each {
			if id := fmt.Sprintf("c%d-id%d", c, i); tracked {
				waitFor(t, func() bool { return charged(id) })
			}
		}
	}
	const n = callers * each
	sum := func() (st cluster.Stats) {
		for _, tn := range nodes {
			s, _, failed := tn.shell.Stats()
			if s.Degraded != 0 || failed != 0 {
				t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", tn.name, s.Degraded, failed)
			}
			st.Add(&s)
		}
		return st
	}
	if tracked {
		// Each identity decided on a node that does not own it is
		// reported and charged once (about two in three); none twice.
		if reports := sum().ReportsCharged; reports > n || reports < n/3 {
			t.Errorf("%d reports charged for %d identities", reports, n)
		}
		return
	}
	// Blind: every admission is charged once, by its owner's sketch
	// (reported by another node, or the owner's own), when every report
	// is acknowledged; a report sent again is not charged again.
	waitFor(t, func() bool { st := sum(); return st.BlindCharged+st.BlindOwn >= n })
	time.Sleep(50 * time.Millisecond) // past a resend of a report whose acknowledgement was late
	for _, tn := range nodes {
		tn.shell.Flush()
	}
	st := sum()
	if st.BlindCharged+st.BlindOwn != n || st.BlindAdmits != st.BlindCharged {
		t.Errorf("%d blind admissions elsewhere charged %d times, %d on the owner, for %d identities", st.BlindAdmits, st.BlindCharged, st.BlindOwn, n)
	}
	if st.Entries != 0 || st.Owned != 0 || st.ReportsCharged != 0 {
		t.Errorf("%d entries, %d owner buckets and %d syncs charged for identities far from their limit, want none", st.Entries, st.Owned, st.ReportsCharged)
	}
	t.Logf("%d identities: %d blind reports carried %d admissions; %d decided by their owner", n, st.BlindReports, st.BlindAdmits, st.BlindOwn)
}

// BenchmarkShellFreshIdentities: three nodes on loopback gRPC decide
// identities never seen before, from 64 callers, until every report has
// reached its owner: the whole cost of a fresh identity in shared mode
// (the local decision, the report item's making, queueing, encoding,
// transport, decoding, charging, and the acknowledgement's way back),
// blind (the default) and tracked (an entry and a sync per identity).
// cpu-ns/op is the process's CPU time (user and system) per identity.
func BenchmarkShellFreshIdentities(b *testing.B) {
	for _, tracked := range []bool{false, true} {
		b.Run(map[bool]string{false: "blind", true: "tracked"}[tracked], func(b *testing.B) {
			benchFreshIdentities(b, tracked)
		})
	}
}

func benchFreshIdentities(b *testing.B, tracked bool) {
	rule := freshRule()
	if !tracked {
		rule = gcraRule("fresh", quota.ModeShared, 300, 3*time.Second, 100) // within the sketch horizon
	}
	p, err := cluster.NewRuleParams(&rule, 1)
	if err != nil {
		b.Fatal(err)
	}
	p.TrackAll = tracked
	var shells []*Node
	var members []cluster.Member
	for i := range 3 {
		name := fmt.Sprintf("gw-%d", i)
		var sh *Node
		tr := newGRPC(b, name, func(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
			return sh.Handle(ctx, from, m)
		})
		sh, err = New(Config{Coordinator: cluster.CoordinatorConfig{Self: name, DecideTimeout: time.Second, MaxKeys: 4 << 20},
			Transport: tr, CallTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sh.Close() })
		shells = append(shells, sh)
		members = append(members, cluster.Member{Name: name, Addr: tr.Addr()})
	}
	ring, err := cluster.NewRing(1, members)
	if err != nil {
		b.Fatal(err)
	}
	for _, sh := range shells {
		sh.SetRules([]cluster.RuleParams{p})
		sh.SetRing(ring)
	}
	// The identities, never seen before, and how many are decided on a
	// node that does not own them: each of those is one report charged.
	names := make([]string, b.N)
	var remote uint64
	for i := range names {
		names[i] = fmt.Sprintf("id-%d", i)
		if o, _ := ring.Owner(names[i]); o.Name != members[i%len(shells)].Name {
			remote++
		}
	}
	// A report is a sync charged (an identity tracked) or a blind item
	// charged (the default for identities far from their limit).
	charged := func() uint64 {
		var n uint64
		for _, sh := range shells {
			st, _, _ := sh.Stats()
			n += st.ReportsCharged + st.BlindCharged
		}
		return n
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := processCPU()
	var wg sync.WaitGroup
	const callers = 64
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < b.N; i += callers {
				if _, err := shells[i%len(shells)].Decide(context.Background(), "fresh", names[i], 1); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Until every report has been charged (the ticker sends what is left
	// within a tick).
	for deadline := time.Now().Add(time.Minute); charged() < remote; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d reports charged after a minute", charged(), remote)
		}
	}
	b.StopTimer()
	b.ReportMetric((processCPU()-start)*1e9/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(remote)/float64(b.N), "reports/op")
	for _, sh := range shells {
		if st, _, failed := sh.Stats(); st.Degraded != 0 || failed != 0 {
			b.Fatalf("%d degraded decisions, %d failed exchanges in a run with no fault", st.Degraded, failed)
		}
	}
}

// TestShellSplitByShard: split puts every item in the part of its
// identity's shard (a result in the part its ticket names, with the
// shard's own ticket), in order, the epoch and handed-over marker in every
// part, as a plain append per item would.
func TestShellSplitByShard(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		shift := rapid.UintRange(1, 4).Draw(t, "shift")
		s := &Node{shards: make([]shard, 1<<shift), shift: shift}
		m := cluster.Message{Epoch: 3, HandedOver: rapid.Uint64Range(0, 1).Draw(t, "marker")}
		id := func(kind string, i int) string { return fmt.Sprint(kind, rapid.IntRange(0, 50).Draw(t, "id"), "-", i) }
		for i := range rapid.IntRange(0, 30).Draw(t, "handoffs") {
			m.Handoffs = append(m.Handoffs, cluster.HandoffItem{Rule: "r", Identity: id("h", i), Count: int64(i)})
		}
		for i := range rapid.IntRange(0, 30).Draw(t, "syncs") {
			m.Syncs = append(m.Syncs, cluster.SyncItem{Rule: "r", Identity: id("s", i), Total: int64(i)})
		}
		for i := range rapid.IntRange(0, 30).Draw(t, "decides") {
			m.Decides = append(m.Decides, cluster.DecideItem{Ticket: uint64(i + 1), Rule: "r", Identity: id("d", i)})
		}
		for i := range rapid.IntRange(0, 30).Draw(t, "acks") {
			m.Acks = append(m.Acks, cluster.AckItem{Rule: "r", Identity: id("a", i), Total: int64(i)})
		}
		for i := range rapid.IntRange(0, 30).Draw(t, "results") {
			m.Results = append(m.Results, cluster.ResultItem{Ticket: rapid.Uint64Range(1, 1<<20).Draw(t, "ticket"), Remaining: int64(i)})
		}
		want := make([]cluster.Message, len(s.shards))
		for i := range want {
			want[i].Epoch, want[i].HandedOver = m.Epoch, m.HandedOver
		}
		for _, h := range m.Handoffs {
			p := &want[s.shardOf(h.Identity)]
			p.Handoffs = append(p.Handoffs, h)
		}
		for _, it := range m.Syncs {
			p := &want[s.shardOf(it.Identity)]
			p.Syncs = append(p.Syncs, it)
		}
		for _, d := range m.Decides {
			p := &want[s.shardOf(d.Identity)]
			p.Decides = append(p.Decides, d)
		}
		for _, a := range m.Acks {
			p := &want[s.shardOf(a.Identity)]
			p.Acks = append(p.Acks, a)
		}
		for _, r := range m.Results {
			p := &want[r.Ticket&uint64(len(s.shards)-1)]
			r.Ticket >>= shift
			p.Results = append(p.Results, r)
		}
		got := s.split(&m)
		for i := range want {
			if !reflect.DeepEqual(normal(got[i]), normal(want[i])) {
				t.Fatalf("shard %d\n%+v\nwant\n%+v", i, got[i], want[i])
			}
		}
	})
}
