package weir

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/weir-dev/weir/cluster"
)

// algoModelRules are one rule of every algorithm the cluster decides in mode
// exact, each on its own path: 20 per second (a leaky queue of 20 per
// second with its default positions), and 5 in flight.
const algoModelRules = `
rules:
  - {id: m-fixed, match: {prefix: /fixed}, key: [header:X-API-Key], algorithm: fixed_window, limit: 20, window: 1s, mode: exact}
  - {id: m-sliding, match: {prefix: /sliding}, key: [header:X-API-Key], algorithm: sliding_window, limit: 20, window: 1s, mode: exact}
  - {id: m-log, match: {prefix: /log}, key: [header:X-API-Key], algorithm: sliding_log, limit: 20, window: 1s, mode: exact}
  - {id: m-leaky, match: {prefix: /leaky}, key: [header:X-API-Key], algorithm: leaky_bucket, limit: 20, window: 1s, burst: 20, mode: exact}
  - {id: m-conc, match: {prefix: /conc}, key: [header:X-API-Key], algorithm: concurrency, limit: 5, window: 1m, mode: exact}
`

// TestModelClusterAlgorithms is the model test's part for the algorithms
// other than gcra: a 3-node cluster in one process (real memberlist and
// gRPC on 127.0.0.1, one shared clock) takes random sequences of bursts of
// one to twelve concurrent callers for one of two identities, one of the
// five rules and a random node, with random pauses. A network makes the
// interleaving random, so each admission is known to have been decided
// somewhere in [sent, done] of the shared clock, and the region is held to
// what one instance of the algorithm allows over every set of admissions
// that certainly lie in one span:
//
//   - fixed_window: at most 20 in an aligned second;
//   - sliding_window: at most 20 in an aligned second, 2·20 − 1 in any second;
//   - sliding_log: at most 20 in any second;
//   - leaky_bucket: at most Q + r·Δ in any span Δ, Q the queue's positions
//     (every admission takes a position that drains at r);
//   - concurrency: at most 5 in flight across the nodes, counted at every
//     admission (each admitted request is held 5–30 ms, then released).
//
// No decision may be degraded. Per node each would admit three times as
// much.
func TestModelClusterAlgorithms(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	c := startClusterWith(t, fmt.Sprintf("model-algos-%d", time.Now().UnixNano()), algoModelRules, 3, 3)
	checks := "5"
	if os.Getenv("WEIR_MODEL") == "long" {
		checks = "50"
	}
	setRapidFlag(t, "rapid.checks", checks)
	setRapidFlag(t, "rapid.steps", "12")
	setRapidFlag(t, "rapid.nofailfile", "true")
	paths := []string{"/fixed", "/sliding", "/log", "/leaky", "/conc"}
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		var mu sync.Mutex
		sends := map[string][]accSend{} // by path and identity
		inFlight, most := map[string]int{}, map[string]int{}
		rt.Repeat(map[string]func(*rapid.T){
			"burst": func(rt *rapid.T) {
				node := rapid.IntRange(0, 2).Draw(rt, "node")
				id := fmt.Sprintf("algo-%d-%d", run, rapid.IntRange(0, 1).Draw(rt, "identity"))
				path := rapid.SampledFrom(paths).Draw(rt, "path")
				callers := rapid.IntRange(1, 12).Draw(rt, "callers")
				key := path + " " + id
				var wg sync.WaitGroup
				for k := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						d := c.nodes[node].Allow(context.Background(), Request{Method: "GET", Path: path, Header: http.Header{"X-Api-Key": {id}}})
						s := accSend{node: node, sent: d.At.UnixNano(), done: c.now(), allowed: d.Allowed, degraded: d.Degraded, err: d.Err}
						mu.Lock()
						sends[key] = append(sends[key], s)
						if d.Allowed && path == "/conc" {
							inFlight[key]++
							most[key] = max(most[key], inFlight[key])
						}
						mu.Unlock()
						if d.Allowed && path == "/conc" {
							time.Sleep(time.Duration(5+5*(k%6)) * time.Millisecond)
							mu.Lock()
							inFlight[key]-- // uncounted before the release
							mu.Unlock()
						}
						d.Done()
					}()
				}
				wg.Wait()
				rt.Logf("%d callers for %s on gw-%d", callers, key, node)
			},
			"pause": func(rt *rapid.T) {
				d := rapid.SampledFrom([]time.Duration{time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond}).Draw(rt, "pause")
				time.Sleep(d)
				rt.Logf("pause %v", d)
			},
		})
		for _, key := range slices.Sorted(maps.Keys(sends)) {
			ss := sends[key]
			for _, s := range ss {
				if s.degraded || s.err != nil {
					rt.Fatalf("%s: a degraded decision (err %v) in a run with no fault", key, s.err)
				}
			}
			if strings.HasPrefix(key, "/conc ") {
				if most[key] > 5 {
					rt.Fatalf("%s: %d requests in flight across the nodes, limit 5", key, most[key])
				}
				continue
			}
			if err := checkAlgorithm(key, admitted(ss), c.accRule); err != "" {
				rt.Fatal(err)
			}
		}
	})
}

// checkAlgorithm holds the admissions of key (path and identity), sorted by
// send time here, to what one instance of its rule's algorithm allows; ""
// when they pass.
func checkAlgorithm(key string, adm []accAdmit, rule func(string) cluster.RuleParams) string {
	slices.SortFunc(adm, func(a, b accAdmit) int { return cmp.Compare(a.sent, b.sent) })
	const limit, w = 20, int64(time.Second)
	// within counts the admissions whose [sent, done] lie in [from, to).
	within := func(from, to int64) int {
		n := 0
		for _, a := range adm {
			if a.sent >= from && a.done < to {
				n++
			}
		}
		return n
	}
	aligned := func() string {
		for _, a := range adm {
			if start := a.sent / w * w; within(start, start+w) > limit {
				return fmt.Sprintf("%s: %d admitted in the aligned second from %d, more than %d", key, within(start, start+w), start, limit)
			}
		}
		return ""
	}
	anySecond := func(most int) string {
		for _, a := range adm {
			if n := within(a.sent, a.sent+w); n > most {
				return fmt.Sprintf("%s: %d admitted within a second from %d, more than %d", key, n, a.sent, most)
			}
		}
		return ""
	}
	switch {
	case strings.HasPrefix(key, "/fixed "):
		return aligned()
	case strings.HasPrefix(key, "/sliding "):
		return cmp.Or(aligned(), anySecond(2*limit-1))
	case strings.HasPrefix(key, "/log "):
		return anySecond(limit)
	case strings.HasPrefix(key, "/leaky "):
		p := rule("m-leaky")
		if up, from, to := worstExcessAt(adm, float64(p.Limit)/float64(p.Window.Nanoseconds())); up > float64(p.Burst)+1e-6 {
			return fmt.Sprintf("%s: %d admissions; the excess over r·Δ is %.2f between %d and %d, above the queue's %d positions", key, len(adm), up, from, to, p.Burst)
		}
	}
	return ""
}
