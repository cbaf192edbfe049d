package cluster

import (
	"context"
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
	if _, ok := co.sketchHint("r"); ok {
		t.Fatal("a hint before the sketch holds counters")
	}
	if _, ok := co.sketchHint("p"); ok {
		t.Fatal("a hint for an ungated rule")
	}
	if _, ok := co.sketchHint("nope"); ok {
		t.Fatal("a hint for an unknown rule")
	}
	var first sketchHint
	for i := range 2000 {
		id := "id-" + strconv.Itoa(i%700)
		if h, ok := co.sketchHint("r"); ok {
			if i == 1 {
				first = h
			}
			h.prefetch(id)
		}
		a, errA := co.Decide(t0, "r", id, 1)
		b, errB := twin.Decide(t0, "r", id, 1)
		if errA != nil || errB != nil || a != b {
			t.Fatalf("request %d: with prefetch %+v %v, without %+v %v", i, a, errA, b, errB)
		}
	}
	h, ok := co.sketchHint("r")
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
	first.prefetch("b")
	a, _ := co.Decide(later, "r", "b", 1)
	b, _ := twin.Decide(later, "r", "b", 1)
	if a != b {
		t.Fatalf("after a stale prefetch: %+v, without %+v", a, b)
	}
}

// TestShellSketchNoAlloc: a gated decision through the Shell, with its
// prefetch and the hint it publishes, allocates nothing (a hint stored on
// every decision had put one on the heap each time).
func TestShellSketchNoAlloc(t *testing.T) {
	rule := gatedRule("r", 6000, time.Minute, 100, &quota.Sketch{Threshold: 4})
	sh := startGRPCCluster(t, 1, rule)[0].shell
	hasher := sh.cfg.Hasher
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "one-shot-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	now := t0
	if o, err := sh.DecideAt(ctx, now, "r", "warm-up", 1); err != nil || o.Source != SourceSketch {
		t.Fatalf("warm-up: %+v, %v: want a sketch admission", o, err)
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		id := ids[i%len(ids)]
		h := hasher.Sum(id)
		sh.Prefetch(h, "r", id)
		o, err := sh.DecideHashedAt(ctx, now, h, "r", id, 1)
		if err != nil || o.Source != SourceSketch {
			t.Fatalf("request %d: %+v, %v: want a sketch admission", i, o, err)
		}
		i++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per gated decision through the Shell, want 0", allocs)
	}
}
