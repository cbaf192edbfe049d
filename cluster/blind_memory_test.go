package cluster

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// BenchmarkBlindMemory: the memory a region of three coordinators keeps
// for one-shot identities of a shared rule, every identity decided once on
// node-0 (100 000 a second), 10 ms passing and the messages delivered
// every 1 024 decisions, with blind spend (the default) and with every identity
// tracked (TrackAll): bytes per identity over the three nodes, the part of
// them in the owners' sketches, and the identities that got an entry or a
// bucket. A fast rule (6 000 000 an hour: a token comes back in 0.6 ms)
// leaves almost nothing live in a sketch; at 100 a minute (0.6 s a token)
// a cell stays live for most of the run, so the sketches grow; a slow rule
// (1 000 an hour: 3.6 s a token, more than the sketch's horizon) has every
// identity charged to a bucket at once.
func BenchmarkBlindMemory(b *testing.B) {
	const ids = 1_000_000
	names := make([]string, ids)
	for i := range names {
		names[i] = "one-shot-identity-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name     string
		limit    int64 // per hour, burst 1000
		trackAll bool
	}{
		{"fast/blind", 6_000_000, false}, {"fast/tracked", 6_000_000, true},
		{"minute/blind", 6000, false}, {"minute/tracked", 6000, true},
		{"slow/blind", 1000, false}, {"slow/tracked", 1000, true},
	} {
		trackAll := c.trackAll
		b.Run(c.name, func(b *testing.B) {
			rule := gcraRule("r", quota.ModeShared, c.limit, time.Hour, 1000)
			p, err := NewRuleParams(&rule, 1)
			if err != nil {
				b.Fatal(err)
			}
			p.TrackAll = trackAll
			var members []Member
			for i := range 3 {
				members = append(members, Member{Name: "node-" + strconv.Itoa(i), Addr: "x"})
			}
			ring, err := NewRing(1, members)
			if err != nil {
				b.Fatal(err)
			}
			var perID, tracked, sketch float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				nodes := map[string]*Coordinator{}
				for _, m := range members {
					c := NewCoordinator(CoordinatorConfig{Self: m.Name})
					c.SetRules(0, []RuleParams{p})
					c.SetTable(t0, ring)
					nodes[m.Name] = c
				}
				now := t0
				// Every node's messages are stepped by their receivers,
				// round after round, until none is left.
				deliver := func() {
					for _, m := range members {
						nodes[m.Name].Tick(now)
					}
					for moved := true; moved; {
						moved = false
						for _, m := range members {
							for _, env := range nodes[m.Name].Ready().Messages {
								nodes[env.To].Step(now, m.Name, &env.Msg)
								moved = true
							}
						}
					}
				}
				for i, id := range names {
					if _, err := nodes["node-0"].Decide(now, "r", id, 1); err != nil {
						b.Fatal(err)
					}
					if i%1024 == 1023 {
						now += int64(10 * time.Millisecond)
						deliver()
					}
				}
				deliver()
				runtime.GC()
				runtime.ReadMemStats(&after)
				var st Stats
				for _, c := range nodes {
					s := c.Stats()
					st.Add(&s)
				}
				perID = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / ids
				tracked = float64(st.Entries+st.Owned) / ids
				sketch = float64(st.SketchBytes) / ids
				runtime.KeepAlive(nodes)
			}
			b.ReportMetric(perID, "B/identity")
			b.ReportMetric(sketch, "sketch-B/identity")
			b.ReportMetric(tracked, "tracked/identity")
		})
	}
}
