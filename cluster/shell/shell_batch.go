package shell

import (
	"slices"
	"sync"

	"github.com/weir-dev/weir/cluster"
)

// outboxes collects the shards' messages, merged per destination.
type outboxes struct {
	envs []cluster.Envelope
	// pool gives the arrays of the merged messages: the shards'
	// messages are copied into them, and their arrays handed back to
	// their coordinators at once (the merged messages' arrays go back to
	// pool once sent or queued: see Node.send, Node.run and
	// Node.Handle).
	pool *msgPool
	// lk, when set, is the Node's (s.mu is held): a message for a peer
	// with an exchange in flight joins its Backlog at once.
	lk   *cluster.Links
	lkMu *sync.Mutex // guards lk
}

// add copies m's items into the message for to (or, with links, into
// the Backlog of a busy peer): m's arrays are free again once it returns.
// m is from the first of left shards still to come, which queue about as
// much each (the identities are spread evenly): a new message is given
// room for left times m's items (and a quarter more) at once, so that it
// does not grow by doubling as the others merge in.
func (o *outboxes) add(to string, m *cluster.Message, left int) {
	if o.lk != nil {
		o.lkMu.Lock()
		queued := o.lk.Queue(o.lk.Peer(to), m)
		o.lkMu.Unlock()
		if queued {
			return
		}
	}
	for i := range o.envs {
		if o.envs[i].To == to {
			o.envs[i].Msg.Merge(m)
			return
		}
	}
	env := cluster.Envelope{To: to, Msg: o.pool.get()}
	if left > 1 {
		reserve(&env.Msg, m, left+left/4)
	}
	env.Msg.Merge(m)
	o.envs = append(o.envs, env)
}

// reserve gives each array of m room for k times as many items as n's
// array of that kind has.
func reserve(m, n *cluster.Message, k int) {
	m.Syncs = grown(m.Syncs, k*len(n.Syncs))
	m.Decides = grown(m.Decides, k*len(n.Decides))
	m.Acks = grown(m.Acks, k*len(n.Acks))
	m.Results = grown(m.Results, k*len(n.Results))
	m.Handoffs = grown(m.Handoffs, k*len(n.Handoffs))
	m.Blinds = grown(m.Blinds, k*len(n.Blinds))
	m.BlindAcks = grown(m.BlindAcks, k*len(n.BlindAcks))
	m.Tracks = grown(m.Tracks, k*len(n.Tracks))
}

// grown returns s with room for n items in all: a new array when s is
// empty (slices.Grow would copy s's whole old array).
func grown[T any](s []T, n int) []T {
	switch {
	case n <= cap(s):
		return s
	case len(s) == 0:
		return make([]T, 0, n)
	}
	return slices.Grow(s, n-len(s))
}

// msgPool keeps the item arrays of messages the Node has sent (or
// queued, copied, in a Backlog), for the next merged messages: at most
// maxPooledMessages messages' worth, each array of at most maxPooledItems
// items (what an idle node keeps after a burst is bounded). It is safe
// for concurrent use.
type msgPool struct {
	mu   sync.Mutex
	free []cluster.Message
}

// get returns an empty message, with arrays kept from an earlier one if
// there are some.
func (p *msgPool) get() cluster.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return cluster.Message{}
	}
	// The largest arrays first: a merged message is as large as the
	// shards' queues, and the smaller arrays would grow.
	best := n - 1
	for i := range n - 1 {
		if capacity(&p.free[i]) > capacity(&p.free[best]) {
			best = i
		}
	}
	m := p.free[best]
	p.free[best] = p.free[n-1]
	p.free[n-1] = cluster.Message{}
	p.free = p.free[:n-1]
	return m
}

// put keeps m's arrays, their items cleared, unless the pool is full; m
// must not be used after the call.
func (p *msgPool) put(m *cluster.Message) {
	if capacity(m) == 0 {
		return
	}
	e := cluster.Message{
		Syncs:     reusable(m.Syncs),
		Decides:   reusable(m.Decides),
		Acks:      reusable(m.Acks),
		Results:   reusable(m.Results),
		Handoffs:  reusable(m.Handoffs),
		Blinds:    reusable(m.Blinds),
		BlindAcks: reusable(m.BlindAcks),
		Tracks:    reusable(m.Tracks),
	}
	*m = cluster.Message{}
	p.mu.Lock()
	if len(p.free) < maxPooledMessages {
		p.free = append(p.free, e)
	}
	p.mu.Unlock()
}

