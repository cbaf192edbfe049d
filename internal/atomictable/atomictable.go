// Package atomictable is a hash table of 64-bit keys, already mixed by the
// caller, to int64 values, whose lookups and value updates take no lock: a
// reader probes with atomic loads and changes a value by compare-and-swap,
// while every change of structure (a key added or deleted, the table
// rebuilt) is made by one writer at a time, under the caller's lock. It is
// the table of each shard of bucket.GCRAStore, there instead of a Go map
// under a mutex because a decision on a key already present is then a
// probe and one compare-and-swap (BenchmarkTable compares the two).
//
// # Values
//
// Values stored are positive: the sign bit is reserved as a seal, and a
// sealed 0 would read as Tomb. A slot's value word is
//
//	v >= 0        live (v >= 1 as stored)
//	v == Tomb     deleted (the seal with payload 0)
//	v|seal        sealed live value v: frozen by the writer (a rebuild, or
//	              a change made under its lock); readers go to the writer
//
// # Invariants
//
//   - Slots never move within a table and are never reused: a key goes
//     0 → k once (the value is stored before the key, so whoever sees the
//     key sees its value or a later one); a value goes live → live (CAS),
//     live → Tomb, or live → sealed; Tomb is final, and a seal is final
//     except that the writer unseals a slot it sealed itself (Seal, Set)
//     before it releases its lock. So within one table the probe run of a
//     key, up to the first empty slot, only ever grows at its end.
//   - In the current table, outside the writer's critical section, a key
//     has at most one slot that is not Tomb, and no slot is sealed but the
//     Tomb ones: a key is inserted only after Find, under the lock, found
//     none.
//   - Rebuild seals every slot of the old table (a CAS loop v → v|seal)
//     before it copies the value, so that no reader's CAS can succeed on it
//     afterwards: the value copied is final and no update is lost. A
//     retired table stays sealed for good.
//   - The writer keeps the table from filling (live + Tomb slots at most
//     3/4, say): every table, current or retired, has an empty slot, so
//     every probe ends.
//
// A reader's CAS v → n that succeeds on a slot therefore succeeded on the
// key's only slot of the current table: it is the linearization point, and
// n was computed from v. A reader that meets a seal, or an empty slot,
// hands over to the writer's path, which redoes the operation under the
// lock.
package atomictable

import (
	"math"
	"math/bits"
	"sync/atomic"
)

const (
	sealBit = math.MinInt64 // the seal bit of a value word
	// Tomb is the value of a deleted slot.
	Tomb = math.MinInt64
)

// Slot is one slot of a Table: 16 bytes. Key 0 marks an empty slot.
type Slot struct {
	key atomic.Uint64
	val atomic.Int64
}

// Key returns the slot's key (0: empty). A slot's key does not change once
// set, except within its label bits (SetKey).
func (s *Slot) Key() uint64 { return s.key.Load() }

// Val returns the slot's value word: live (≥ 0), Tomb, or sealed (another
// negative value).
func (s *Slot) Val() int64 { return s.val.Load() }

// CAS sets a live value from old to new (new ≥ 1) if it is still old: a
// sealed or deleted slot never matches.
func (s *Slot) CAS(old, new int64) bool { return s.val.CompareAndSwap(old, new) }

// Seal freezes a live slot against readers' CAS and returns its value, for
// the writer to change it and then Set it; a slot that is Tomb is returned
// as is. Writer only.
func (s *Slot) Seal() int64 {
	v := s.val.Load()
	for v >= 0 && !s.val.CompareAndSwap(v, v|sealBit) {
		v = s.val.Load()
	}
	return v
}

// Set stores v (live, ≥ 1, or Tomb) into a slot the writer sealed or
// deletes a slot outright (Tomb): a reader's CAS on it then fails. Writer
// only.
func (s *Slot) Set(v int64) { s.val.Store(v) }

// Delete makes the slot Tomb and returns the value it had. Writer only.
func (s *Slot) Delete() int64 { return s.val.Swap(Tomb) }

