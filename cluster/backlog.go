package cluster

import (
	"hash/maphash"
	"slices"
	"unsafe"

	"github.com/weir-dev/weir/internal/posindex"
	"github.com/weir-dev/weir/internal/prefetch"
)

// Backlog is what waits for a peer while an exchange with it is in flight:
// Links keeps at most one exchange in flight per peer, and what is due to a
// busy peer meanwhile joins its Backlog, to leave as the next exchange when
// the one in flight returns.
//
// Syncs are cumulative, so a newer report of an identity's generation
// replaces the one queued instead of joining it: under overload the backlog
// grows with the identities that have spend to report, not with the reports
// (each item keeps its place, so the order of the rest holds). Every other
// item is appended in the order it was added.
//
// The zero value is an empty Backlog. A Backlog is not safe for concurrent
// use; Take empties it for reuse. A caller that is done with a message Take
// returned may hand its arrays back with Reuse, so that the next fills do
// not allocate: two sets of arrays then alternate between the Backlog and
// the exchange in flight.
type Backlog struct {
	msg   Message
	spare Message   // arrays handed back by Reuse, for the fill after the next Take
	idx   syncIndex // where each queued sync is in msg.Syncs
	// lastSyncs is the number of syncs the last Take returned, and
	// lastMost the most items of one kind it returned: under a steady
	// overload the next fill is about as large, so the sync array grows
	// to it at once instead of by doubling, and Reuse keeps arrays of
	// that size.
	lastSyncs, lastMost int
}

// Add queues m's items after those already queued (a sync of a (rule,
// identity, generation) already queued replaces it in place when its total
// is not below the queued one's). The Backlog copies the items: m's arrays
// stay the caller's.
func (b *Backlog) Add(m *Message) {
	syncs := m.Syncs
	m.Syncs = nil
	b.msg.Merge(m)
	m.Syncs = syncs
	if len(syncs) == 0 {
		return
	}
	if n := len(b.msg.Syncs) + len(syncs); n > cap(b.msg.Syncs) {
		// Grow at once to half as much again as the last fill (under
		// overload the backlog grows from one exchange to the next, with
		// identities mostly not those reported then), or double.
		want := max(n, 2*cap(b.msg.Syncs), b.lastSyncs+b.lastSyncs/2)
		if len(b.msg.Syncs) == 0 {
			b.msg.Syncs = make([]SyncItem, 0, want) // Grow would copy the old array whole
		} else {
			b.msg.Syncs = slices.Grow(b.msg.Syncs, want-len(b.msg.Syncs))
		}
	}
	// The index is sized as the array is, to what this fill will likely
	// reach, so that it is not refilled as it grows.
	b.idx.reserve(b.msg.Syncs, max(len(b.msg.Syncs)+len(syncs), min(cap(b.msg.Syncs), b.lastSyncs+b.lastSyncs/2)))
	// In groups, pipelined so that cache misses overlap instead of
	// following one another: the next group's identities are asked of
	// the memory (they were made long ago, each on its own), then this
	// group's hashes are taken, each one's slot asked for, and only then
	// are the lookups made.
	var hs [prefetchGroup]uint64
	var it *SyncItem
	same := func(j int) bool { // the sync at j has it's key
		old := &b.msg.Syncs[j]
		return old.Gen == it.Gen && old.Identity == it.Identity && old.Rule == it.Rule
	}
	prefetchIdentities(syncs[:min(len(syncs), prefetchGroup)])
	for len(syncs) > 0 {
		group := syncs[:min(len(syncs), prefetchGroup)]
		syncs = syncs[len(group):]
		prefetchIdentities(syncs[:min(len(syncs), prefetchGroup)])
		for i := range group {
			hs[i] = b.idx.hash(&group[i])
			b.idx.pos.Prefetch(hs[i])
		}
		for i := range group {
			it = &group[i]
			if j, ok := b.idx.pos.Find(hs[i], same); ok {
				if old := &b.msg.Syncs[j]; it.Total >= old.Total {
					*old = *it
				}
				continue
			}
			b.idx.pos.Insert(hs[i], len(b.msg.Syncs))
			b.msg.Syncs = append(b.msg.Syncs, *it)
		}
	}
}

// prefetchGroup is how many syncs Add hashes ahead of their lookups.
const prefetchGroup = 16

// prefetchIdentities asks for the first cache line of each sync's
// identity.
func prefetchIdentities(syncs []SyncItem) {
	for i := range syncs {
		if id := syncs[i].Identity; len(id) > 0 {
			prefetch.Line(uintptr(unsafe.Pointer(unsafe.StringData(id))))
		}
	}
}

// Empty reports whether nothing waits: no item and no handed-over marker.
func (b *Backlog) Empty() bool { return b.msg.Empty() }

