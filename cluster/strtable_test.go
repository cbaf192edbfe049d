package cluster

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// tent is a table entry for the tests: it knows its identity.
type tent struct{ id string }

func (e *tent) tableID() string { return e.id }

// TestStrTableMatchesMap runs random sets, deletions and lookups on a
// strTable and on a Go map side by side (the reference), over key spaces
// small enough that runs of collisions, deletions inside runs, wrap-around
// at the table's end, growth and shrinking all happen, and compares every
// answer and, after each phase, the whole contents.
func TestStrTableMatchesMap(t *testing.T) {
	for _, space := range []int{3, 40, 2000} {
		rng := rand.New(rand.NewPCG(uint64(space), 7))
		var tb strTable[*tent]
		ref := map[string]*tent{}
		vals := make([]tent, space)
		for i := range vals {
			vals[i].id = "id-" + strconv.Itoa(i)
		}
		key := func() string { return "id-" + strconv.Itoa(rng.IntN(space)) }
		for phase := range 6 {
			// Phases alternate between filling (mostly sets) and draining
			// (mostly deletions), so the table grows and shrinks.
			pSet := 0.7
			if phase%2 == 1 {
				pSet = 0.2
			}
			for range 20 * space {
				k := key()
				switch x := rng.Float64(); {
				case x < pSet:
					i, _ := strconv.Atoi(k[3:])
					v := &vals[i]
					_, had := ref[k]
					ref[k] = v
					if added := tb.set(k, v); added == had {
						t.Fatalf("space %d: set(%q) reported added %v, map had it: %v", space, k, added, had)
					}
				case x < pSet+0.2:
					_, had := ref[k]
					delete(ref, k)
					if got := tb.del(k); got != had {
						t.Fatalf("space %d: del(%q) = %v, map had it: %v", space, k, got, had)
					}
				default:
					if got := tb.get(k); got != ref[k] {
						t.Fatalf("space %d: get(%q) = %p, want %p", space, k, got, ref[k])
					}
				}
				if tb.len() != len(ref) {
					t.Fatalf("space %d: len %d, want %d", space, tb.len(), len(ref))
				}
			}
			ids, vs := tb.appendAll(nil, nil)
			if len(ids) != len(ref) {
				t.Fatalf("space %d phase %d: %d entries walked, want %d", space, phase, len(ids), len(ref))
			}
			for i, id := range ids {
				if ref[id] != vs[i] {
					t.Fatalf("space %d phase %d: walk gave %q → %p, want %p", space, phase, id, vs[i], ref[id])
				}
			}
			for k, v := range ref {
				if got := tb.get(k); got != v {
					t.Fatalf("space %d phase %d: get(%q) = %p, want %p", space, phase, k, got, v)
				}
			}
			if n := len(tb.slots); n > 0 && (4*tb.n > 3*n || n&(n-1) != 0) {
				t.Fatalf("space %d phase %d: %d entries in %d slots", space, phase, tb.n, n)
			}
		}
	}
}

// TestStrTableChurnStaysSmall: identities that come and go (each set, then
// deleted) leave the table at the size its live entries need, as the key
// cap's churn requires (keycap.go).
func TestStrTableChurnStaysSmall(t *testing.T) {
	var tb strTable[*tent]
	set := func(id string) { tb.set(id, &tent{id}) }
	const live = 100
	for i := range 200_000 {
		set("k-" + strconv.Itoa(i))
		if i >= live {
			if !tb.del("k-" + strconv.Itoa(i-live)) {
				t.Fatalf("k-%d missing", i-live)
			}
		}
	}
	if tb.len() != live {
		t.Fatalf("len %d, want %d", tb.len(), live)
	}
	if len(tb.slots) > 4*live {
		t.Fatalf("%d slots for %d live entries", len(tb.slots), tb.len())
	}
	// And it gives memory back after a peak, once the deletions since
	// pay for the copy.
	for i := range 100_000 {
		set("p-" + strconv.Itoa(i))
	}
	peak := len(tb.slots)
	ids, _ := tb.appendAll(nil, nil)
	slices.Sort(ids)
	for _, id := range ids {
		tb.del(id)
	}
	for i := range 5000 {
		set("q-" + strconv.Itoa(i))
		tb.del("q-" + strconv.Itoa(i))
	}
	if tb.len() != 0 || len(tb.slots) > minTableSlots {
		t.Fatalf("after a peak of %d slots and churn: len %d, %d slots", peak, tb.len(), len(tb.slots))
	}
}

// BenchmarkStrTable compares a strTable's lookups with a Go map's over the
// same 1 000 identities (read the ratio of one run).
func BenchmarkStrTable(b *testing.B) {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "identity-" + strconv.Itoa(i)
	}
	b.Run("strTable", func(b *testing.B) {
		var tb strTable[*tent]
		for _, id := range ids {
			tb.set(id, &tent{id})
		}
		for i := range b.N {
			if tb.get(ids[i&1023]) == nil {
				b.Fatal("missing")
			}
		}
	})
	b.Run("map", func(b *testing.B) {
		m := map[string]*tent{}
		for _, id := range ids {
			m[id] = &tent{id}
		}
		for i := range b.N {
			if m[ids[i&1023]] == nil {
				b.Fatal("missing")
			}
		}
	})
}
