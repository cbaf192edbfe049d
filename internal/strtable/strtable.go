// Package strtable maps strings (identities) to entries that know their
// own string, kept by pointer: cluster's table of a rule's entries, one per
// rule and role. It is there instead of a Go map[string]P because a
// lookup then hashes the identity once for all the tables it is looked up
// in (Hash, the ...H methods), compares strings only where 32 bits of the
// hash match, and keeps no copy of the key (BenchmarkTable compares the
// two).
package strtable

import (
	"hash/maphash"
	"unsafe"
)

// Table maps identities (strings) to entries of type P (pointers that
// know their identity, Entry), as a Go map[string]P would: open addressing
// with linear probing (at most three quarters full) over 16-byte slots
// that hold the low 32 bits of the key's Hash and the entry, so that a
// lookup hashes once and compares a key (the entry's own, TableID) only
// where those bits match; the key is not kept in the slot, since a hit
// loads the entry anyway (its caller reads it next). A deletion shifts the
// following slots of its run back (no tombstones), so that identities that
// come and go never make the table grow: it grows with the live entries
// alone, and is made again at their size once the deletions since it was
// last made pay for the copy (rebuildAfter), so that memory goes back
// after a peak.
//
// Its zero value is empty and ready to use. The order of its slots depends
// on the process's seed: nothing may depend on it (a caller that walks the
// entries sorts what AppendAll gives). A Table is not safe for concurrent
// use.
type Table[P Entry] struct {
	slots []slot[P] // len 0 or a power of two, at most 1<<32
	n     int       // live entries
	dels  int       // deletions since the last resize
}

// seed seeds the hash of every table: random per process, as a Go map's,
// so that nobody outside can choose identities that collide, and one for
// all tables, so that a caller may hash an identity once for all its
// lookups (Hash, GetH, SetH, DelH).
var seed = maphash.MakeSeed()

// Hash returns identity's hash in every Table of this process: Go's own
// string hash (the one its maps use), through hash/maphash.
func Hash(identity string) uint64 { return maphash.String(seed, identity) }

// Entry is what a Table holds: a pointer to an entry (nil for none) that
// returns the identity it is kept under, which must not change while it is
// in a table.
type Entry interface {
	comparable
	TableID() string
}

// slot is one slot of a Table: the low 32 bits of its identity's Hash,
// from which its home slot also follows (tables have at most 1<<32 slots),
// and its entry, nil in an empty slot.
type slot[P Entry] struct {
	tag uint32
	p   P
}

// minTableSlots is the smallest table made.
const minTableSlots = 8

// Get returns id's entry, or nil.
func (t *Table[P]) Get(id string) P {
	if t.n == 0 {
		var none P
		return none
	}
	return t.GetH(Hash(id), id)
}

// GetH is Get of id whose Hash is h.
func (t *Table[P]) GetH(h uint64, id string) P {
	var none P
	if t.n == 0 {
		return none
	}
	mask, tag := uint64(len(t.slots)-1), uint32(h)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == none {
			return none
		}
		if s.tag == tag && sameString(s.p.TableID(), id) {
			return s.p
		}
	}
}

// Set makes v (not nil, v.TableID() == id) id's entry and reports whether
// id had none.
func (t *Table[P]) Set(id string, v P) bool { return t.SetH(Hash(id), id, v) }

// SetH is Set of id whose Hash is h.
func (t *Table[P]) SetH(h uint64, id string, v P) bool {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	var none P
	mask, tag := uint64(len(t.slots)-1), uint32(h)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == none {
			*s = slot[P]{tag: tag, p: v}
			t.n++
			return true
		}
		if s.tag == tag && sameString(s.p.TableID(), id) {
			s.p = v
			return false
		}
	}
}

// Del deletes id's entry and reports whether it had one.
func (t *Table[P]) Del(id string) bool { return t.DelH(Hash(id), id) }

// DelH is Del of id whose Hash is h.
func (t *Table[P]) DelH(h uint64, id string) bool {
	if t.n == 0 {
		return false
	}
	var none P
	mask, tag := uint64(len(t.slots)-1), uint32(h)
	i := h & mask
	for ; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == none {
			return false
		}
		if s.tag == tag && sameString(s.p.TableID(), id) {
			break
		}
	}
	// Shift back the slots after i in its run that may move to i: those
	// whose home slot is not cyclically in (i, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &t.slots[j]
		if s.p == none {
			break
		}
		if home := uint64(s.tag) & mask; (j-home)&mask >= (j-i)&mask {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = slot[P]{}
	t.n--
	// Memory goes back after a peak, but only once the deletions since
	// the last resize pay for the copy (a churn of identities): a table that
	// fills and drains again and again keeps its size.
	if t.dels++; t.dels > rebuildAfter(t.n) {
		if size := tableSize(t.n); size < len(t.slots) {
			t.resize(size)
		}
		t.dels = 0
	}
	return true
}

// resize moves the entries into a table of size slots (a power of two,
// more than t.n).
func (t *Table[P]) resize(size int) {
	var none P
	old := t.slots
	t.slots, t.dels = make([]slot[P], size), 0
	mask := uint64(size - 1)
	for k := range old {
		s := &old[k]
		if s.p == none {
			continue
		}
		i := uint64(s.tag) & mask
		for t.slots[i].p != none {
			i = (i + 1) & mask
		}
		t.slots[i] = *s
	}
}

// Len returns the number of entries.
func (t *Table[P]) Len() int { return t.n }

// tableSize is the size of a table made for n entries: at most half full.
func tableSize(n int) int {
	size := minTableSlots
	for size < 2*n {
		size *= 2
	}
	return size
}

// rebuildAfter is how many deletions a table of live entries takes before
// it is made again at the size they need.
func rebuildAfter(live int) int { return 2*live + 4096 }

// AppendAll appends t's identities and entries to ids and vs, in no
// particular order.
func (t *Table[P]) AppendAll(ids []string, vs []P) ([]string, []P) {
	var none P
	for k := range t.slots {
		if s := &t.slots[k]; s.p != none {
			ids, vs = append(ids, s.p.TableID()), append(vs, s.p)
		}
	}
	return ids, vs
}

// sameString is a == b, answered without comparing bytes when both are the
// same string in memory: an entry's own identity is often the very string
// it is looked up by.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}
