package strtable

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// tent is a table entry for the tests: it knows its identity.
type tent struct{ id string }

func (e *tent) TableID() string { return e.id }

// TestStrTableMatchesMap runs random sets, deletions and lookups on a
// Table and on a Go map side by side (the reference), over key spaces
// small enough that runs of collisions, deletions inside runs, wrap-around
// at the table's end, growth and shrinking all happen, and compares every
// answer and, after each phase, the whole contents.
func TestStrTableMatchesMap(t *testing.T) {
	for _, space := range []int{3, 40, 2000} {
		rng := rand.New(rand.NewPCG(uint64(space), 7))
		var tb Table[*tent]
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
					if added := tb.Set(k, v); added == had {
						t.Fatalf("space %d: set(%q) reported added %v, map had it: %v", space, k, added, had)
					}
				case x < pSet+0.2:
					_, had := ref[k]
					delete(ref, k)
					if got := tb.Del(k); got != had {
						t.Fatalf("space %d: del(%q) = %v, map had it: %v", space, k, got, had)
					}
				default:
					if got := tb.Get(k); got != ref[k] {
						t.Fatalf("space %d: get(%q) = %p, want %p", space, k, got, ref[k])
					}
				}
				if tb.Len() != len(ref) {
					t.Fatalf("space %d: len %d, want %d", space, tb.Len(), len(ref))
				}
			}
			ids, vs := tb.AppendAll(nil, nil)
			if len(ids) != len(ref) {
				t.Fatalf("space %d phase %d: %d entries walked, want %d", space, phase, len(ids), len(ref))
			}
			for i, id := range ids {
				if ref[id] != vs[i] {
					t.Fatalf("space %d phase %d: walk gave %q → %p, want %p", space, phase, id, vs[i], ref[id])
				}
			}
			for k, v := range ref {
				if got := tb.Get(k); got != v {
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
// deleted) leave the table at the size its live entries need, as a churn of
// identities at cluster's key cap requires.
func TestStrTableChurnStaysSmall(t *testing.T) {
	var tb Table[*tent]
	set := func(id string) { tb.Set(id, &tent{id}) }
	const live = 100
	for i := range 200_000 {
		set("k-" + strconv.Itoa(i))
		if i >= live {
			if !tb.Del("k-" + strconv.Itoa(i-live)) {
				t.Fatalf("k-%d missing", i-live)
			}
		}
	}
	if tb.Len() != live {
		t.Fatalf("len %d, want %d", tb.Len(), live)
	}
	if len(tb.slots) > 4*live {
		t.Fatalf("%d slots for %d live entries", len(tb.slots), tb.Len())
	}
	// And it gives memory back after a peak, once the deletions since
	// pay for the copy.
	for i := range 100_000 {
		set("p-" + strconv.Itoa(i))
	}
	peak := len(tb.slots)
	ids, _ := tb.AppendAll(nil, nil)
	slices.Sort(ids)
	for _, id := range ids {
		tb.Del(id)
	}
	for i := range 5000 {
		set("q-" + strconv.Itoa(i))
		tb.Del("q-" + strconv.Itoa(i))
	}
	if tb.Len() != 0 || len(tb.slots) > minTableSlots {
		t.Fatalf("after a peak of %d slots and churn: len %d, %d slots", peak, tb.Len(), len(tb.slots))
	}
}

// BenchmarkTable compares a Table with the Go map it stands in for,
// map[string]*entry, on what cluster's coordinator does with it on a
// decision: a lookup that hits (the hash taken once by the caller, as a
// decision does for all its tables: GetH), a lookup that misses, and a
// delete with an insert (identities that come and go at the key cap), at
// 1 k, 100 k and 1 M identities of 32 bytes. Read the ratios of one run:
//
//	go test -run '^$' -bench Table -benchmem ./internal/strtable/
func BenchmarkTable(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		ids := make([]string, n)
		absent := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("identity-%023d", i)
			absent[i] = fmt.Sprintf("identity-%023d", n+i)
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		// cur[i] is ids[i]'s entry; spare[i] the one its replacement
		// takes, so that no entry's identity changes while it is held.
		ents := make([]tent, 2*n)
		cur, spare := make([]*tent, n), make([]*tent, n)
		name := "keys=" + strconv.Itoa(n/1000) + "k"
		if n == 1_000_000 {
			name = "keys=1M"
		}
		fill := func() *Table[*tent] {
			tb := &Table[*tent]{}
			for i, id := range ids {
				cur[i], spare[i] = &ents[i], &ents[n+i]
				cur[i].id = id
				tb.Set(id, cur[i])
			}
			return tb
		}
		fillMap := func() map[string]*tent {
			m := map[string]*tent{}
			for i, id := range ids {
				cur[i], spare[i] = &ents[i], &ents[n+i]
				cur[i].id = id
				m[id] = cur[i]
			}
			return m
		}
		b.Run(name+"/hit/table", func(b *testing.B) {
			tb := fill()
			for i := 0; b.Loop(); i++ {
				id := ids[i%n]
				if tb.GetH(Hash(id), id) == nil {
					b.Fatal("missing")
				}
			}
		})
		b.Run(name+"/hit/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				if m[ids[i%n]] == nil {
					b.Fatal("missing")
				}
			}
		})
		b.Run(name+"/miss/table", func(b *testing.B) {
			tb := fill()
			for i := 0; b.Loop(); i++ {
				if tb.Get(absent[i%n]) != nil {
					b.Fatal("present")
				}
			}
		})
		b.Run(name+"/miss/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				if m[absent[i%n]] != nil {
					b.Fatal("present")
				}
			}
		})
		// Each op deletes an identity and inserts another, so the size
		// stays n.
		b.Run(name+"/delete+insert/table", func(b *testing.B) {
			tb := fill()
			for i := 0; b.Loop(); i++ {
				j := i % n
				tb.Del(ids[j])
				e := spare[j]
				e.id = absent[j]
				tb.Set(absent[j], e)
				ids[j], absent[j] = absent[j], ids[j]
				spare[j], cur[j] = cur[j], e
			}
		})
		b.Run(name+"/delete+insert/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				j := i % n
				delete(m, ids[j])
				e := spare[j]
				e.id = absent[j]
				m[absent[j]] = e
				ids[j], absent[j] = absent[j], ids[j]
				spare[j], cur[j] = cur[j], e
			}
		})
	}
}
