package bucket

// GCRAStore: a keyed store of GCRA TATs whose hot path is a map access and
// an atomic.
//
// # Layout
//
// Keys are spread over shards exactly as in Store (mix, high bits pick the
// shard, the bits below them the home slot). A shard holds a mutex and an
// atomic pointer to its current table: a power-of-two array of 16-byte slots
// {key atomic.Uint64; tat atomic.Int64} probed linearly. key 0 = empty.
//
// The tat word of a slot is a TAT with its sign bit reserved as SEAL:
//
//	tat >= 1          live entry, state = tat (idle when tat <= now)
//	tat == tomb       tombstone: SEAL with payload 0 (math.MinInt64)
//	tat == v|SEAL     sealed live entry, payload v >= 1 (rebuild or Update in
//	                  progress, or a table already replaced)
//
// Callers' times must lie in [0, 2^62) (GCRA requires < 2^62 anyway). Then
// every TAT that is stored is > now >= 0, so a live payload is >= 1 and is
// never confused with the tombstone, and never has the SEAL bit.
//
// # Invariants (I1–I7)
//
// I1 Every structural change — publishing a key, tombstoning, sealing,
// rebuilding, publishing a table, the counters live/tombs/hand — is made by
// the holder of the shard mutex. Lock-free code (Apply's and Peek's fast
// paths) only loads the table pointer, loads slots and CASes the tat of a
// live slot from an unsealed value v to an unsealed value n (n >= v >= 1).
//
// I2 Entries never move within a table and slots are never reused: a key
// word goes 0 → h once (tat is stored before the key, so whoever sees the
// key sees a valid tat or a later value); a tat word goes live → live
// (CAS), live → tomb, or live → sealed; tomb and sealed are final except
// that Update (under the mutex) turns its own seal back into a live value or
// the tombstone before it unlocks. Hence, within one table, the probe chain
// of h up to the first empty slot only ever grows at its end.
//
// I3 In the current table, outside the mutex holder's critical section, a
// key has at most one live (non-tomb) slot, and no slot is sealed except
// tombstones. (Insert happens only after a probe under the mutex found no
// live slot for h; the mutex holder unseals or replaces the table before it
// unlocks.) So under the mutex, "sealed" in the current table means tomb.
//
// I4 Rebuild (grow, shrink, or same-size to purge tombstones) seals every
// slot of the old table with a CAS loop v → v|SEAL, copies the payload of
// each sealed live slot into a private new table (dropping it instead if it
// is idle at the rebuilding operation's now, which is a sweep), then
// publishes the new table with an atomic store. Sealing a slot freezes it:
// no fast-path CAS can succeed on it afterwards (the CAS expects an unsealed
// value), so the value copied is the slot's final value and no admission is
// lost. Updates of slots not yet sealed are captured when they are sealed
// later in the same pass. The old table stays sealed forever; it is garbage
// once no fast path holds it. A rebuild happens only when an insert would
// pass the load (I6) — doubling if live+1 > half the table, else at the same
// size, so at least a quarter of the table is inserted between two rebuilds
// (amortized O(1)) — or when a delete leaves the table under 1/8 full.
//
// I5 Deleting an idle entry (sweep, eviction of an idle entry, idle after a
// slow-path step) is CAS(v, tomb) from the observed idle v: if it fails, a
// fast path has just spent the entry, which is therefore not idle, and is
// kept. Deleting regardless of the state (Delete, a forgiven eviction, an
// Update that leaves it idle) stores tomb: a fast path whose CAS then fails
// reloads, sees the tombstone and goes on probing; the spend it was making
// is redone on the slow path against a fresh state, exactly as if it came
// after the delete.
//
// I6 Load: live + tombs <= 3/4 of the table after every insert (a rebuild
// runs first when the insert would pass it), so every table, current or
// retired, has an empty slot and every probe terminates.
//
// # Why each fast-path outcome is linearizable
//
//   - CAS v → n succeeds on a slot of table t: the slot was unsealed at the
//     CAS, so t was still current (I4: a replaced table is fully sealed) and
//     the slot was the key's only live entry (I3). The CAS is the
//     linearization point; n was computed from v, so no concurrent update
//     is overwritten (the lost-update-free argument of any CAS loop).
//   - The step changes nothing (a rejection, cost 0): the load of the
//     unsealed v is the linearization point, by the same argument.
//   - A probe sees the key with a tombstone: the key was deleted from that
//     slot before the load (tomb is final), and I2 says a reinsertion into t
//     lands further along the chain, so the probe goes on.
//   - A probe sees the key sealed (not tomb), or a CAS fails and the reload
//     shows a seal, or the probe reaches an empty slot: the fast path takes
//     the slow path, which locks the mutex, reloads the table pointer and
//     redoes the whole operation under the mutex (I1, I3: no rebuild or
//     Update can be in progress then). For Peek only, an empty slot answers
//     "absent" lock-free if the table pointer is unchanged after the probe:
//     the empty read happened while t was current, every slot before it
//     held another key or a tombstone of this one, and a reinsertion could
//     only have filled that empty slot (I2), so the key was absent then.
//
// # Differences from Store[TAT] (none visible in Decisions or Peek)
//
// A step on the fast path that leaves the entry idle (only possible when
// the entry was idle already and the step charged nothing) keeps it; the
// sweep removes it later. Tombstones occupy slots until the next rebuild, so
// Stats.Slots can be up to twice Store's under delete/insert churn, and the
// slot layout — hence which spent entry is forgiven at the key cap, and
// which idle entries the sweep finds first — differs from Store's
// backward-shift layout. Entries idle at the cap or the sweep are dropped in
// a possibly different order (a rebuild also drops the idle entries it
// copies, counted in Swept), which no Decision can observe; so Stats.Live,
// Swept and EvictedIdle may differ from Store's for the same sequence.

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

