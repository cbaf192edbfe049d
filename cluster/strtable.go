package cluster

import (
	"unsafe"

	"github.com/weir-dev/weir/internal/strtable"
)

// strTable is the table of a rule's entries (keyMap's, one per rule and
// role): internal/strtable, keyed by identity.
type strTable[P strtable.Entry] = strtable.Table[P]

// hashID returns identity's hash in every strTable (strtable.Hash).
func hashID(identity string) uint64 { return strtable.Hash(identity) }

// TableHash returns the hash this process's coordinators look identity up
// by in their tables (seeded per process, as a Go map's; not the ring's
// IdentityHash): an adapter that decides the same identity many times may
// compute it once and hand it to DecideInto, which then need not hash the
// identity again.
func TableHash(identity string) uint64 { return hashID(identity) }

// sameString is a == b, answered without comparing bytes when both are the
// same string in memory: rule IDs and member names reach the coordinator as
// the strings of its rule set and ring, mostly.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}
