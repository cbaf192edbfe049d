package lease

import (
	"container/heap"
	"fmt"
	"maps"
	"slices"
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
// store: it copies every held bucket (its TAT and parameters) aside as its
// legacy bucket, once (a pass over the held buckets in that one Apply).
// From then on only format-1 commands (from nodes that still speak only
// format 1, while a fleet is mixed) update a legacy bucket. Spend that a
// format-2 command charges to a bare value (the chain's first source keeps
// bare values) is not legacy spend: an API key equal to an IP, sent after
// the switch, never reaches the IP's bucket through this inheritance. An
// inherited bucket is converted to the command's parameters as a held one
// would be (spend carries over as tokens). Legacy buckets expire by their
// own TAT, so the copy shrinks to nothing as the buckets of before the
// switch refill.

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

// inherit switches the store at its first format-2 command, and returns
// the bucket k, about to be charged by c, starts from: b as held, else, for
// a command naming a legacy identity, that identity's bucket as format-1
// commands left it (inherited true; Apply converts it to c's parameters as
// it would a held bucket).
func (s *DurableStore) inherit(c DurableCommand, k durableKey, b durableBucket, held bool) (durableBucket, bool) {
	if c.KeyFormat < keyFormatNamespaced {
		return b, false
	}
	if !s.switched {
		s.switched = true
		s.legacy = maps.Clone(s.tats) // advance dropped the full ones
		if s.legacy == nil {
			s.legacy = map[durableKey]durableBucket{}
		}
		s.legacyExp = make(expiryHeap, 0, len(s.legacy))
		for _, lk := range slices.SortedFunc(maps.Keys(s.legacy), compareDurableKeys) {
			s.legacyExp = append(s.legacyExp, expiry{tat: s.legacy[lk].tat, key: lk})
		}
		heap.Init(&s.legacyExp)
	}
	if held || c.Legacy == "" {
		return b, false
	}
	lb, ok := s.legacy[durableKey{k.rule, c.Legacy}]
	if !ok || lb.tat <= s.now {
		return b, false
	}
	return lb, true
}

// recordLegacy notes, after a format-1 command c charged (or looked at) k
// in a switched store, the bucket as format-1 commands leave it. (Before
// the switch the buckets themselves are that state.)
func (s *DurableStore) recordLegacy(c DurableCommand, k durableKey) {
	if c.KeyFormat >= keyFormatNamespaced || !s.switched {
		return
	}
	b, held := s.tats[k]
	if !held {
		delete(s.legacy, k)
		return
	}
	if old, ok := s.legacy[k]; !ok || old.tat != b.tat {
		heap.Push(&s.legacyExp, expiry{tat: b.tat, key: k})
	}
	s.legacy[k] = b
}

// expireLegacy drops the legacy buckets that are full by the store's clock.
// A legacy bucket's TAT may move either way when a format-1 command
// records it again (a conversion may move it earlier), so every recording
// pushes an entry and an entry that no longer matches is skipped.
func (s *DurableStore) expireLegacy() {
	for len(s.legacyExp) > 0 && s.legacyExp[0].tat <= s.now {
		e := heap.Pop(&s.legacyExp).(expiry)
		if b, ok := s.legacy[e.key]; ok && b.tat == e.tat {
			delete(s.legacy, e.key)
		}
	}
}

// LegacyTAT returns the bucket's TAT as format-1 commands left it: the
// bucket's own TAT before the store switched (Switched), its TAT at the
// switch or after the last format-1 command since; ok is false when there
// is none (or the bucket is full).
func (s *DurableStore) LegacyTAT(rule, identity string) (tat int64, ok bool) {
	if !s.switched {
		return s.TAT(rule, identity)
	}
	b, ok := s.legacy[durableKey{rule, identity}]
	return b.tat, ok
}

// Switched reports whether the store has applied a command of key format 2
// or more (and so keeps legacy buckets apart from the buckets).
func (s *DurableStore) Switched() bool { return s.switched }

// marshalLegacy appends the legacy section of the state encoding
// (snapshot.go, version 5, written once the store switched): count, each
// rule identity tat interval burst, sorted.
func (s *DurableStore) marshalLegacy(w *stateWriter) {
	keys := slices.SortedFunc(maps.Keys(s.legacy), compareDurableKeys)
	w.uint(uint64(len(keys)))
	for _, k := range keys {
		b := s.legacy[k]
		w.str(k.rule)
		w.str(k.identity)
		w.int(b.tat)
		w.int(b.p.t)
		w.int(b.p.burst)
	}
}

// durableLegacy reads and checks the legacy section into s, which it
// switches: entries in order, not full, of valid parameters.
func (r *stateReader) durableLegacy(s *DurableStore) {
	s.switched, s.legacy = true, map[durableKey]durableBucket{}
	var prev *durableKey
	for range r.count() {
		k := durableKey{r.str(), r.str()}
		b := durableBucket{tat: r.int(), p: durableParams{t: r.int(), burst: r.int()}}
		if r.err != nil {
			return
		}
		var msg string
		switch {
		case prev != nil && compareDurableKeys(*prev, k) >= 0:
			msg = "out of order"
		case k.rule == "" || len(k.rule) > MaxDurableRuleIDBytes || len(k.identity) > MaxDurableIdentityBytes:
			msg = "bad rule id or identity"
		case b.tat <= s.now:
			msg = fmt.Sprintf("full (TAT %d, now %d): it should have been dropped", b.tat, s.now)
		case !b.p.valid():
			msg = fmt.Sprintf("parameters %+v do not make a GCRA", b.p)
		}
		if msg != "" {
			r.fail(fmt.Sprintf("durable legacy bucket %q/%q: %s", k.rule, k.identity, msg))
			s.switched, s.legacy = false, nil
			return
		}
		s.legacy[k] = b
		s.legacyExp = append(s.legacyExp, expiry{tat: b.tat, key: k})
		prev = &k
	}
	heap.Init(&s.legacyExp)
}
