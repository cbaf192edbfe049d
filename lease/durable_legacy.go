package lease

import (
	"container/heap"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/weir-dev/weir/bucket"
)

// This file carries durable counters across a change of the embedding
// node's bucket-key format (weir's keys.go): under format 1 every source of
// a rule's key chain counts under its bare value, so the bucket of the IP
// 198.51.100.7 is also the bucket of an API key of that value; under
// format 2 each source is a namespace, and the identities of the chain's
// later sources are tagged. A tagged identity has no bucket of its own at
// first: its spend under format 1 is in the bare value's bucket. So that a
// "one free trial" rule does not grant a second trial at the switch, a
// format-2 command for a bucket the store does not hold, naming the
// identity format 1 used (DurableCommand.Legacy), starts from that
// identity's bucket as format-1 commands left it.
//
// Until the first format-2 command, every bucket is format-1 state and the
// store keeps nothing more. That command (of any source) switches the
// store: it copies every held bucket's TAT aside as its legacy TAT, once
// (a pass over the held buckets in that one Apply). From then on only
// format-1 commands (from nodes that still speak only format 1, while a
// fleet is mixed) update a legacy TAT. Spend that a format-2 command
// charges to a bare value (the chain's first source keeps bare values) is
// not legacy spend: an API key equal to an IP, sent after the switch, never
// reaches the IP's bucket through this inheritance. A legacy TAT is at most
// its bucket's TAT (a bucket's TAT only grows while it is held), so it
// expires with the bucket, no later, and the copy shrinks to nothing as the
// buckets of before the switch refill.

// DurableKey names a durable bucket's identity under the key format the
// deciding node has in force.
type DurableKey struct {
	// Identity is the bucket's identity within the rule (any bytes, at
	// most MaxDurableIdentityBytes).
	Identity string
	// Legacy is, under key format 2, the identity that format 1 counted
	// the same requests under, when it differs from Identity (a tagged
	// identity of a later source, or an escaped one); empty otherwise.
	Legacy string
	// KeyFormat is the key format the node has in force; 0 means 1.
	KeyFormat uint32
}

// KeyedDurableService is a DurableService that names a bucket's identity
// under both key formats, so that the store can carry spend across the
// switch. *Group and *Client implement it.
type KeyedDurableService interface {
	DurableService
	// DurableKeyed is Durable for the identity key names.
	DurableKeyed(ctx context.Context, rule DurableRule, key DurableKey, cost int64) (bucket.Decision, error)
}

var (
	_ KeyedDurableService = (*Group)(nil)
	_ KeyedDurableService = (*Client)(nil)
)

// DurableKeyed is Durable for the identity key names (DurableKey).
func (g *Group) DurableKeyed(ctx context.Context, rule DurableRule, key DurableKey, cost int64) (bucket.Decision, error) {
	return g.durable(ctx, DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: key.Identity,
		Legacy: key.Legacy, KeyFormat: key.KeyFormat, Cost: cost})
}

// DurableKeyed is Client.Durable for the identity key names (DurableKey).
func (c *Client) DurableKeyed(ctx context.Context, rule DurableRule, key DurableKey, cost int64) (bucket.Decision, error) {
	return c.durableCommand(ctx, DurableCommand{RequestID: newRequestID(), Rule: rule, Identity: key.Identity,
		Legacy: key.Legacy, KeyFormat: key.KeyFormat, Cost: cost})
}

// keyFormatNamespaced is the first key format in which sources are
// namespaces; a command of a lower format (0 or 1) is a format-1 command.
const keyFormatNamespaced = 2

// checkLegacy checks the fields of c that name its bucket under format 1.
func (c DurableCommand) checkLegacy() error {
	switch {
	case len(c.Legacy) > MaxDurableIdentityBytes:
		return fmt.Errorf("%w: durable legacy identity of %d bytes, over %d", ErrBadCommand, len(c.Legacy), MaxDurableIdentityBytes)
	case c.Legacy != "" && c.KeyFormat < keyFormatNamespaced:
		return fmt.Errorf("%w: a durable legacy identity needs key format %d or more, got %d", ErrBadCommand, keyFormatNamespaced, c.KeyFormat)
	case c.Legacy != "" && c.Legacy == c.Identity:
		return fmt.Errorf("%w: a durable legacy identity equal to the identity", ErrBadCommand)
	}
	return nil
}