const (
	sealBit = math.MinInt64 // the SEAL bit of a slot's tat word
	tombTAT = math.MinInt64 // a tombstone: sealed, payload 0
)

// gslot is one table slot: 16 bytes.
type gslot struct {
	key atomic.Uint64 // mixed key; 0 = empty; never changes once set
	tat atomic.Int64  // see the encoding above
}

// gtable is one immutable-shape table of a GCRAStore shard.
type gtable struct {
	slots []gslot
	shift uint8 // 64 − log2(len(slots))
}

// gshard is one shard: the table pointer read by the fast path on its own
// 64-byte line, the mutex and the slow-path state on the next.
type gshard struct {
	table atomic.Pointer[gtable]
	_     [56]byte
	mu    sync.Mutex
	live  int // keys with a non-tomb slot (idle ones included until swept)
	tombs int // tombstones in the current table
	hand  int // sweep hand, a slot index
	evictions
}

// GCRAStore maps 64-bit keys to GCRA TATs, like Store[TAT, *TAT] with the
// same observable behaviour (key 0 aliased, idle entries equal no entry and
// are swept on insert, the MaxKeys cap evicts idle entries first and else
// forgives the least indebted of the entries examined), but a decision on a
// key already present takes no lock: it is a probe of atomic loads and a
// CAS on the key's TAT. Inserts,
// deletes, the sweep, eviction and resizing take the shard mutex. Times
// (now) must lie in [0, 2^62). Safe for concurrent use.
type GCRAStore struct {
	shards []gshard
	layout
}

// NewGCRAStore returns an empty GCRAStore; cfg means what it means for
// NewStore. Tables are allocated lazily on first insert. It returns an error
// naming the bad field of cfg.
func NewGCRAStore(cfg StoreConfig) (*GCRAStore, error) {
	lay, shards, err := newLayout(cfg)
	if err != nil {
		return nil, err
	}
	return &GCRAStore{shards: make([]gshard, shards), layout: lay}, nil
}

// Apply steps g with cost at now on key's TAT (a full bucket if absent) and
// returns the decision, as Store[TAT].Apply(key, now, g, cost) does: it is
// g.Decision(st.Allow(key, now, g, cost)). For a key already present it
// takes no lock and allocates nothing. Safe for concurrent use.
func (st *GCRAStore) Apply(key uint64, now int64, g *GCRA, cost int64) Decision {
	return g.Decision(st.Allow(key, now, g, cost))
}

