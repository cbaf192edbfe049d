package weir

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
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
