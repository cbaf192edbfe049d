package bucket

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/internal/keytable"
)

// StoreConfig configures a Store. The zero value works: 10 M keys over 256
// shards.
type StoreConfig struct {
	// MaxKeys caps the live keys over the whole store: each shard holds at
	// most ceil(MaxKeys/Shards), so the store holds at most
	// MaxKeys + Shards − 1 (a shard never gets a cap of zero). 0 means
	// DefaultMaxKeys.
	MaxKeys int
	// Shards is the number of independently locked shards, a power of two
	// between 1 and 1<<16. 0 means DefaultShards.
	Shards int
}

// Defaults for a zero StoreConfig.
const (
	DefaultMaxKeys = 10_000_000
	DefaultShards  = 256
)

// StoreStats are counters of a Store, summed over its shards.
type StoreStats struct {
	Live            int    // keys held now
	Slots           int    // table slots allocated (memory is Slots × slot size)
	EvictedIdle     uint64 // idle entries removed at the key cap to make room
	EvictedForgiven uint64 // partly spent entries evicted at the key cap: their debt is forgiven
	Swept           uint64 // idle entries removed by the sweep hand on insert
	// ForgivenTokens sums what the EvictedForgiven entries had spent, for
	// states that count tokens (fixed and sliding windows, sliding logs,
	// concurrency slots in flight).
	ForgivenTokens uint64
	// ForgivenNanos sums what the EvictedForgiven entries owed in time, for
	// states that hold a time (a GCRA TAT: the time until the bucket is
	// full, its spend times the rule's emission interval; a leaky queue's
	// time to drain; a penalty lockout's rest), in nanoseconds, saturating.
	ForgivenNanos uint64
}

// zeroAlias is the key a caller's key 0 is stored as (0 marks an empty slot),
// so keys 0 and zeroAlias name the same entry.
const zeroAlias = golden

const (
	minSlots  = 8  // smallest table, in slots
	sweepStep = 2  // slots the sweep hand examines per insert
	capScan   = 64 // slots examined at the cap looking for an idle entry
)

// shard is one lock and one table (keytable: linear probing, backward-shift
// deletion, a power-of-two size) kept at most 3/4 full. It is padded to 128
// bytes so no two shards share a cache line (or an adjacent-line pair).
type shard[S any, P State[S]] struct {
	mu        sync.Mutex
	tab       keytable.Table[S]
	scratch   *S   // a heap cell for stepping a not-yet-inserted state without allocating
	hand      int  // sweep hand, a slot index
	inTime    bool // the unit of evictions.forgiven: ns, else tokens (see debtor)
	evictions      // see StoreStats
	_         [16]byte
}

// Store maps 64-bit keys to per-key algorithm state S. It is safe for
// concurrent use: keys are spread over shards by their high bits (after a
// multiplicative mix, so poor keys still spread), each with its own mutex and
// table, so no lock is shared across shards. Entries expire with no cleanup
// job: an entry whose state is Idle equals no entry and is dropped by the
// sweep hand on inserts, at the cap, or right after the Apply that made it
// idle. Operations on one shard are deterministic: the same keys and times in
// the same order give the same evictions.
type Store[S any, P State[S]] struct {
	shards []shard[S, P]
	layout
	grace atomic.Int64 // SetGrace
}

// NewStore returns an empty Store. Tables are allocated lazily on first
// insert. It returns an error naming the bad field of cfg.
func NewStore[S any, P State[S]](cfg StoreConfig) (*Store[S, P], error) {
	lay, shards, err := newLayout(cfg)
	if err != nil {
		return nil, err
	}
	st := &Store[S, P]{shards: make([]shard[S, P], shards), layout: lay}
	for i := range st.shards {
		st.shards[i].tab = keytable.New[S](lay.shardBits, tagMask)
		st.shards[i].scratch = new(S)
	}
	return st, nil
}

// evictions are a shard's removal counters (see StoreStats), shared by
// Store and GCRAStore. Guarded by the shard's mutex.
type evictions struct {
	evictedIdle, evictedForgiven, swept uint64
	forgiven                            uint64 // what the forgiven entries owed, in their unit (see debtor)
}

// addTo adds the counters to s; inTime is the unit of forgiven.
func (e *evictions) addTo(s *StoreStats, inTime bool) {
	s.EvictedIdle += e.evictedIdle
	s.EvictedForgiven += e.evictedForgiven
	s.Swept += e.swept
	if inTime {
		s.ForgivenNanos = satAddU(s.ForgivenNanos, e.forgiven)
	} else {
		s.ForgivenTokens = satAddU(s.ForgivenTokens, e.forgiven)
	}
}

