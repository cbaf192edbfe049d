package cluster

import (
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// BenchmarkOwnerDecide measures Decide on the owner of the identities (one
// node: a map access and the algorithm's step), for a gcra rule (the
// reference: the hot path that other algorithms must not slow down) and a
// fixed_window and a leaky_bucket rule in exact mode, over 1024 identities
// in turn, the clock advancing 1µs per decision. Read the ratios of one run.
func BenchmarkOwnerDecide(b *testing.B) {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "identity-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name string
		rule quota.Rule
	}{
		{"gcra", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmGCRA, Limit: 1 << 29, Window: time.Second, Burst: 1 << 20}},
		{"fixed_window", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmFixedWindow, Limit: 1 << 29, Window: time.Second, Burst: 1 << 29}},
		{"leaky_bucket", quota.Rule{ID: "r", Mode: quota.ModeExact, Algorithm: quota.AlgorithmLeakyBucket, Limit: 1 << 29, Window: time.Second, Burst: 1 << 20, MaxDelay: time.Second}},
	} {
		b.Run(c.name, func(b *testing.B) { benchDecide(b, c.rule, ids, time.Microsecond) })
	}
}

// benchDecide times Decide on one node with no ring (it owns every
// identity) under rule r over ids in turn (a power of two of them), the
// clock advancing step per decision, after one decision of each identity;
// every decision must admit. It returns the coordinator.
func benchDecide(b *testing.B, r quota.Rule, ids []string, step time.Duration) *Coordinator {
	p, err := NewRuleParams(&r, 1)
	if err != nil {
		b.Fatal(err)
	}
	co := NewCoordinator(CoordinatorConfig{Self: "a"})
	co.SetRules(0, []RuleParams{p})
	now := t0
	for _, id := range ids {
		co.Decide(now, r.ID, id, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now += int64(step)
		o, _ := co.Decide(now, r.ID, ids[i&(len(ids)-1)], 1)
		if !o.Allowed {
			b.Fatalf("rejected: %+v", o)
		}
	}
	b.StopTimer()
	return co
}

// BenchmarkForwardRoundTrip measures one forwarded decision through the
// coordinators alone, no transport: Decide on a node that does not own the
// identity, the owner's Step of that message, the asker's Step of the reply
// and the completion taken, with every message recycled as the simulator
// does. An exact rule that never rejects, so that every decision is a round
// trip; 1 000 identities drawn uniformly, and the asker drawn among the
// other nodes. With 2 coordinators everything stays in the CPU's caches;
// with 100 each decision touches coordinators the last ones did not, as in
// the simulator's 100-node measure (docs/performance.md, Simulator): the
// difference is what memory costs.
func BenchmarkForwardRoundTrip(b *testing.B) {
	for _, nodes := range []int{2, 100} {
		b.Run("coordinators="+strconv.Itoa(nodes), func(b *testing.B) {
			r := quota.Rule{ID: "r", Algorithm: quota.AlgorithmGCRA, Mode: quota.ModeExact, Limit: 1 << 30, Window: 100 * time.Second, Burst: 1 << 20}
			p, err := NewRuleParams(&r, 1)
			if err != nil {
				b.Fatal(err)
			}
			ms := make([]Member, nodes)
			idx := map[string]int{}
			for i := range ms {
				name := "n" + strconv.Itoa(i)
				ms[i] = Member{Name: name, Addr: name}
				idx[name] = i
			}
			ring, err := NewRing(1, ms)
			if err != nil {
				b.Fatal(err)
			}
			cs := make([]*Coordinator, nodes)
			for i := range cs {
				cs[i] = NewCoordinator(CoordinatorConfig{Self: ms[i].Name, SyncInterval: 100 * time.Millisecond})
				cs[i].SetRules(0, []RuleParams{p})
				cs[i].SetTable(t0, ring)
			}
			ids := make([]string, 1000)
			owner := make([]int, len(ids))
			for i := range ids {
				ids[i] = "identity-" + strconv.Itoa(i)
				owner[i] = idx[ring.OwnerName(ids[i])]
			}
			// A fixed sequence of (identity, asker), so that drawing costs
			// nothing in the loop.
			type req struct{ id, at int }
			seq := make([]req, 1<<16)
			x := uint64(0x9e3779b97f4a7c15)
			for i := range seq {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				id := int(x % uint64(len(ids)))
				at := int(x>>32) % nodes
				if at == owner[id] {
					at = (at + 1) % nodes
				}
				seq[i] = req{id, at}
			}
			now := t0
			var rd, rd2 Ready
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				now += int64(10 * time.Microsecond)
				q := seq[i&(len(seq)-1)]
				a, o := cs[q.at], cs[owner[q.id]]
				out, err := a.Decide(now, "r", ids[q.id], 1)
				if err != nil || !out.Pending {
					b.Fatalf("decision %d: %+v, %v: want a forward", i, out, err)
				}
				a.ReadyInto(&rd)
				for j := range rd.Messages {
					m := &rd.Messages[j].Msg
					o.Step(now+100_000, a.cfg.Self, m)
					a.Recycle(m)
				}
				o.ReadyInto(&rd2)
				for j := range rd2.Messages {
					m := &rd2.Messages[j].Msg
					cs[idx[rd2.Messages[j].To]].Step(now+200_000, o.cfg.Self, m)
					o.Recycle(m)
				}
				a.ReadyInto(&rd)
				if len(rd.Completions) != 1 || !rd.Completions[0].Outcome.Allowed {
					b.Fatalf("decision %d: completions %+v: want one admission", i, rd.Completions)
				}
				if i%1024 == 0 {
					for _, c := range cs {
						c.Tick(now)
					}
				}
			}
		})
	}
}