// capacity returns the items m's arrays have room for.
func capacity(m *cluster.Message) int {
	return cap(m.Syncs) + cap(m.Decides) + cap(m.Acks) + cap(m.Results) + cap(m.Handoffs) + cap(m.Blinds) +
		cap(m.BlindAcks) + cap(m.Tracks)
}

// reusable returns s emptied, its items cleared, or nil when its array is
// too large to keep.
func reusable[T any](s []T) []T {
	if cap(s) > maxPooledItems {
		return nil
	}
	clear(s)
	return s[:0]
}

// take hands shard i's completions to their waiters and adds its messages
// to out, its forwarded requests' tickets made the Node's (under shard i's
// lock); left is the number of shards, this one included, whose messages
// out is still to get.
func (s *Node) take(i int, out *outboxes, left int) {
	sh := &s.shards[i]
	if !sh.coord.HasReady() {
		return
	}
	// The arrays of sh.rd are reused: the completions are handed out and
	// each message's items copied into out before the next take, and the
	// items' arrays handed back to the coordinator with Recycle.
	rd := &sh.rd
	sh.coord.ReadyInto(rd)
	sh.complete(rd.Completions)
	for k := range rd.Messages {
		m := &rd.Messages[k].Msg
		for j := range m.Decides {
			m.Decides[j].Ticket = m.Decides[j].Ticket<<s.shift | uint64(i)
		}
		out.add(rd.Messages[k].To, m, left)
		// Copied: the coordinator's next outboxes reuse the arrays.
		sh.coord.Recycle(m)
	}
}

// split cuts a batch from a peer into one part per shard: every item goes
// to the shard of its identity, every result to the shard its ticket names
// (with the shard's own ticket back), every blind acknowledgement to the
// shard whose stream it names (none when it names no shard of this run),
// and a handed-over marker to every shard. It returns nil when m is for
// one shard only (s.shift is 0). A blind report's items go to their
// identities' shards: each charges its part of the report, once per
// sequence number, and acknowledges it, and every part is stepped before
// the reply leaves, so an acknowledgement always follows the charge of the
// whole report.
func (s *Node) split(m *cluster.Message) []cluster.Message {
	if s.shift == 0 {
		return nil
	}
	parts := make([]cluster.Message, len(s.shards))
	for i := range parts {
		parts[i].Epoch, parts[i].HandedOver = m.Epoch, m.HandedOver
	}
	// Each kind's items are counted per shard first, then copied into one
	// array cut into the shards' parts: no part grows by appending.
	var sc splitScratch
	sc.init(len(s.shards), max(len(m.Handoffs), len(m.Syncs), len(m.Decides), len(m.Acks), len(m.Results),
		len(m.Blinds), len(m.BlindAcks), len(m.Tracks)))
	splitItems(&sc, m.Handoffs, func(h *cluster.HandoffItem) int { return s.shardOf(h.Identity) },
		func(i int) *[]cluster.HandoffItem { return &parts[i].Handoffs })
	splitItems(&sc, m.Blinds, func(b *cluster.BlindItem) int { return s.shardOf(b.Identity) },
		func(i int) *[]cluster.BlindItem { return &parts[i].Blinds })
	splitItems(&sc, m.Tracks, func(t *cluster.TrackItem) int { return s.shardOf(t.Identity) },
		func(i int) *[]cluster.TrackItem { return &parts[i].Tracks })
	splitItems(&sc, s.ownAcks(m.BlindAcks), func(a *cluster.BlindAck) int { return int(a.Stream - s.streamBase) },
		func(i int) *[]cluster.BlindAck { return &parts[i].BlindAcks })
	splitItems(&sc, m.Syncs, func(it *cluster.SyncItem) int { return s.shardOf(it.Identity) },
		func(i int) *[]cluster.SyncItem { return &parts[i].Syncs })
	splitItems(&sc, m.Decides, func(d *cluster.DecideItem) int { return s.shardOf(d.Identity) },
		func(i int) *[]cluster.DecideItem { return &parts[i].Decides })
	splitItems(&sc, m.Acks, func(a *cluster.AckItem) int { return s.shardOf(a.Identity) },
		func(i int) *[]cluster.AckItem { return &parts[i].Acks })
	mask := uint64(len(s.shards) - 1)
	splitItems(&sc, m.Results, func(r *cluster.ResultItem) int { return int(r.Ticket & mask) },
		func(i int) *[]cluster.ResultItem { return &parts[i].Results })
	for i := range parts {
		for k := range parts[i].Results {
			parts[i].Results[k].Ticket >>= s.shift
		}
	}
	return parts
}