// forgive counts one forgiven eviction of an entry that owed owed.
func (e *evictions) forgive(owed int64) {
	e.evictedForgiven++
	e.forgiven = satAddU(e.forgiven, uint64(max(owed, 0)))
}

// satAddU is a+b saturating at the largest uint64.
func satAddU(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// layout is how a store spreads keys over shards; Store and GCRAStore share
// it, and its validation.
type layout struct {
	shardShift uint8 // 64 − log2(shards); 64 for one shard
	shardBits  uint8
	perShard   int // the key cap of one shard
}

// newLayout applies cfg's defaults and checks it. It returns the layout and
// the number of shards, or an error naming the bad field.
func newLayout(cfg StoreConfig) (layout, int, error) {
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.MaxKeys < 0 {
		return layout{}, 0, fmt.Errorf("bucket: StoreConfig.MaxKeys %d: must be >= 0", cfg.MaxKeys)
	}
	if cfg.Shards < 0 || cfg.Shards > 1<<16 || cfg.Shards&(cfg.Shards-1) != 0 {
		return layout{}, 0, fmt.Errorf("bucket: StoreConfig.Shards %d: must be a power of two in [1, 65536]", cfg.Shards)
	}
	sb := uint8(bits.TrailingZeros(uint(cfg.Shards)))
	return layout{shardShift: 64 - sb, shardBits: sb, perShard: (cfg.MaxKeys + cfg.Shards - 1) / cfg.Shards}, cfg.Shards, nil
}

// TagBits is the width of the tag an entry of a Store or GCRAStore records
// (AllowTagged, ApplyTagged): tags are below 1<<TagBits.
const TagBits = 12

// tagMask selects the tag in a stored key word: the low TagBits bits, the
// worst-mixed bits of a multiplicative hash. Shards and home slots are
// picked from the high bits, so a tag change never moves an entry; keys
// compare on the bits above the tag.
const tagMask = 1<<TagBits - 1

// keyWord maps a caller's key to its stored key word with a zero tag: mix's
// bits above the tag, never 0.
func keyWord(key uint64) uint64 {
	h := mix(key) &^ tagMask
	if h == 0 {
		h = golden &^ tagMask
	}
	return h
}

// mix maps a caller's key to the stored key: a bijection with 0 reserved.
func mix(key uint64) uint64 {
	if key == 0 {
		key = zeroAlias
	}
	return key * golden // odd multiplier: a bijection, 0 only for 0
}

func (st *Store[S, P]) shardOf(h uint64) *shard[S, P] {
	return &st.shards[h>>st.shardShift]
}

// find returns the slot index of h, or the empty slot where probing
// stopped (-1 if there is no table).
func (st *Store[S, P]) find(sh *shard[S, P], h uint64) (int, bool) { return sh.tab.Find(h) }

// Apply finds key's state (or a zero state if absent), steps alg on it with
// cost at now, and returns the decision. An entry whose state is Idle after
// the step is not kept. Inserting a new key may sweep idle entries and, at
// the key cap, evict one (see StoreStats). Apply allocates nothing except when
// a table grows. Safe for concurrent use.
func (st *Store[S, P]) Apply(key uint64, now int64, alg Stepper[S], cost int64) Decision {
	d, _ := st.apply(key, 0, false, now, alg, cost)
	return d
}

// ApplyTagged is Apply for entries that record the rule they were written
// under: tag (below 1<<TagBits) names that rule, for the caller, and a key
// inserted here gets it. If key holds an entry under another tag it changes
// nothing and returns false: the caller converts the entry with Retag and
// asks again. A key's entry is found whatever its tag (a tag is a label, not
// part of the key), so Apply, Peek and Update see it too. Safe for
// concurrent use.
func (st *Store[S, P]) ApplyTagged(key uint64, tag uint16, now int64, alg Stepper[S], cost int64) (Decision, bool) {
	return st.apply(key, tag, true, now, alg, cost)
}

// apply is Apply (strict false: an entry of any tag is stepped) and
// ApplyTagged (strict: an entry of another tag is left alone).
func (st *Store[S, P]) apply(key uint64, tag uint16, strict bool, now int64, alg Stepper[S], cost int64) (Decision, bool) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	i, ok := st.find(sh, h)
	if ok {
		e := sh.tab.At(i)
		if strict && e.Key != h|uint64(tag&tagMask) {
			// Even an idle entry: converted, it may be live again (a
			// lengthened window).
			sh.mu.Unlock()
			return Decision{}, false
		}
		p := &e.Val
		d := alg.Step(p, now, cost)
		if P(p).Idle(now) {
			st.deleteAt(sh, i)
			st.maybeShrink(sh)
		}
		sh.mu.Unlock()
		return d, true
	}
	var zero S
	*sh.scratch = zero
	d := alg.Step(sh.scratch, now, cost)
	if !P(sh.scratch).Idle(now) {
		st.insert(sh, h|uint64(tag&tagMask), i, now)
	}
	sh.mu.Unlock()
	return d, true
}

