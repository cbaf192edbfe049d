package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/prefetch"
)

// Shell is the thin adapter around one node's decision core: it serialises
// calls into the core, reads the clock, drives Tick with a ticker, sends
// what Ready returns through a Transport as the node's Links decide (one
// exchange in flight per peer, Nagle's sending, a circuit breaker per peer:
// links.go), feeds replies and incoming batches back through Step, and
// hands late decisions to the callers waiting for them. All decisions are
// made by the core and the Links; the Shell only does I/O.
//
// The core is sharded: ShellConfig.Shards Coordinators, each with its own
// mutex, each deciding the identities whose hash falls in its shard, so
// that requests for different identities do not queue on one lock
// (DESIGN.md: no lock shared across keys). Nothing the Coordinator decides
// spans identities, so shards are independent: every one gets the same
// rules, ring and peer states; a batch from a peer is split by identity
// (results by ticket: a forwarded request's ticket carries its shard) and
// what the shards send one peer is merged into one batch again.
type Shell struct {
	cfg    ShellConfig
	log    *slog.Logger
	now    func() int64
	shards []shard
	shift  uint // ticket = the shard's ticket << shift | the shard's index
	ring   atomic.Pointer[Ring]
	// mu guards lk, the policy of the exchanges with peers (links.go:
	// one in flight per peer, Nagle's sending, the breakers). It may be
	// held while taking shard locks, never taken while one is held.
	mu sync.Mutex
	lk *Links
	// pool keeps the item arrays of messages the Shell is done with.
	pool msgPool

	flushC chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool

	sent, failed atomic.Uint64
	// fastRejects counts the view rejections answered from a shard's
	// reject cache (Stats adds them to ViewRejects).
	fastRejects atomic.Uint64
}

// shard is one Coordinator of a Shell and the callers waiting on it.
type shard struct {
	mu    sync.Mutex // guards coord and waits
	coord *Coordinator
	waits map[uint64]chan Outcome    // by the coordinator's own ticket
	rd    Ready                      // reused by every take (Coordinator.ReadyInto)
	rej   *rejCache                  // view rejections answered without mu (rejcache.go)
	drops uint64                     // coord.Drops() when mu was last released by DecideAt
	hint  atomic.Pointer[sketchHint] // the last gated rule decided here, for Prefetch
	_     [32]byte                   // keeps neighbouring shards' mutexes off one cache line
}

// lock takes the shard's mutex to change its coordinator's state other than
// by Decide: cached view rejections are stale from now on.
func (sh *shard) lock() {
	sh.mu.Lock()
	sh.rej.invalidate()
}

// minShardSketchWidth is the narrowest a shard's share of a sketch gets.
const minShardSketchWidth = 4096

// DefaultShards is ShellConfig.Shards' default.
const DefaultShards = 8

// MaxShards bounds ShellConfig.Shards.
const MaxShards = 256

// ShellConfig configures a Shell.
type ShellConfig struct {
	// Coordinator configures the core (Self is required); every shard is
	// a Coordinator with this configuration.
	Coordinator CoordinatorConfig
	// Shards is the number of Coordinators the identities are spread
	// over, each behind its own mutex: a power of two, at most MaxShards;
	// zero means DefaultShards. 1 serialises every decision on one lock.
	Shards int
	// Transport carries batches to peers. Required.
	Transport Transport
	// Linger is the longest queued items wait for an exchange in flight
	// to return before the flusher sends them anyway (a backstop: they
	// normally leave at once when no exchange is in flight, or when the
	// one in flight returns); zero means 200µs.
	Linger time.Duration
	// MaxBatch is the most items one exchange carries: a batch that
	// reaches it in one shard is sent at once, without waiting for the
	// linger, and a larger one (several shards' items, a leaving node's
	// handoffs) is cut into several exchanges, sent in order. Zero means
	// 1024; at most MaxBatchItems.
	MaxBatch int
	// CallTimeout bounds one exchange with a peer; zero means 200ms.
	CallTimeout time.Duration
	// TickInterval is how often the core's Tick runs; zero means 10ms.
	TickInterval time.Duration
	// BreakerFailures consecutive failed exchanges open a peer's breaker
	// (its identities are then decided by on_failure); zero means 3.
	BreakerFailures int
	// BreakerCooldown is how long a breaker stays open before one trial
	// exchange; zero means 1s.
	BreakerCooldown time.Duration
	// Clock returns unix nanoseconds; nil means the system clock.
	Clock func() int64
	// Logger receives breaker changes; nil discards.
	Logger *slog.Logger
	// Hasher picks an identity's shard. The zero value is deterministic
	// (bucket.NewSeededHasher(0)); a node passes its per-process Hasher
	// so that no one can choose identities that all crowd one shard's
	// mutex (docs/security.md).
	Hasher bucket.Hasher
}

