package cluster

import (
	"hash/maphash"
	"unsafe"
)

// strTable maps identities (strings) to entries of type P (pointers that
// know their identity, tableEntry): the table behind keyMap, one per rule.
// It does what a Go map[string]P does for the coordinator with fewer
// instructions per call and less memory: open addressing with linear
// probing (at most three quarters full) over 16-byte slots that hold the
// low 32 bits of the key's hash (hashID) and the entry, so that a lookup
// hashes once and compares a key (the entry's own, tableID) only where
// those bits match; the key is not kept in the slot, since a hit loads the
// entry anyway (its caller reads it next). A deletion shifts the
// following slots of its run back (no tombstones), so that identities that
// come and go never make the table grow: it grows with the live entries
// alone, and is made again at their size once the deletions since it was
// last made pay for the copy (rebuildAfter), as keyMap's Go maps were.
//
// Its zero value is empty and ready to use. The order of its slots depends
// on the seed: nothing may depend on it (every walk of the coordinator's
// entries collects and sorts its keys).
type strTable[P tableEntry] struct {
	slots []tslot[P] // len 0 or a power of two, at most 1<<32
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

// TableHash returns the hash this process's coordinators look identity up
// by in their tables (seeded per process, as a Go map's; not the ring's
// IdentityHash): an adapter that decides the same identity many times may
// compute it once and hand it to DecideInto, which then need not hash the
// identity again.
func TableHash(identity string) uint64 { return hashID(identity) }

// tableEntry is what a strTable holds: a pointer to an entry (nil for
// none) that returns the identity it is kept under, which must not change
// while it is in a table.
type tableEntry interface {
	comparable
	tableID() string
}

// tslot is one slot of a strTable: the low 32 bits of its identity's
// hashID, from which its home slot also follows (tables have at most 1<<32
// slots), and its entry, nil in an empty slot.
type tslot[P tableEntry] struct {
	tag uint32
	p   P
}

// minTableSlots is the smallest table made.
const minTableSlots = 8

// get returns id's entry, or nil.
func (t *strTable[P]) get(id string) P {
	if t.n == 0 {
		var none P
		return none
	}
	return t.getH(hashID(id), id)
}

// getH is get of id whose hashID is h.
func (t *strTable[P]) getH(h uint64, id string) P {
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
		if s.tag == tag && sameString(s.p.tableID(), id) {
			return s.p
		}
	}
}

// set makes v (not nil, v.tableID() == id) id's entry and reports whether
// id had none.
func (t *strTable[P]) set(id string, v P) bool { return t.setH(hashID(id), id, v) }

// setH is set of id whose hashID is h.
func (t *strTable[P]) setH(h uint64, id string, v P) bool {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	var none P
	mask, tag := uint64(len(t.slots)-1), uint32(h)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.p == none {
			*s = tslot[P]{tag: tag, p: v}
			t.n++
			return true
		}
		if s.tag == tag && sameString(s.p.tableID(), id) {
			s.p = v
			return false
		}
	}
}

// del deletes id's entry and reports whether it had one.
func (t *strTable[P]) del(id string) bool { return t.delH(hashID(id), id) }

// delH is del of id whose hashID is h.
func (t *strTable[P]) delH(h uint64, id string) bool {
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
		if s.tag == tag && sameString(s.p.tableID(), id) {
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
	t.slots[i] = tslot[P]{}
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
func (t *strTable[P]) resize(size int) {
	var none P
	old := t.slots
	t.slots, t.dels = make([]tslot[P], size), 0
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

// len returns the number of entries.
func (t *strTable[P]) len() int { return t.n }

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
func (t *strTable[P]) appendAll(ids []string, vs []P) ([]string, []P) {
	var none P
	for k := range t.slots {
		if s := &t.slots[k]; s.p != none {
			ids, vs = append(ids, s.p.tableID()), append(vs, s.p)
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