// Retag converts key's entry, if it holds one under another tag than tag,
// to tag: fn gets the entry's tag and state, converts the state in place
// and returns true, or returns false to leave the entry as it is (an Idle
// result removes the entry). It runs under the shard lock; fn must not call
// the store. Retag reports false only when fn did. Safe for concurrent use.
func (st *Store[S, P]) Retag(key uint64, tag uint16, now int64, fn func(from uint16, s *S) bool) bool {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if !ok {
		return true
	}
	e := sh.tab.At(i)
	from := uint16(e.Key & tagMask)
	if from == tag&tagMask {
		return true
	}
	if !fn(from, &e.Val) {
		return false
	}
	e.Key = h | uint64(tag&tagMask)
	if P(&e.Val).Idle(now) {
		st.deleteAt(sh, i)
		st.maybeShrink(sh)
	}
	return true
}

// Peek returns a copy of key's state and true if an entry exists and is not
// Idle at now; otherwise the zero state and false. The copy is shallow: for
// SlidingLogState it shares the ring with the stored entry, so read it only
// while no Apply on the key can run. Safe for concurrent use.
func (st *Store[S, P]) Peek(key uint64, now int64) (S, bool) {
	s, _, ok := st.PeekTagged(key, now)
	if !ok || P(&s).Idle(now) {
		var zero S
		return zero, false
	}
	return s, true
}

// PeekTagged returns a copy of key's state (shallow, as Peek's), the tag it
// was written under (see ApplyTagged) and true if an entry exists, Idle or
// not (converted to another rule, an idle state may be live again). It
// converts nothing. Safe for concurrent use.
func (st *Store[S, P]) PeekTagged(key uint64, now int64) (S, uint16, bool) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if !ok {
		var zero S
		return zero, 0, false
	}
	return sh.tab.At(i).Val, uint16(sh.tab.At(i).Key & tagMask), true
}

// SetGrace makes the sweep and the key cap treat an entry as idle only once
// it has been Idle for d ns: while some tagged entries may still be
// converted to rules under which they live longer (a lengthened window),
// they are kept that long. 0 (the default) drops entries as soon as they
// are Idle. Safe for concurrent use.
func (st *Store[S, P]) SetGrace(d time.Duration) { st.grace.Store(int64(max(d, 0))) }

// Update calls fn on key's state under the shard lock, inserting a zero state
// first if the key is absent, and drops the entry if it is Idle afterwards.
// An entry keeps its tag; one inserted here gets tag 0. For rare paths
// (releasing a concurrency slot, inspection); fn must not call the Store.
// May allocate. Safe for concurrent use.
func (st *Store[S, P]) Update(key uint64, now int64, fn func(s *S)) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if ok {
		fn(&sh.tab.At(i).Val)
		if P(&sh.tab.At(i).Val).Idle(now) {
			st.deleteAt(sh, i)
			st.maybeShrink(sh)
		}
		return
	}
	var zero S
	*sh.scratch = zero
	fn(sh.scratch)
	if !P(sh.scratch).Idle(now) {
		st.insert(sh, h, i, now)
	}
}

// Take removes key's entry and returns its state and tag, and true if it
// was there (Idle or not: converted to another rule, an idle state may be
// live again). Safe for concurrent use.
func (st *Store[S, P]) Take(key uint64, now int64) (S, uint16, bool) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var zero S
	i, ok := st.find(sh, h)
	if !ok {
		return zero, 0, false
	}
	s, tag := sh.tab.At(i).Val, uint16(sh.tab.At(i).Key&tagMask)
	st.deleteAt(sh, i)
	st.maybeShrink(sh)
	return s, tag, true
}

// Put stores s under tag for key, replacing any entry (an Idle s removes
// it). May allocate. Safe for concurrent use.
func (st *Store[S, P]) Put(key uint64, tag uint16, now int64, s S) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if ok {
		*sh.tab.At(i) = keytable.Slot[S]{Key: h | uint64(tag&tagMask), Val: s}
		if P(&sh.tab.At(i).Val).Idle(now) {
			st.deleteAt(sh, i)
			st.maybeShrink(sh)
		}
		return
	}
	*sh.scratch = s
	if !P(sh.scratch).Idle(now) {
		st.insert(sh, h|uint64(tag&tagMask), i, now)
	}
	var zero S
	*sh.scratch = zero
}

