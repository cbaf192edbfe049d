package cluster

import (
	"hash/maphash"
	"unsafe"
)

// strTable maps identities (strings) to entries of type V: the table behind
// keyMap, one per rule. It does what a Go map[string]*V does for the
// coordinator with fewer instructions per call: open addressing with linear
// probing (at most three quarters full) over slots that hold the key's hash
// (hashID), the key and the entry, so that a lookup hashes once and
// compares a key only where the whole hash matches; a deletion shifts the
// following slots of its run back (no tombstones), so that identities that
// come and go never make the table grow: it grows with the live entries
// alone, and is made again at their size once the deletions since it was
// last made pay for the copy (rebuildAfter), as keyMap's Go maps were.
//
// Its zero value is empty and ready to use. The order of its slots depends
// on the seed: nothing may depend on it (every walk of the coordinator's
// entries collects and sorts its keys).
type strTable[V any] struct {
	slots []tslot[V] // len 0 or a power of two
	n     int        // live entries
	dels  int        // deletions since the last resize
}

// idSeed seeds the hash of every table: random per process, as a Go
// map's, so that nobody outside can choose identities that collide, and
// one for all tables, so that a caller may hash an identity once for all
// its lookups (hashID, getH, setH).
var idSeed = maphash.MakeSeed()

// hashID returns identity's hash in every strTable: Go's own string hash
// (the one its maps use), through hash/maphash.
func hashID(identity string) uint64 { return maphash.String(idSeed, identity) }

// tslot is one slot of a strTable; p is nil in an empty slot.
type tslot[V any] struct {
	h  uint64
	id string
	p  *V
}

// minTableSlots is the smallest table made.
const minTableSlots = 8

// get returns id's entry, or nil.
func (t *strTable[V]) get(id string) *V {
	if t.n == 0 {
		return nil
	}
	return t.getH(hashID(id), id)
}

// getH is get of id whose hashID is h.
func (t *strTable[V]) getH(h uint64, id string) *V {
	if t.n == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == nil {
			return nil
		}
		if s.h == h && sameString(s.id, id) {
			return s.p
		}
	}
}

// set makes v (not nil) id's entry and reports whether id had none.
func (t *strTable[V]) set(id string, v *V) bool { return t.setH(hashID(id), id, v) }

// setH is set of id whose hashID is h.
func (t *strTable[V]) setH(h uint64, id string, v *V) bool {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == nil {
			*s = tslot[V]{h: h, id: id, p: v}
			t.n++
			return true
		}
		if s.h == h && sameString(s.id, id) {
			s.p = v
			return false
		}
	}
}

// del deletes id's entry and reports whether it had one.
func (t *strTable[V]) del(id string) bool { return t.delH(hashID(id), id) }

// delH is del of id whose hashID is h.
func (t *strTable[V]) delH(h uint64, id string) bool {
	if t.n == 0 {
		return false
	}
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for ; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == nil {
			return false
		}
		if s.h == h && sameString(s.id, id) {
			break
		}
	}
	// Shift back the slots after i in its run that may move to i: those
	// whose home slot is not cyclically in (i, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &t.slots[j]
		if s.p == nil {
			break
		}
		if home := s.h & mask; (j-home)&mask >= (j-i)&mask {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = tslot[V]{}
	t.n--
	// Memory goes back after a peak, but only once the deletions since
	// the last resize pay for the copy (keyMap's churn): a table that
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
func (t *strTable[V]) resize(size int) {
	old := t.slots
	t.slots, t.dels = make([]tslot[V], size), 0
	mask := uint64(size - 1)
	for k := range old {
		s := &old[k]
		if s.p == nil {
			continue
		}
		i := s.h & mask
		for t.slots[i].p != nil {
			i = (i + 1) & mask
		}
		t.slots[i] = *s
	}
}

// len returns the number of entries.
func (t *strTable[V]) len() int { return t.n }

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

// appendAll appends t's identities and entries to ids and vs, in no
// particular order.
func (t *strTable[V]) appendAll(ids []string, vs []*V) ([]string, []*V) {
	for k := range t.slots {
		if s := &t.slots[k]; s.p != nil {
			ids, vs = append(ids, s.id), append(vs, s.p)
		}
	}
	return ids, vs
}

// sameString is a == b, answered without comparing bytes when both are the
// same string in memory: rule IDs and member names reach the coordinator as
// the strings of its rule set and ring, mostly.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}
