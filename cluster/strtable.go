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

// Key is an identity as the coordinator's tables look it up: the identity
// with its table hash (seeded per process, as a Go map's; not the ring's
// IdentityHash). KeyOf computes the hash once, so that an adapter deciding
// one identity many times hands the same Key to DecideInto and the
// identity is not hashed again; a Key written as Key{Identity: id} is
// hashed on every call.
type Key struct {
	Identity string
	hash     uint64
}

// KeyOf returns identity's Key, its table hash computed.
func KeyOf(identity string) Key { return Key{Identity: identity, hash: hashID(identity)} }

// sameString is a == b, answered without comparing bytes when both are the
// same string in memory: rule IDs and member names reach the coordinator as
// the strings of its rule set and ring, mostly.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}
