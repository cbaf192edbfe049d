package weir

import (
	"testing"
	"time"
)

// TestCanaryCore: the canary is ok during its first window, while probes
// are rejected within the window, and not ok once a window passes with
// only admissions or errors.
func TestCanaryCore(t *testing.T) {
	s := int64(time.Second)
	c := canaryCore{window: 5 * s, start: 100 * s}
	steps := []struct {
		at      int64
		outcome string
		ok      bool
	}{
		{101 * s, CanaryAllowed, true},  // first window: nothing concluded
		{104 * s, CanaryAllowed, true},  // still the first window
		{105 * s, CanaryAllowed, false}, // a window with no rejection
		{106 * s, CanaryRejected, true},
		{110 * s, CanaryAllowed, true}, // the rejection is 4 s old
		{111 * s, CanaryAllowed, true}, // exactly a window old
		{112 * s, CanaryAllowed, false},
		{113 * s, CanaryError, false}, // errors do not count as enforcement
		{114 * s, CanaryRejected, true},
	}
	for i, st := range steps {
		c.observe(st.at, st.outcome)
		if got := c.ok(st.at); got != st.ok {
			t.Fatalf("step %d (%+v): ok = %v", i, st, got)
		}
	}
	if c.allowed != 6 || c.rejected != 2 || c.errors != 1 {
		t.Fatalf("counts %d/%d/%d, want 6/2/1", c.allowed, c.rejected, c.errors)
	}
}
