package weir

// The harness of the cluster accuracy tests (cluster_accuracy_test.go):
// a cluster of real nodes on loopback, the load that drives it, and the
// envelope arithmetic the checks use.

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
	"go.uber.org/goleak"
)

// accRules are the rules of these tests: 50 per 250 ms (r = 200/s, one token
// every 5 ms), so a one-second run spans four windows, with a burst of 20.
// Accuracy 0.25 gives each of three nodes a slack of ⌊0.25·50/3⌋ = 4 tokens
// (S = 8 over the two non-owners); exact has no slack.
const accRules = `
rules:
  - id: acc-shared
    match: {prefix: /shared}
    key: [header:X-API-Key]
    limit: 50
    window: 250ms
    burst: 20
    accuracy: 0.25
    mode: shared
  - id: acc-exact
    match: {prefix: /exact}
    key: [header:X-API-Key]
    limit: 50
    window: 250ms
    burst: 20
    accuracy: 0.25
    mode: exact
`

// accTimeout is the clusters' decide and call timeout: generous, because CI
// runs these tests with -race on a loaded 2-core machine (stalls of a
// second or two were seen), and a forwarded decision that timed out would
// be degraded.
const accTimeout = 5 * time.Second

// accWarmup is how long a ring must stay unchanged before an accuracy run:
// after a ring change a new owner has moved identities decided by their
// previous owner (one more hop) until that owner's handoff arrives, for at
// most the handoff timeout.
const accWarmup = cluster.DefaultHandoffTimeout + 100*time.Millisecond

// accCluster is a cluster of real nodes, gw-0 … gw-(n−1), on loopback.
type accCluster struct {
	t     *testing.T
	label string
	rules []quota.Rule
	clock Clock
	now   func() int64
	nodes []*Node  // by index; nil while a node is down
	addrs []string // each node's last gossip address
}

// sharedClock is one monotonic clock for a whole test cluster.
func sharedClock() Clock {
	base := time.Now()
	return func() time.Time { return base.Add(time.Since(base)) }
}

// startAccCluster starts n nodes, in a cluster with room for slots, and
// waits until every one sees all of them and the rings have stopped
// changing. When the test ends it stops every node and checks that none
// left a goroutine behind.
func startAccCluster(t *testing.T, label string, slots, n int) *accCluster {
	t.Helper()
	return startClusterWith(t, label, accRules, slots, n)
}

// startClusterWith is startAccCluster with the rules of the YAML rulesYAML.
func startClusterWith(t *testing.T, label, rulesYAML string, slots, n int) *accCluster {
	t.Helper()
	// Registered first, so it runs last: no goroutine outlives the nodes,
	// crashed ones included.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	rules, err := quota.Parse("acc.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	c := &accCluster{t: t, label: label, rules: rules, clock: sharedClock(),
		nodes: make([]*Node, slots), addrs: make([]string, slots)}
	c.now = clockNanos(c.clock)
	t.Cleanup(func() {
		for _, node := range c.nodes {
			if node != nil {
				node.Close()
			}
		}
	})
	for i := range n {
		c.start(i, "127.0.0.1:0")
	}
	c.waitMembers(c.live()...)
	c.settle()
	return c
}

// start starts node gw-i with its gossip bound to addr, joining a live
// node if there is one.
func (c *accCluster) start(i int, addr string) *Node {
	c.t.Helper()
	cc := &ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: c.label,
		GossipAddr: addr, DecideTimeout: accTimeout, CallTimeout: accTimeout}
	for j, node := range c.nodes {
		if node != nil && j != i {
			cc.Join = []string{node.gossipAddr()}
			break
		}
	}
	node, err := New(Config{Rules: c.rules, Cluster: cc, Clock: c.clock})
	if err != nil && addr != "127.0.0.1:0" {
		// The old address is taken: a new one works too, once the others
		// have forgotten the dead member at the old one.
		c.t.Logf("gw-%d cannot bind %s again (%v): starting on a new port", i, addr, err)
		cc.GossipAddr = "127.0.0.1:0"
		node, err = New(Config{Rules: c.rules, Cluster: cc, Clock: c.clock})
	}
	if err != nil {
		c.t.Fatalf("start gw-%d: %v", i, err)
	}
	c.nodes[i] = node
	c.addrs[i] = node.gossipAddr()
	return node
}

// live returns the indices of the running nodes.
func (c *accCluster) live() []int {
	var out []int
	for i, node := range c.nodes {
		if node != nil {
			out = append(out, i)
		}
	}
	return out
}

