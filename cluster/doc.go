// Package cluster places identities on a region's live gateways.
//
// Ring is the placement: an immutable value built from the live member set
// and an epoch, rebuilt on every membership change and swapped in whole by
// the caller. It reads no clock, starts no goroutine and ranges over no map,
// so the deterministic simulator runs the same code as production.
package cluster