// Delete removes key's entry if present. Safe for concurrent use.
func (st *Store[S, P]) Delete(key uint64) {
	h := keyWord(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	if i, ok := st.find(sh, h); ok {
		st.deleteAt(sh, i)
		st.maybeShrink(sh)
	}
	sh.mu.Unlock()
}

// Stats returns the store's counters, summed shard by shard (each shard is
// consistent, the sum is not a snapshot). Safe for concurrent use.
func (st *Store[S, P]) Stats() StoreStats {
	var s StoreStats
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.Live += sh.tab.Len()
		s.Slots += sh.tab.Size()
		sh.evictions.addTo(&s, sh.inTime)
		sh.mu.Unlock()
	}
	return s
}

// insert adds h with the state in *sh.scratch. at is the empty slot where
// find stopped (-1 if there is no table). It evicts at the cap, grows at
// load 3/4, and advances the sweep hand.
func (st *Store[S, P]) insert(sh *shard[S, P], h uint64, at int, now int64) {
	now -= st.grace.Load() // idle for the sweep and the cap: see SetGrace
	moved := false
	if sh.tab.Len() >= st.perShard {
		if st.perShard == 0 {
			return // MaxKeys 0 after defaults cannot happen; keep nothing
		}
		st.evict(sh, now)
		moved = true
	}
	if n := sh.tab.Size(); n == 0 || (sh.tab.Len()+1)*4 > n*3 {
		st.resize(sh, max(2*n, minSlots))
		moved = true
	}
	if moved {
		at, _ = st.find(sh, h)
	}
	sh.tab.Insert(at, h, *sh.scratch)
	var zero S
	*sh.scratch = zero
	if !moved {
		st.sweep(sh, now, sweepStep)
	}
}

// sweep examines n slots at the hand and deletes the idle ones.
func (st *Store[S, P]) sweep(sh *shard[S, P], now int64, n int) {
	mask := sh.tab.Size() - 1
	for ; n > 0; n-- {
		i := sh.hand & mask
		if e := sh.tab.At(i); e.Key != 0 && P(&e.Val).Idle(now) {
			st.deleteAt(sh, i) // a later entry may shift into i: examine i again
			sh.swept++
			continue
		}
		sh.hand = (i + 1) & mask
	}
	st.maybeShrink(sh)
}

// evict makes room at the cap. It examines the capScan slots from the sweep
// hand (wrapping around a table smaller than that): the first idle entry
// among them goes (EvictedIdle). Failing that, of the live entries examined
// the one with the least debt goes, the first of them on a tie, and what it
// owed is forgiven and counted (EvictedForgiven, and ForgivenTokens or
// ForgivenNanos by the state's unit: see debtor). So an entry is forgiven
// only when every other entry examined owes at least as much, and the most
// indebted of them is never the victim while a less indebted one is there.
// The hand moves past the victim.
func (st *Store[S, P]) evict(sh *shard[S, P], now int64) {
	mask := sh.tab.Size() - 1
	victim := -1
	var vowed int64
	for n := 0; n < capScan || victim < 0; n++ {
		i := (sh.hand + n) & mask
		e := sh.tab.At(i)
		if e.Key == 0 {
			continue
		}
		p := P(&e.Val)
		if p.Idle(now) {
			sh.hand = i
			st.deleteAt(sh, i)
			sh.evictedIdle++
			return
		}
		if owed, inTime := debtOf(p, now); victim < 0 || owed < vowed {
			victim, vowed = i, owed
			sh.inTime = inTime
		}
	}
	sh.hand = (victim + 1) & mask
	st.deleteAt(sh, victim)
	sh.forgive(vowed)
}

// deleteAt empties slot i (keytable's backward shift: later entries of the
// probe run move back, so lookups never need tombstones).
func (st *Store[S, P]) deleteAt(sh *shard[S, P], i int) { sh.tab.DeleteAt(i) }

// maybeShrink halves the table (or more) when it is under 1/8 full.
func (st *Store[S, P]) maybeShrink(sh *shard[S, P]) {
	if sh.tab.Size() <= minSlots || sh.tab.Len()*8 >= sh.tab.Size() {
		return
	}
	n := minSlots
	for n < sh.tab.Len()*2 {
		n *= 2
	}
	st.resize(sh, n)
}

// resize rehashes the shard into a table of n slots (a power of two) and
// resets the sweep hand.
func (st *Store[S, P]) resize(sh *shard[S, P], n int) {
	sh.tab.Resize(n)
	sh.hand = 0
}