// Take returns what is queued, as one message, and empties the Backlog. The
// message's arrays become the caller's; the Backlog fills the arrays handed
// back by Reuse next, if any, else new ones.
func (b *Backlog) Take() Message {
	m := b.msg
	b.lastSyncs = len(m.Syncs)
	b.lastMost = max(len(m.Syncs), len(m.Decides), len(m.Acks), len(m.Results), len(m.Handoffs), len(m.Blinds),
		len(m.BlindAcks), len(m.Tracks))
	b.msg = Message{
		Syncs:     b.spare.Syncs,
		Decides:   b.spare.Decides,
		Acks:      b.spare.Acks,
		Results:   b.spare.Results,
		Handoffs:  b.spare.Handoffs,
		Blinds:    b.spare.Blinds,
		BlindAcks: b.spare.BlindAcks,
		Tracks:    b.spare.Tracks,
	}
	b.spare = Message{}
	b.idx.pos.Reset(maxIdleIndexSlots)
	return m
}

// Reuse hands back the arrays of m, a message Take returned (or any other
// message whose arrays nothing reads any more), for the Backlog's fills
// after the next Take. It keeps, of each kind, the larger of the array it
// holds for that and m's (up to maxReuseItems items, or twice the most of
// one kind the last Take returned when that is more); m must not be used
// after the call. The items are cleared, so that the Backlog keeps no
// identity alive.
func (b *Backlog) Reuse(m *Message) {
	limit := max(maxReuseItems, 2*b.lastMost)
	b.spare.Syncs = keepLarger(b.spare.Syncs, m.Syncs, limit)
	b.spare.Decides = keepLarger(b.spare.Decides, m.Decides, limit)
	b.spare.Acks = keepLarger(b.spare.Acks, m.Acks, limit)
	b.spare.Results = keepLarger(b.spare.Results, m.Results, limit)
	b.spare.Handoffs = keepLarger(b.spare.Handoffs, m.Handoffs, limit)
	b.spare.Blinds = keepLarger(b.spare.Blinds, m.Blinds, limit)
	b.spare.BlindAcks = keepLarger(b.spare.BlindAcks, m.BlindAcks, limit)
	b.spare.Tracks = keepLarger(b.spare.Tracks, m.Tracks, limit)
	*m = Message{}
}

// keepLarger returns, emptied, whichever of kept and s has the larger
// array (kept when they are the same size, or when s's holds more than
// limit items), with s's items cleared when it is s.
func keepLarger[T any](kept, s []T, limit int) []T {
	if cap(s) <= cap(kept) || cap(s) > limit {
		return kept
	}
	clear(s)
	return s[:0]
}

// maxReuseItems bounds the arrays Backlog.Reuse keeps while the backlog
// is small: a burst's larger arrays are left to the collector once it is
// over.
const maxReuseItems = MaxBatchItems

// Merge appends n's items to m's, keeping their order; n is the newer.
func (m *Message) Merge(n *Message) {
	m.Epoch = n.Epoch
	m.Syncs = append(m.Syncs, n.Syncs...)
	m.Decides = append(m.Decides, n.Decides...)
	m.Acks = append(m.Acks, n.Acks...)
	m.Results = append(m.Results, n.Results...)
	m.Handoffs = append(m.Handoffs, n.Handoffs...)
	m.Blinds = append(m.Blinds, n.Blinds...)
	m.BlindAcks = append(m.BlindAcks, n.BlindAcks...)
	m.Tracks = append(m.Tracks, n.Tracks...)
	if n.HandedOver != 0 {
		m.HandedOver = n.HandedOver
	}
}

// syncIndex finds a queued sync by its (rule, identity, generation): a
// posindex of positions in the Backlog's syncs. The hash is seeded per
// Backlog (maphash), so that no one can choose identities that collide;
// the seed decides only where positions are kept, never what the Backlog
// holds.
type syncIndex struct {
	pos      posindex.Index
	seed     maphash.Seed
	seeded   bool
	lastRule string // rule of the last hash, and its hash: rules are few
	ruleHash uint64
}

// hash returns the hash of it's (rule, identity, generation).
func (x *syncIndex) hash(it *SyncItem) uint64 {
	if !x.seeded {
		x.seed, x.seeded = maphash.MakeSeed(), true
		x.ruleHash = maphash.String(x.seed, x.lastRule)
	}
	if it.Rule != x.lastRule {
		x.lastRule, x.ruleHash = it.Rule, maphash.String(x.seed, it.Rule)
	}
	h := maphash.String(x.seed, it.Identity) ^ x.ruleHash ^ it.Gen*0x9e3779b97f4a7c15
	// fmix64 (MurmurHash3): every input bit reaches the tag's bits.
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// reserve makes room for n positions of syncs (those of syncs indexed
// already, the rest to come), indexing syncs again when the table is made
// anew.
func (x *syncIndex) reserve(syncs []SyncItem, n int) {
	if x.pos.Reserve(n) {
		for i := range syncs {
			x.pos.Insert(x.hash(&syncs[i]), i)
		}
	}
}

// maxIdleIndexSlots is the largest table Take keeps however little of it
// the last fill used.
const maxIdleIndexSlots = 1 << 16
