package weir

import (
	"fmt"
	"testing"
	"time"
)

// TestEventLogCoalescesAndBounds: events of one kind, rule and reason less
// than a second apart are one event with a count; the ring keeps the newest
// EventsKept, newest first.
func TestEventLogCoalescesAndBounds(t *testing.T) {
	var l eventLog
	s := int64(time.Second)
	l.add(0, EventFailOpen, "a", "r1", "id-1")
	l.add(s/2, EventFailOpen, "a", "r1", "id-2")
	l.add(s/2+1, EventFailOpen, "b", "r1", "id-3")
	l.add(3*s, EventFailOpen, "a", "r1", "id-4")
	got := l.recent()
	want := []struct {
		rule, id string
		count    uint64
	}{{"a", "id-4", 1}, {"b", "id-3", 1}, {"a", "id-2", 2}}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Rule != w.rule || got[i].Identity != w.id || got[i].Count != w.count || got[i].Kind != EventFailOpen {
			t.Fatalf("event %d = %+v, want %+v", i, got[i], w)
		}
	}
	for i := range 3 * EventsKept {
		l.add(int64(10+2*i)*s, EventFallback, fmt.Sprintf("r%d", i), "x", "")
	}
	got = l.recent()
	if len(got) != EventsKept {
		t.Fatalf("kept %d events, want %d", len(got), EventsKept)
	}
	if got[0].Rule != fmt.Sprintf("r%d", 3*EventsKept-1) || got[EventsKept-1].Rule != fmt.Sprintf("r%d", 2*EventsKept) {
		t.Fatalf("kept %s..%s, want the newest first", got[0].Rule, got[EventsKept-1].Rule)
	}
	if l.dropped.Load() != 0 {
		t.Fatalf("dropped %d events with no contention", l.dropped.Load())
	}
}

// TestEventLogAddDoesNotAllocate: recording an event on the decision path
// allocates nothing.
func TestEventLogAddDoesNotAllocate(t *testing.T) {
	var l eventLog
	now := int64(0)
	if a := testing.AllocsPerRun(1000, func() {
		now += 2 * int64(time.Second)
		l.add(now, EventFailOpen, "rule", failOpenReason(false, "local"), "identity")
	}); a != 0 {
		t.Fatalf("add allocates %v times", a)
	}
}
