package bucket

import (
	"fmt"
	"math/bits"
	"sync"
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

type slot[S any] struct {
	key   uint64 // mixed key; 0 = empty
	state S
}

// shard is one lock and one open-addressing table: linear probing,
// backward-shift deletion, power-of-two size, max load 3/4. It is padded to
// 128 bytes so no two shards share a cache line (or an adjacent-line pair).
type shard[S any, P State[S]] struct {
	mu        sync.Mutex
	slots     []slot[S]
	scratch   *S    // a heap cell for stepping a not-yet-inserted state without allocating
	count     int   // occupied slots
	hand      int   // sweep hand, a slot index
	tshift    uint8 // 64 − log2(len(slots))
	inTime    bool  // the unit of evictions.forgiven: ns, else tokens (see debtor)
	evictions       // see StoreStats
	_         [32]byte
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

// home is the first slot probed for h: the bits just below the shard bits,
// the best-mixed bits of a multiplicative hash.
func (st *Store[S, P]) home(sh *shard[S, P], h uint64) int {
	return int((h << st.shardBits) >> sh.tshift)
}

// find returns the slot index of h, or the empty slot where probing stopped.
func (st *Store[S, P]) find(sh *shard[S, P], h uint64) (int, bool) {
	if sh.slots == nil {
		return -1, false
	}
	mask := len(sh.slots) - 1
	i := st.home(sh, h)
	for {
		k := sh.slots[i].key
		if k == h {
			return i, true
		}
		if k == 0 {
			return i, false
		}
		i = (i + 1) & mask
	}
}

// Apply finds key's state (or a zero state if absent), steps alg on it with
// cost at now, and returns the decision. An entry whose state is Idle after
// the step is not kept. Inserting a new key may sweep idle entries and, at
// the key cap, evict one (see StoreStats). Apply allocates nothing except when
// a table grows. Safe for concurrent use.
func (st *Store[S, P]) Apply(key uint64, now int64, alg Stepper[S], cost int64) Decision {
	h := mix(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	i, ok := st.find(sh, h)
	if ok {
		p := &sh.slots[i].state
		d := alg.Step(p, now, cost)
		if P(p).Idle(now) {
			st.deleteAt(sh, i)
			st.maybeShrink(sh)
		}
		sh.mu.Unlock()
		return d
	}
	var zero S
	*sh.scratch = zero
	d := alg.Step(sh.scratch, now, cost)
	if !P(sh.scratch).Idle(now) {
		st.insert(sh, h, i, now)
	}
	sh.mu.Unlock()
	return d
}

// Peek returns a copy of key's state and true if an entry exists and is not
// Idle at now; otherwise the zero state and false. The copy is shallow: for
// SlidingLogState it shares the ring with the stored entry, so read it only
// while no Apply on the key can run. Safe for concurrent use.
func (st *Store[S, P]) Peek(key uint64, now int64) (S, bool) {
	h := mix(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if !ok || P(&sh.slots[i].state).Idle(now) {
		var zero S
		return zero, false
	}
	return sh.slots[i].state, true
}

// Update calls fn on key's state under the shard lock, inserting a zero state
// first if the key is absent, and drops the entry if it is Idle afterwards.
// For rare paths (releasing a concurrency slot, inspection); fn must not call
// the Store. May allocate. Safe for concurrent use.
func (st *Store[S, P]) Update(key uint64, now int64, fn func(s *S)) {
	h := mix(key)
	sh := st.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := st.find(sh, h)
	if ok {
		fn(&sh.slots[i].state)
		if P(&sh.slots[i].state).Idle(now) {
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

// Delete removes key's entry if present. Safe for concurrent use.
func (st *Store[S, P]) Delete(key uint64) {
	h := mix(key)
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
		s.Live += sh.count
		s.Slots += len(sh.slots)
		sh.evictions.addTo(&s, sh.inTime)
		sh.mu.Unlock()
	}
	return s
}

// insert adds h with the state in *sh.scratch. at is the empty slot where
// find stopped (-1 if there is no table). It evicts at the cap, grows at
// load 3/4, and advances the sweep hand.
func (st *Store[S, P]) insert(sh *shard[S, P], h uint64, at int, now int64) {
	moved := false
	if sh.count >= st.perShard {
		if st.perShard == 0 {
			return // MaxKeys 0 after defaults cannot happen; keep nothing
		}
		st.evict(sh, now)
		moved = true
	}
	if sh.slots == nil || (sh.count+1)*4 > len(sh.slots)*3 {
		n := minSlots
		if sh.slots != nil {
			n = len(sh.slots) * 2
		}
		st.resize(sh, n)
		moved = true
	}
	if moved {
		at, _ = st.find(sh, h)
	}
	sh.slots[at] = slot[S]{key: h, state: *sh.scratch}
	var zero S
	*sh.scratch = zero
	sh.count++
	if !moved {
		st.sweep(sh, now, sweepStep)
	}
}

// sweep examines n slots at the hand and deletes the idle ones.
func (st *Store[S, P]) sweep(sh *shard[S, P], now int64, n int) {
	mask := len(sh.slots) - 1
	for ; n > 0; n-- {
		i := sh.hand & mask
		if sh.slots[i].key != 0 && P(&sh.slots[i].state).Idle(now) {
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
	mask := len(sh.slots) - 1
	victim := -1
	var vowed int64
	for n := 0; n < capScan || victim < 0; n++ {
		i := (sh.hand + n) & mask
		if sh.slots[i].key == 0 {
			continue
		}
		p := P(&sh.slots[i].state)
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

// deleteAt empties slot i with backward-shift deletion: later entries of the
// probe run move back so lookups never need tombstones.
func (st *Store[S, P]) deleteAt(sh *shard[S, P], i int) {
	mask := len(sh.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		k := sh.slots[j].key
		if k == 0 {
			break
		}
		home := st.home(sh, k)
		// The entry at j may move to i iff i lies cyclically in [home, j).
		if (j-home)&mask >= (j-i)&mask {
			sh.slots[i] = sh.slots[j]
			i = j
		}
	}
	sh.slots[i] = slot[S]{}
	sh.count--
}

// maybeShrink halves the table (or more) when it is under 1/8 full.
func (st *Store[S, P]) maybeShrink(sh *shard[S, P]) {
	if len(sh.slots) <= minSlots || sh.count*8 >= len(sh.slots) {
		return
	}
	n := minSlots
	for n < sh.count*2 {
		n *= 2
	}
	st.resize(sh, n)
}

// resize rehashes the shard into a table of n slots (a power of two) and
// resets the sweep hand.
func (st *Store[S, P]) resize(sh *shard[S, P], n int) {
	old := sh.slots
	sh.slots = make([]slot[S], n)
	sh.tshift = uint8(64 - bits.TrailingZeros(uint(n)))
	sh.hand = 0
	mask := n - 1
	for k := range old {
		e := &old[k]
		if e.key == 0 {
			continue
		}
		i := st.home(sh, e.key)
		for sh.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		sh.slots[i] = *e
	}
}
