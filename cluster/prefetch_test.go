package cluster

import (
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/quota"
)

// TestSketchHint checks what Shell.Prefetch relies on: a gated rule's hint
// points at its sketch's counters and computes the same counter indices as
// the gate, an ungated or unused rule has none, and prefetching (also
// through a hint whose counters were since dropped) changes no decision.
func TestSketchHint(t *testing.T) {
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 4, Width: 1 << 12, Depth: 3})
	plain := gcraRule("p", quota.ModeShared, 6000, time.Minute, 100)
	mk := func() *Coordinator {
		co := NewCoordinator(CoordinatorConfig{Self: "a"})
		co.SetRules(0, ruleParams(t, []quota.Rule{rule, plain}))
		return co
	}
	co, twin := mk(), mk()
	if _, ok := co.SketchHint("r"); ok {
		t.Fatal("a hint before the sketch holds counters")
	}
	if _, ok := co.SketchHint("p"); ok {
		t.Fatal("a hint for an ungated rule")
	}
	if _, ok := co.SketchHint("nope"); ok {
		t.Fatal("a hint for an unknown rule")
	}
	var first SketchHint
	for i := range 2000 {
		id := "id-" + strconv.Itoa(i%700)
		if h, ok := co.SketchHint("r"); ok {
			if i == 1 {
				first = h
			}
			h.Prefetch(id)
		}
		a, errA := co.Decide(t0, "r", id, 1)
		b, errB := twin.Decide(t0, "r", id, 1)
		if errA != nil || errB != nil || a != b {
			t.Fatalf("request %d: with prefetch %+v %v, without %+v %v", i, a, errA, b, errB)
		}
	}
	h, ok := co.SketchHint("r")
	if !ok {
		t.Fatal("no hint for a gated rule in use")
	}
	s := co.rules["r"].sk
	if h.base != uintptr(unsafe.Pointer(&s.counts[0])) || h.width != 1<<12 || h.depth != 3 || h.seed != s.seed || h.rule != "r" {
		t.Fatalf("hint %+v does not describe the sketch", h)
	}
	if h != first {
		t.Fatalf("the hint moved with no new period: %+v, then %+v", first, h)
	}
	var want, got [quota.MaxSketchDepth]int
	for i := range 100 {
		id := "x" + strconv.Itoa(i)
		s.slots(id, &want)
		sketchSlots(h.seed, h.width, h.depth, id, &got)
		if want != got {
			t.Fatalf("%q: gate's counters %v, the hint's %v", id, want, got)
		}
	}
	// Two periods later with no use in between the counters are dropped;
	// a stale hint still prefetches without harm.
	later := t0 + 3*int64(time.Minute)
	co.Decide(later, "r", "a", 1)
	twin.Decide(later, "r", "a", 1)
	later += 2 * int64(time.Minute)
	first.Prefetch("b")
	a, _ := co.Decide(later, "r", "b", 1)
	b, _ := twin.Decide(later, "r", "b", 1)
	if a != b {
		t.Fatalf("after a stale prefetch: %+v, without %+v", a, b)
	}
}
