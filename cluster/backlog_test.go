package cluster

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestBacklogCoalescesSyncs: what waits for a busy peer keeps one sync per
// (rule, identity, generation), the newest total in the place of the first,
// and every other item in order.
func TestBacklogCoalescesSyncs(t *testing.T) {
	var q Backlog
	q.Add(&Message{Epoch: 1, Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 3}, {Rule: "r", Identity: "b", Gen: 1, Total: 1}},
		Decides: []DecideItem{{Ticket: 7, Rule: "r", Identity: "c", Cost: 1}}})
	q.Add(&Message{Epoch: 2, Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 9, Grant: 2, GrantEpoch: 4},
		{Rule: "r", Identity: "a", Gen: 2, Total: 1}, {Rule: "r", Identity: "b", Gen: 1, Total: 1}},
		Decides: []DecideItem{{Ticket: 8, Rule: "r", Identity: "c", Cost: 1}}, HandedOver: 42})
	want := Message{Epoch: 2, HandedOver: 42,
		Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 9, Grant: 2, GrantEpoch: 4}, {Rule: "r", Identity: "b", Gen: 1, Total: 1},
			{Rule: "r", Identity: "a", Gen: 2, Total: 1}},
		Decides: []DecideItem{{Ticket: 7, Rule: "r", Identity: "c", Cost: 1}, {Ticket: 8, Rule: "r", Identity: "c", Cost: 1}}}
	if q.Empty() {
		t.Fatal("Empty after two Adds")
	}
	if got := q.Take(); !reflect.DeepEqual(normal(got), normal(want)) {
		t.Fatalf("queued\n%+v\nwant\n%+v", got, want)
	}
}

// TestBacklogTakeEmpties: Take leaves an empty Backlog that forgets the
// syncs it held (a sync added after a Take is appended, not matched with
// one already sent), and does not hand back the caller's arrays.
func TestBacklogTakeEmpties(t *testing.T) {
	var q Backlog
	if !q.Empty() {
		t.Fatal("zero Backlog not Empty")
	}
	m := Message{Epoch: 1, Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 3}}}
	q.Add(&m)
	m.Syncs[0].Total = 100 // the caller's array: the Backlog copied the item
	first := q.Take()
	if !q.Empty() {
		t.Fatal("not Empty after Take")
	}
	if len(first.Syncs) != 1 || first.Syncs[0].Total != 3 {
		t.Fatalf("first take %+v, want one sync of total 3", first)
	}
	q.Add(&Message{Epoch: 2, Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 2}},
		Acks: []AckItem{{Rule: "r", Identity: "b"}}})
	second := q.Take()
	if len(second.Syncs) != 1 || second.Syncs[0].Total != 2 || len(second.Acks) != 1 || second.Epoch != 2 {
		t.Fatalf("second take %+v, want the sync of total 2 and the ack, epoch 2", second)
	}
	if first.Syncs[0].Total != 3 {
		t.Fatal("the second fill wrote into the first take's array")
	}
	// A message with only a handed-over marker still fills the backlog.
	q.Add(&Message{HandedOver: 7})
	if q.Empty() {
		t.Fatal("Empty after adding a handed-over marker")
	}
	if got := q.Take(); got.HandedOver != 7 {
		t.Fatalf("take %+v, want HandedOver 7", got)
	}
}

