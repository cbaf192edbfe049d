package main

import (
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestDistIDs: the computed identities are 32 characters of the alphabet,
// distinct, deterministic, and draw stays inside its space.
func TestDistIDs(t *testing.T) {
	const n = 200_000
	seen := make(map[string]uint64, n)
	for i := range uint64(n) {
		id := distID(i)
		if len(id) != 32 {
			t.Fatalf("distID(%d) = %q: %d characters, want 32", i, id, len(id))
		}
		if strings.Trim(id, idAlphabet) != "" {
			t.Fatalf("distID(%d) = %q: a character outside the alphabet", i, id)
		}
		if j, dup := seen[id]; dup {
			t.Fatalf("distID(%d) = distID(%d) = %q", i, j, id)
		}
		seen[id] = i
	}
	if distID(12345) != distID(12345) {
		t.Fatal("distID is not deterministic")
	}
	space := idSpace(1000)
	r := rand.New(rand.NewPCG(1, 2))
	inSpace := make(map[string]bool, 1000)
	for i := range uint64(1000) {
		inSpace[distID(i)] = true
	}
	drawn := map[string]bool{}
	for range 20_000 {
		id := space.draw(r)
		if !inSpace[id] {
			t.Fatalf("draw returned %q, outside the space of 1000", id)
		}
		drawn[id] = true
	}
	if len(drawn) < 990 {
		t.Errorf("20 000 draws from 1000 identities hit only %d of them", len(drawn))
	}
}

// BenchmarkDraw is the generator's cost of one identity and of the first
// look at its bytes (a hash, as every system makes), drawn from a slice of a
// million stored strings (the generator before 2026-11-30) or computed
// (idSpace.draw), serially.
func BenchmarkDraw(b *testing.B) {
	seed := maphash.MakeSeed()
	b.Run("stored", func(b *testing.B) {
		ids := benchIDs(keys1M)
		r := rand.New(rand.NewPCG(1, 2))
		var h uint64
		for b.Loop() {
			h += maphash.String(seed, ids[r.IntN(len(ids))])
		}
		_ = h
	})
	b.Run("computed", func(b *testing.B) {
		space := idSpace(keys1M)
		r := rand.New(rand.NewPCG(1, 2))
		var h uint64
		for b.Loop() {
			h += maphash.String(seed, space.draw(r))
		}
		_ = h
	})
}

// BenchmarkGeneratorFloor runs the fixed-load phase's generator (2 000
// calls a second, open loop, 256 callers) against a system that costs
// nothing, for one second per iteration: its p50 and p99 are the floor
// under every system's latency figures (the dispatcher's sleep overshoot
// and the hand-off to a caller).
func BenchmarkGeneratorFloor(b *testing.B) {
	var p50, p99 []float64
	for b.Loop() {
		r := fixedLoad(nullSystem{}, idSpace(keys1M), offeredLoad, time.Second, 256)
		if r.errors != 0 || r.samples == 0 {
			b.Fatalf("%d errors, %d samples", r.errors, r.samples)
		}
		p50, p99 = append(p50, r.p50), append(p99, r.p99)
	}
	b.ReportMetric(median(p50), "p50-µs")
	b.ReportMetric(median(p99), "p99-µs")
}