// Allow is Apply for callers that need only whether the request passed and
// when to retry: it makes the same decision with the same effect on the
// store, and returns it as a Verdict (two words in registers, with no token
// count to compute). GCRA.Decision gives the whole Decision from it. Safe
// for concurrent use.
func (st *GCRAStore) Allow(key uint64, now int64, g *GCRA, cost int64) Verdict {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	if t := sh.table.Load(); t != nil {
		s := t.slots
		mask := len(s) - 1
		i := int((h << (st.shardBits & 63)) >> (t.shift & 63)) // both < 64: no shift-overflow fixup
		for {
			e := &s[i&mask]
			k := e.key.Load()
			if k&^tagMask == h { // whatever its tag
				v := e.tat.Load()
				for v >= 0 { // live: step it, CAS the change in
					if cost > 0 && cost <= g.burst { // Step's hot path, inlined
						n := satAdd(max(v, now), cost*g.t)
						if used := n - now; used <= g.tau {
							if e.tat.CompareAndSwap(v, n) {
								return Verdict{Reset: time.Duration(used)}
							}
							v = e.tat.Load()
							continue
						}
					}
					// A rejection or cost <= 0: the state does not change.
					d, _ := g.verdict(v, now, cost)
					return d
				}
				if v != tombTAT {
					break // sealed: rebuild or Update in progress
				}
			} else if k == 0 {
				break // absent here: insert under the mutex
			}
			i++
		}
	}
	d, _ := st.allowSlow(sh, h, 0, false, now, g, cost)
	return d
}

// AllowTagged is Allow for entries that record the rule they were written
// under: tag (below 1<<TagBits) names that rule, for the caller, and a key
// inserted here gets it. If key holds a live entry under another tag it
// changes nothing and returns false: the caller converts the entry with
// Retag and asks again. A key's entry is found whatever its tag (a tag is a
// label, not part of the key), so Allow, Peek and Update see it too. For a
// key already present under tag it costs what Allow costs. Safe for
// concurrent use.
//
// Its fast path is a copy of Allow's with an exact key compare, so that
// neither pays for the other's test.
func (st *GCRAStore) AllowTagged(key uint64, tag uint16, now int64, g *GCRA, cost int64) (Verdict, bool) {
	h := keyWord(key)
	want := h | uint64(tag&tagMask)
	sh := &st.shards[h>>st.shardShift]
	if t := sh.table.Load(); t != nil {
		s := t.slots
		mask := len(s) - 1
		i := int((h << (st.shardBits & 63)) >> (t.shift & 63)) // both < 64: no shift-overflow fixup
		for {
			e := &s[i&mask]
			k := e.key.Load()
			if k == want {
				v := e.tat.Load()
				for v >= 0 { // live: step it, CAS the change in
					if cost > 0 && cost <= g.burst { // Step's hot path, inlined
						n := satAdd(max(v, now), cost*g.t)
						if used := n - now; used <= g.tau {
							if e.tat.CompareAndSwap(v, n) {
								return Verdict{Reset: time.Duration(used)}, true
							}
							v = e.tat.Load()
							continue
						}
					}
					// A rejection or cost <= 0: the state does not change.
					d, _ := g.verdict(v, now, cost)
					return d, true
				}
				if v != tombTAT {
					break // sealed: rebuild or Update in progress
				}
			} else if k == 0 || (k&^tagMask == h && e.tat.Load() != tombTAT) {
				break // absent here, or under another tag: under the mutex
			}
			i++
		}
	}
	return st.allowSlow(sh, h, tag, true, now, g, cost)
}

// allowSlow is Allow (strict false: an entry of any tag is stepped) and
// AllowTagged (strict: an entry of another tag is left alone) under the
// shard mutex.
func (st *GCRAStore) allowSlow(sh *gshard, h uint64, tag uint16, strict bool, now int64, g *GCRA, cost int64) (Verdict, bool) {
	sh.mu.Lock()
	t := sh.table.Load()
	i, ok := st.find(t, h)
	if ok && strict && t.slots[i].key.Load() != h|uint64(tag&tagMask) {
		sh.mu.Unlock()
		return Verdict{}, false
	}
	if ok {
		e := &t.slots[i]
		for {
			v := e.tat.Load() // unsealed (I3), may still change under fast paths
			d, n := g.verdict(v, now, cost)
			if cost <= 0 {
				n = v // a peek never charges (Step)
			}
			if n <= now { // idle after the step: drop it, as Store does
				if !e.tat.CompareAndSwap(v, tombTAT) {
					continue
				}
				sh.live--
				sh.tombs++
				st.maybeShrink(sh, t, now)
			} else if n != v && !e.tat.CompareAndSwap(v, n) {
				continue
			}
			sh.mu.Unlock()
			return d, true
		}
	}
	d, n := g.verdict(0, now, cost)
	if cost > 0 && n > now && n > 0 {
		st.insert(sh, t, h|uint64(tag&tagMask), i, n, now)
	}
	sh.mu.Unlock()
	return d, true
}

