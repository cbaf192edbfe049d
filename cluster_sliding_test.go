package weir

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"
)

// sliding_window and sliding_log rules in mode exact on a real 3-node
// cluster (memberlist and gRPC on loopback): the identity's owner holds the
// counter or the log, so a client that saturates every node is admitted
// what one counter or one log admits, summed over the nodes, not nodes ×
// the limit.

const slidingRules = `
rules:
  - id: sw-exact
    match: {prefix: /sw}
    key: [header:X-API-Key]
    algorithm: sliding_window
    limit: 20
    window: 1s
    mode: exact
  - id: log-exact
    match: {prefix: /log}
    key: [header:X-API-Key]
    algorithm: sliding_log
    limit: 20
    window: 1s
    mode: exact
`

// slidingAdmit is one admission a caller saw: the owner decided it at some
// instant in [sent, done] of the cluster's shared clock.
type slidingAdmit struct{ sent, done int64 }

// TestClusterSlidingExact: 3 nodes, two saturating callers on each, one
// identity under each algorithm with 20 per second in mode exact.
//
//   - sliding_log: any admissions whose owner decision times all lie within
//     one second are at most 20 (per node it would be up to 60). An
//     admission's decision time is somewhere in its [sent, done], so every
//     set of admissions whose [sent, done] fit in a span of one second is
//     checked.
//   - sliding_window: at most 20 in each aligned window (the counter's Cur),
//     by the same rule, and at most 2·20 − 1 in any span of one second.
//
// Both admit at least the limit per window less one window's worth over
// the run: the load is spread, but the owner decides as one.
func TestClusterSlidingExact(t *testing.T) {
	const limit, w = 20, int64(time.Second)
	c := startFWCluster(t, fmt.Sprintf("weir-sw-%d", time.Now().UnixNano()), slidingRules, 3)
	for _, tc := range []struct{ path, rule, id string }{{"/sw", "sw-exact", "tenant-sw"}, {"/log", "log-exact", "tenant-log"}} {
		t.Run(tc.rule, func(t *testing.T) {
			owner := c.ring(0).OwnerName(tc.id)
			var admits []slidingAdmit
			var answered [3]int
			degraded := 0
			c.stableRun(c.live(), func() {
				var mu sync.Mutex
				admits, answered, degraded = nil, [3]int{}, 0
				var wg sync.WaitGroup
				stop := time.Now().Add(2500 * time.Millisecond)
				for i, node := range c.nodes {
					pause := time.Duration(0)
					if fmt.Sprintf("gw-%d", i) == owner {
						pause = ownerPause // see saturate
					}
					for range 2 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for time.Now().Before(stop) {
								time.Sleep(pause)
								sent := c.now()
								d := node.Allow(context.Background(), Request{Method: "GET", Path: tc.path, Header: http.Header{"X-Api-Key": {tc.id}}})
								done := c.now()
								if d.Err != nil {
									t.Errorf("allow: %v", d.Err)
									return
								}
								mu.Lock()
								answered[i]++
								if d.Degraded {
									degraded++
								}
								if d.Allowed {
									admits = append(admits, slidingAdmit{sent, done})
								}
								mu.Unlock()
							}
						}()
					}
				}
				wg.Wait()
			})
			slices.SortFunc(admits, func(a, b slidingAdmit) int { return int(a.sent - b.sent) })
			// within counts the admissions whose [sent, done] lie in
			// [from, to).
			within := func(from, to int64) int {
				n := 0
				for _, a := range admits {
					if a.sent >= from && a.done < to {
						n++
					}
				}
				return n
			}
			worst := 0
			for _, a := range admits {
				worst = max(worst, within(a.sent, a.sent+w))
			}
			most := limit
			if tc.rule == "sw-exact" {
				most = 2*limit - 1
				for _, a := range admits {
					start := a.sent / w * w
					if n := within(start, start+w); n > limit {
						t.Errorf("aligned window from %d: %d admitted over all nodes, more than the limit %d", start, n, limit)
					}
				}
			}
			if worst > most {
				t.Errorf("%d admitted within one second over all nodes, more than %d (per node it would be up to %d)", worst, most, 3*most)
			}
			span := admits[len(admits)-1].done - admits[0].sent
			if least := int(span/w)*limit - limit; len(admits) < least {
				t.Errorf("%d admitted over %v, fewer than %d", len(admits), time.Duration(span), least)
			}
			t.Logf("%d admitted over %v, at most %d within one second; requests answered per node %v", len(admits), time.Duration(span), worst, answered)
			for i, n := range answered {
				if n == 0 {
					t.Errorf("no request went through gw-%d: the test does not spread the load", i)
				}
			}
			if degraded != 0 {
				t.Errorf("%d degraded decisions with no fault", degraded)
			}
			if fo := c.failOpen(tc.rule); fo != 0 {
				t.Errorf("%d fail-open decisions counted with no fault", fo)
			}
		})
	}
}

