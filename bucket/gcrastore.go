package bucket

// GCRAStore: a keyed store of GCRA TATs whose hot path is a probe and one
// compare-and-swap.
//
// # Layout
//
// Keys are spread over shards exactly as in Store (mix, high bits pick the
// shard, the bits below them the home slot). A shard holds a mutex and an
// atomic pointer to its current table, an atomictable.Table: its lookups
// and value updates take no lock, its changes of structure (inserts,
// deletes, rebuilds) are made under the shard mutex; its doc states the
// protocol (slots that never move, the seal, Rebuild) and why a reader's
// compare-and-swap is linearizable.
//
// A slot's value is the entry's TAT. Callers' times must lie in [0, 2^62)
// (GCRA requires < 2^62 anyway). Then every TAT that is stored is > now >=
// 0, so a live value is >= 1 and never has the table's seal bit.
//
// # Why each fast-path outcome is linearizable
//
//   - The CAS of a TAT v → n succeeds: n was computed from v by the GCRA
//     step, and the table's protocol makes the CAS the linearization point.
//   - The step changes nothing (a rejection, cost 0): the load of the
//     unsealed v is the linearization point, by the same argument.
//   - Lookup finds no slot, or the slot is sealed, or a CAS fails and the
//     reload shows a seal or a tombstone: the fast path takes the slow
//     path, which locks the mutex, reloads the table pointer and redoes
//     the whole operation under it. For Peek only, "absent" is answered
//     lock-free if the table pointer is unchanged after the probe (see
//     Lookup).
//
// Under the mutex, every change that is not a GCRA step seals the entry
// first (Retag, Put, Update) or deletes it outright (Delete, a forgiven
// eviction, Take): a fast path whose CAS then fails goes to the slow path,
// and the spend it was making is redone there against a fresh state,
// exactly as if it came after the change. Deleting an idle entry (sweep,
// eviction of an idle entry, idle after a slow-path step) is a
// compare-and-swap from the idle TAT observed: if it fails, a fast path has
// just spent the entry, which is therefore not idle, and is kept.
//
// A rebuild happens only when an insert would pass the load — live +
// tombstones at most 3/4 of the table — doubling if live+1 > half the
// table, else at the same size, so at least a quarter of the table is
// inserted between two rebuilds (amortized O(1)), or when a delete leaves
// the table under 1/8 full. Entries idle at the rebuild's now are dropped
// on the way (a sweep).
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/internal/atomictable"
)

const tombTAT = atomictable.Tomb // a deleted entry's slot

