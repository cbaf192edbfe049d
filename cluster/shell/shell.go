package shell

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

	"github.com/weir-dev/weir/cluster"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/prefetch"
)

// Node is the thin adapter around one node's decision core: it serialises
// calls into the core, reads the clock, drives Tick with a ticker, sends
// what Ready returns through a Transport as the node's Links decide (one
// exchange in flight per peer, Nagle's sending, a circuit breaker per peer:
// links.go), feeds replies and incoming batches back through Step, and
// hands late decisions to the callers waiting for them. All decisions are
// made by the core and the Links; the Node only does I/O.
//
// The core is sharded: Config.Shards Coordinators, each with its own
// mutex, each deciding the identities whose hash falls in its shard, so
// that requests for different identities do not queue on one lock
// (no lock is shared across keys). Nothing the Coordinator decides
// spans identities, so shards are independent: every one gets the same
// rules, ring and peer states; a batch from a peer is split by identity
// (results by ticket: a forwarded request's ticket carries its shard) and
// what the shards send one peer is merged into one batch again.
type Node struct {
	cfg    Config
	log    *slog.Logger
	now    func() int64
	shards []shard
	shift  uint // ticket = the shard's ticket << shift | the shard's index
	// streamBase is shard 0's blind-report stream; shard i's is
	// streamBase + i (CoordinatorConfig.Stream).
	streamBase uint64
	ring       atomic.Pointer[cluster.Ring]
	// mu serialises the flushes, ring changes and breaker changes, which
	// span the shards. It may be held while taking shard locks, never
	// taken while one is held.
	mu sync.Mutex
	// lkMu guards lk, the policy of the exchanges with peers
	// (cluster.Links: one in flight per peer, Nagle's sending, the
	// breakers). It is the innermost lock, held only for a call into lk:
	// a decision's nudge takes it, and must not wait for a flush.
	lkMu sync.Mutex
	lk   *cluster.Links
	// pool keeps the item arrays of messages the Node is done with.
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

// shard is one Coordinator of a Node and the callers waiting on it.
type shard struct {
	mu    sync.Mutex // guards coord and waits
	coord *cluster.Coordinator
	waits map[uint64]chan cluster.Outcome    // by the coordinator's own ticket
	rd    cluster.Ready                      // reused by every take (Coordinator.ReadyInto)
	rej   *rejCache                          // view rejections answered without mu (rejcache.go)
	drops uint64                             // coord.Drops() when mu was last released by DecideAt
	hint  atomic.Pointer[cluster.SketchHint] // the last gated rule decided here, for Prefetch
	_     [32]byte                           // keeps neighbouring shards' mutexes off one cache line
}

// lock takes the shard's mutex to change its coordinator's state other than
// by Decide: cached view rejections are stale from now on.
func (sh *shard) lock() {
	sh.mu.Lock()
	sh.rej.invalidate()
}

// minShardSketchWidth is the narrowest a shard's share of a sketch gets.
const minShardSketchWidth = 4096

// DefaultShards is Config.Shards' default.
const DefaultShards = 8

// MaxShards bounds Config.Shards.
const MaxShards = 256

// Config configures a Node.
type Config struct {
	// Coordinator configures the core (Self is required); every shard is
	// a Coordinator with this configuration.
	Coordinator cluster.CoordinatorConfig
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

// New starts a Node around a new Coordinator.
func New(cfg Config) (*Node, error) {
	if cfg.Coordinator.Self == "" {
		return nil, errors.New("cluster: Config.Coordinator.Self: required")
	}
	if cfg.Transport == nil {
		return nil, errors.New("cluster: Config.Transport: required")
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 200 * time.Microsecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.MaxBatch > cluster.MaxBatchItems {
		return nil, fmt.Errorf("cluster: Config.MaxBatch: %d is more than the wire limit of %d items", cfg.MaxBatch, cluster.MaxBatchItems)
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.Shards < 0 || cfg.Shards > MaxShards || cfg.Shards&(cfg.Shards-1) != 0 {
		return nil, fmt.Errorf("cluster: Config.Shards: %d is not a power of two from 1 to %d", cfg.Shards, MaxShards)
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
		cfg.Coordinator.MaxKeys = cluster.DefaultMaxKeys
	}
	cfg.Coordinator.MaxKeys = (cfg.Coordinator.MaxKeys + cfg.Shards - 1) / cfg.Shards
	if cfg.Coordinator.Incarnation == 0 {
		cfg.Coordinator.Incarnation = uint64(cfg.Clock())
	}
	s := &Node{
		cfg:    cfg,
		log:    cfg.Logger,
		now:    cfg.Clock,
		shards: make([]shard, cfg.Shards),
		shift:  uint(bits.TrailingZeros(uint(cfg.Shards))),
		lk: cluster.NewLinks(cluster.LinkConfig{BreakerFailures: cfg.BreakerFailures,
			BreakerCooldown: cfg.BreakerCooldown, MaxBatch: cfg.MaxBatch}),
		flushC: make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	// Each shard's blind reports are a stream of their own, new with each
	// run: the streams of a run are a range that starts at a hash of its
	// Incarnation, so that two runs' ranges meet with a chance of about
	// Shards in 2⁶³ however close their incarnations are.
	s.streamBase = cfg.Coordinator.Stream
	if s.streamBase == 0 {
		s.streamBase = bucket.Splitmix64(cfg.Coordinator.Incarnation)>>1 + 1
	}
	for i := range s.shards {
		cc := cfg.Coordinator
		cc.Stream = s.streamBase + uint64(i)
		s.shards[i].coord = cluster.NewCoordinator(cc)
		s.shards[i].rej = &rejCache{}
		s.shards[i].waits = map[uint64]chan cluster.Outcome{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.wg.Add(2)
	go s.ticker()
	go s.flusher()
	return s, nil
}

// SetRules installs the rules the core decides, at the Node's clock's now
// (Coordinator.SetRules). A gated rule's sketch is
// split over the shards: each shard sees about 1/Shards of the identities,
// so a sketch of 1/Shards the width (at least 4096 counters, or the whole
// width when it is smaller) keeps the same load per counter, and a node's
// sketches take about the memory of one.
func (s *Node) SetRules(rules []cluster.RuleParams) {
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
func (s *Node) SetRing(r *cluster.Ring) {
	s.mu.Lock()
	s.ring.Store(r)
	// Every shard's handoffs and its handed-over marker leave together:
	// a peer takes a marker to mean that all this node's handoffs came
	// before it, so no shard's may be sent before every shard has queued
	// its own (all shard locks are held until then).
	envs := s.withAll(func(now int64, c *cluster.Coordinator) { c.SetTable(now, r) })
	// A member that is back in the ring, or at a new address, is a new
	// run of that node: its identities stop being decided by on_failure
	// at once instead of after the cooldown (Links.SetPeers).
	s.lkMu.Lock()
	up := s.lk.SetPeers(r.Members(), nil)
	s.lkMu.Unlock()
	for _, peer := range up {
		s.peerUp(peer)
	}
	s.kick()
	s.mu.Unlock()
	for _, env := range envs {
		s.send(env)
	}
}

// withAll locks every shard, calls f on each coordinator at one time, takes
// what each has ready, unlocks, and returns the messages merged per peer.
func (s *Node) withAll(f func(now int64, c *cluster.Coordinator)) []cluster.Envelope {
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
// its hash under Config.Hasher (seeded per process on a node, unlike
// the ring's hash, which every node must agree on).
func (s *Node) shardOf(identity string) int {
	if s.shift == 0 {
		return 0
	}
	return s.shardOfHash(s.cfg.Hasher.Sum(identity))
}

// shardOfHash is shardOf of an identity whose hash is h.
func (s *Node) shardOfHash(h uint64) int {
	if s.shift == 0 {
		return 0
	}
	return int(h >> (64 - s.shift))
}

// maxPooledMessages bounds msgPool: a few per peer are in use at once (one
// in flight, one merging).
const maxPooledMessages = 8

// maxPooledItems bounds the arrays msgPool keeps (1 MiB of syncs).
const maxPooledItems = 16384

// Ring returns the ring in force.
func (s *Node) Ring() *cluster.Ring { return s.ring.Load() }

// Decide decides one request. A decision the core cannot make locally waits
// for the owner's answer; the core's decide timeout bounds the wait (then
// on_failure decides), and so does ctx (then the request is decided by
// on_failure at once, and marked degraded).
func (s *Node) Decide(ctx context.Context, ruleID, identity string, cost int64) (cluster.Outcome, error) {
	return s.DecideAt(ctx, s.now(), ruleID, identity, cost)
}

// DecideAt is Decide at a time the caller already read from the Node's
// clock (Config.Clock), so that a request reads the clock once: outside
// the Node's lock.
func (s *Node) DecideAt(ctx context.Context, now int64, ruleID, identity string, cost int64) (cluster.Outcome, error) {
	return s.DecideHashedAt(ctx, now, s.cfg.Hasher.Sum(identity), ruleID, identity, cost)
}

// Prefetch starts loading into the CPU's cache what a decision of identity
// under ruleID will read first at random: the entry in its slot of the
// reject cache, and, when the rule is gated (quota.Sketch) and was last
// decided through its sketch in identity's shard, the sketch counters; h is
// Config.Hasher.Sum(identity). It takes no lock, changes nothing and
// decides nothing: a caller that will call DecideHashedAt calls it first,
// before its other work for the request (the clock read), so that those
// cache misses (the sketch's megabytes of counters are read at random)
// overlap that work instead of stalling the decision under the lock.
func (s *Node) Prefetch(h uint64, ruleID, identity string) {
	sh := &s.shards[s.shardOfHash(h)]
	if e := sh.rej.slot(h).Load(); e != nil {
		prefetch.Line(uintptr(unsafe.Pointer(e)))
	}
	if hp := sh.hint.Load(); hp != nil && hp.Rule() == ruleID {
		hp.Prefetch(identity)
	}
}

// publishHint records, under sh.mu, where ruleID's sketch counters are for
// Prefetch, when they moved since the last time.
func (sh *shard) publishHint(ruleID string) {
	hi, ok := sh.coord.SketchHint(ruleID)
	if !ok {
		return
	}
	if hp := sh.hint.Load(); hp == nil || *hp != hi {
		// A copy made only here: storing &hi would put hi on the heap on
		// every call, changed or not.
		fresh := new(cluster.SketchHint)
		*fresh = hi
		sh.hint.Store(fresh)
	}
}

// DecideHashedAt is DecideAt for a caller that has already hashed the
// identity with the Node's Hasher: h must be Config.Hasher.Sum(identity)
// (it picks the shard and the reject cache's slot, so another value would
// split one identity's state over shards). It saves the second hash of the
// identity on the decision path.
func (s *Node) DecideHashedAt(ctx context.Context, now int64, h uint64, ruleID, identity string, cost int64) (cluster.Outcome, error) {
	sh := &s.shards[s.shardOfHash(h)]
	// A request the view rejects, as it rejected the last one, is answered
	// without the mutex (rejcache.go).
	if d, ok := sh.rej.lookup(h, now, ruleID, identity, cost); ok {
		s.fastRejects.Add(1)
		yieldNow()
		return cluster.Outcome{Source: cluster.SourceView, Decision: d}, nil
	}
	sh.mu.Lock()
	o, err := sh.coord.Decide(now, ruleID, identity, cost)
	if o.Source == cluster.SourceSketch {
		sh.publishHint(ruleID)
	}
	if d := sh.coord.Drops(); d != sh.drops {
		sh.drops = d // an entry was dropped to make room: cached views may be of it
		sh.rej.invalidate()
	}
	if err == nil && o.Source == cluster.SourceView && o.RetryAfter != bucket.Never {
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
	ch, _ := waitPool.Get().(chan cluster.Outcome)
	if ch == nil {
		ch = make(chan cluster.Outcome, 1)
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
		// The ticket, so that a concurrency slot the owner may still
		// grant can be released (Release).
		return cluster.Outcome{Ticket: o.Ticket}, ctx.Err()
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
func (s *Node) Refund(ruleID, identity string, cost int64, src cluster.Source) {
	sh := &s.shards[s.shardOf(identity)]
	sh.lock()
	sh.coord.Refund(s.now(), ruleID, identity, cost, src)
	// A refund the owner gives back leaves in a sync: sent as a decision's
	// messages are.
	queued, ready := sh.coord.Queued(), sh.coord.HasReady()
	sh.mu.Unlock()
	s.nudge(false, ready, queued)
}

// Release frees the concurrency slot that this node's request took under
// ticket, the Outcome.Ticket of its admission, or of a decision the caller
// gave up waiting for (see Coordinator.Release).
func (s *Node) Release(ruleID, identity string, ticket uint64, cost int64) {
	if ticket == 0 {
		return
	}
	sh := &s.shards[s.shardOf(identity)]
	sh.lock()
	sh.coord.Release(s.now(), ruleID, identity, ticket, cost)
	queued, ready := sh.coord.Queued(), sh.coord.HasReady()
	sh.mu.Unlock()
	s.nudge(false, ready, queued)
}

// Stats returns the core's counters, summed over the shards, and the
// exchanges sent and failed.
func (s *Node) Stats() (cluster.Stats, uint64, uint64) {
	var sum cluster.Stats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st := sh.coord.Stats()
		sh.mu.Unlock()
		sum.Add(&st)
	}
	sum.ViewRejects += s.fastRejects.Load()
	return sum, s.sent.Load(), s.failed.Load()
}

// Close stops the shell's goroutines and waits for exchanges in flight
// (each bounded by CallTimeout). It does not close the Transport.
func (s *Node) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	return nil
}

// String names the shell for logs.
func (s *Node) String() string { return fmt.Sprintf("shell(%s)", s.cfg.Coordinator.Self) }
