package atomictable

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
)

func mixKey(i uint64) uint64 { return (i + 1) * 0x9e3779b97f4a7c15 }

// writer is the structural side as bucket.GCRAStore drives it: inserts
// and deletes under a mutex, rebuilding before the table would pass 3/4
// (live + tombstones).
type writer struct {
	mu          sync.Mutex
	t           *Table
	live, tombs int
}

func (w *writer) put(k uint64, v int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t == nil {
		w.t = New(8, 0, 0)
	}
	if i, ok := w.t.Find(k); ok {
		e := w.t.At(i)
		e.Seal()
		e.Set(v)
		return
	}
	if (w.live+w.tombs+1)*4 > w.t.Size()*3 {
		n := w.t.Size()
		if (w.live+1)*2 > n {
			n *= 2
		}
		w.t = w.t.Rebuild(n, func(int64) bool { return true })
		w.tombs = 0
	}
	i, _ := w.t.Find(k)
	w.t.Insert(i, k, v)
	w.live++
}

func (w *writer) del(k uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t == nil {
		return false
	}
	i, ok := w.t.Find(k)
	if ok {
		w.t.At(i).Delete()
		w.live--
		w.tombs++
	}
	return ok
}

func (w *writer) get(k uint64) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t == nil {
		return 0, false
	}
	if e, v := w.t.Lookup(k); e != nil {
		return v, true
	}
	return 0, false
}

// TestTableAgainstMap: random puts, deletes and lookups agree with a Go
// map's, through rebuilds.
func TestTableAgainstMap(t *testing.T) {
	var w writer
	ref := map[uint64]int64{}
	r := rand.New(rand.NewPCG(1, 2))
	for op := range 200_000 {
		k := mixKey(uint64(r.IntN(3000)))
		switch r.IntN(3) {
		case 0:
			w.put(k, int64(op)+1)
			ref[k] = int64(op) + 1
		case 1:
			_, had := ref[k]
			if w.del(k) != had {
				t.Fatalf("op %d: delete of %x: table and map disagree", op, k)
			}
			delete(ref, k)
		default:
			v, ok := w.get(k)
			rv, had := ref[k]
			if ok != had || v != rv {
				t.Fatalf("op %d: lookup of %x: table (%d, %v) and map (%d, %v) disagree", op, k, v, ok, rv, had)
			}
		}
	}
}

// TestNoLostUpdate: readers increment values by CAS while the writer
// rebuilds the table over and over; every increment that succeeded is
// there at the end (a sealed slot's value is final, so a rebuild copies
// what the readers committed).
func TestNoLostUpdate(t *testing.T) {
	var w writer
	const keys = 64
	for i := range keys {
		w.put(mixKey(uint64(i)), 1)
	}
	var cur sync.Mutex // guards the published table pointer, as an atomic pointer would
	table := func() *Table { cur.Lock(); defer cur.Unlock(); return w.t }
	var done sync.WaitGroup
	var committed [keys]int64
	var cmu sync.Mutex
	for g := range 2 {
		done.Go(func() {
			n := [keys]int64{}
			for i := range 20_000 {
				j := (i*7 + g) % keys
				k := mixKey(uint64(j))
				for {
					e, v := table().Lookup(k)
					if e == nil {
						t.Error("key lost")
						return
					}
					if v < 0 {
						continue // sealed: the writer is rebuilding
					}
					if e.CAS(v, v+1) {
						n[j]++
						break
					}
				}
			}
			cmu.Lock()
			for j := range n {
				committed[j] += n[j]
			}
			cmu.Unlock()
		})
	}
	stop := make(chan struct{})
	var rebuilds sync.WaitGroup
	rebuilds.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			w.mu.Lock()
			nt := w.t.Rebuild(w.t.Size(), func(int64) bool { return true })
			cur.Lock()
			w.t = nt
			cur.Unlock()
			w.mu.Unlock()
		}
	})
	done.Wait()
	close(stop)
	rebuilds.Wait()
	for j := range keys {
		if v, _ := w.get(mixKey(uint64(j))); v != 1+committed[j] {
			t.Fatalf("key %d: %d in the table, 1 + %d increments committed", j, v, committed[j])
		}
	}
}

// BenchmarkTable compares a Table with the Go map it stands in for, a
// map[uint64]int64 under a mutex (bucket.GCRAStore's shards are shared by
// every goroutine), on what a decision does with it: a lookup that hits
// and changes the value (a CAS here, an assignment under the lock there),
// a lookup that misses, and a delete with an insert, at 1 k, 100 k and
// 1 M keys, serial and parallel for the hit. Read the ratios of one run:
//
//	go test -run '^$' -bench Table -benchmem ./internal/atomictable/
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
		fill := func() *writer {
			w := &writer{}
			for i, k := range keys {
				w.put(k, int64(i)+1)
			}
			return w
		}
		type lockedMap struct {
			mu sync.Mutex
			m  map[uint64]int64
		}
		fillMap := func() *lockedMap {
			m := &lockedMap{m: make(map[uint64]int64)}
			for i, k := range keys {
				m.m[k] = int64(i)
			}
			return m
		}
		b.Run(name+"/hit/table", func(b *testing.B) {
			t := fill().t
			for i := 0; b.Loop(); i++ {
				if e, v := t.Lookup(keys[i%n]); e != nil {
					e.CAS(v, v+1)
				}
			}
		})
		b.Run(name+"/hit/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				m.mu.Lock()
				m.m[keys[i%n]]++
				m.mu.Unlock()
			}
		})
		b.Run(name+"/hit/parallel/table", func(b *testing.B) {
			t := fill().t
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(n)
				for pb.Next() {
					if e, v := t.Lookup(keys[i%n]); e != nil {
						e.CAS(v, v+1)
					}
					i++
				}
			})
		})
		b.Run(name+"/hit/parallel/map", func(b *testing.B) {
			m := fillMap()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(n)
				for pb.Next() {
					m.mu.Lock()
					m.m[keys[i%n]]++
					m.mu.Unlock()
					i++
				}
			})
		})
		b.Run(name+"/miss/table", func(b *testing.B) {
			t := fill().t
			miss := 0
			for i := 0; b.Loop(); i++ {
				if e, _ := t.Lookup(absent[i%n]); e == nil {
					miss++
				}
			}
		})
		b.Run(name+"/miss/map", func(b *testing.B) {
			m := fillMap()
			miss := 0
			for i := 0; b.Loop(); i++ {
				m.mu.Lock()
				if _, ok := m.m[absent[i%n]]; !ok {
					miss++
				}
				m.mu.Unlock()
			}
		})
		// Each op deletes a key and inserts another, so the size stays n.
		b.Run(name+"/delete+insert/table", func(b *testing.B) {
			w := fill()
			for i := 0; b.Loop(); i++ {
				j := i % n
				w.del(keys[j])
				w.put(absent[j], int64(i)+1)
				keys[j], absent[j] = absent[j], keys[j]
			}
		})
		b.Run(name+"/delete+insert/map", func(b *testing.B) {
			m := fillMap()
			for i := 0; b.Loop(); i++ {
				j := i % n
				m.mu.Lock()
				delete(m.m, keys[j])
				m.m[absent[j]] = int64(i)
				m.mu.Unlock()
				keys[j], absent[j] = absent[j], keys[j]
			}
		})
	}
}