// Retag converts key's entry, if it holds one under another tag than tag,
// to tag: fn gets the entry's tag and TAT and returns the TAT under tag (a
// TAT idle at now removes the entry), or false to leave the entry as it is.
// It runs under the shard mutex with the entry sealed against fast paths;
// fn must not call the store. Retag reports false only when fn did. Safe for
// concurrent use.
func (st *GCRAStore) Retag(key uint64, tag uint16, now int64, fn func(from uint16, tat TAT) (TAT, bool)) bool {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	i, ok := st.find(t, h)
	if !ok {
		return true
	}
	e := &t.slots[i]
	from := uint16(e.key.Load() & tagMask)
	if from == tag&tagMask {
		return true
	}
	v := e.tat.Load()
	for !e.tat.CompareAndSwap(v, v|sealBit) {
		v = e.tat.Load()
	}
	n, ok := fn(from, TAT(v))
	if !ok {
		e.tat.Store(v)
		return false
	}
	e.key.Store(h | uint64(tag&tagMask))
	if int64(n) > now && n > 0 {
		e.tat.Store(int64(n))
		return true
	}
	e.tat.Store(tombTAT)
	sh.live--
	sh.tombs++
	st.maybeShrink(sh, t, now)
	return true
}

// Peek returns key's TAT and true if an entry exists and is not idle at now;
// otherwise 0 and false. Lock-free unless a rebuild is in progress.
func (st *GCRAStore) Peek(key uint64, now int64) (TAT, bool) {
	tat, _, ok := st.PeekTagged(key, now)
	if !ok || int64(tat) <= now {
		return 0, false
	}
	return tat, true
}

// PeekTagged returns key's TAT, the tag it was written under (see
// AllowTagged) and true if an entry exists, idle at now or not (converted
// to another rule, an idle TAT may be live again, as with Store's
// PeekTagged). It converts nothing. Lock-free unless a rebuild is in
// progress.
func (st *GCRAStore) PeekTagged(key uint64, now int64) (TAT, uint16, bool) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	t := sh.table.Load()
	if t == nil {
		return 0, 0, false // tables only ever go from nil to non-nil
	}
	s := t.slots
	mask := len(s) - 1
	for i := int((h << (st.shardBits & 63)) >> (t.shift & 63)); ; i++ {
		e := &s[i&mask]
		k := e.key.Load()
		if k&^tagMask == h {
			v := e.tat.Load()
			if v >= 0 {
				return TAT(v), uint16(k & tagMask), true
			}
			if v != tombTAT {
				break
			}
		} else if k == 0 {
			if sh.table.Load() == t {
				return 0, 0, false
			}
			break
		}
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t = sh.table.Load()
	i, ok := st.find(t, h)
	if !ok {
		return 0, 0, false
	}
	v := t.slots[i].tat.Load()
	if v < 0 {
		return 0, 0, false
	}
	return TAT(v), uint16(t.slots[i].key.Load() & tagMask), true
}

// Take removes key's entry and returns its TAT and tag, and true if it was
// there, idle at now or not (as Store's Take). Safe for concurrent use.
func (st *GCRAStore) Take(key uint64, now int64) (TAT, uint16, bool) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	i, ok := st.find(t, h)
	if !ok {
		return 0, 0, false
	}
	e := &t.slots[i]
	tag := uint16(e.key.Load() & tagMask)
	v := e.tat.Swap(tombTAT) // a fast path's CAS then fails (I5)
	sh.live--
	sh.tombs++
	st.maybeShrink(sh, t, now)
	if v < 0 {
		return 0, 0, false
	}
	return TAT(v), tag, true
}

