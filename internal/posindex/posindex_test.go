package posindex

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"testing"
)

var seed = maphash.MakeSeed()

func hashOf(s string) uint64 { return maphash.String(seed, s) }

// fill indexes keys as cluster.Backlog does: reserve, look up, insert
// what is new at the end of the array; it returns the array (each key
// once, in first-seen order).
func fill(x *Index, keys []string) []string {
	var arr []string
	for _, k := range keys {
		if x.Reserve(len(arr) + 1) {
			for i, a := range arr {
				x.Insert(hashOf(a), i)
			}
		}
		h := hashOf(k)
		if _, ok := x.Find(h, func(pos int) bool { return arr[pos] == k }); ok {
			continue
		}
		x.Insert(h, len(arr))
		arr = append(arr, k)
	}
	return arr
}

// TestIndexAgainstMap: the positions found are those a map from key to
// first position gives, through growth and resets, also with a hash that
// collides (every key's tag and home alike).
func TestIndexAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var x Index
	for round := range 20 {
		keys := make([]string, 1+r.IntN(5000))
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(r.IntN(2000))
		}
		arr := fill(&x, keys)
		ref := map[string]int{}
		for _, k := range keys {
			if _, ok := ref[k]; !ok {
				ref[k] = len(ref)
			}
		}
		if len(arr) != len(ref) {
			t.Fatalf("round %d: %d distinct keys, want %d", round, len(arr), len(ref))
		}
		for k, want := range ref {
			if got, ok := x.Find(hashOf(k), func(pos int) bool { return arr[pos] == k }); !ok || got != want {
				t.Fatalf("round %d: %q at %d %v, want %d", round, k, got, ok, want)
			}
		}
		if _, ok := x.Find(hashOf("absent"), func(pos int) bool { return arr[pos] == "absent" }); ok {
			t.Fatalf("round %d: found an absent key", round)
		}
		x.Reset(1 << 10)
	}
	// Every hash the same: a probe compares each candidate.
	var c Index
	c.Reserve(100)
	arr := []string{"a", "b", "c"}
	for i := range arr {
		c.Insert(42, i)
	}
	for want, k := range arr {
		if got, ok := c.Find(42, func(pos int) bool { return arr[pos] == k }); !ok || got != want {
			t.Fatalf("colliding %q at %d %v, want %d", k, got, ok, want)
		}
	}
}

// TestResetGivesMemoryBack: a large table left mostly empty by the last
// fill is dropped; one that was well used is kept.
func TestResetGivesMemoryBack(t *testing.T) {
	var x Index
	x.Reserve(100_000)
	x.Reset(1 << 16)
	if x.slots != nil {
		t.Fatal("an empty table of 256 k slots kept")
	}
	x.Reserve(100_000)
	for i := range 50_000 {
		x.Insert(uint64(i)*0x9e3779b97f4a7c15, i)
	}
	n := len(x.slots)
	x.Reset(1 << 16)
	if len(x.slots) != n || x.used != 0 {
		t.Fatalf("a well-used table: %d slots (had %d), %d used", len(x.slots), n, x.used)
	}
}

// BenchmarkIndex compares an Index with the Go map it stands in for,
// map[string]int from key to position, on what cluster.Backlog does with
// it: a fill of n new keys from empty (a lookup that misses and an insert
// each), lookups that hit, and the reset between fills, at 1 k, 100 k and
// 1 M keys of 32 bytes, read in an order unrelated to the one they were
// made in. Read the ratios of one run:
//
//	go test -run '^$' -bench Index -benchmem ./internal/posindex/
func BenchmarkIndex(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("user:%027d", i)
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		name := "keys=" + strconv.Itoa(n/1000) + "k"
		if n == 1_000_000 {
			name = "keys=1M"
		}
		// fill+reset: ns/op per key.
		b.Run(name+"/fill+reset/index", func(b *testing.B) {
			var x Index
			arr := make([]string, 0, n)
			for b.Loop() {
				x.Reserve(n)
				arr = arr[:0]
				for _, k := range keys {
					h := hashOf(k)
					if _, ok := x.Find(h, func(pos int) bool { return arr[pos] == k }); !ok {
						x.Insert(h, len(arr))
						arr = append(arr, k)
					}
				}
				x.Reset(2 * n)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
		})
		b.Run(name+"/fill+reset/map", func(b *testing.B) {
			m := make(map[string]int, n)
			arr := make([]string, 0, n)
			for b.Loop() {
				arr = arr[:0]
				for _, k := range keys {
					if _, ok := m[k]; !ok {
						m[k] = len(arr)
						arr = append(arr, k)
					}
				}
				clear(m)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
		})
		b.Run(name+"/hit/index", func(b *testing.B) {
			var x Index
			arr := fill(&x, keys)
			for i := 0; b.Loop(); i++ {
				k := keys[i%n]
				if _, ok := x.Find(hashOf(k), func(pos int) bool { return arr[pos] == k }); !ok {
					b.Fatal("missing")
				}
			}
		})
		b.Run(name+"/hit/map", func(b *testing.B) {
			m := make(map[string]int, n)
			for i, k := range keys {
				m[k] = i
			}
			for i := 0; b.Loop(); i++ {
				if _, ok := m[keys[i%n]]; !ok {
					b.Fatal("missing")
				}
			}
		})
	}
}
