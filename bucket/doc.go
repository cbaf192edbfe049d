// Package bucket holds weir's rate-limiting algorithms as pure step machines
// and the sharded, keyed state store that applies them.
//
// Nothing in this package reads a clock, starts a goroutine or touches the
// network: every method takes the caller's time as now, an int64 count of
// nanoseconds on any epoch (time.Now().UnixNano() in production, a virtual
// clock in the simulator). Same inputs, same outputs.
//
// # Algorithms
//
// Each algorithm is a small value type built by a constructor that validates
// its parameters (GCRA, FixedWindow, SlidingWindow, SlidingLog, Leaky,
// Concurrency, Penalty) and works on a per-key state type whose zero value
// means "no entry": a full bucket, an empty window. A state type's Idle method
// reports when the state is back to that zero meaning, so the store can drop
// it; expiry needs no cleanup job.
//
// # The usage loop
//
//	rule, err := bucket.NewGCRA(100, time.Minute, 20) // 100/min, burst 20
//	store, err := bucket.NewStore[bucket.TAT](bucket.StoreConfig{})
//	hasher := bucket.NewHasher()
//	...
//	// per request:
//	key := bucket.Mix(ruleID, hasher.Sum(apiKey)) // (rule, identity) pair
//	d := store.Apply(key, time.Now().UnixNano(), &rule, cost)
//	if !d.Allowed {
//		// 429 with Retry-After d.RetryAfter; X-RateLimit-* from d.Limit,
//		// d.Remaining, d.Reset.
//	}
//
// Store.Apply finds or inserts the key's state, steps the algorithm on it
// under the shard lock and returns the Decision by value; for a key already
// present it allocates nothing. Rule changes need no store migration as long
// as the state type is the same: the next Apply uses the new parameters.
//
// # The GCRA store
//
// GCRAStore is the store specialised for the default algorithm: one int64
// per key, and for a key already present no lock at all, only a
// compare-and-swap on the key's TAT (inserts, sweeps and rebuilds still take
// the shard's mutex). Its decisions are identical to Store[TAT]'s, which a
// differential test checks; use it for GCRA rules on the hot path.
//
//	store, err := bucket.NewGCRAStore(bucket.StoreConfig{})
//	d := store.Apply(key, now, &rule, cost)
package bucket
