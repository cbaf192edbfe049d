// Package keytable is a hash table of 64-bit keys, already mixed by the
// caller, to values of type V: open addressing with linear probing,
// backward-shift deletion (no tombstones) and a power-of-two size. It is
// the table of each shard of bucket.Store, there instead of a Go map
// because a decision then probes its key's slot in place and steps the
// state where it lies (BenchmarkTable compares the two). Its slots are
// visible by index, so that the caller walks them in an order that depends
// only on the keys and the operations (bucket.Store's sweep hand and its
// choice of what to evict at the key cap), never on a seed.
//
// A Table is not safe for concurrent use. Its zero value is not usable;
// New makes one.
package keytable

import "math/bits"

// Slot is one slot of a Table: Key 0 marks an empty slot.
type Slot[V any] struct {
	Key uint64
	Val V
}

// Table maps non-zero 64-bit keys to values of type V.
//
// A key's home slot is taken from its bits below the skip highest (those a
// caller may have spent already, on picking a shard); keys are equal when
// they are equal outside the label bits, the low bits a caller may use to
// keep something beside the key (a tag), which a lookup ignores.
type Table[V any] struct {
	slots []Slot[V] // nil, or a power of two of them
	n     int       // occupied slots
	shift uint8     // 64 − log2(len(slots))
	skip  uint8     // the high key bits not used for the home slot
	label uint64    // the low key bits that are not part of the key
}

// New returns an empty Table (it allocates on the first Resize) whose home
// slots are taken from the key bits below the skip highest (skip < 64), and
// whose keys compare outside the bits of label.
func New[V any](skip uint8, label uint64) Table[V] {
	return Table[V]{skip: skip, label: label}
}

// Len returns the number of keys held.
func (t *Table[V]) Len() int { return t.n }

// Size returns the number of slots (0 before the first Resize).
func (t *Table[V]) Size() int { return len(t.slots) }

// At returns slot i (0 ≤ i < Size), empty or not. Its Val may be changed
// in place; its Key only to another with the same bits outside the label.
func (t *Table[V]) At(i int) *Slot[V] { return &t.slots[i] }

// home returns the first slot probed for k.
func (t *Table[V]) home(k uint64) int {
	return int((k << (t.skip & 63)) >> (t.shift & 63))
}

// Find returns the slot of k and true, or the empty slot where a probe for
// k stopped (where Insert puts it) and false; -1 and false before the first
// Resize.
func (t *Table[V]) Find(k uint64) (int, bool) {
	if t.slots == nil {
		return -1, false
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := t.slots[i].Key
		if (s^k)&^t.label == 0 {
			return i, true
		}
		if s == 0 {
			return i, false
		}
	}
}

// Insert puts k (not 0, not held) with v in slot at, the slot Find
// returned for it with no Resize or DeleteAt since. The caller keeps the
// table from filling (Resize): a probe needs an empty slot to stop at.
func (t *Table[V]) Insert(at int, k uint64, v V) {
	t.slots[at] = Slot[V]{Key: k, Val: v}
	t.n++
}

// DeleteAt empties slot i, which holds a key, moving the later keys of its
// probe run back into the gap, so that a lookup never needs a tombstone.
// A key moved that way lands at i or at a later slot vacated by the shift;
// slots before i do not change.
func (t *Table[V]) DeleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		k := t.slots[j].Key
		if k == 0 {
			break
		}
		// The key at j may move to i iff i lies cyclically in [home, j).
		if home := t.home(k); (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = Slot[V]{}
	t.n--
}

// Resize moves the keys into a new table of n slots (a power of two, more
// than Len), in slot order: the new layout depends only on the keys and
// the old layout.
func (t *Table[V]) Resize(n int) {
	old := t.slots
	t.slots = make([]Slot[V], n)
	t.shift = uint8(64 - bits.TrailingZeros(uint(n)))
	mask := n - 1
	for k := range old {
		e := &old[k]
		if e.Key == 0 {
			continue
		}
		i := t.home(e.Key)
		for t.slots[i].Key != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = *e
	}
}