// Put stores tat under tag for key, replacing any entry (a TAT idle at now
// removes it). Safe for concurrent use.
func (st *GCRAStore) Put(key uint64, tag uint16, now int64, tat TAT) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	i, ok := st.find(t, h)
	if ok {
		e := &t.slots[i]
		v := e.tat.Load()
		for !e.tat.CompareAndSwap(v, v|sealBit) {
			v = e.tat.Load()
		}
		e.key.Store(h | uint64(tag&tagMask))
		if int64(tat) > now && tat > 0 {
			e.tat.Store(int64(tat))
			return
		}
		e.tat.Store(tombTAT)
		sh.live--
		sh.tombs++
		st.maybeShrink(sh, t, now)
		return
	}
	if int64(tat) > now && tat > 0 {
		st.insert(sh, t, h|uint64(tag&tagMask), i, int64(tat), now)
	}
}

// Update calls fn on key's TAT under the shard mutex (a zero TAT if absent),
// stores the result and drops the entry if it is idle at now, as
// Store[TAT].Update does. Concurrent fast paths on the key wait for it. fn
// is called exactly once and must not call the store. Safe for concurrent
// use.
func (st *GCRAStore) Update(key uint64, now int64, fn func(s *TAT)) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	i, ok := st.find(t, h)
	if !ok {
		var s TAT
		fn(&s)
		if int64(s) > now && s > 0 {
			st.insert(sh, t, h, i, int64(s), now)
		}
		return
	}
	e := &t.slots[i]
	v := e.tat.Load()
	for !e.tat.CompareAndSwap(v, v|sealBit) { // freeze it against fast paths
		v = e.tat.Load()
	}
	sealed := true
	defer func() {
		if sealed { // fn panicked: restore the entry (I3)
			e.tat.Store(v)
		}
	}()
	s := TAT(v)
	fn(&s)
	sealed = false
	if int64(s) > now && s > 0 {
		e.tat.Store(int64(s))
		return
	}
	e.tat.Store(tombTAT)
	sh.live--
	sh.tombs++
	st.maybeShrink(sh, t, now)
}

// Delete removes key's entry if present. Safe for concurrent use.
func (st *GCRAStore) Delete(key uint64) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	sh.mu.Lock()
	t := sh.table.Load()
	if i, ok := st.find(t, h); ok {
		t.slots[i].tat.Store(tombTAT)
		sh.live--
		sh.tombs++
		st.maybeShrink(sh, t, math.MinInt64) // no time: keep idle entries
	}
	sh.mu.Unlock()
}

// Stats returns the store's counters, summed shard by shard (each shard is
// consistent, the sum is not a snapshot). Live counts entries not yet swept,
// idle ones included; Slots counts tombstoned slots too. Safe for concurrent
// use.
func (st *GCRAStore) Stats() StoreStats {
	var s StoreStats
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.Live += sh.live
		if t := sh.table.Load(); t != nil {
			s.Slots += len(t.slots)
		}
		sh.evictions.addTo(&s, true)
		sh.mu.Unlock()
	}
	return s
}

// home is the first slot probed for h in t.
func (st *GCRAStore) home(t *gtable, h uint64) int {
	return int((h << (st.shardBits & 63)) >> (t.shift & 63))
}

// find probes t for h under the shard mutex, where every sealed slot of the
// current table is a tombstone (I3). It returns the index of h's live slot,
// or the empty slot where probing stopped (-1 if there is no table).
func (st *GCRAStore) find(t *gtable, h uint64) (int, bool) {
	if t == nil {
		return -1, false
	}
	mask := len(t.slots) - 1
	i := st.home(t, h)
	for {
		e := &t.slots[i]
		k := e.key.Load()
		if k == 0 {
			return i, false
		}
		if k&^tagMask == h&^tagMask && e.tat.Load() >= 0 {
			return i, true
		}
		i = (i + 1) & mask
	}
}

