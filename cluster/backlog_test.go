package cluster

import (
	"reflect"
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