// splitScratch is split's working memory: the shard of each item of the
// kind being split, and the items per shard.
type splitScratch struct {
	shard  []uint8 // MaxShards is 256
	counts []int
}

// init sizes sc for shards shards and kinds of at most n items.
func (sc *splitScratch) init(shards, n int) {
	sc.shard = make([]uint8, n)
	sc.counts = make([]int, shards)
}

// splitItems copies items into the shards' parts, in order: into(i) is
// shard i's array, which gets a window of one new array of all items.
func splitItems[T any](sc *splitScratch, items []T, shardOf func(*T) int, into func(int) *[]T) {
	if len(items) == 0 {
		return
	}
	clear(sc.counts)
	for k := range items {
		i := shardOf(&items[k])
		sc.shard[k] = uint8(i)
		sc.counts[i]++
	}
	all := make([]T, len(items))
	off := 0
	for i, c := range sc.counts {
		if c > 0 {
			*into(i) = all[off : off : off+c]
			off += c
		}
	}
	for k := range items {
		p := into(int(sc.shard[k]))
		*p = append(*p, items[k])
	}
}

// step steps a batch from peer from through the shards it concerns and
// returns what they have for every peer, merged.
func (s *Node) step(from string, m *cluster.Message) []cluster.Envelope {
	out := outboxes{pool: &s.pool}
	i, one := s.oneShard(m)
	if one {
		// Most batches are small and concern one shard: step m as it is
		// (split would allocate a message per shard), with its results'
		// tickets made the shard's own on a copy (m is the caller's).
		if len(m.Results) > 0 && s.shift > 0 {
			single := *m
			single.Results = make([]cluster.ResultItem, len(m.Results))
			for k, r := range m.Results {
				r.Ticket >>= s.shift
				single.Results[k] = r
			}
			m = &single
		}
		sh := &s.shards[i]
		sh.lock()
		sh.coord.Step(s.now(), from, m)
		s.take(i, &out, 1)
		sh.mu.Unlock()
		return out.envs
	}
	parts := s.split(m)
	for i := range parts {
		if parts[i].Empty() {
			continue
		}
		sh := &s.shards[i]
		sh.lock()
		sh.coord.Step(s.now(), from, &parts[i])
		s.take(i, &out, len(parts)-i)
		sh.mu.Unlock()
	}
	return out.envs
}

// oneShard reports whether every item of m goes to one shard, and which: a
// handed-over marker goes to every shard, so a message carrying one does
// not (unless there is one shard).
func (s *Node) oneShard(m *cluster.Message) (int, bool) {
	if s.shift == 0 {
		return 0, true
	}
	if m.HandedOver != 0 || m.Empty() {
		return 0, false // a marker: every shard; nothing: no shard (split)
	}
	i := -1
	same := func(j int) bool {
		if i < 0 {
			i = j
		}
		return i == j
	}
	for _, h := range m.Handoffs {
		if !same(s.shardOf(h.Identity)) {
			return 0, false
		}
	}
	for _, it := range m.Syncs {
		if !same(s.shardOf(it.Identity)) {
			return 0, false
		}
	}
	for _, d := range m.Decides {
		if !same(s.shardOf(d.Identity)) {
			return 0, false
		}
	}
	for _, a := range m.Acks {
		if !same(s.shardOf(a.Identity)) {
			return 0, false
		}
	}
	for _, b := range m.Blinds {
		if !same(s.shardOf(b.Identity)) {
			return 0, false
		}
	}
	for _, t := range m.Tracks {
		if !same(s.shardOf(t.Identity)) {
			return 0, false
		}
	}
	for _, a := range m.BlindAcks {
		if !s.ownStream(a.Stream) || !same(int(a.Stream-s.streamBase)) {
			return 0, false // another run's acknowledgement: split drops it
		}
	}
	mask := uint64(len(s.shards) - 1)
	for _, r := range m.Results {
		if !same(int(r.Ticket & mask)) {
			return 0, false
		}
	}
	return max(i, 0), true
}

// ownStream reports whether stream is the blind-report stream of one of
// this run's shards (shard i's is streamBase + i).
func (s *Node) ownStream(stream uint64) bool {
	return stream-s.streamBase < uint64(len(s.shards))
}

// ownAcks returns the blind acknowledgements of acks that name a stream
// of this run (acks itself when all do).
func (s *Node) ownAcks(acks []cluster.BlindAck) []cluster.BlindAck {
	for k := range acks {
		if !s.ownStream(acks[k].Stream) {
			own := slices.Clone(acks[:k])
			for _, a := range acks[k+1:] {
				if s.ownStream(a.Stream) {
					own = append(own, a)
				}
			}
			return own
		}
	}
	return acks
}

