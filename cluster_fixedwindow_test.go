package weir

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/quota"
)

// A fixed_window rule in mode exact on a real 3-node cluster (memberlist
// and gRPC on loopback): the identity's owner counts the window, so a
// client that saturates every node is admitted exactly the limit per
// window summed over the nodes (docs/cluster.md, "exact"), not nodes × the limit.

// fwRules: 20 per 1 s aligned windows: a window far above a forwarded
// round trip even under -race on a loaded machine, so that each admission's
// window is known.
const fwRules = `
rules:
  - id: fw-exact
    match: {prefix: /fw}
    key: [header:X-API-Key]
    algorithm: fixed_window
    limit: 20
    window: 1s
    mode: exact
`

const (
	fwLimit  = 20
	fwWindow = time.Second
	// ownerPause paces the owner's callers (saturate): two of them offer
	// 100 per window, five times the limit.
	ownerPause = 20 * time.Millisecond
)

// startFWCluster starts n nodes with rules on one shared clock and waits
// until their rings hold all of them and have settled; every node is closed
// and checked for leaked goroutines when the test ends. The nodes use LAN
// timing, as the cluster benchmarks do: these tests saturate both cores
// (under -race, beside other packages' tests), and the local profile's
// 50ms probe timeout then declares busy nodes dead.
func startFWCluster(t *testing.T, label, rules string, n int) *accCluster {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		// memberlist's Shutdown does not wait for a probe in flight,
		// which with LAN timing may run a probe interval (1s) more.
		deadline := time.Now().Add(5 * time.Second)
		for goleak.Find(ignore) != nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		goleak.VerifyNone(t, ignore)
	})
	rs, err := quota.Parse("fw.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	c := &accCluster{t: t, label: label, rules: rs, clock: sharedClock(), nodes: make([]*Node, n), addrs: make([]string, n)}
	c.now = clockNanos(c.clock)
	t.Cleanup(func() {
		for _, node := range c.nodes {
			if node != nil {
				node.Close()
			}
		}
	})
	for i := range n {
		cc := &ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", Label: label,
			DecideTimeout: accTimeout, CallTimeout: accTimeout}
		if i > 0 {
			cc.Join = []string{c.nodes[0].gossipAddr()}
		}
		node, err := New(Config{Rules: rs, Cluster: cc, Clock: c.clock})
		if err != nil {
			t.Fatalf("start gw-%d: %v", i, err)
		}
		c.nodes[i], c.addrs[i] = node, node.gossipAddr()
	}
	c.waitMembers(c.live()...)
	c.settle()
	return c
}

// fwRun is what a saturating run saw: by the end of the owner's window
// they were counted in, the admissions whose window is known (certain,
// with the node each came through) and the rejections whose window is
// known, and the admissions whose round trip spanned more than one window
// boundary (unsure: each with the first and last window end it may have
// been counted in).
type fwRun struct {
	certain  map[int64][]int
	rejected map[int64]int // rejections of certain window
	unsure   [][2]int64
	sent     [3]int // answered requests per node
	degraded int
}

// windowEnds returns the first and last aligned window end that the
// owner's window of a request may have: sent at sent, answered at done,
// with reset (the owner's window end minus its now, from the rule's
// result). The owner decided it between sent and done, so its window ends
// in [sent+reset, done+reset], on a multiple of the window: one, unless
// the round trip was longer than a window.
func windowEnds(sent, done int64, reset time.Duration) (first, last int64) {
	w := int64(fwWindow)
	lo, hi := sent+int64(reset), done+int64(reset)
	return (lo + w - 1) / w * w, hi / w * w
}

