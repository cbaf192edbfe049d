package cluster

// Backlog is what waits for a peer while an exchange with it is in flight:
// the adapter keeps at most one exchange in flight per peer, and what is due
// to a busy peer meanwhile joins its Backlog, to leave as the next exchange
// when the one in flight returns (Shell.send and Shell.run do this, and so
// does the simulator's model of them in sim/region).
//
// Syncs are cumulative, so a newer report of an identity's generation
// replaces the one queued instead of joining it: under overload the backlog
// grows with the identities that have spend to report, not with the reports
// (each item keeps its place, so the order of the rest holds). Every other
// item is appended in the order it was added.
//
// The zero value is an empty Backlog. A Backlog is not safe for concurrent
// use; Take empties it for reuse.
type Backlog struct {
	msg   Message
	syncs map[syncKey]int // index in msg.Syncs
}

// syncKey names one cumulative report: an identity's generation under a
// rule.
type syncKey struct {
	rule, identity string
	gen            uint64
}

// Add queues m's items after those already queued (a sync of a (rule,
// identity, generation) already queued replaces it in place when its total
// is not below the queued one's). The Backlog copies the items: m's arrays
// stay the caller's.
func (b *Backlog) Add(m *Message) {
	syncs := m.Syncs
	m.Syncs = nil
	b.msg.merge(m)
	m.Syncs = syncs
	if b.syncs == nil {
		b.syncs = make(map[syncKey]int, len(b.msg.Syncs)+len(syncs))
		for i, it := range b.msg.Syncs {
			b.syncs[syncKey{it.Rule, it.Identity, it.Gen}] = i
		}
	}
	for _, it := range syncs {
		k := syncKey{it.Rule, it.Identity, it.Gen}
		if i, ok := b.syncs[k]; ok {
			if old := &b.msg.Syncs[i]; it.Total >= old.Total {
				*old = it
			}
			continue
		}
		b.syncs[k] = len(b.msg.Syncs)
		b.msg.Syncs = append(b.msg.Syncs, it)
	}
}

// Empty reports whether nothing waits: no item and no handed-over marker.
func (b *Backlog) Empty() bool { return b.msg.Empty() }

// Take returns what is queued, as one message, and empties the Backlog. The
// message's arrays become the caller's.
func (b *Backlog) Take() Message {
	m := b.msg
	b.msg = Message{}
	clear(b.syncs)
	return m
}

// merge appends n's items to m's, keeping their order; n is the newer.
func (m *Message) merge(n *Message) {
	m.Epoch = n.Epoch
	m.Syncs = append(m.Syncs, n.Syncs...)
	m.Decides = append(m.Decides, n.Decides...)
	m.Acks = append(m.Acks, n.Acks...)
	m.Results = append(m.Results, n.Results...)
	m.Handoffs = append(m.Handoffs, n.Handoffs...)
	if n.HandedOver != 0 {
		m.HandedOver = n.HandedOver
	}
}
