package keytable

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// mixKey spreads i over 64 bits, as bucket's key words are (odd
// multiplier: a bijection, 0 only for 0).
func mixKey(i uint64) uint64 { return (i + 1) * 0x9e3779b97f4a7c15 }

// grow keeps t at most 3/4 full before an insert, as bucket.Store does.
func grow[V any](t *Table[V]) {
	if n := t.Size(); n == 0 || (t.Len()+1)*4 > n*3 {
		t.Resize(max(2*n, 8))
	}
}

func put[V any](t *Table[V], k uint64, v V) {
	if i, ok := t.Find(k); ok {
		t.At(i).Val = v
		return
	}
	grow(t)
	i, _ := t.Find(k)
	t.Insert(i, k, v)
}

func del[V any](t *Table[V], k uint64) bool {
	i, ok := t.Find(k)
	if ok {
		t.DeleteAt(i)
	}
	return ok
}

// check verifies that every key is found at its own slot and Len counts
// them.
func check[V any](tb testing.TB, t *Table[V]) {
	tb.Helper()
	n := 0
	for i := range t.Size() {
		k := t.At(i).Key
		if k == 0 {
			continue
		}
		n++
		if j, ok := t.Find(k); !ok || j != i {
			tb.Fatalf("slot %d (key %x) unreachable: Find gives %d %v", i, k, j, ok)
		}
	}
	if n != t.Len() {
		tb.Fatalf("Len %d, %d keys in the slots", t.Len(), n)
	}
}

// TestTableAgainstMap runs random puts, deletes and lookups on a Table and
// on a Go map, with shards' high bits skipped and a label in the low bits
// as bucket.Store uses it, and checks they agree.
func TestTableAgainstMap(t *testing.T) {
	const label = 1<<12 - 1
	for _, skip := range []uint8{0, 8} {
		tab := New[int](skip, label)
		ref := map[uint64]int{}
		r := rand.New(rand.NewPCG(1, uint64(skip)))
		for op := range 200_000 {
			k := mixKey(uint64(r.IntN(5000))) &^ label
			switch r.IntN(3) {
			case 0:
				put(&tab, k|uint64(r.IntN(label)), op)
				ref[k] = op
			case 1:
				_, had := ref[k]
				if del(&tab, k) != had {
					t.Fatalf("op %d: delete of %x: table and map disagree", op, k)
				}
				delete(ref, k)
			default:
				i, ok := tab.Find(k)
				v, had := ref[k]
				if ok != had || (ok && tab.At(i).Val != v) {
					t.Fatalf("op %d: lookup of %x: table (%v) and map (%v, %d) disagree", op, k, ok, had, v)
				}
			}
			if op%10_000 == 0 {
				check(t, &tab)
			}
		}
		check(t, &tab)
		if tab.Len() != len(ref) {
			t.Fatalf("Len %d, map %d", tab.Len(), len(ref))
		}
		// Shrinking keeps every key.
		n := 8
		for n < 2*tab.Len() {
			n *= 2
		}
		tab.Resize(n)
		check(t, &tab)
		for k, v := range ref {
			if i, ok := tab.Find(k); !ok || tab.At(i).Val != v {
				t.Fatalf("after shrink: %x lost", k)
			}
		}
	}
}

// TestTableLayoutDeterministic: the same operations give the same slots,
// whatever came before in the process (no seed).
func TestTableLayoutDeterministic(t *testing.T) {
	build := func() []Slot[int] {
		tab := New[int](4, 0)
		for i := range 3000 {
			put(&tab, mixKey(uint64(i)), i)
			if i%3 == 0 {
				del(&tab, mixKey(uint64(i/2)))
			}
		}
		return append([]Slot[int](nil), tab.slots...)
	}
	a, b := build(), build()
	if len(a) != len(b) {
		t.Fatalf("sizes %d and %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("slot %d: %v and %v", i, a[i], b[i])
		}
	}
}

// BenchmarkTable compares a Table with the Go map it stands in for,
// map[uint64]V, on what bucket.Store does with it on a decision: a lookup
// that hits (and changes the value in place), a lookup that misses, an
// insert and a delete, at 1 k, 100 k and 1 M keys. V is 8 bytes (a GCRA
// TAT). Read the ratios of one run:
//
//	go test -run '^$' -bench Table -benchmem ./internal/keytable/
func BenchmarkTable(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		keys := make([]uint64, n)
		absent := make([]uint64, n)
		for i := range keys {
			keys[i], absent[i] = mixKey(uint64(i)), mixKey(uint64(n+i))
		}
		r := rand.New(rand.NewPCG(1, 2))
		r.Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		name := "keys=" + strconv.Itoa(n/1000) + "k"
		if n == 1_000_000 {
			name = "keys=1M"
		}
		fill := func() Table[int64] {
			tab := New[int64](0, 0)
			for i, k := range keys {
				put(&tab, k, int64(i))
			}
			return tab
		}
		fillMap := func() map[uint64]int64 {
			m := make(map[uint64]int64)
			for i, k := range keys {
				m[k] = int64(i)
			}
			return m
		}
		b.Run(name+"/hit/table", func(b *testing.B) {
			tab := fill()
			for i := 0; b.Loop(); i++ {
				if j, ok := tab.Find(keys[i%n]); ok {
					tab.At(j).Val++
				}
			}
		})
		b.Run(name+"/hit/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				m[keys[i%n]]++
			}
		})
		b.Run(name+"/miss/table", func(b *testing.B) {
			tab := fill()
			miss := 0
			for i := 0; b.Loop(); i++ {
				if _, ok := tab.Find(absent[i%n]); !ok {
					miss++
				}
			}
		})
		b.Run(name+"/miss/map", func(b *testing.B) {
			m := fillMap()
			miss := 0
			for i := 0; b.Loop(); i++ {
				if _, ok := m[absent[i%n]]; !ok {
					miss++
				}
			}
		})
		// Insert and delete in turn: each op deletes a key and inserts
		// another, so the size stays n.
		b.Run(name+"/delete+insert/table", func(b *testing.B) {
			tab := fill()
			for i := 0; b.Loop(); i++ {
				j := i % n
				del(&tab, keys[j])
				put(&tab, absent[j], int64(i))
				keys[j], absent[j] = absent[j], keys[j]
			}
		})
		b.Run(name+"/delete+insert/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				j := i % n
				delete(m, keys[j])
				m[absent[j]] = int64(i)
				keys[j], absent[j] = absent[j], keys[j]
			}
		})
	}
}
