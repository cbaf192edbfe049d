package bucket_test

import (
	"fmt"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// A rule of 100 per minute with a burst of 20: 20 pass at once, the 21st is
// told to come back in 600 ms, and then one passes every 600 ms.
func ExampleGCRA() {
	rule, err := bucket.NewGCRA(100, time.Minute, 20)
	if err != nil {
		panic(err)
	}
	var s bucket.TAT // zero value: a full bucket
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	passed := 0
	for i := 0; i < 20; i++ {
		if rule.Step(&s, now, 1).Allowed {
			passed++
		}
	}
	d := rule.Step(&s, now, 1)
	fmt.Println("passed at once:", passed)
	fmt.Println("21st allowed:", d.Allowed, "retry after:", d.RetryAfter)
	now += int64(d.RetryAfter)
	d = rule.Step(&s, now, 1)
	fmt.Println("after 600ms:", d.Allowed, "remaining:", d.Remaining, "reset:", d.Reset)
	// Output:
	// passed at once: 20
	// 21st allowed: false retry after: 600ms
	// after 600ms: true remaining: 0 reset: 12s
}

// The keyed store: hash the (rule, identity) pair, Apply with the time.
func ExampleStore() {
	rule, _ := bucket.NewGCRA(2, time.Second, 2) // 2/s, burst 2
	store, err := bucket.NewStore[bucket.TAT](bucket.StoreConfig{MaxKeys: 1000})
	if err != nil {
		panic(err)
	}
	h := bucket.NewSeededHasher(42)
	ruleID := h.Sum("rule:/search")
	now := int64(time.Hour)
	for _, id := range []string{"alice", "alice", "alice", "bob"} {
		d := store.Apply(bucket.Mix(ruleID, h.Sum(id)), now, &rule, 1)
		fmt.Printf("%s allowed=%v remaining=%d retry=%v\n", id, d.Allowed, d.Remaining, d.RetryAfter)
	}
	fmt.Println("live keys:", store.Stats().Live)
	// Both buckets are full again a second later: the entries are idle and
	// the next inserts sweep them away.
	// Output:
	// alice allowed=true remaining=1 retry=0s
	// alice allowed=true remaining=0 retry=0s
	// alice allowed=false remaining=0 retry=500ms
	// bob allowed=true remaining=1 retry=0s
	// live keys: 2
}