// saturate sends requests for id from workers callers on every node for
// dur, each as soon as its previous one is answered, except the owner's,
// which pause ownerPause between requests: the owner answers its own at
// once, and unpaced it would fill every window before a forwarded request
// arrived (the rule would still hold, but the run would not show the
// other nodes' admissions counted in the same window). Its callers alone
// still offer more than the limit per window.
func saturate(c *accCluster, id string, workers int, dur time.Duration,
	allow func(ctx context.Context, node *Node, id string) (ok bool, reset time.Duration, degraded bool, at int64)) fwRun {
	var mu sync.Mutex
	run := fwRun{certain: map[int64][]int{}, rejected: map[int64]int{}}
	var wg sync.WaitGroup
	stop := time.Now().Add(dur)
	owner := c.ring(0).OwnerName(id)
	for i, node := range c.nodes {
		pause := time.Duration(0)
		if fmt.Sprintf("gw-%d", i) == owner {
			pause = ownerPause
		}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					time.Sleep(pause)
					ok, reset, deg, at := allow(context.Background(), node, id)
					done := c.now()
					mu.Lock()
					run.sent[i]++
					if deg {
						run.degraded++
					}
					switch first, last := windowEnds(at, done, reset); {
					case ok && first == last:
						run.certain[first] = append(run.certain[first], i)
					case ok:
						run.unsure = append(run.unsure, [2]int64{first, last})
					case first == last:
						run.rejected[first]++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return run
}

// check asserts at most fwLimit admissions in every window, and exactly
// fwLimit in every window the limit was reached in (a request was rejected
// in it: a cost-1 request is rejected only when the window holds the
// limit), counting an admission of unsure window toward each window it may
// belong to for that lower bound only; that the limit was reached in at
// least two windows (the run saturates); and that requests went through
// every node (per node, each would admit the limit on its own).
func (run fwRun) check(t *testing.T, nodes int) {
	t.Helper()
	var ends []int64
	for end := range run.certain {
		ends = append(ends, end)
	}
	for end := range run.rejected {
		if len(run.certain[end]) == 0 {
			ends = append(ends, end)
		}
	}
	slices.Sort(ends)
	through := map[int]bool{}
	reached := 0
	total := len(run.unsure)
	for _, end := range ends {
		got := len(run.certain[end])
		total += got
		unsure := 0
		for _, u := range run.unsure {
			if u[0] <= end && end <= u[1] {
				unsure++
			}
		}
		for _, n := range run.certain[end] {
			through[n] = true
		}
		t.Logf("window ending %d: %d admitted (%d unsure), %d rejected", end, got, unsure, run.rejected[end])
		if got > fwLimit {
			t.Errorf("window ending %d: %d admitted over all nodes, more than the limit %d", end, got, fwLimit)
		}
		if run.rejected[end] > 0 {
			reached++
			if got+unsure < fwLimit {
				t.Errorf("window ending %d: the limit was reached (a request was rejected), yet %d admitted over all nodes (%d unsure), want exactly %d", end, got, unsure, fwLimit)
			}
		}
	}
	if len(ends) > 0 {
		if windows := int((ends[len(ends)-1]-ends[0])/int64(fwWindow)) + 1; total > windows*fwLimit {
			t.Errorf("%d admitted in %d windows, more than %d each", total, windows, fwLimit)
		}
	}
	if reached < 2 {
		t.Errorf("the limit was reached in %d windows, want at least 2: the run does not saturate", reached)
	}
	t.Logf("requests answered per node %v; admissions came through %d node(s)", run.sent, len(through))
	for i, n := range run.sent[:nodes] {
		if n == 0 {
			t.Errorf("no request went through gw-%d: the test does not spread the load", i)
		}
	}
	if run.degraded != 0 {
		t.Errorf("%d degraded decisions with no fault", run.degraded)
	}
}

// fwAllow decides one request of id on node through Allow: whether it was
// admitted, the fixed-window rule's reset, whether it was degraded, and
// its send time.
func fwAllow(t *testing.T) func(ctx context.Context, node *Node, id string) (bool, time.Duration, bool, int64) {
	return func(ctx context.Context, node *Node, id string) (bool, time.Duration, bool, int64) {
		d := node.Allow(ctx, Request{Method: "GET", Path: "/fw", Header: http.Header{"X-Api-Key": {id}}})
		if d.Err != nil {
			t.Errorf("allow: %v", d.Err)
		}
		var reset time.Duration
		for _, r := range d.Results() {
			if r.Rule == "fw-exact" {
				reset = r.Reset
			}
		}
		return d.Allowed, reset, d.Degraded, d.At.UnixNano()
	}
}

// TestClusterFixedWindowExact: 3 nodes, two saturating callers on each,
// one identity under a 20-per-second fixed window in mode exact: every
// window admits at most 20 summed over the nodes (per node it would be up
// to 60), and exactly 20 when the limit was reached in it.
func TestClusterFixedWindowExact(t *testing.T) {
	c := startFWCluster(t, fmt.Sprintf("weir-fw-%d", time.Now().UnixNano()), fwRules, 3)
	var run fwRun
	c.stableRun(c.live(), func() {
		run = saturate(c, "tenant-fw", 2, 3*fwWindow+fwWindow/2, fwAllow(t))
	})
	run.check(t, 3)
	if fo := c.failOpen("fw-exact"); fo != 0 {
		t.Errorf("%d fail-open decisions counted with no fault", fo)
	}

	// The identity look-up on a non-owner asks the owner: a spent window
	// says when it ends and that a request may come back then.
	id := "tenant-fw-lookup"
	owner := c.ring(0).OwnerName(id)
	var ownerNode, other *Node
	for i, node := range c.nodes {
		if fmt.Sprintf("gw-%d", i) == owner {
			ownerNode = node
		} else {
			other = node
		}
	}
	var rep IdentityReport
	// A window may end between spending it and the look-up: then again.
	for attempt := 0; attempt < 5; attempt++ {
		for {
			d := ownerNode.Allow(context.Background(), Request{Method: "GET", Path: "/fw", Header: http.Header{"X-Api-Key": {id}}})
			if !d.Allowed {
				break
			}
		}
		var err error
		rep, err = other.lookupIdentity(context.Background(), id, IdentityQuery{})
		if err != nil || len(rep.Rules) != 1 {
			t.Fatalf("LookupIdentity on a non-owner: %+v, %v", rep, err)
		}
		if rep.Rules[0].Bucket.Remaining == 0 {
			break
		}
	}
	b := rep.Rules[0].Bucket
	if b.Remaining != 0 || b.ResetAfterMS <= 0 || b.ResetAfterMS > fwWindow.Milliseconds() || b.RetryAfterMS != b.ResetAfterMS {
		t.Errorf("a spent fixed window looked up through a non-owner: %+v; want remaining 0 and retry after = reset after, within the window", b)
	}
}

// lkRules: a leaky bucket of 20 per second (one every 50ms) queueing at
// most 250ms (6 positions), in mode exact.
const lkRules = `
rules:
  - id: lk-exact
    match: {prefix: /lk}
    key: [header:X-API-Key]
    algorithm: leaky_bucket
    limit: 20
    window: 1s
    max_delay: 250ms
    mode: exact
`

// TestClusterLeakyExact: 3 nodes, two saturating callers on each, one
// identity under a leaky bucket in mode exact: the owner keeps the one
// queue, so over the run the cluster admits one per 50ms plus the queue's
// 6 positions, not three times that, and every admission's delay (counted
// from its answer) is within max_delay. (TestLeakyForwardedDelay in
// cluster/ checks that a forwarded admission carries the owner's delay.)
func TestClusterLeakyExact(t *testing.T) {
	const T, positions, dur = 50 * time.Millisecond, 6, 1500 * time.Millisecond
	c := startFWCluster(t, fmt.Sprintf("weir-lk-%d", time.Now().UnixNano()), lkRules, 3)
	id := "tenant-lk"
	owner := c.ring(0).OwnerName(id)
	var admitted, degraded, remoteDelayed int
	var answered [3]int
	var first, last int64
	c.stableRun(c.live(), func() {
		var mu sync.Mutex
		admitted, degraded, remoteDelayed, first, last, answered = 0, 0, 0, 0, 0, [3]int{}
		var wg sync.WaitGroup
		stop := time.Now().Add(dur)
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
						d := node.Allow(context.Background(), Request{Method: "GET", Path: "/lk", Header: http.Header{"X-Api-Key": {id}}})
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
							admitted++
							if d.Delay > 250*time.Millisecond {
								t.Errorf("admitted with a delay of %v, over max_delay", d.Delay)
							}
							if d.Delay > 0 && fmt.Sprintf("gw-%d", i) != owner {
								remoteDelayed++
							}
							at := d.At.UnixNano()
							if first == 0 || at < first {
								first = at
							}
							last = max(last, at)
						}
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
	})
	t.Logf("%d admitted over %v (%d through other nodes with a delay); requests answered per node %v", admitted, time.Duration(last-first), remoteDelayed, answered)
	// The owner's queue lets one through per T from the first admission,
	// with at most the positions queued at the end.
	span := time.Duration(last - first)
	if most := positions + int(span/T) + 1; admitted > most {
		t.Errorf("%d admitted over %v: more than one per %v plus %d queued (%d); per node it would be up to 3×", admitted, span, T, positions, most)
	}
	if least := int(span/T) - 1; admitted < least {
		t.Errorf("%d admitted over %v: fewer than one per %v (%d)", admitted, span, T, least)
	}
	for i, n := range answered {
		if n == 0 {
			t.Errorf("no request went through gw-%d: the test does not spread the load", i)
		}
	}
	if degraded != 0 {
		t.Errorf("%d degraded decisions with no fault", degraded)
	}
	if fo := c.failOpen("lk-exact"); fo != 0 {
		t.Errorf("%d fail-open decisions counted with no fault", fo)
	}
}