// waitMembers waits until every node in idx has exactly the nodes in idx in
// its ring.
func (c *accCluster) waitMembers(idx ...int) {
	c.t.Helper()
	var want []string
	for _, i := range idx {
		want = append(want, fmt.Sprintf("gw-%d", i))
	}
	slices.Sort(want)
	accWait(c.t, 10*time.Second, func() bool {
		for _, i := range idx {
			if !slices.Equal(c.nodes[i].members(), want) {
				return false
			}
		}
		return true
	}, "rings of %v to hold %v", idx, want)
}

// settle waits until no live node's ring has changed for accWarmup: a ring
// change starts a warm-up during which a new owner relays moved identities
// to their previous owner, which is not what an accuracy run measures.
func (c *accCluster) settle() {
	c.t.Helper()
	last, since := c.epochs(), time.Now()
	accWait(c.t, 20*time.Second, func() bool {
		if e := c.epochs(); !slices.Equal(e, last) {
			last, since = e, time.Now()
		}
		return time.Since(since) > accWarmup
	}, "rings to settle")
}

// epochs returns the ring epoch of every live node.
func (c *accCluster) epochs() []uint64 {
	var e []uint64
	for _, i := range c.live() {
		e = append(e, c.ring(i).Epoch())
	}
	return e
}

// crash stops gw-i abruptly, as a process crash would.
func (c *accCluster) crash(i int) {
	c.nodes[i].crash()
	c.nodes[i] = nil
}

// with returns c reporting to t (a subtest's).
func (c *accCluster) with(t *testing.T) *accCluster {
	d := *c
	d.t = t
	return &d
}

// close stops every live node gracefully.
func (c *accCluster) close() {
	for i, node := range c.nodes {
		if node != nil {
			node.Close()
			c.nodes[i] = nil
		}
	}
}

