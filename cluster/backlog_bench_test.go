package cluster

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// mapBacklog is the reference for BenchmarkBacklogAdd: the same dedupe of
// syncs as Backlog (a newer report of a (rule, identity, generation)
// replaces the queued one in place when its total is not below it), kept
// the plain way: a Go map by key, and arrays started anew after each take.
type mapBacklog struct {
	syncs []SyncItem
	at    map[mapSyncKey]int
}

type mapSyncKey struct {
	rule, identity string
	gen            uint64
}

func (b *mapBacklog) add(m *Message) {
	if b.at == nil {
		b.at = map[mapSyncKey]int{}
	}
	for _, it := range m.Syncs {
		k := mapSyncKey{it.Rule, it.Identity, it.Gen}
		if i, ok := b.at[k]; ok {
			if it.Total >= b.syncs[i].Total {
				b.syncs[i] = it
			}
			continue
		}
		b.at[k] = len(b.syncs)
		b.syncs = append(b.syncs, it)
	}
}

func (b *mapBacklog) take() []SyncItem {
	s := b.syncs
	b.syncs = nil
	clear(b.at)
	return s
}

// BenchmarkBacklogAdd: rounds of fresh syncs (64 batches) added to a
// Backlog, taken and handed back with Reuse, as the Shell does for a busy
// peer under never-repeating identities, against the map-keyed reference
// (ref); ns/op is per round.
func BenchmarkBacklogAdd(b *testing.B) {
	for _, perAdd := range []int{512, 4096} {
		const adds, rounds = 64, 4
		// The identities are made in one order and reported in another,
		// as a node's are: each is read from wherever it was made.
		all := make([]SyncItem, rounds*adds*perAdd)
		for i := range all {
			all[i] = SyncItem{Rule: "r", Identity: "user:" + strconv.Itoa(i), Gen: 1, Total: 1}
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		msgs := make([][]Message, rounds)
		for r := range msgs {
			msgs[r] = make([]Message, adds)
			for k := range msgs[r] {
				msgs[r][k].Syncs, all = all[:perAdd:perAdd], all[perAdd:]
			}
		}
		b.Run(fmt.Sprintf("syncs=%d/backlog", adds*perAdd), func(b *testing.B) {
			var q Backlog
			b.ReportAllocs()
			r := 0
			for b.Loop() {
				for k := range msgs[r] {
					q.Add(&msgs[r][k])
				}
				m := q.Take()
				q.Reuse(&m)
				r = (r + 1) % rounds
			}
		})
		b.Run(fmt.Sprintf("syncs=%d/ref", adds*perAdd), func(b *testing.B) {
			var q mapBacklog
			b.ReportAllocs()
			r := 0
			for b.Loop() {
				for k := range msgs[r] {
					q.add(&msgs[r][k])
				}
				q.take()
				r = (r + 1) % rounds
			}
		})
	}
}