// TestBacklogReuseMatchesModel: rounds of random Adds, each round taken
// and its arrays handed back with Reuse (or not), give what a plain model
// of the Backlog gives: the syncs in order of first arrival, each the
// last one added of its (rule, identity, generation) whose total is not
// below the one queued, every other item appended. A Take never shares an
// array with what the Backlog fills next, and with Reuse the arrays are
// the same two sets round after round.
func TestBacklogReuseMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var q Backlog
	var model []SyncItem
	var others Message
	var handed Message // the last take, whose arrays go back
	held := map[*SyncItem]bool{}
	for round := range 60 {
		reuse := round%3 != 2
		for range 1 + rng.IntN(8) {
			m := Message{Epoch: uint64(round + 1)}
			for range rng.IntN(40) {
				// Few identities and generations: many replacements,
				// and lower totals that must not replace.
				it := SyncItem{Rule: []string{"r", "s"}[rng.IntN(2)], Identity: fmt.Sprint("id", rng.IntN(30)),
					Gen: uint64(1 + rng.IntN(2)), Total: int64(rng.IntN(100)), Grant: int64(rng.IntN(3))}
				m.Syncs = append(m.Syncs, it)
			}
			for range rng.IntN(3) {
				m.Acks = append(m.Acks, AckItem{Rule: "r", Identity: fmt.Sprint("a", rng.IntN(5)), Total: int64(rng.IntN(9))})
			}
			if rng.IntN(4) == 0 {
				m.Decides = append(m.Decides, DecideItem{Ticket: uint64(1 + rng.IntN(99)), Rule: "r", Identity: "d", Cost: 1})
			}
			q.Add(&m)
			for _, it := range m.Syncs {
				i := slices.IndexFunc(model, func(o SyncItem) bool {
					return o.Rule == it.Rule && o.Identity == it.Identity && o.Gen == it.Gen
				})
				switch {
				case i < 0:
					model = append(model, it)
				case it.Total >= model[i].Total:
					model[i] = it
				}
			}
			m.Syncs = nil
			others.Merge(&m)
			// The caller's arrays stay the caller's.
			if len(m.Acks) > 0 {
				m.Acks[0].Total = -1
			}
		}
		if reuse && handed.Syncs != nil {
			q.Reuse(&handed)
			if handed.Syncs != nil {
				t.Fatal("Reuse left the message its arrays")
			}
		}
		got := q.Take()
		if !q.Empty() {
			t.Fatalf("round %d: not Empty after Take", round)
		}
		want := others
		want.Syncs = model
		if !reflect.DeepEqual(normal(got), normal(want)) {
			t.Fatalf("round %d: took\n%+v\nwant\n%+v", round, got, want)
		}
		if len(got.Syncs) > 0 {
			held[&got.Syncs[:1][0]] = true
		}
		model, others = nil, Message{}
		handed = got
	}
	// With Reuse most rounds, the sync arrays are a few, not one a round.
	if len(held) > 30 {
		t.Fatalf("%d different sync arrays in 60 rounds, want the Reuse'd ones again", len(held))
	}
}

// TestBacklogReuseClears: arrays handed back keep no item (no identity is
// kept alive), and the next fill after a Take writes into them, not into
// the message taken.
func TestBacklogReuseClears(t *testing.T) {
	var q Backlog
	q.Add(&Message{Syncs: []SyncItem{{Rule: "r", Identity: "a", Gen: 1, Total: 1}, {Rule: "r", Identity: "b", Gen: 1, Total: 1}}})
	first := q.Take()
	arr := first.Syncs[:cap(first.Syncs)]
	q.Reuse(&first)
	for i, it := range arr {
		if it != (SyncItem{}) {
			t.Fatalf("item %d of a handed-back array not cleared: %+v", i, it)
		}
	}
	// The spare is used after the next Take, not before.
	q.Add(&Message{Syncs: []SyncItem{{Rule: "r", Identity: "c", Gen: 1, Total: 2}}})
	second := q.Take()
	q.Add(&Message{Syncs: []SyncItem{{Rule: "r", Identity: "d", Gen: 1, Total: 3}}})
	third := q.Take()
	if &third.Syncs[0] != &arr[0] {
		t.Fatal("the fill after the Take did not reuse the handed-back array")
	}
	if second.Syncs[0].Identity != "c" || third.Syncs[0].Identity != "d" {
		t.Fatalf("takes %+v and %+v", second, third)
	}
	// A take's array is not filled again while the caller holds it.
	q.Add(&Message{Syncs: []SyncItem{{Rule: "r", Identity: "e", Gen: 1, Total: 4}}})
	if second.Syncs[0].Identity != "c" || third.Syncs[0].Identity != "d" {
		t.Fatal("a later fill wrote into a take not handed back")
	}
}

// normal turns empty slices into nil for comparison.
func normal(m Message) Message {
	if len(m.Handoffs) == 0 {
		m.Handoffs = nil
	}
	if len(m.Syncs) == 0 {
		m.Syncs = nil
	}
	if len(m.Decides) == 0 {
		m.Decides = nil
	}
	if len(m.Acks) == 0 {
		m.Acks = nil
	}
	if len(m.Results) == 0 {
		m.Results = nil
	}
	return m
}
