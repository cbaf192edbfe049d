package shell

import (
	"sync/atomic"

	"github.com/weir-dev/weir/cluster"

	"github.com/weir-dev/weir/bucket"
)

// rejSlots is how many identities a shard's reject cache holds: a hot
// identity needs one slot, and a few hundred rejected identities per shard
// at once is already an attack spread thin.
const rejSlots = 256

// rejCache lets a shard answer a request that its coordinator's view
// rejects without taking the shard's mutex. Under abuse the rejections are
// the hot path: an identity hammered on every node is rejected millions of
// times a second by nodes that are not its owner, each time by the same
// arithmetic on the same state (Coordinator.Decide's view).
//
// After a view rejection the Node stores, under the shard's mutex, the
// state behind it (ViewReject) with the shard's generation. Every change to
// the coordinator's state other than Decide (Step, Tick, SetTable,
// SetRules, Refund, SetPeerDown, FlushAll, HandoffAll) bumps the
// generation under the same mutex before it changes anything, and so does
// a Decide that dropped an entry (the key cap): a Decide that admits or
// forwards only makes the view stricter. A lookup that finds its identity's
// entry of the current generation therefore decides the request as Decide
// would at that moment (ViewReject.Reject), or misses and takes the mutex.
type rejCache struct {
	gen   atomic.Uint64
	slots [rejSlots]atomic.Pointer[rejEntry]
}

// rejEntry is one cached view rejection: immutable once stored.
type rejEntry struct {
	gen uint64
	v   cluster.ViewReject
}

// slot returns the slot of the identity whose shard hash is h (its high
// bits chose the shard; the low ones choose the slot).
func (rc *rejCache) slot(h uint64) *atomic.Pointer[rejEntry] {
	return &rc.slots[h%rejSlots]
}

// lookup decides a request from the cache: ok is false when it cannot.
func (rc *rejCache) lookup(h uint64, now int64, ruleID, identity string, cost int64) (bucket.Decision, bool) {
	e := rc.slot(h).Load()
	if e == nil || e.gen != rc.gen.Load() || e.v.Rule != ruleID || e.v.Identity != identity {
		return bucket.Decision{}, false
	}
	return e.v.Reject(now, cost)
}

// store caches v as of the current generation. The caller holds the
// shard's mutex.
func (rc *rejCache) store(h uint64, v cluster.ViewReject) {
	rc.slot(h).Store(&rejEntry{gen: rc.gen.Load(), v: v})
}

// forget empties the slot of h if it holds the rule's identity. The caller
// holds the shard's mutex.
func (rc *rejCache) forget(h uint64, ruleID, identity string) {
	sl := rc.slot(h)
	if e := sl.Load(); e != nil && e.v.Rule == ruleID && e.v.Identity == identity {
		sl.Store(nil)
	}
}

// invalidate makes every cached rejection stale. The caller holds the
// shard's mutex and calls it before changing the coordinator.
func (rc *rejCache) invalidate() { rc.gen.Add(1) }
