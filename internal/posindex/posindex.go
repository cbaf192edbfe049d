// Package posindex finds items of a caller's array by key: a hash table of
// positions in that array, with linear probing, at most half full. A slot
// holds the high 32 bits of the key's hash and the position + 1 (0:
// empty), so that the table holds no pointers (clearing it is a memclr the
// collector never scans) and a probe asks the caller to compare keys only
// where those bits match. It is the index of cluster.Backlog's queued
// syncs, there instead of a Go map keyed by (rule, identity, generation)
// because a fill of a large backlog then hashes each key once, asks for
// the slots' cache lines ahead of the lookups and keeps no copy of the
// keys (BenchmarkIndex compares the two).
//
// The caller hashes its keys (well mixed: the slot comes from the low
// bits, the tag from the high ones). An Index is not safe for concurrent
// use; its zero value is empty.
package posindex

import (
	"unsafe"

	"github.com/weir-dev/weir/internal/prefetch"
)

// Index maps hashes of keys to positions in the caller's array.
type Index struct {
	slots []uint64 // len 0 or a power of two
	used  int      // slots not empty
}

// MinSlots is the smallest table an Index makes.
const MinSlots = 64

// Reserve makes room for n positions, making the table anew, empty, when
// it would be more than half full: it reports whether it did, and the
// caller then inserts again the positions it had indexed.
func (x *Index) Reserve(n int) bool {
	if 2*n <= len(x.slots) {
		return false
	}
	size := max(len(x.slots), MinSlots)
	for size < 2*n {
		size *= 2
	}
	x.slots, x.used = make([]uint64, size), 0
	return true
}

// Prefetch asks for the cache line of the first slot a key of hash h
// probes (when the table is larger than MinSlots: a small one is in the
// cache already).
func (x *Index) Prefetch(h uint64) {
	if len(x.slots) > MinSlots {
		prefetch.Line(uintptr(unsafe.Pointer(&x.slots[h&uint64(len(x.slots)-1)])))
	}
}

// Find returns the position of the key of hash h, asking eq whether the
// key at a position whose tag matches is it, and false if none is.
func (x *Index) Find(h uint64, eq func(pos int) bool) (int, bool) {
	if len(x.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(x.slots) - 1)
	tag := h >> 32
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>32 == tag {
			if pos := int(uint32(s)) - 1; eq(pos) {
				return pos, true
			}
		}
	}
}

// Insert records position pos (below 1<<32 − 1) under hash h; the table
// has room (Reserve).
func (x *Index) Insert(h uint64, pos int) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i] != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = h>>32<<32 | uint64(uint32(pos+1))
	x.used++
}

// Reset forgets every position, keeping the table unless it is larger than
// maxIdle slots and was less than an eighth full (a burst is over: the next
// fill makes one of the size it needs).
func (x *Index) Reset(maxIdle int) {
	if len(x.slots) > maxIdle && 8*x.used < len(x.slots) {
		x.slots, x.used = nil, 0
		return
	}
	if x.used > 0 {
		clear(x.slots)
		x.used = 0
	}
}