// insert adds h with TAT v at the empty slot at (-1 if t is nil), under the
// shard mutex. It evicts at the cap, rebuilds when live+tombs would pass 3/4
// of the table, and advances the sweep hand.
func (st *GCRAStore) insert(sh *gshard, t *gtable, h uint64, at int, v, now int64) {
	moved := false
	if sh.live >= st.perShard {
		if st.perShard == 0 {
			return
		}
		st.evict(sh, t, now)
		moved = true
	}
	if t == nil || (sh.live+sh.tombs+1)*4 > len(t.slots)*3 {
		n := minSlots
		if t != nil {
			n = len(t.slots)
			if (sh.live+1)*2 > n { // else same size: purge tombstones only
				n *= 2
			}
		}
		t = st.rebuild(sh, t, n, now)
		at, _ = st.find(t, h)
		moved = true
	}
	e := &t.slots[at]
	e.tat.Store(v) // the TAT first, then publish the key (I2)
	e.key.Store(h)
	sh.live++
	if !moved {
		st.sweep(sh, t, now, sweepStep)
	}
}

// sweep examines n slots at the hand and tombstones the idle entries.
func (st *GCRAStore) sweep(sh *gshard, t *gtable, now int64, n int) {
	mask := len(t.slots) - 1
	for ; n > 0; n-- {
		i := sh.hand & mask
		e := &t.slots[i]
		if e.key.Load() != 0 {
			if v := e.tat.Load(); v >= 0 && v <= now && e.tat.CompareAndSwap(v, tombTAT) {
				sh.live--
				sh.tombs++
				sh.swept++
			}
		}
		sh.hand = (i + 1) & mask
	}
	st.maybeShrink(sh, t, now)
}

// evict makes room at the cap, choosing as Store does: of the capScan slots
// from the sweep hand (wrapping around a smaller table), the first idle
// entry goes (EvictedIdle); failing that, the live entry with the smallest
// TAT, whose debt tat − now is the least, the first of them on a tie, and
// that debt is forgiven and counted (EvictedForgiven, ForgivenNanos).
// Tombstones are skipped. The hand moves past the victim.
func (st *GCRAStore) evict(sh *gshard, t *gtable, now int64) {
	mask := len(t.slots) - 1
	victim := -1
	var vtat int64
	for n := 0; n < capScan || victim < 0; n++ {
		i := (sh.hand + n) & mask
		e := &t.slots[i]
		if e.key.Load() == 0 {
			continue
		}
		v := e.tat.Load()
		if v < 0 {
			continue // tombstone
		}
		if v <= now && e.tat.CompareAndSwap(v, tombTAT) {
			sh.hand = i
			sh.live--
			sh.tombs++
			sh.evictedIdle++
			return
		}
		if victim < 0 || v < vtat {
			victim, vtat = i, v
		}
	}
	sh.hand = (victim + 1) & mask
	// A fast path may have spent the victim since it was read: the debt
	// counted is the one it has when it goes.
	v := t.slots[victim].tat.Swap(tombTAT)
	sh.live--
	sh.tombs++
	sh.forgive(v - now)
}

// maybeShrink rebuilds the table smaller when it is under 1/8 full.
func (st *GCRAStore) maybeShrink(sh *gshard, t *gtable, now int64) {
	if t == nil || len(t.slots) <= minSlots || sh.live*8 >= len(t.slots) {
		return
	}
	n := minSlots
	for n < sh.live*2 {
		n *= 2
	}
	st.rebuild(sh, t, n, now)
}

// rebuild seals every slot of old, copies its live entries into a new table
// of n slots (a power of two) and publishes it (I4). Entries idle at now are
// dropped on the way and counted as swept. It resets the sweep hand and the
// tombstone count. Under the shard mutex.
func (st *GCRAStore) rebuild(sh *gshard, old *gtable, n int, now int64) *gtable {
	nt := &gtable{slots: make([]gslot, n), shift: uint8(64 - bits.TrailingZeros(uint(n)))}
	if old != nil {
		mask := n - 1
		for k := range old.slots {
			e := &old.slots[k]
			h := e.key.Load()
			if h == 0 {
				continue
			}
			v := e.tat.Load()
			for v >= 0 && !e.tat.CompareAndSwap(v, v|sealBit) {
				v = e.tat.Load()
			}
			if v < 0 {
				continue // a tombstone (I3)
			}
			if v <= now { // idle: drop it like the sweep would
				sh.live--
				sh.swept++
				continue
			}
			i := st.home(nt, h)
			for nt.slots[i].key.Load() != 0 {
				i = (i + 1) & mask
			}
			nt.slots[i].tat.Store(v)
			nt.slots[i].key.Store(h)
		}
	}
	sh.tombs = 0
	sh.hand = 0
	sh.table.Store(nt)
	return nt
}