// gshard is one shard: the table pointer read by the fast path on its own
// 64-byte line, the mutex and the slow-path state on the next.
type gshard struct {
	table atomic.Pointer[atomictable.Table]
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
// store, and returns it as a Verdict (two words, with no token count to
// compute). GCRA.Decision gives the whole Decision from it. Safe
// for concurrent use.
func (st *GCRAStore) Allow(key uint64, now int64, g *GCRA, cost int64) Verdict {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	if t := sh.table.Load(); t != nil {
		if e, v := t.Lookup(h); e != nil { // whatever its tag
			for v >= 0 { // live: step it, CAS the change in
				if cost > 0 && cost <= g.burst { // Step's admit path, inlined
					n := satAdd(max(v, now), cost*g.t)
					if used := n - now; used <= g.tau {
						if e.CAS(v, n) {
							return Verdict{Reset: time.Duration(used)}
						}
						v = e.Val()
						continue
					}
				}
				// A rejection or cost <= 0: the state does not change.
				d, _ := g.verdict(v, now, cost)
				return d
			}
			// Sealed, or deleted since: under the mutex.
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
// Its fast path is a copy of Allow's with a check of the tag, so that a
// hit is one function, with no call, in both.
func (st *GCRAStore) AllowTagged(key uint64, tag uint16, now int64, g *GCRA, cost int64) (Verdict, bool) {
	h := keyWord(key)
	sh := &st.shards[h>>st.shardShift]
	if t := sh.table.Load(); t != nil {
		// An entry under another tag goes to the slow path.
		if e, v := t.Lookup(h); e != nil && e.Key() == h|uint64(tag&tagMask) {
			for v >= 0 { // live: step it, CAS the change in
				if cost > 0 && cost <= g.burst { // Step's admit path, inlined
					n := satAdd(max(v, now), cost*g.t)
					if used := n - now; used <= g.tau {
						if e.CAS(v, n) {
							return Verdict{Reset: time.Duration(used)}, true
						}
						v = e.Val()
						continue
					}
				}
				// A rejection or cost <= 0: the state does not change.
				d, _ := g.verdict(v, now, cost)
				return d, true
			}
			// Sealed, or deleted since: under the mutex.
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
	if ok && strict && t.At(i).Key() != h|uint64(tag&tagMask) {
		sh.mu.Unlock()
		return Verdict{}, false
	}
	if ok {
		e := t.At(i)
		for {
			v := e.Val() // unsealed (under the mutex), may still change under fast paths
			d, n := g.verdict(v, now, cost)
			if cost <= 0 {
				n = v // a peek never charges (Step)
			}
			if n <= now { // idle after the step: drop it, as Store does
				if !e.DeleteIf(v) {
					continue
				}
				sh.live--
				sh.tombs++
				st.maybeShrink(sh, t, now)
			} else if n != v && !e.CAS(v, n) {
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
	e := t.At(i)
	from := uint16(e.Key() & tagMask)
	if from == tag&tagMask {
		return true
	}
	v := e.Seal()
	n, ok := fn(from, TAT(v))
	if !ok {
		e.Set(v)
		return false
	}
	e.SetKey(h | uint64(tag&tagMask))
	if int64(n) > now && n > 0 {
		e.Set(int64(n))
		return true
	}
	e.Set(tombTAT)
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
	if e, v := t.Lookup(h); e != nil {
		if v >= 0 {
			return TAT(v), uint16(e.Key() & tagMask), true
		}
		// Sealed: under the mutex.
	} else if sh.table.Load() == t {
		return 0, 0, false
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t = sh.table.Load()
	i, ok := st.find(t, h)
	if !ok {
		return 0, 0, false
	}
	e := t.At(i)
	v := e.Val()
	if v < 0 {
		return 0, 0, false
	}
	return TAT(v), uint16(e.Key() & tagMask), true
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
	e := t.At(i)
	tag := uint16(e.Key() & tagMask)
	v := e.Delete() // a fast path's CAS then fails
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
		e := t.At(i)
		e.Seal()
		e.SetKey(h | uint64(tag&tagMask))
		if int64(tat) > now && tat > 0 {
			e.Set(int64(tat))
			return
		}
		e.Set(tombTAT)
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
	e := t.At(i)
	v := e.Seal() // freeze it against fast paths
	sealed := true
	defer func() {
		if sealed { // fn panicked: restore the entry
			e.Set(v)
		}
	}()
	s := TAT(v)
	fn(&s)
	sealed = false
	if int64(s) > now && s > 0 {
		e.Set(int64(s))
		return
	}
	e.Set(tombTAT)
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
		t.At(i).Set(tombTAT)
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
			s.Slots += t.Size()
		}
		sh.evictions.addTo(&s, true)
		sh.mu.Unlock()
	}
	return s
}

// find probes t for h under the shard mutex. It returns the index of h's
// live slot, or the empty slot where probing stopped (-1 if there is no
// table).
func (st *GCRAStore) find(t *atomictable.Table, h uint64) (int, bool) {
	if t == nil {
		return -1, false
	}
	return t.Find(h)
}

// insert adds h with TAT v at the empty slot at (-1 if t is nil), under the
// shard mutex. It evicts at the cap, rebuilds when live+tombs would pass 3/4
// of the table, and advances the sweep hand.
func (st *GCRAStore) insert(sh *gshard, t *atomictable.Table, h uint64, at int, v, now int64) {
	moved := false
	if sh.live >= st.perShard {
		if st.perShard == 0 {
			return
		}
		st.evict(sh, t, now)
		moved = true
	}
	if t == nil || (sh.live+sh.tombs+1)*4 > t.Size()*3 {
		n := minSlots
		if t != nil {
			n = t.Size()
			if (sh.live+1)*2 > n { // else same size: purge tombstones only
				n *= 2
			}
		}
		t = st.rebuild(sh, t, n, now)
		at, _ = st.find(t, h)
		moved = true
	}
	t.Insert(at, h, v)
	sh.live++
	if !moved {
		st.sweep(sh, t, now, sweepStep)
	}
}

// sweep examines n slots at the hand and tombstones the idle entries.
func (st *GCRAStore) sweep(sh *gshard, t *atomictable.Table, now int64, n int) {
	mask := t.Size() - 1
	for ; n > 0; n-- {
		i := sh.hand & mask
		if e := t.At(i); e.Key() != 0 {
			if v := e.Val(); v >= 0 && v <= now && e.DeleteIf(v) {
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
func (st *GCRAStore) evict(sh *gshard, t *atomictable.Table, now int64) {
	mask := t.Size() - 1
	victim := -1
	var vtat int64
	for n := 0; n < capScan || victim < 0; n++ {
		i := (sh.hand + n) & mask
		e := t.At(i)
		if e.Key() == 0 {
			continue
		}
		v := e.Val()
		if v < 0 {
			continue // tombstone
		}
		if v <= now && e.DeleteIf(v) {
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
	v := t.At(victim).Delete()
	sh.live--
	sh.tombs++
	sh.forgive(v - now)
}

// maybeShrink rebuilds the table smaller when it is under 1/8 full.
func (st *GCRAStore) maybeShrink(sh *gshard, t *atomictable.Table, now int64) {
	if t == nil || t.Size() <= minSlots || sh.live*8 >= t.Size() {
		return
	}
	n := minSlots
	for n < sh.live*2 {
		n *= 2
	}
	st.rebuild(sh, t, n, now)
}

// rebuild copies the live entries of old (nil: none) into a new table of n
// slots (a power of two) and publishes it (atomictable's Rebuild). Entries
// idle at now are dropped on the way and counted as swept. It resets the
// sweep hand and the tombstone count. Under the shard mutex.
func (st *GCRAStore) rebuild(sh *gshard, old *atomictable.Table, n int, now int64) *atomictable.Table {
	var nt *atomictable.Table
	if old == nil {
		nt = atomictable.New(n, st.shardBits, tagMask)
	} else {
		nt = old.Rebuild(n, func(v int64) bool {
			if v <= now { // idle: drop it like the sweep would
				sh.live--
				sh.swept++
				return false
			}
			return true
		})
	}
	sh.tombs = 0
	sh.hand = 0
	sh.table.Store(nt)
	return nt
}