// DeleteIf makes the slot Tomb if its value is still v and reports whether
// it did: false means a reader has just changed it. Writer only.
func (s *Slot) DeleteIf(v int64) bool { return s.val.CompareAndSwap(v, Tomb) }

// SetKey changes the label bits of a sealed slot's key. Writer only.
func (s *Slot) SetKey(k uint64) { s.key.Store(k) }

// Table is one immutable-shape table: its slots are changed in place, its
// size never; a writer replaces it by Rebuild.
//
// A key's home slot is taken from its bits below the skip highest (those
// a caller may have spent already, on picking a shard); keys are equal
// when they are equal outside the label bits, the low bits a caller may
// use to keep something beside the key (a tag), which a lookup ignores.
type Table struct {
	slots []Slot
	mask  int   // len(slots) − 1
	shift uint8 // 64 − log2(len(slots))
	skip  uint8 // the high key bits not used for the home slot
	label uint64
	keep  uint64 // ^label: the key bits a lookup compares
}

// New returns an empty table of n slots (a power of two, at least 2),
// homing keys on their bits below the skip highest (skip < 64) and
// comparing them outside the bits of label.
func New(n int, skip uint8, label uint64) *Table {
	return &Table{slots: make([]Slot, n), mask: n - 1, shift: uint8(64 - bits.TrailingZeros(uint(n))), skip: skip, label: label, keep: ^label}
}

// Size returns the number of slots.
func (t *Table) Size() int { return len(t.slots) }

// At returns slot i (0 ≤ i < Size).
func (t *Table) At(i int) *Slot { return &t.slots[i] }

// Lookup returns k's slot that is not Tomb and the value it read there
// (live, or sealed: negative), or nil if a probe reaches an empty slot
// first. k has its label bits 0. It takes no lock. A nil result is
// "absent" only if the caller sees the same table current after it (the
// empty slot was read while the table was current, and a key inserted
// since could only have filled it); otherwise the caller asks under the
// lock.
func (t *Table) Lookup(k uint64) (*Slot, int64) {
	for i := t.home(k); ; i++ {
		e := &t.slots[i&t.mask]
		kk := e.key.Load()
		if kk&t.keep == k {
			if v := e.val.Load(); v != Tomb {
				return e, v
			}
		} else if kk == 0 {
			return nil, 0
		}
	}
}

// home returns the first slot probed for k.
func (t *Table) home(k uint64) int {
	return int((k << (t.skip & 63)) >> (t.shift & 63))
}

// Find returns the index of k's live slot and true, or the index of the
// empty slot where the probe stopped and false. Under the writer's lock,
// where the only sealed slots of the current table are Tomb.
func (t *Table) Find(k uint64) (int, bool) {
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		e := &t.slots[i]
		kk := e.key.Load()
		if kk == 0 {
			return i, false
		}
		if (kk^k)&^t.label == 0 && e.val.Load() >= 0 {
			return i, true
		}
	}
}

// Insert puts k with the live value v (≥ 1) into the empty slot at, the one Find
// returned for k with no change of structure since: the value first, then
// the key, which publishes it. Writer only.
func (t *Table) Insert(at int, k uint64, v int64) {
	e := &t.slots[at]
	e.val.Store(v)
	e.key.Store(k)
}

// Rebuild seals every slot of t and copies into a new table of n slots (a
// power of two, room for them all) the live ones for which keep of their
// value is true, in slot order, then returns it for the writer to publish
// (t stays sealed for good). keep runs under the writer's lock.
func (t *Table) Rebuild(n int, keep func(v int64) bool) *Table {
	nt := New(n, t.skip, t.label)
	mask := n - 1
	for k := range t.slots {
		e := &t.slots[k]
		key := e.key.Load()
		if key == 0 {
			continue
		}
		v := e.Seal()
		if v < 0 || !keep(v) {
			continue // Tomb, or dropped by the caller
		}
		i := nt.home(key)
		for nt.slots[i].key.Load() != 0 {
			i = (i + 1) & mask
		}
		nt.Insert(i, key, v)
	}
	return nt
}