// cloneMessage returns a copy of m in new arrays, each of its length.
func cloneMessage(m *cluster.Message) cluster.Message {
	c := cluster.Message{Epoch: m.Epoch, HandedOver: m.HandedOver}
	if len(m.Syncs) > 0 {
		c.Syncs = slices.Clone(m.Syncs)
	}
	if len(m.Decides) > 0 {
		c.Decides = slices.Clone(m.Decides)
	}
	if len(m.Acks) > 0 {
		c.Acks = slices.Clone(m.Acks)
	}
	if len(m.Results) > 0 {
		c.Results = slices.Clone(m.Results)
	}
	if len(m.Handoffs) > 0 {
		c.Handoffs = slices.Clone(m.Handoffs)
	}
	if len(m.Blinds) > 0 {
		c.Blinds = slices.Clone(m.Blinds)
	}
	if len(m.BlindAcks) > 0 {
		c.BlindAcks = slices.Clone(m.BlindAcks)
	}
	if len(m.Tracks) > 0 {
		c.Tracks = slices.Clone(m.Tracks)
	}
	return c
}

// eachPart calls f with m cut into messages of at most n items each (m
// itself when it fits), as Message.Split cuts it, until f returns false.
// The parts are not copies: each is a window on m's arrays, with no room
// to append into m's items, valid while m is.
func eachPart(m *cluster.Message, n int, f func(part *cluster.Message) bool) {
	if n <= 0 || m.Items() <= n {
		f(m)
		return
	}
	p := parts{f: f, cur: cluster.Message{Epoch: m.Epoch}, room: n, n: n, ok: true}
	addParts(&p, m.Handoffs, func(m *cluster.Message) *[]cluster.HandoffItem { return &m.Handoffs })
	addReports(&p, m.Blinds)
	addParts(&p, m.Syncs, func(m *cluster.Message) *[]cluster.SyncItem { return &m.Syncs })
	addParts(&p, m.Decides, func(m *cluster.Message) *[]cluster.DecideItem { return &m.Decides })
	addParts(&p, m.Acks, func(m *cluster.Message) *[]cluster.AckItem { return &m.Acks })
	addParts(&p, m.BlindAcks, func(m *cluster.Message) *[]cluster.BlindAck { return &m.BlindAcks })
	addParts(&p, m.Tracks, func(m *cluster.Message) *[]cluster.TrackItem { return &m.Tracks })
	addParts(&p, m.Results, func(m *cluster.Message) *[]cluster.ResultItem { return &m.Results })
	if p.ok {
		// The last part (never empty: m has more than n items) carries
		// the handed-over marker, which follows every handoff.
		p.cur.HandedOver = m.HandedOver
		f(&p.cur)
	}
}

// addReports adds blind items to the parts, a report whole: one that does
// not fit in the room left starts the next part, and one longer than a
// part is a part of its own (as Message.Split cuts them).
func addReports(p *parts, blinds []cluster.BlindItem) {
	for p.ok && len(blinds) > 0 {
		// The reports that fit in the room left, or the first one
		// whole in a part of its own.
		t := 0
		for t < len(blinds) {
			k := cluster.BlindReportLen(blinds[t:])
			if t+k > p.room && (t > 0 || p.room < p.n) {
				break
			}
			t += k
		}
		if t == 0 {
			p.ok = p.f(&p.cur)
			p.cur, p.room = cluster.Message{Epoch: p.cur.Epoch}, p.n
			continue
		}
		p.cur.Blinds, blinds = blinds[:t:t], blinds[t:]
		p.room = max(p.room-t, 0)
	}
}

// parts is eachPart's cutter: cur is the part being filled, with room for
// room more items.
type parts struct {
	f       func(*cluster.Message) bool
	cur     cluster.Message
	room, n int
	ok      bool // f has not returned false
}

// take returns how many of k items go into cur, sending cur first and
// starting the next part when it is full.
func (p *parts) take(k int) int {
	if p.room == 0 {
		p.ok = p.ok && p.f(&p.cur)
		p.cur, p.room = cluster.Message{Epoch: p.cur.Epoch}, p.n
	}
	t := min(k, p.room)
	p.room -= t
	return t
}

// addParts adds items, of the kind field picks out of a message, to the
// parts.
func addParts[T any](p *parts, items []T, field func(*cluster.Message) *[]T) {
	for p.ok && len(items) > 0 {
		t := p.take(len(items)) // may start the next part: field is taken after
		*field(&p.cur), items = items[:t:t], items[t:]
	}
}
