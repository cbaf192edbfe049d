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

// ringChangeRules are 5/s with a burst of 5 (one token every 200 ms) in
// both cluster modes, at the default accuracy: ⌊0.05·5 ÷ n⌋ = 0, so no node
// holds slack and every admission of a non-owner waits for the owner.
const ringChangeRules = `
rules:
  - id: ring-shared
    match: {prefix: /shared}
    key: [header:X-API-Key]
    limit: 5
    window: 1s
    burst: 5
    mode: shared
  - id: ring-exact
    match: {prefix: /exact}
    key: [header:X-API-Key]
    limit: 5
    window: 1s
    burst: 5
    mode: exact
`

// ringChangeBursts is how many fresh identities each mode bursts at.
const ringChangeBursts = 100

// TestClusterRingChangeBursts holds DESIGN.md's "No rejection window at a
// ring change": a ring of three nodes forms, and a fourth joins and leaves
// over and over, while fresh identities burst at the nodes right after
// each change, when a new owner has not yet got the previous owner's
// state. Each identity's 5 requests, sent at once, are all admitted (no
// new owner rejects while tokens remain: it has the previous owner decide,
// docs/cluster.md), 100 times in 100 per mode; and the 6th, sent right
// after, is rejected whenever it must be: when it was decided within one
// token's time (200 ms) of the burst and every ring held the same members
// throughout (with views disagreeing, two owners are the split-ownership
// fault term of docs/overshoot.md). No decision is degraded.
func TestClusterRingChangeBursts(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	rules, err := quota.Parse("ring.yaml", []byte(ringChangeRules))
	if err != nil {
		t.Fatal(err)
	}
	c := &accCluster{t: t, label: "ringchange", rules: rules, clock: sharedClock(),
		nodes: make([]*Node, 4), addrs: make([]string, 4)}
	c.now = clockNanos(c.clock)
	t.Cleanup(func() {
		for _, node := range c.nodes {
			if node != nil {
				node.Close()
			}
		}
	})
	paths := map[string]string{"shared": "/shared", "exact": "/exact"}
	modes := []string{"shared", "exact"}
	whole := map[string]int{}
	bursts := map[string]int{}
	sixthAdmitted := map[string]int{}
	sixthChecked := map[string]int{}
	var failures []string
	seq := 0
	// burst sends a fresh identity's 5 requests at once to one live node,
	// then a 6th, and records the outcome.
	burst := func(mode string) {
		live := c.live()
		ni := live[seq%len(live)]
		seq++
		id := fmt.Sprintf("fresh-%s-%d", mode, seq)
		node := c.nodes[ni]
		req := Request{Method: "GET", Path: paths[mode], Header: http.Header{"X-Api-Key": {id}}}
		before := c.views()
		start := c.now()
		var wg sync.WaitGroup
		ds := make([]Decision, 5)
		for k := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ds[k] = node.Allow(context.Background(), req)
			}()
		}
		wg.Wait()
		sixth := node.Allow(context.Background(), req)
		end := c.now()
		after := c.views()
		bursts[mode]++
		n := 0
		for _, d := range ds {
			if d.Degraded || d.Err != nil {
				t.Errorf("%s at gw-%d: a degraded decision (err %v) in a run with no fault", id, ni, d.Err)
			}
			if d.Allowed {
				n++
			}
		}
		if n == 5 {
			whole[mode]++
		} else {
			var why []string
			for _, d := range ds {
				if r, ok := d.Limiting(); ok && !d.Allowed {
					why = append(why, fmt.Sprintf("Remaining=%d RetryAfter=%v", r.Remaining, r.RetryAfter))
				}
			}
			failures = append(failures, fmt.Sprintf("%s at gw-%d: %d of 5 admitted (%s)", id, ni, n, why))
		}
		if stable := slices.Equal(before, after) && agree(after); stable && n == 5 && end-start < int64(200*time.Millisecond) {
			sixthChecked[mode]++
			if sixth.Allowed {
				sixthAdmitted[mode]++
				failures = append(failures, fmt.Sprintf("%s at gw-%d: a 6th request admitted %v after the burst's start, rings unchanged", id, ni, time.Duration(end-start)))
			}
		}
	}
	// Each change is followed by bursts in both modes while the new owners
	// wait for their handoffs.
	after := func(per int) {
		for range per {
			for _, m := range modes {
				if bursts[m] < ringChangeBursts {
					burst(m)
				}
			}
		}
	}
	const per = 4
	for i := range 3 {
		c.start(i, "127.0.0.1:0")
		after(per)
	}
	for cycle := 0; bursts["shared"] < ringChangeBursts || bursts["exact"] < ringChangeBursts; cycle++ {
		if cycle == 40 {
			t.Fatalf("after %d join and leave cycles only %v bursts were sent", cycle, bursts)
		}
		c.start(3, "127.0.0.1:0")
		after(per)
		if err := c.nodes[3].Close(); err != nil {
			t.Fatalf("gw-3 leaving: %v", err)
		}
		c.nodes[3] = nil
		after(per)
	}
	for _, f := range failures {
		t.Error(f)
	}
	for _, m := range modes {
		t.Logf("%s: a fresh burst of 5 admitted whole %d times in %d; the 6th checked %d times, admitted %d", m, whole[m], bursts[m], sixthChecked[m], sixthAdmitted[m])
		if whole[m] != bursts[m] {
			t.Errorf("%s: a fresh identity's burst of 5 was admitted whole %d times in %d, want every time", m, whole[m], bursts[m])
		}
	}
	for _, i := range c.live() {
		for _, rc := range c.nodes[i].Counts() {
			if rc.FailOpen != 0 {
				t.Errorf("gw-%d: rule %s: %d fail-open decisions in a run with no fault", i, rc.Rule, rc.FailOpen)
			}
		}
	}
}

// views returns every live node's ring members, joined, in node order.
func (c *accCluster) views() []string {
	var out []string
	for _, i := range c.live() {
		out = append(out, fmt.Sprint(c.nodes[i].Members()))
	}
	return out
}

// agree reports whether every view in views is the same.
func agree(views []string) bool {
	for _, v := range views {
		if v != views[0] {
			return false
		}
	}
	return true
}