// windowRingRules: a window far longer than the test, so that nothing
// counted leaves it: what the cluster admits over the whole test is what
// one state fed every request admits, at most the limit, whatever the ring
// does, unless the state is lost.
const windowRingRules = `
rules:
  - id: fw
    match: {prefix: /fw}
    key: [header:X-API-Key]
    algorithm: fixed_window
    limit: 20
    window: 1h
    mode: exact
  - id: sw
    match: {prefix: /sw}
    key: [header:X-API-Key]
    algorithm: sliding_window
    limit: 20
    window: 1h
    mode: exact
  - id: log
    match: {prefix: /log}
    key: [header:X-API-Key]
    algorithm: sliding_log
    limit: 20
    window: 1h
    mode: exact
  - id: g
    match: {prefix: /g}
    key: [header:X-API-Key]
    limit: 20
    window: 1h
    mode: exact
  - id: lk
    match: {prefix: /lk}
    key: [header:X-API-Key]
    algorithm: leaky_bucket
    limit: 20
    window: 1h
    burst: 20
    mode: exact
  - id: conc
    match: {prefix: /conc}
    key: [header:X-API-Key]
    algorithm: concurrency
    limit: 20
    window: 1h
    mode: exact
`

// TestClusterWindowAlgorithmsRingChange: for each window algorithm in mode
// exact, gcra, a leaky bucket (a queue of 20 positions) and a concurrency
// limit of 20 (no request ends) in mode exact beside them, on a real
// cluster, one identity driven round robin over the live nodes is admitted
// its limit of 20 once in all across a graceful leave of its owner and the
// join of a new node that takes it over (the state is handed over both
// times: no fresh window), and at most the limit once more after a crash of
// the owner (the stated fault term: the lost state, at most L). The
// concurrency limit's slots held by the leaving gateway are freed when it
// leaves: 4 more are admitted after the leave.
func TestClusterWindowAlgorithmsRingChange(t *testing.T) {
	if testing.Short() {
		t.Skip("ring changes of a 3-node cluster")
	}
	const limit = 20
	c := startClusterWith(t, fmt.Sprintf("weir-ring-%d", time.Now().UnixNano()), windowRingRules, 4, 3)
	// An identity gw-1 owns, which gw-3 owns once gw-1 has left and gw-3
	// has joined.
	after, err := cluster.NewRing(1, []cluster.Member{{Name: "gw-0"}, {Name: "gw-2"}, {Name: "gw-3"}})
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for k := 0; id == ""; k++ {
		if cand := fmt.Sprintf("ring-%d", k); c.ring(0).OwnerName(cand) == "gw-1" && after.OwnerName(cand) == "gw-3" {
			id = cand
		}
	}
	paths := [6]string{"/fw", "/sw", "/log", "/g", "/lk", "/conc"}
	// send asks n times per rule, round robin over the live nodes, and
	// returns the admissions of each; a degraded decision or an error
	// fails the test.
	send := func(phase string, n int) (got [6]int) {
		t.Helper()
		live := c.live()
		for k, path := range paths {
			for j := range n {
				node := c.nodes[live[j%len(live)]]
				d := node.Allow(context.Background(), Request{Method: "GET", Path: path, Header: http.Header{"X-Api-Key": {id}}})
				if d.Err != nil || d.Degraded {
					t.Fatalf("%s %s: err %v, degraded %v", phase, path, d.Err, d.Degraded)
				}
				if d.Allowed {
					got[k]++
				}
			}
		}
		t.Logf("%s: admitted %v of %d each (fixed_window, sliding_window, sliding_log, gcra, leaky_bucket, concurrency)", phase, got, n)
		return got
	}
	first := send("before", 12)
	// The owner leaves gracefully: it hands every state to the next owner.
	c.nodes[1].Close()
	c.nodes[1] = nil
	c.waitMembers(0, 2)
	c.settle()
	left := send("after the owner's leave", 30)
	for k, path := range paths {
		want := limit
		if path == "/conc" {
			want += 4 // gw-1's slots (j = 1, 4, 7, 10 of the 12) are freed when it leaves
		}
		if sum := first[k] + left[k]; first[k] != 12 || sum != want {
			t.Errorf("%s: admitted %d, then %d after the owner's leave: %d in all, want 12 first and exactly %d in all",
				path, first[k], left[k], sum, want)
		}
	}
	// gw-3 joins and becomes the identity's owner: the heir hands the
	// states on.
	c.start(3, "127.0.0.1:0")
	c.waitMembers(0, 2, 3)
	c.settle()
	joined := send("after the join", 30)
	for k, path := range paths {
		if joined[k] != 0 {
			t.Errorf("%s: %d admitted after the join, want 0: the limit was spent before it", path, joined[k])
		}
	}
	// The owner crashes: its states are lost, and the next owner admits
	// at most the limit again.
	c.crash(3)
	c.waitMembers(0, 2)
	c.settle()
	crashed := send("after the owner's crash", 30)
	for k, path := range paths {
		if crashed[k] > limit {
			t.Errorf("%s: %d admitted after the owner's crash, more than the lost state's %d", path, crashed[k], limit)
		}
	}
}
