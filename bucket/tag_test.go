package bucket

import (
	"testing"
	"time"
)

// tatShift is a TATConverter that moves a TAT by the tag's offset and
// records the calls.
type tatShift struct{ calls []uint16 }

func (c *tatShift) ConvertTAT(tag uint16, tat TAT, now int64) (TAT, bool) {
	if tag == 7 {
		return tat, false // unknown
	}
	c.calls = append(c.calls, tag)
	return TAT(now), true // converted to full
}

// A tagged GCRAStore entry is converted once when read under another tag,
// and re-tagged; an unknown tag leaves it as it is; Take and Put move it.
func TestGCRAStoreTags(t *testing.T) {
	st, _ := NewGCRAStore(StoreConfig{Shards: 1})
	g, _ := NewGCRA(1, time.Second, 1)
	var c tatShift
	now := int64(time.Hour)
	if !st.AllowTagged(42, 1, now, &g, 1, &c).Allowed() {
		t.Fatal("first admission rejected")
	}
	if st.AllowTagged(42, 1, now, &g, 1, &c).Allowed() {
		t.Fatal("spent bucket admitted under its own tag")
	}
	if _, tag, ok := st.PeekTagged(42, now); !ok || tag != 1 {
		t.Fatalf("peek: tag %d ok %v", tag, ok)
	}
	// Under tag 2 the converter empties the debt: admitted, tag 2.
	if !st.AllowTagged(42, 2, now, &g, 1, &c).Allowed() || len(c.calls) != 1 || c.calls[0] != 1 {
		t.Fatalf("conversion: calls %v", c.calls)
	}
	if _, tag, _ := st.PeekTagged(42, now); tag != 2 {
		t.Fatalf("tag after conversion %d", tag)
	}
	// An untagged caller sees the entry whatever its tag.
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
	if st.AllowTagged(42, 3, now, &g, 1, &c).Allowed() {
		t.Fatal("unknown tag converted")
	}
	if _, tag, _ := st.PeekTagged(42, now); tag != 7 {
		t.Fatalf("unknown tag replaced: %d", tag)
	}
}

// fixedReset is a Converter that empties a window for tag 1.
type fixedReset struct{ calls int }

func (c *fixedReset) Convert(tag uint16, s *FixedState, now int64) bool {
	if tag != 1 {
		return false
	}
	c.calls++
	*s = FixedState{}
	return true
}

// The same for the generic Store, where a conversion to an idle state drops
// the entry.
func TestStoreTags(t *testing.T) {
	st, _ := NewStore[FixedState](StoreConfig{Shards: 1})
	f, _ := NewFixedWindow(1, time.Second)
	var c fixedReset
	now := int64(time.Hour)
	if !st.ApplyTagged(9, 1, now, &f, 1, &c).Allowed || st.ApplyTagged(9, 1, now, &f, 1, &c).Allowed {
		t.Fatal("window of 1 not spent by one request")
	}
	if d := st.ApplyTagged(9, 2, now, &f, 1, &c); !d.Allowed || c.calls != 1 {
		t.Fatalf("conversion: %+v calls %d", d, c.calls)
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
	st.Put(9, 5, now, FixedState{})
	if st.Stats().Live != 0 {
		t.Fatal("an idle Put kept the entry")
	}
}
