package bucket

import (
	"testing"
	"time"
)

// A tagged GCRAStore entry read under another tag is left alone until
// Retag converts it; an untagged caller sees it whatever its tag; Take and
// Put move it.
func TestGCRAStoreTags(t *testing.T) {
	st, _ := NewGCRAStore(StoreConfig{Shards: 1})
	g, _ := NewGCRA(1, time.Second, 1)
	now := int64(time.Hour)
	if v, ok := st.AllowTagged(42, 1, now, &g, 1); !ok || !v.Allowed() {
		t.Fatal("first admission rejected")
	}
	if v, ok := st.AllowTagged(42, 1, now, &g, 1); !ok || v.Allowed() {
		t.Fatal("spent bucket admitted under its own tag")
	}
	if _, ok := st.AllowTagged(42, 2, now, &g, 1); ok {
		t.Fatal("an entry of tag 1 was stepped under tag 2")
	}
	if _, tag, ok := st.PeekTagged(42, now); !ok || tag != 1 {
		t.Fatalf("peek: tag %d ok %v", tag, ok)
	}
	if st.Retag(42, 2, now, func(uint16, TAT) (TAT, bool) { return 0, false }) {
		t.Fatal("a refused conversion reported done")
	}
	var from []uint16
	if !st.Retag(42, 2, now, func(f uint16, tat TAT) (TAT, bool) { from = append(from, f); return tat, true }) || len(from) != 1 || from[0] != 1 {
		t.Fatalf("retag: %v", from)
	}
	st.Retag(42, 2, now, func(f uint16, tat TAT) (TAT, bool) { from = append(from, f); return tat, true })
	if len(from) != 1 {
		t.Fatal("an entry already under the tag was converted again")
	}
	if v, ok := st.AllowTagged(42, 2, now, &g, 1); !ok || v.Allowed() {
		t.Fatal("converted spent bucket admitted")
	}
	if st.Allow(42, now, &g, 1).Allowed() {
		t.Fatal("untagged read missed the tagged entry")
	}
	tat, tag, ok := st.Take(42, now)
	if !ok || tag != 2 || int64(tat) != now+int64(time.Second) {
		t.Fatalf("take: %d %d %v", int64(tat)-now, tag, ok)
	}
	if _, _, ok := st.PeekTagged(42, now); ok {
		t.Fatal("entry left after Take")
	}
	st.Put(42, 7, now, tat)
	if _, tag, _ := st.PeekTagged(42, now); tag != 7 {
		t.Fatalf("put: tag %d", tag)
	}
	// A conversion to a full bucket removes the entry.
	st.Retag(42, 3, now, func(uint16, TAT) (TAT, bool) { return TAT(now), true })
	if _, _, ok := st.PeekTagged(42, now); ok || st.Stats().Live != 0 {
		t.Fatal("a full converted bucket was kept")
	}
}

// The same for the generic Store, where a conversion to an idle state drops
// the entry.
func TestStoreTags(t *testing.T) {
	st, _ := NewStore[FixedState](StoreConfig{Shards: 1})
	f, _ := NewFixedWindow(1, time.Second)
	now := int64(time.Hour)
	if d, _ := st.ApplyTagged(9, 1, now, &f, 1); !d.Allowed {
		t.Fatal("first admission rejected")
	}
	if _, ok := st.ApplyTagged(9, 2, now, &f, 1); ok {
		t.Fatal("an entry of tag 1 was stepped under tag 2")
	}
	if !st.Retag(9, 2, now, func(from uint16, s *FixedState) bool { return from == 1 }) {
		t.Fatal("retag refused")
	}
	if d, ok := st.ApplyTagged(9, 2, now, &f, 1); !ok || d.Allowed {
		t.Fatalf("converted window: %+v %v", d, ok)
	}
	if _, tag, ok := st.PeekTagged(9, now); !ok || tag != 2 {
		t.Fatalf("peek: %d %v", tag, ok)
	}
	s, tag, ok := st.Take(9, now)
	if !ok || tag != 2 || s.Count != 1 || st.Stats().Live != 0 {
		t.Fatalf("take: %+v %d %v", s, tag, ok)
	}
	st.Put(9, 5, now, s)
	if _, tag, ok := st.PeekTagged(9, now); !ok || tag != 5 {
		t.Fatalf("put: %d %v", tag, ok)
	}
	// Idle at a later time, an entry of another tag is still left to the
	// caller to convert (converted, it may be live again), and seen by
	// PeekTagged though not by Peek.
	later := now + int64(time.Second)
	if _, ok := st.ApplyTagged(9, 6, later, &f, 1); ok {
		t.Fatal("an idle entry of another tag was stepped")
	}
	if _, _, ok := st.PeekTagged(9, later); !ok {
		t.Fatal("PeekTagged missed an idle entry")
	}
	if _, ok := st.Peek(9, later); ok {
		t.Fatal("Peek returned an idle entry")
	}
	st.Retag(9, 8, later, func(uint16, *FixedState) bool { return true })
	st.Retag(9, 9, later, func(_ uint16, s *FixedState) bool { *s = FixedState{}; return true })
	if st.Stats().Live != 0 {
		t.Fatal("an idle converted entry was kept")
	}
}

// With a grace, the sweep keeps entries idle for less than it.
func TestStoreGrace(t *testing.T) {
	st, _ := NewStore[FixedState](StoreConfig{Shards: 1})
	f, _ := NewFixedWindow(1, time.Second)
	st.SetGrace(time.Hour)
	for k := range uint64(64) {
		st.ApplyTagged(k, 1, 0, &f, 1) // windows ending at 1s
	}
	later := int64(time.Minute)
	for k := range uint64(64) {
		st.ApplyTagged(1000+k, 1, later, &f, 1) // inserts sweep
	}
	if s := st.Stats(); s.Live != 128 || s.Swept != 0 {
		t.Fatalf("with a grace of 1h: %+v", s)
	}
	st.SetGrace(0)
	for k := range uint64(64) {
		st.ApplyTagged(2000+k, 1, later, &f, 1)
	}
	if s := st.Stats(); s.Swept == 0 {
		t.Fatalf("without a grace nothing swept: %+v", s)
	}
}