// watchRings watches the rings of the nodes in idx until the returned stop
// is called; stop reports whether any of them ever held other members than
// idx. That happens when a live node is declared dead and comes back,
// which memberlist's local timing does on a badly overloaded machine (see
// shell.ProfileLocal): a fault the test did not inject, so a run it falls
// in is not a run with no fault.
func (c *accCluster) watchRings(idx ...int) (stop func() (changed bool)) {
	var nodes []*Node
	var want []string
	for _, i := range idx {
		nodes = append(nodes, c.nodes[i])
		want = append(want, fmt.Sprintf("gw-%d", i))
	}
	slices.Sort(want)
	var changed atomic.Bool
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, n := range nodes {
				if !slices.Equal(n.members(), want) {
					changed.Store(true)
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() bool {
		close(done)
		wg.Wait()
		return changed.Load()
	}
}

// stableRun runs measure until the membership of the nodes in idx did not
// change while it ran, at most accAttempts times, letting the rings settle
// between attempts; it fails the test when every attempt was disturbed.
// measure records; the caller asserts on the last, undisturbed, run.
func (c *accCluster) stableRun(idx []int, measure func()) {
	c.t.Helper()
	for attempt := 1; ; attempt++ {
		stop := c.watchRings(idx...)
		measure()
		if !stop() {
			return
		}
		if attempt == accAttempts {
			c.t.Fatalf("membership changed under each of %d attempts: a live node was declared dead (the machine is too loaded for memberlist's local timing)", attempt)
		}
		c.t.Logf("membership changed during attempt %d: a live node was declared dead (overloaded machine); again", attempt)
		c.waitMembers(idx...)
		c.settle()
	}
}

// ring is gw-i's ring.
func (c *accCluster) ring(i int) *cluster.Ring { return c.nodes[i].cluster.shell.Ring() }

// identityOwnedBy returns the first identity prefix-k that gw-owner owns.
func (c *accCluster) identityOwnedBy(prefix string, owner int) string {
	c.t.Helper()
	name := fmt.Sprintf("gw-%d", owner)
	for k := range 10000 {
		id := fmt.Sprintf("%s-%d", prefix, k)
		if c.ring(owner).OwnerName(id) == name {
			return id
		}
	}
	c.t.Fatalf("no identity owned by %s", name)
	return ""
}

// failOpen sums the fail-open counts of rule over every live node.
func (c *accCluster) failOpen(rule string) uint64 {
	var sum uint64
	for _, i := range c.live() {
		for _, rc := range c.nodes[i].counts() {
			if rc.Rule == rule {
				sum += rc.FailOpen
			}
		}
	}
	return sum
}

// stats returns gw-i's coordinator counters and its exchanges sent.
func (c *accCluster) stats(i int) (cluster.Stats, uint64) {
	st, sent, _ := c.nodes[i].cluster.shell.Stats()
	return st, sent
}

func accWait(t *testing.T, limit time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not met within %v: "+what, append([]any{limit}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// accSend is one request of a run and what became of it.
type accSend struct {
	node     int   // the node it was sent to
	sent     int64 // Decision.At: when Allow started, on the shared clock
	done     int64 // when Allow returned, on the shared clock
	allowed  bool
	degraded bool
	err      error
}

// drive offers requests for one identity at one every interval, sending
// each to the node that a smooth weighted round robin over weights picks,
// until dur passes or ctx ends. A node whose callers are all busy queues
// the request; a full queue drops it (counted). It returns every request,
// sorted by send time.
func (c *accCluster) drive(ctx context.Context, path, id string, nodes []int, weights []int, interval, dur time.Duration) (sends []accSend, dropped int) {
	queues := make([]chan struct{}, len(nodes))
	results := make([][]accSend, len(nodes)*accWorkers)
	var wg sync.WaitGroup
	for qi, ni := range nodes {
		queues[qi] = make(chan struct{}, 256)
		node := c.nodes[ni]
		for w := range accWorkers {
			slot := qi*accWorkers + w
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := Request{Method: "GET", Path: path, Header: http.Header{"X-Api-Key": {id}}}
				for range queues[qi] {
					d := node.Allow(context.Background(), req)
					results[slot] = append(results[slot], accSend{node: ni, sent: d.At.UnixNano(), done: c.now(),
						allowed: d.Allowed, degraded: d.Degraded, err: d.Err})
				}
			}()
		}
	}
	total := 0
	for _, w := range weights {
		total += w
	}
	current := make([]int, len(weights))
	pick := func() int { // smooth weighted round robin: an even interleave
		best := 0
		for i, w := range weights {
			current[i] += w
			if current[i] > current[best] {
				best = i
			}
		}
		current[best] -= total
		return best
	}
	start := time.Now()
	sent := 0
loop:
	for {
		el := time.Since(start)
		if el >= dur {
			break
		}
		for due := int(el/interval) + 1; sent < due; sent++ {
			select {
			case queues[pick()] <- struct{}{}:
			default:
				dropped++
			}
		}
		select {
		case <-ctx.Done():
			break loop
		case <-time.After(min(interval, time.Millisecond)):
		}
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	for _, r := range results {
		sends = append(sends, r...)
	}
	slices.SortFunc(sends, func(a, b accSend) int { return cmp.Compare(a.sent, b.sent) })
	return sends, dropped
}

// accAdmit is one admission: its send time and when Allow returned; it was
// decided between the two.
type accAdmit struct{ sent, done int64 }

// admitted returns the admissions among sends.
func admitted(sends []accSend) []accAdmit {
	var out []accAdmit
	for _, s := range sends {
		if s.allowed {
			out = append(out, accAdmit{s.sent, s.done})
		}
	}
	return out
}

// worstExcess returns the largest count − r·Δ over every run i…j of
// admissions (sorted by send time), where Δ runs from the first's send
// time to the latest return among them: every one of them was decided in
// that interval, so docs/overshoot.md's envelope bounds the excess by B + S (by B
// for exact). rate is tokens per nanosecond; each admission costs one.
func worstExcess(adm []accAdmit, rate float64) float64 {
	worst, _, _ := worstExcessAt(adm, rate)
	return worst
}

// worstExcessAt is worstExcess with the interval it found.
func worstExcessAt(adm []accAdmit, rate float64) (worst float64, from, to int64) {
	for i := range adm {
		end := adm[i].done
		for j := i; j < len(adm); j++ {
			end = max(end, adm[j].done)
			if v := float64(j-i+1) - rate*float64(end-adm[i].sent); v > worst {
				worst, from, to = v, adm[i].sent, end
			}
		}
	}
	return worst, from, to
}

// worstShortfall returns the largest r·(Δ − stalls) − count over every
// interval from one admission's send time to another's (and from the run's
// first send to its first admission, and from its last admission to its
// last send), counting the admissions strictly inside. docs/overshoot.md bounds
// r·Δ − count by S + c + ⌈r·ℓ⌉ for a client that saturates the limiter;
// this one saturates it only while it sends. stalls is the time in the
// interval during which it did not: every gap between two consecutive
// sends beyond one token interval T (a stalled machine, or callers all
// waiting on slow round trips), each of which lets r·(gap − T) tokens go
// unasked. A run with no such gap is checked against the plain bound.
func worstShortfall(sends []accSend, rate float64, T time.Duration) float64 {
	type point struct {
		at    int64
		stall int64 // the callers' stall time since the run's first send
	}
	var pts []point
	var stall int64
	pts = append(pts, point{sends[0].sent, 0})
	for k, s := range sends {
		if k > 0 {
			stall += max(0, s.sent-sends[k-1].sent-int64(T))
		}
		if s.allowed {
			pts = append(pts, point{s.sent, stall})
		}
	}
	pts = append(pts, point{sends[len(sends)-1].sent, stall})
	worst := 0.0
	for i := range pts {
		for j := i + 1; j < len(pts); j++ {
			busy := (pts[j].at - pts[i].at) - (pts[j].stall - pts[i].stall)
			if v := rate*float64(busy) - float64(j-i-1); v > worst {
				worst = v
			}
		}
	}
	return worst
}

// referenceGap feeds the reference bucket (one exact GCRA of the rule) every
// request at its send time, in send order, and returns how far the run's
// admissions ran ahead of it (over) and behind it (under) at most, over
// every prefix of the sends, with the reference's total.
//
// The bounds (TestClusterAccuracy): the owner decides each request at most
// δ after its send (δ measured: the longest send-to-answer time), on a
// bucket whose k-th token after the burst frees at g_k + o, o ∈ [0, δ]
// the lag of its first decision, where the reference's frees at g_k. The
// reference spends token k on the first send at or after g_k, which is at
// most G after it (G the longest gap between sends); the owner on the
// first decision at or after g_k + o, a request sent at least g_k − δ and
// at most g_k + 2δ + G. So over every prefix of sends up to t the run is
// ahead by the tokens freeing in (t − G, t + δ], at most 1 + ⌈r·(δ + G)⌉,
// and behind by those freeing in (t − 2δ − G, t], at most 1 + ⌈r·(2δ +
// G)⌉. With sends at least every 1/r (this test's 3× rate) and no lag both
// are 1 + ⌈r·δ⌉, the figure; a busy machine's gaps between sends
// (G of several milliseconds, r·G above 1 at this rule's rate) made that
// figure fail about once in 30 runs.
func referenceGap(sends []accSend, g bucket.GCRA) (over, under, refTotal int) {
	var tat bucket.TAT
	got := 0
	for _, s := range sends {
		if g.Step(&tat, s.sent, 1).Allowed {
			refTotal++
		}
		if s.allowed {
			got++
		}
		over, under = max(over, got-refTotal), max(under, refTotal-got)
	}
	return over, under, refTotal
}

// shortfallBound returns the lower bound's allowance for a run of sends:
// S + c + ⌈r·ℓ⌉ + ⌈r·δ⌉ (c = 1), with δ the longest time any request took
// (linger, round trip and queueing at the owner), measured, and ℓ = δ: it
// bounds the sync round trip, and the second term is the distance between
// a send time and its decision.
func shortfallBound(S int64, rate float64, sends []accSend) (bound float64, delta time.Duration) {
	for _, s := range sends {
		delta = max(delta, time.Duration(s.done-s.sent))
	}
	return float64(S) + 1 + 2*math.Ceil(rate*float64(delta)), delta
}

// longestGap returns the longest time between two consecutive sends.
func longestGap(sends []accSend) (gap time.Duration) {
	for k := 1; k < len(sends); k++ {
		gap = max(gap, time.Duration(sends[k].sent-sends[k-1].sent))
	}
	return gap
}

// accRule returns the coordinator's parameters of rule id.
func (c *accCluster) accRule(id string) cluster.RuleParams {
	c.t.Helper()
	for i := range c.rules {
		if c.rules[i].ID == id {
			p, err := cluster.NewRuleParams(&c.rules[i], 1)
			if err != nil {
				c.t.Fatal(err)
			}
			return p
		}
	}
	c.t.Fatalf("no rule %q", id)
	return cluster.RuleParams{}
}

// gcraOf returns the reference bucket of a rule.
func gcraOf(t *testing.T, p cluster.RuleParams) bucket.GCRA {
	g, err := bucket.NewGCRA(p.Limit, p.Window, p.Burst)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// ratePerNs is the reference's rate: one token per emission interval.
func ratePerNs(g bucket.GCRA) float64 { return 1 / float64(g.Interval()) }