// NewShell starts a Shell around a new Coordinator.
func NewShell(cfg ShellConfig) (*Shell, error) {
	if cfg.Coordinator.Self == "" {
		return nil, errors.New("cluster: ShellConfig.Coordinator.Self: required")
	}
	if cfg.Transport == nil {
		return nil, errors.New("cluster: ShellConfig.Transport: required")
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 200 * time.Microsecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.MaxBatch > MaxBatchItems {
		return nil, fmt.Errorf("cluster: ShellConfig.MaxBatch: %d is more than the wire limit of %d items", cfg.MaxBatch, MaxBatchItems)
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.Shards < 0 || cfg.Shards > MaxShards || cfg.Shards&(cfg.Shards-1) != 0 {
		return nil, fmt.Errorf("cluster: ShellConfig.Shards: %d is not a power of two from 1 to %d", cfg.Shards, MaxShards)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 200 * time.Millisecond
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 10 * time.Millisecond
	}
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = 3
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = time.Second
	}
	if cfg.Clock == nil {
		base := time.Now()
		wall := base.UnixNano()
		cfg.Clock = func() int64 { return wall + int64(time.Since(base)) }
	}
	// The key cap is the node's, per rule: each shard holds its share of
	// it (its identities are about 1/Shards of the node's).
	if cfg.Coordinator.MaxKeys <= 0 {
		cfg.Coordinator.MaxKeys = DefaultMaxKeys
	}
	cfg.Coordinator.MaxKeys = (cfg.Coordinator.MaxKeys + cfg.Shards - 1) / cfg.Shards
	if cfg.Coordinator.Incarnation == 0 {
		cfg.Coordinator.Incarnation = uint64(cfg.Clock())
	}
	s := &Shell{
		cfg:    cfg,
		log:    cfg.Logger,
		now:    cfg.Clock,
		shards: make([]shard, cfg.Shards),
		shift:  uint(bits.TrailingZeros(uint(cfg.Shards))),
		lk: NewLinks(LinkConfig{BreakerFailures: cfg.BreakerFailures,
			BreakerCooldown: cfg.BreakerCooldown, MaxBatch: cfg.MaxBatch}),
		flushC: make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].coord = NewCoordinator(cfg.Coordinator)
		s.shards[i].rej = &rejCache{}
		s.shards[i].waits = map[uint64]chan Outcome{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.wg.Add(2)
	go s.ticker()
	go s.flusher()
	return s, nil
}

// SetRules installs the rules the core decides, at the Shell's clock's now
// (Coordinator.SetRules). A gated rule's sketch is
// split over the shards: each shard sees about 1/Shards of the identities,
// so a sketch of 1/Shards the width (at least 4096 counters, or the whole
// width when it is smaller) keeps the same load per counter, and a node's
// sketches take about the memory of one.
func (s *Shell) SetRules(rules []RuleParams) {
	if k := len(s.shards); k > 1 {
		rules = slices.Clone(rules)
		for i := range rules {
			if w := rules[i].Sketch.Width; rules[i].Sketch.Threshold != 0 {
				rules[i].Sketch.Width = max((w+k-1)/k, min(w, minShardSketchWidth))
			}
		}
	}
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.lock()
		sh.coord.SetRules(now, rules)
		sh.mu.Unlock()
	}
}

// SetRing installs a new ring (after a membership change).
func (s *Shell) SetRing(r *Ring) {
	s.mu.Lock()
	s.ring.Store(r)
	// Every shard's handoffs and its handed-over marker leave together:
	// a peer takes a marker to mean that all this node's handoffs came
	// before it, so no shard's may be sent before every shard has queued
	// its own (all shard locks are held until then).
	envs := s.withAll(func(now int64, c *Coordinator) { c.SetTable(now, r) })
	// A member that is back in the ring, or at a new address, is a new
	// run of that node: its identities stop being decided by on_failure
	// at once instead of after the cooldown (Links.SetPeers).
	for _, peer := range s.lk.SetPeers(r.Members(), nil) {
		s.peerUp(peer)
	}
	s.kickLocked()
	s.mu.Unlock()
	for _, env := range envs {
		s.send(env)
	}
}

// withAll locks every shard, calls f on each coordinator at one time, takes
// what each has ready, unlocks, and returns the messages merged per peer.
func (s *Shell) withAll(f func(now int64, c *Coordinator)) []Envelope {
	for i := range s.shards {
		s.shards[i].lock()
	}
	now := s.now()
	out := outboxes{pool: &s.pool}
	for i := range s.shards {
		sh := &s.shards[i]
		f(now, sh.coord)
		s.take(i, &out, len(s.shards)-i)
	}
	for i := range s.shards {
		s.shards[i].mu.Unlock()
	}
	return out.envs
}

// shardOf returns the index of the shard deciding identity: high bits of
// its hash under ShellConfig.Hasher (seeded per process on a node, unlike
// the ring's hash, which every node must agree on).
func (s *Shell) shardOf(identity string) int {
	if s.shift == 0 {
		return 0
	}
	return s.shardOfHash(s.cfg.Hasher.Sum(identity))
}

// shardOfHash is shardOf of an identity whose hash is h.
func (s *Shell) shardOfHash(h uint64) int {
	if s.shift == 0 {
		return 0
	}
	return int(h >> (64 - s.shift))
}

// outboxes collects the shards' messages, merged per destination.
type outboxes struct {
	envs []Envelope
	// pool gives the arrays of the merged messages: the shards'
	// messages are copied into them, and their arrays handed back to
	// their coordinators at once (the merged messages' arrays go back to
	// pool once sent or queued: see Shell.send, Shell.run and
	// Shell.Handle).
	pool *msgPool
	// lk, when set, is the Shell's (s.mu is held): a message for a peer
	// with an exchange in flight joins its Backlog at once.
	lk *Links
}

// add copies m's items into the message for to (or, with links, into
// the Backlog of a busy peer): m's arrays are free again once it returns.
// m is from the first of left shards still to come, which queue about as
// much each (the identities are spread evenly): a new message is given
// room for left times m's items (and a quarter more) at once, so that it
// does not grow by doubling as the others merge in.
func (o *outboxes) add(to string, m *Message, left int) {
	if o.lk != nil && o.lk.Queue(to, m) {
		return
	}
	for i := range o.envs {
		if o.envs[i].To == to {
			o.envs[i].Msg.merge(m)
			return
		}
	}
	env := Envelope{To: to, Msg: o.pool.get()}
	if left > 1 {
		reserve(&env.Msg, m, left+left/4)
	}
	env.Msg.merge(m)
	o.envs = append(o.envs, env)
}

// reserve gives each array of m room for k times as many items as n's
// array of that kind has.
func reserve(m, n *Message, k int) {
	m.Syncs = grown(m.Syncs, k*len(n.Syncs))
	m.Decides = grown(m.Decides, k*len(n.Decides))
	m.Acks = grown(m.Acks, k*len(n.Acks))
	m.Results = grown(m.Results, k*len(n.Results))
	m.Handoffs = grown(m.Handoffs, k*len(n.Handoffs))
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

// msgPool keeps the item arrays of messages the Shell has sent (or
// queued, copied, in a Backlog), for the next merged messages: at most
// maxPooledMessages messages' worth, each array of at most maxPooledItems
// items (what an idle node keeps after a burst is bounded). It is safe
// for concurrent use.
type msgPool struct {
	mu   sync.Mutex
	free []Message
}

// maxPooledMessages bounds msgPool: a few per peer are in use at once (one
// in flight, one merging).
const maxPooledMessages = 8

// maxPooledItems bounds the arrays msgPool keeps (1 MiB of syncs).
const maxPooledItems = 16384

// get returns an empty message, with arrays kept from an earlier one if
// there are some.
func (p *msgPool) get() Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return Message{}
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
	p.free[n-1] = Message{}
	p.free = p.free[:n-1]
	return m
}

// put keeps m's arrays, their items cleared, unless the pool is full; m
// must not be used after the call.
func (p *msgPool) put(m *Message) {
	if capacity(m) == 0 {
		return
	}
	e := Message{
		Syncs:    reusable(m.Syncs),
		Decides:  reusable(m.Decides),
		Acks:     reusable(m.Acks),
		Results:  reusable(m.Results),
		Handoffs: reusable(m.Handoffs),
	}
	*m = Message{}
	p.mu.Lock()
	if len(p.free) < maxPooledMessages {
		p.free = append(p.free, e)
	}
	p.mu.Unlock()
}

// capacity returns the items m's arrays have room for.
func capacity(m *Message) int {
	return cap(m.Syncs) + cap(m.Decides) + cap(m.Acks) + cap(m.Results) + cap(m.Handoffs)
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
// to out, its forwarded requests' tickets made the Shell's (under shard i's
// lock); left is the number of shards, this one included, whose messages
// out is still to get.
func (s *Shell) take(i int, out *outboxes, left int) {
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
// (with the shard's own ticket back), and a handed-over marker to every
// shard. It returns nil when m is for one shard only (s.shift is 0).
func (s *Shell) split(m *Message) []Message {
	if s.shift == 0 {
		return nil
	}
	parts := make([]Message, len(s.shards))
	for i := range parts {
		parts[i].Epoch, parts[i].HandedOver = m.Epoch, m.HandedOver
	}
	// Each kind's items are counted per shard first, then copied into one
	// array cut into the shards' parts: no part grows by appending.
	var sc splitScratch
	sc.init(len(s.shards), max(len(m.Handoffs), len(m.Syncs), len(m.Decides), len(m.Acks), len(m.Results)))
	splitItems(&sc, m.Handoffs, func(h *HandoffItem) int { return s.shardOf(h.Identity) },
		func(i int) *[]HandoffItem { return &parts[i].Handoffs })
	splitItems(&sc, m.Syncs, func(it *SyncItem) int { return s.shardOf(it.Identity) },
		func(i int) *[]SyncItem { return &parts[i].Syncs })
	splitItems(&sc, m.Decides, func(d *DecideItem) int { return s.shardOf(d.Identity) },
		func(i int) *[]DecideItem { return &parts[i].Decides })
	splitItems(&sc, m.Acks, func(a *AckItem) int { return s.shardOf(a.Identity) },
		func(i int) *[]AckItem { return &parts[i].Acks })
	mask := uint64(len(s.shards) - 1)
	splitItems(&sc, m.Results, func(r *ResultItem) int { return int(r.Ticket & mask) },
		func(i int) *[]ResultItem { return &parts[i].Results })
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
func (s *Shell) step(from string, m *Message) []Envelope {
	out := outboxes{pool: &s.pool}
	i, one := s.oneShard(m)
	if one {
		// Most batches are small and concern one shard: step m as it is
		// (split would allocate a message per shard), with its results'
		// tickets made the shard's own on a copy (m is the caller's).
		if len(m.Results) > 0 && s.shift > 0 {
			single := *m
			single.Results = make([]ResultItem, len(m.Results))
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
func (s *Shell) oneShard(m *Message) (int, bool) {
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
	mask := uint64(len(s.shards) - 1)
	for _, r := range m.Results {
		if !same(int(r.Ticket & mask)) {
			return 0, false
		}
	}
	return max(i, 0), true
}

// Ring returns the ring in force.
func (s *Shell) Ring() *Ring { return s.ring.Load() }

// Decide decides one request. A decision the core cannot make locally waits
// for the owner's answer; the core's decide timeout bounds the wait (then
// on_failure decides), and so does ctx (then the request is decided by
// on_failure at once, and marked degraded).
func (s *Shell) Decide(ctx context.Context, ruleID, identity string, cost int64) (Outcome, error) {
	return s.DecideAt(ctx, s.now(), ruleID, identity, cost)
}

// DecideAt is Decide at a time the caller already read from the Shell's
// clock (ShellConfig.Clock), so that a request reads the clock once: outside
// the Shell's lock.
func (s *Shell) DecideAt(ctx context.Context, now int64, ruleID, identity string, cost int64) (Outcome, error) {
	return s.DecideHashedAt(ctx, now, s.cfg.Hasher.Sum(identity), ruleID, identity, cost)
}

// Prefetch starts loading into the CPU's cache what a decision of identity
// under ruleID will read first at random: the entry in its slot of the
// reject cache, and, when the rule is gated (quota.Sketch) and was last
// decided through its sketch in identity's shard, the sketch counters; h is
// ShellConfig.Hasher.Sum(identity). It takes no lock, changes nothing and
// decides nothing: a caller that will call DecideHashedAt calls it first,
// before its other work for the request (the clock read), so that those
// cache misses (the sketch's megabytes of counters are read at random)
// overlap that work instead of stalling the decision under the lock.
func (s *Shell) Prefetch(h uint64, ruleID, identity string) {
	sh := &s.shards[s.shardOfHash(h)]
	if e := sh.rej.slot(h).Load(); e != nil {
		prefetch.Line(uintptr(unsafe.Pointer(e)))
	}
	if hp := sh.hint.Load(); hp != nil && hp.rule == ruleID {
		hp.prefetch(identity)
	}
}

// publishHint records, under sh.mu, where ruleID's sketch counters are for
// Prefetch, when they moved since the last time.
func (sh *shard) publishHint(ruleID string) {
	hi, ok := sh.coord.sketchHint(ruleID)
	if !ok {
		return
	}
	if hp := sh.hint.Load(); hp == nil || *hp != hi {
		// A copy made only here: storing &hi would put hi on the heap on
		// every call, changed or not.
		fresh := new(sketchHint)
		*fresh = hi
		sh.hint.Store(fresh)
	}
}

// DecideHashedAt is DecideAt for a caller that has already hashed the
// identity with the Shell's Hasher: h must be ShellConfig.Hasher.Sum(identity)
// (it picks the shard and the reject cache's slot, so another value would
// split one identity's state over shards). It saves the second hash of the
// identity on the decision path.
func (s *Shell) DecideHashedAt(ctx context.Context, now int64, h uint64, ruleID, identity string, cost int64) (Outcome, error) {
	sh := &s.shards[s.shardOfHash(h)]
	// A request the view rejects, as it rejected the last one, is answered
	// without the mutex (rejcache.go).
	if d, ok := sh.rej.lookup(h, now, ruleID, identity, cost); ok {
		s.fastRejects.Add(1)
		yieldNow()
		return Outcome{Source: SourceView, Decision: d}, nil
	}
	sh.mu.Lock()
	o, err := sh.coord.Decide(now, ruleID, identity, cost)
	if o.Source == SourceSketch {
		sh.publishHint(ruleID)
	}
	if d := sh.coord.Drops(); d != sh.drops {
		sh.drops = d // an entry was dropped to make room: cached views may be of it
		sh.rej.invalidate()
	}
	if err == nil && o.Source == SourceView && o.RetryAfter != bucket.Never {
		if v := sh.coord.LastViewReject(); v.Rule == ruleID && v.Identity == identity && v.Cost == cost {
			sh.rej.store(h, v)
		}
	} else {
		// An admission within slack moved this identity's view on: its
		// cached rejection would still reject, but not say when to retry.
		sh.rej.forget(h, ruleID, identity)
	}
	queued, ready := sh.coord.Queued(), sh.coord.HasReady()
	if err != nil || !o.Pending {
		sh.mu.Unlock()
		s.nudge(false, ready, queued)
		return o, err
	}
	ch, _ := waitPool.Get().(chan Outcome)
	if ch == nil {
		ch = make(chan Outcome, 1)
	}
	sh.waits[o.Ticket] = ch
	sh.mu.Unlock()
	s.nudge(true, ready, queued)
	select {
	case out := <-ch:
		waitPool.Put(ch)
		return out, nil
	case <-ctx.Done():
		sh.mu.Lock()
		if _, waiting := sh.waits[o.Ticket]; waiting {
			delete(sh.waits, o.Ticket)
			waitPool.Put(ch) // nothing was or will be sent on it
		}
		sh.mu.Unlock()
		return Outcome{}, ctx.Err()
	}
}

// yieldNow lets the scheduler run, once in yieldEvery calls on average.
// A caller hammering rejected identities through the reject cache never
// blocks, where the shard's mutex used to park it now and then; with more
// such callers than cores, Go's scheduler then looks at its global run
// queue, where the network poller puts the goroutines it wakes (gRPC's
// readers, the exchanges' senders), only once in 61 schedules, that is
// once in 61 preemptions of 10 ms. A forwarded decision could then wait
// past its decide timeout and be degraded. Yielding about every
// 300 µs of such calls bounds that wait to tens of milliseconds.
func yieldNow() {
	if rand.Uint32()%yieldEvery == 0 {
		runtime.Gosched()
	}
}

// yieldEvery is how many fast rejections yieldNow lets pass on average.
const yieldEvery = 1024

// waitPool recycles the channels on which pending requests wait for their
// owner's answer: one per forwarded decision otherwise. A channel goes back
// empty, and only once nothing can send on it any more.
var waitPool sync.Pool

// Refund gives back what Decide admitted for a request that did not go
// through after all (see Coordinator.Refund).
func (s *Shell) Refund(ruleID, identity string, cost int64, src Source) {
	sh := &s.shards[s.shardOf(identity)]
	sh.lock()
	sh.coord.Refund(s.now(), ruleID, identity, cost, src)
	sh.mu.Unlock()
}

// nudge carries out what Links.Decided makes of a decision that left its
// shard with pending (the decision waits for a peer), ready
// (Coordinator.HasReady) and queued (Coordinator.Queued): a flush now, the
// backstop flush after the linger, or nothing. A decision that left
// nothing to send (a local admission or rejection) takes no lock:
// Decided answers NudgeNone to it.
func (s *Shell) nudge(pending, ready bool, queued int) {
	if (!pending && !ready) || s.closed.Load() {
		return // nothing is sent once Close has begun
	}
	s.mu.Lock()
	n := s.lk.Decided(pending, ready, queued)
	s.mu.Unlock()
	switch n {
	case NudgeFlush:
		s.flush()
	case NudgeLinger:
		s.signalFlusher()
	}
}

// collect flushes when a decision left work pending for a returning
// exchange (Links.Collect).
func (s *Shell) collect() {
	if s.closed.Load() {
		return
	}
	s.mu.Lock()
	p := s.lk.Collect()
	s.mu.Unlock()
	if p {
		s.flush()
	}
}

// kickLocked asks for the backstop flush after the linger, unless one is
// due already (under s.mu).
func (s *Shell) kickLocked() {
	if s.lk.Kick() {
		s.signalFlusher()
	}
}

// signalFlusher wakes the flusher, which flushes after the linger. Links
// asks for one backstop flush at a time, so the channel has room.
func (s *Shell) signalFlusher() {
	select {
	case s.flushC <- struct{}{}:
	default:
	}
}

// Handle is the Transport Handler: it steps an incoming batch through the
// core and returns what the core has for the sender as the reply.
func (s *Shell) Handle(ctx context.Context, from string, m *Message) (*Message, error) {
	if s.closed.Load() {
		return nil, errors.New("cluster: node closed")
	}
	reply := &Message{}
	var others []Envelope
	for _, env := range s.step(from, m) {
		if env.To != from {
			others = append(others, env)
			continue
		}
		// The reply carries one batch, in arrays of its own (the
		// transport drops it once encoded, so the pool's would not come
		// back); anything beyond it follows as exchanges of its own.
		var rest Message
		first := true
		eachPart(&env.Msg, s.cfg.MaxBatch, func(part *Message) bool {
			if first {
				*reply, first = cloneMessage(part), false
			} else {
				if rest.Items() == 0 {
					rest = s.pool.get()
				}
				rest.merge(part)
			}
			return true
		})
		if rest.Items() > 0 {
			others = append(others, Envelope{To: from, Msg: rest})
		}
		s.pool.put(&env.Msg)
	}
	for _, env := range others {
		s.send(env)
	}
	return reply, nil
}

// cloneMessage returns a copy of m in new arrays, each of its length.
func cloneMessage(m *Message) Message {
	c := Message{Epoch: m.Epoch, HandedOver: m.HandedOver}
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
	return c
}

// complete hands completions to their waiters (under sh.mu).
func (sh *shard) complete(cs []Completion) {
	for _, c := range cs {
		if ch, ok := sh.waits[c.Ticket]; ok {
			ch <- c.Outcome
			delete(sh.waits, c.Ticket)
		}
	}
}

func (s *Shell) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			for i := range s.shards {
				sh := &s.shards[i]
				sh.lock()
				sh.coord.Tick(s.now())
				sh.mu.Unlock()
			}
			s.mu.Lock()
			// Cooled-down breakers are half-open: decisions go to the
			// peer again, and the next batch to it is the trial.
			for _, peer := range s.lk.Tick(s.now(), nil) {
				s.setPeerDown(s.now(), peer, false)
			}
			s.mu.Unlock()
			s.flush()
		}
	}
}

func (s *Shell) flusher() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.flushC:
			t := time.NewTimer(s.cfg.Linger)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
			s.mu.Lock()
			s.lk.Lingered()
			s.mu.Unlock()
			s.flush()
		}
	}
}

// Flush reports every identity's unsent spend to its owner and waits for
// the exchanges (each bounded by CallTimeout): a node does it before it
// leaves, so that what it admitted is charged.
func (s *Shell) Flush() { s.flushWith(func(now int64, c *Coordinator) { c.FlushAll(now) }) }

// Leave hands every bucket this node owns to its owner in the ring without
// this node, reports all unsent spend, and waits for the exchanges: the
// graceful half of leaving (the caller then leaves the membership).
func (s *Shell) Leave() {
	r := s.ring.Load()
	var rest []Member
	for _, m := range r.Members() {
		if m.Name != s.cfg.Coordinator.Self {
			rest = append(rest, m)
		}
	}
	next, err := NewRing(r.Epoch()+1, rest)
	if err != nil || next.Len() == 0 {
		s.Flush()
		return
	}
	s.flushWith(func(now int64, c *Coordinator) { c.HandoffAll(now, next) })
}

func (s *Shell) flushWith(queue func(now int64, c *Coordinator)) {
	var wg sync.WaitGroup
	for _, env := range s.withAll(queue) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, msg := range env.Msg.Split(s.cfg.MaxBatch) {
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
				reply, err := s.cfg.Transport.Exchange(ctx, s.addrOf(env.To), &msg)
				cancel()
				s.sent.Add(1)
				if err != nil {
					s.failed.Add(1)
					return
				}
				if reply != nil && !reply.Empty() {
					// What stepping the reply readied (acknowledgements,
					// results of decides forwarded here, other
					// requests' work taken with it) goes as any send.
					for _, e := range s.step(env.To, reply) {
						s.send(e)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// addrOf returns a member's peer address from the ring (its name if absent).
func (s *Shell) addrOf(name string) string {
	if r := s.ring.Load(); r != nil {
		if i := r.IndexOf(name); i >= 0 {
			return r.Member(i).Addr
		}
	}
	return name
}

// flush sends everything the core has queued, one exchange per peer.
//
// What is due to a peer with an exchange in flight joins its Backlog
// straight from the shards' outboxes (s.mu is held throughout, so that no
// exchange starts or ends meanwhile): under load, when every peer is
// busy, the items are copied once on their way, not merged first.
func (s *Shell) flush() {
	out := outboxes{pool: &s.pool}
	s.mu.Lock()
	out.lk = s.lk
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.take(i, &out, len(s.shards)-i)
		sh.mu.Unlock()
	}
	s.mu.Unlock()
	for _, env := range out.envs {
		s.send(env)
	}
}

// send exchanges one batch with a peer in its own goroutine and steps the
// reply back in. Failures feed the peer's breaker.
func (s *Shell) send(env Envelope) {
	// One exchange in flight per peer (Links.Send): what is due to a busy
	// peer joins its Backlog for the next exchange.
	s.mu.Lock()
	start := s.lk.Send(env.To, &env.Msg)
	s.mu.Unlock()
	if !start {
		s.pool.put(&env.Msg) // the Backlog copied the items
		return
	}
	addr := s.addrOf(env.To)
	s.wg.Add(1)
	go s.run(env.To, addr, env.Msg)
}

// run exchanges msg with the peer to, then whatever queued for it
// meanwhile, until nothing does; the peer is marked busy throughout. The
// arrays of each message sent go back to the peer's Backlog, for it to
// fill while the next exchange is in flight (and to the pool at the end).
// It calls s.wg.Done when it returns.
func (s *Shell) run(to, addr string, msg Message) {
	defer s.wg.Done()
	for {
		// Most batches fit in one exchange; a larger one goes as parts
		// that are windows on its arrays (the transport copies nothing
		// back into them), in Split's order.
		eachPart(&msg, s.cfg.MaxBatch, func(part *Message) bool {
			// A failed part ends the batch: the rest is dropped, as a
			// lost message.
			return s.exchange(to, addr, part)
		})
		// What the shards queued while this exchange was in flight goes
		// now: this peer's part joins the queue below.
		s.collect()
		s.mu.Lock()
		if s.closed.Load() {
			s.lk.Drop(to)
			s.mu.Unlock()
			s.pool.put(&msg)
			return
		}
		// The exchange is over: the transport kept nothing of msg, whose
		// arrays the next exchange reuses.
		next, more := s.lk.Next(to, &msg)
		if !more {
			s.mu.Unlock()
			s.pool.put(&msg)
			s.collect()
			return
		}
		msg = next
		s.mu.Unlock()
	}
}

// eachPart calls f with m cut into messages of at most n items each (m
// itself when it fits), as Message.Split cuts it, until f returns false.
// The parts are not copies: each is a window on m's arrays, with no room
// to append into m's items, valid while m is.
func eachPart(m *Message, n int, f func(part *Message) bool) {
	if n <= 0 || m.Items() <= n {
		f(m)
		return
	}
	p := parts{f: f, cur: Message{Epoch: m.Epoch}, room: n, n: n, ok: true}
	addParts(&p, m.Handoffs, func(m *Message) *[]HandoffItem { return &m.Handoffs })
	addParts(&p, m.Syncs, func(m *Message) *[]SyncItem { return &m.Syncs })
	addParts(&p, m.Decides, func(m *Message) *[]DecideItem { return &m.Decides })
	addParts(&p, m.Acks, func(m *Message) *[]AckItem { return &m.Acks })
	addParts(&p, m.Results, func(m *Message) *[]ResultItem { return &m.Results })
	if p.ok {
		// The last part (never empty: m has more than n items) carries
		// the handed-over marker, which follows every handoff.
		p.cur.HandedOver = m.HandedOver
		f(&p.cur)
	}
}

// parts is eachPart's cutter: cur is the part being filled, with room for
// room more items.
type parts struct {
	f       func(*Message) bool
	cur     Message
	room, n int
	ok      bool // f has not returned false
}

// take returns how many of k items go into cur, sending cur first and
// starting the next part when it is full.
func (p *parts) take(k int) int {
	if p.room == 0 {
		p.ok = p.ok && p.f(&p.cur)
		p.cur, p.room = Message{Epoch: p.cur.Epoch}, p.n
	}
	t := min(k, p.room)
	p.room -= t
	return t
}

// addParts adds items, of the kind field picks out of a message, to the
// parts.
func addParts[T any](p *parts, items []T, field func(*Message) *[]T) {
	for p.ok && len(items) > 0 {
		t := p.take(len(items)) // may start the next part: field is taken after
		*field(&p.cur), items = items[:t:t], items[t:]
	}
}

// exchange sends one batch, steps the reply in and sends what follows from
// it; it reports whether the exchange succeeded.
func (s *Shell) exchange(to, addr string, msg *Message) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	defer cancel()
	reply, err := s.cfg.Transport.Exchange(ctx, addr, msg)
	s.sent.Add(1)
	if err != nil {
		s.failed.Add(1)
	}
	s.mu.Lock()
	switch s.lk.Outcome(s.now(), to, err == nil) {
	case BreakerOpened:
		s.setPeerDown(s.now(), to, true)
		s.log.Warn("peer unreachable: its identities fall back to on_failure", "peer", to, "err", err)
	case BreakerClosed:
		s.peerUp(to)
	}
	s.mu.Unlock()
	var envs []Envelope
	if err == nil && reply != nil && !reply.Empty() {
		envs = s.step(to, reply)
	}
	if s.closed.Load() {
		return false
	}
	for _, e := range envs {
		s.send(e)
	}
	return err == nil
}

// peerUp marks a peer whose breaker closed up again in every shard (under
// s.mu).
func (s *Shell) peerUp(peer string) {
	s.setPeerDown(0, peer, false)
	s.log.Info("peer reachable again", "peer", peer)
}

// setPeerDown marks peer down or back in every shard (under s.mu). The
// requests a shard then decides by on_failure complete at the next flush.
func (s *Shell) setPeerDown(now int64, peer string, down bool) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.lock()
		sh.coord.SetPeerDown(now, peer, down)
		sh.mu.Unlock()
	}
	if down {
		s.kickLocked() // the on_failure completions go at the backstop flush
	}
}

// Stats returns the core's counters, summed over the shards, and the
// exchanges sent and failed.
func (s *Shell) Stats() (Stats, uint64, uint64) {
	var sum Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st := sh.coord.Stats()
		sh.mu.Unlock()
		sum.add(&st)
	}
	sum.ViewRejects += s.fastRejects.Load()
	return sum, s.sent.Load(), s.failed.Load()
}

// add adds every counter of o to st.
func (st *Stats) add(o *Stats) {
	st.LocalAdmits += o.LocalAdmits
	st.ViewRejects += o.ViewRejects
	st.Forwarded += o.Forwarded
	st.RemoteResults += o.RemoteResults
	st.Degraded += o.Degraded
	st.SyncsSent += o.SyncsSent
	st.AcksSent += o.AcksSent
	st.ReportsCharged += o.ReportsCharged
	st.Entries += o.Entries
	st.Owned += o.Owned
	st.SketchAdmits += o.SketchAdmits
	st.SketchPromotions += o.SketchPromotions
	st.SketchBytes += o.SketchBytes
	st.EvictedIdle += o.EvictedIdle
	st.EvictedViews += o.EvictedViews
	st.EvictedForgiven += o.EvictedForgiven
	st.OverCap += o.OverCap
	st.ForgivenTokens += o.ForgivenTokens
}

// Close stops the shell's goroutines and waits for exchanges in flight
// (each bounded by CallTimeout). It does not close the Transport.
func (s *Shell) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	return nil
}

// String names the shell for logs.
func (s *Shell) String() string { return fmt.Sprintf("shell(%s)", s.cfg.Coordinator.Self) }
