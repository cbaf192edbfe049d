package cluster

import (
	"cmp"
	"slices"
)

// This file assembles the coordinator's outgoing messages. A round's
// messages are built in place in the envelopes that Ready hands out
// (Coordinator.outs), so that a message is never copied on its way out:
// ReadyInto swaps the array of envelopes with the caller's, as it does the
// completions. The item arrays come from pools, one per kind of item, that
// Recycle fills: a message takes an array only of the kinds it carries, and
// hands back only those it has.

// itemPools holds item arrays handed back by Recycle, at most maxReuse of
// each kind, for the next messages' items.
type itemPools struct {
	syncs    [][]SyncItem
	decides  [][]DecideItem
	acks     [][]AckItem
	results  [][]ResultItem
	handoffs [][]HandoffItem
	blinds   [][]BlindItem
	backs    [][]BlindAck
	tracks   [][]TrackItem
}

// addItem returns s one item longer, starting from an array of pool when
// it has none: the caller writes every field of the new last item (an
// array from the pool holds old items).
func addItem[T any](s []T, pool *[][]T) []T {
	if s == nil {
		if p := *pool; len(p) > 0 { // *pool read once
			n := len(p) - 1
			s, p[n] = p[n], nil
			*pool = p[:n]
		}
	}
	return grow1(s)
}

// grow1 returns s one element longer, in its own array while it has
// room: the new last element is whatever the array held there (the
// caller overwrites it), or zero when the array grew.
func grow1[T any](s []T) []T {
	if n := len(s); n < cap(s) {
		return s[:n+1]
	}
	var zero T
	return append(s, zero)
}

// appendItem appends it to s, which starts from an array of pool when it
// has none.
func appendItem[T any](s []T, pool *[][]T, it T) []T {
	s = addItem(s, pool)
	s[len(s)-1] = it
	return s
}

// recycle puts s's array into pool, unless it has none or pool is full.
func recycle[T any](pool *[][]T, s []T) {
	if cap(s) > 0 && len(*pool) < maxReuse {
		*pool = append(*pool, s[:0])
	}
}

// outbox returns the message of this round for to, starting one. The
// pointer is valid until the next call (a new message may move the others).
func (c *Coordinator) outbox(to string) *Message {
	if i := c.lastOut; i >= 0 && sameString(c.outs[i].To, to) {
		return &c.outs[i].Msg
	}
	if c.indexed {
		if i, ok := c.outIdx[to]; ok {
			c.lastOut = i
			return &c.outs[i].Msg
		}
	} else {
		for i := range c.outs {
			if c.outs[i].To == to {
				c.lastOut = i
				return &c.outs[i].Msg
			}
		}
	}
	// The array's slots past its length may hold envelopes handed out
	// before (ReadyInto's swap): a new one overwrites the slot whole.
	n := len(c.outs)
	c.outs = grow1(c.outs)
	env := &c.outs[n]
	env.Msg = Message{Epoch: c.epoch}
	env.To = to
	c.lastOut = n
	switch {
	case c.indexed:
		c.outIdx[to] = c.lastOut
	case len(c.outs) > smallOutboxes:
		if c.outIdx == nil {
			c.outIdx = make(map[string]int, 2*len(c.outs))
		}
		for i := range c.outs {
			c.outIdx[c.outs[i].To] = i
		}
		c.indexed = true
	}
	return &env.Msg
}

// Recycle hands back the item arrays of a message that Ready or ReadyInto
// returned, once nothing reads it any more, so that later outboxes reuse
// them instead of allocating. It is optional, and only for a caller that
// knows the message is done with: the Shell calls it once it has copied
// the items into a message of its own (its sends run on goroutines of
// their own); the simulator does once the receiver has stepped it. m's
// items must not be read after the call.
func (c *Coordinator) Recycle(m *Message) {
	p := &c.pools
	recycle(&p.syncs, m.Syncs)
	recycle(&p.decides, m.Decides)
	recycle(&p.acks, m.Acks)
	recycle(&p.results, m.Results)
	recycle(&p.handoffs, m.Handoffs)
	recycle(&p.blinds, m.Blinds)
	recycle(&p.backs, m.BlindAcks)
	recycle(&p.tracks, m.Tracks)
}

// Queued returns the largest number of items queued for one peer: the
// adapter sends at once, without waiting for its linger, when it reaches the
// batch size.
func (c *Coordinator) Queued() int {
	most := 0
	for i := range c.outs {
		most = max(most, c.outs[i].Msg.Items())
	}
	return most
}

// Ready returns, and forgets, the messages to send (one per destination,
// sorted by name) and the completions to hand out (in ticket order of
// arrival).
func (c *Coordinator) Ready() Ready {
	c.sealBlinds()
	var rd Ready
	if len(c.outs) > 0 {
		rd.Messages = c.takeOutboxes()
		c.outs = nil
	}
	rd.Completions, c.done = c.done, nil
	return rd
}

// ReadyInto is Ready for an adapter that reuses memory: it fills rd with
// what Ready would return, reusing the arrays of rd.Messages and
// rd.Completions. Those arrays may become the coordinator's again at the
// next call (each is swapped with the coordinator's own when there is
// something of its kind to hand out), so the caller must be done with rd by
// then. The items of each message are new arrays, or ones handed back with
// Recycle.
func (c *Coordinator) ReadyInto(rd *Ready) {
	c.sealBlinds()
	// With nothing of a kind to hand out, rd keeps its own array, emptied.
	if len(c.outs) > 0 {
		rd.Messages, c.outs = c.takeOutboxes(), rd.Messages[:0]
	} else if len(rd.Messages) > 0 {
		rd.Messages = rd.Messages[:0]
	}
	if len(c.done) > 0 {
		rd.Completions, c.done = c.done, rd.Completions[:0]
	} else if len(rd.Completions) > 0 {
		rd.Completions = rd.Completions[:0]
	}
}

// takeOutboxes returns this round's non-empty messages, sorted by
// destination, in the array of c.outs, and forgets them (the caller takes
// the array).
func (c *Coordinator) takeOutboxes() []Envelope {
	out := c.outs
	if len(out) == 1 && !c.indexed && !out[0].Msg.Empty() {
		// The common round: one message, nothing to sort or drop.
		c.lastOut = -1
		return out
	}
	if len(out) > 1 {
		slices.SortFunc(out, func(a, b Envelope) int { return cmp.Compare(a.To, b.To) })
	}
	n := 0
	for i := range out {
		if !out[i].Msg.Empty() {
			if i != n {
				out[n] = out[i]
			}
			n++
		}
	}
	if n < len(out) {
		clear(out[n:])
		out = out[:n]
	}
	if c.indexed {
		// Kept: its size follows the most destinations of a round, at
		// most the ring's members.
		clear(c.outIdx)
		c.indexed = false
	}
	c.lastOut = -1
	return out
}