// inherit switches the store at its first format-2 command, and gives k,
// about to be charged by c, its legacy identity's spend under format 1 when
// the store holds no bucket for k.
func (s *DurableStore) inherit(c DurableCommand, k durableKey) {
	if c.KeyFormat < keyFormatNamespaced {
		return
	}
	if !s.switched {
		s.switched = true
		s.legacy = maps.Clone(s.tats) // advance dropped the full ones
		if s.legacy == nil {
			s.legacy = map[durableKey]int64{}
		}
	}
	if c.Legacy == "" {
		return
	}
	if _, held := s.tats[k]; held {
		return
	}
	tat, ok := s.legacy[durableKey{k.rule, c.Legacy}]
	if !ok || tat <= s.now {
		return
	}
	s.tats[k] = tat
	heap.Push(&s.exp, expiry{tat: tat, key: k})
}

// recordLegacy notes, after a format-1 command c charged (or looked at) k
// in a switched store, the bucket's state as format-1 commands leave it.
// (Before the switch the buckets themselves are that state.)
func (s *DurableStore) recordLegacy(c DurableCommand, k durableKey) {
	if c.KeyFormat >= keyFormatNamespaced || !s.switched {
		return
	}
	if tat, held := s.tats[k]; held {
		s.legacy[k] = tat
	}
}

// dropLegacy forgets k's legacy state with its bucket.
func (s *DurableStore) dropLegacy(k durableKey) { delete(s.legacy, k) }

// LegacyTAT returns the bucket's TAT as format-1 commands left it: the
// bucket's own TAT before the store switched (Switched), its TAT at the
// switch or after the last format-1 command since; ok is false when there
// is none (or the bucket is full).
func (s *DurableStore) LegacyTAT(rule, identity string) (tat int64, ok bool) {
	if !s.switched {
		return s.TAT(rule, identity)
	}
	tat, ok = s.legacy[durableKey{rule, identity}]
	return tat, ok
}

// Switched reports whether the store has applied a command of key format 2
// or more (and so keeps legacy TATs apart from the buckets).
func (s *DurableStore) Switched() bool { return s.switched }

// marshalLegacy appends the legacy section of the state encoding
// (snapshot.go, version 4, written once the store switched): count, each
// rule identity tat, sorted.
func (s *DurableStore) marshalLegacy(w *stateWriter) {
	keys := slices.SortedFunc(maps.Keys(s.legacy), compareDurableKeys)
	w.uint(uint64(len(keys)))
	for _, k := range keys {
		w.str(k.rule)
		w.str(k.identity)
		w.int(s.legacy[k])
	}
}

// durableLegacy reads and checks the legacy section into s, which it
// switches: every entry belongs to a bucket s holds, at most its TAT, in
// order.
func (r *stateReader) durableLegacy(s *DurableStore) {
	s.switched, s.legacy = true, map[durableKey]int64{}
	var prev *durableKey
	for range r.count() {
		k := durableKey{r.str(), r.str()}
		tat := r.int()
		if r.err != nil {
			return
		}
		held, ok := s.tats[k]
		switch {
		case prev != nil && compareDurableKeys(*prev, k) >= 0:
			r.fail(fmt.Sprintf("durable legacy bucket %q/%q out of order", k.rule, k.identity))
			return
		case !ok:
			r.fail(fmt.Sprintf("durable legacy bucket %q/%q: no such bucket", k.rule, k.identity))
			return
		case tat <= s.now || tat > held:
			r.fail(fmt.Sprintf("durable legacy bucket %q/%q: TAT %d outside (now %d, bucket's TAT %d]", k.rule, k.identity, tat, s.now, held))
			return
		}
		s.legacy[k] = tat
		prev = &k
	}
}
