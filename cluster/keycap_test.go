package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// capRule is 10 tokens a second (one per 100ms), burst 10.
func capRule(t testing.TB, mode quota.Mode) RuleParams {
	t.Helper()
	r := gcraRule("r", mode, 10, time.Second, 10)
	p, err := NewRuleParams(&r, 1)
	if err != nil {
		t.Fatal(err)
	}
	p.TrackAll = true // the cap counts entries: no blind spend
	return p
}

// ownerOnly returns a coordinator alone in its ring (it owns every
// identity) with a key cap.
func ownerOnly(t testing.TB, maxKeys int) *Coordinator {
	t.Helper()
	c := NewCoordinator(CoordinatorConfig{Self: "a", MaxKeys: maxKeys})
	c.SetRules(0, []RuleParams{capRule(t, quota.ModeShared)})
	ring, err := NewRing(1, []Member{{Name: "a", Addr: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetTable(t0, ring)
	return c
}

func mustDecide(t *testing.T, c *Coordinator, now int64, id string, cost int64) Outcome {
	t.Helper()
	o, err := c.Decide(now, "r", id, cost)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestKeyCapEvictsFullFirst: at the cap a full bucket goes first; with
// none full, the bucket with the least debt goes and its debt is counted
// as forgiven.
func TestKeyCapEvictsFullFirst(t *testing.T) {
	c := ownerOnly(t, 3)
	now := t0
	mustDecide(t, c, now, "a", 5) // full again at +500ms
	mustDecide(t, c, now, "b", 1) // +100ms
	mustDecide(t, c, now, "c", 8) // +800ms
	now += int64(200 * time.Millisecond)
	mustDecide(t, c, now, "d", 1)
	st := c.Stats()
	if st.EvictedIdle != 1 || st.EvictedForgiven != 0 || st.Owned != 3 {
		t.Fatalf("after d: %+v, want one idle eviction and 3 buckets", st)
	}
	if c.owned.get(entryKey{"r", "b"}) != nil {
		t.Fatal("the full bucket b was kept; another was evicted")
	}
	// No bucket is full now: d (1 token of debt) forgives least, then a
	// (3 tokens), not c (6) nor e (7).
	mustDecide(t, c, now, "e", 9)
	st = c.Stats()
	if st.EvictedForgiven != 1 || st.ForgivenTokens != 1 || st.Owned != 3 || st.OverCap != 0 {
		t.Fatalf("after e: %+v, want one forgiven eviction of 1 token", st)
	}
	if c.owned.get(entryKey{"r", "d"}) != nil || c.owned.get(entryKey{"r", "a"}) == nil {
		t.Fatal("evicted the wrong bucket: want d (smallest TAT)")
	}
	mustDecide(t, c, now, "f", 1)
	st = c.Stats()
	if st.EvictedForgiven != 2 || st.ForgivenTokens != 1+3 || c.owned.get(entryKey{"r", "a"}) != nil || c.owned.get(entryKey{"r", "c"}) == nil {
		t.Fatalf("after f: %+v, want a evicted (3 tokens), c kept", st)
	}
	// The forgiven identity starts over with a full bucket.
	if o := mustDecide(t, c, now, "a", 10); !o.Allowed {
		t.Fatal("a forgiven bucket is not full again")
	}
	if st.Degraded != 0 {
		t.Fatalf("degraded decisions: %d", st.Degraded)
	}
}

// pair is a gateway and the owner of every identity it sees, wired by
// hand: messages are delivered at once.
type pair struct {
	gw, owner *Coordinator
	hold      bool // keep the gateway's messages (the owner does not answer)
	held      []Message
	done      int // completions the gateway handed out
}

func newPair(t *testing.T, mode quota.Mode, maxKeys int) *pair {
	t.Helper()
	ring, err := NewRing(1, []Member{{Name: "gw", Addr: "gw"}, {Name: "own", Addr: "own"}})
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{gw: NewCoordinator(CoordinatorConfig{Self: "gw", MaxKeys: maxKeys}),
		owner: NewCoordinator(CoordinatorConfig{Self: "own"})}
	for _, c := range []*Coordinator{p.gw, p.owner} {
		c.SetRules(0, []RuleParams{capRule(t, mode)})
		c.SetTable(t0, ring)
	}
	return p
}

// remoteIDs returns n identities the ring gives to "own".
func (p *pair) remoteIDs(n int) []string {
	var ids []string
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("id-%d", i)
		if p.gw.table.OwnerName(id) == "own" {
			ids = append(ids, id)
		}
	}
	return ids
}

// pump delivers messages both ways until none is left.
func (p *pair) pump(now int64) {
	for range 10 {
		moved := false
		rd := p.gw.Ready()
		p.done += len(rd.Completions)
		for _, env := range rd.Messages {
			moved = true
			if p.hold {
				p.held = append(p.held, env.Msg)
				continue
			}
			p.owner.Step(now, "gw", &env.Msg)
		}
		for _, env := range p.owner.Ready().Messages {
			moved = true
			p.gw.Step(now, "own", &env.Msg)
		}
		if !moved {
			return
		}
	}
}

// TestKeyCapNeverEvictsPending: node entries waiting on their owner stay;
// with nothing else to evict the new entry is made over the cap, and once
// the answers are in, entries go again.
func TestKeyCapNeverEvictsPending(t *testing.T) {
	p := newPair(t, quota.ModeExact, 2)
	ids := p.remoteIDs(4)
	now := t0
	p.hold = true
	for _, id := range ids[:3] {
		if o := mustDecide(t, p.gw, now, id, 1); !o.Pending {
			t.Fatalf("%s: exact rule decided locally: %+v", id, o)
		}
		p.pump(now)
	}
	st := p.gw.Stats()
	if st.Entries != 3 || st.OverCap != 1 || st.EvictedIdle+st.EvictedViews+st.EvictedForgiven != 0 {
		t.Fatalf("pending entries: %+v, want 3 entries, one over the cap, none evicted", st)
	}
	// The owner answers: the entries are acknowledged and may go.
	p.hold = false
	for _, m := range p.held {
		p.owner.Step(now, "gw", &m)
	}
	p.held = nil
	p.pump(now)
	if got := p.done; got != 3 {
		t.Fatalf("%d completions, want 3", got)
	}
	mustDecide(t, p.gw, now, ids[3], 1)
	p.pump(now)
	st = p.gw.Stats()
	if st.EvictedIdle+st.EvictedViews != 2 || st.Entries != 2 {
		t.Fatalf("after the answers: %+v, want the cap kept by two evictions", st)
	}
	if st.Degraded != 0 {
		t.Fatalf("degraded decisions: %d", st.Degraded)
	}
}

// TestKeyCapIdleNodeEntryFirst: an idle node entry goes before one whose
// view of the owner's bucket is still spent; among those, the view repaid
// first goes first.
func TestKeyCapIdleNodeEntryFirst(t *testing.T) {
	p := newPair(t, quota.ModeExact, 2)
	ids := p.remoteIDs(4)
	now := t0
	mustDecide(t, p.gw, now, ids[0], 1) // the owner's bucket full again at +100ms
	p.pump(now)
	mustDecide(t, p.gw, now, ids[1], 9) // +900ms
	p.pump(now)
	now += int64(300 * time.Millisecond)
	mustDecide(t, p.gw, now, ids[2], 1)
	p.pump(now)
	st := p.gw.Stats()
	if st.EvictedIdle != 1 || st.EvictedViews != 0 || p.gw.entries.get(entryKey{"r", ids[1]}) == nil {
		t.Fatalf("%+v: want the idle entry of %s evicted, %s kept", st, ids[0], ids[1])
	}
	mustDecide(t, p.gw, now, ids[3], 1)
	p.pump(now)
	st = p.gw.Stats()
	if st.EvictedViews != 1 || st.EvictedForgiven != 0 || p.gw.entries.get(entryKey{"r", ids[2]}) != nil ||
		p.gw.entries.get(entryKey{"r", ids[1]}) == nil {
		t.Fatalf("%+v: want the entry of %s (view repaid at +400ms) evicted, not %s (+900ms)", st, ids[2], ids[1])
	}
}

// TestKeyCapBoundsMemory: a stream of 100 000 distinct identities, through
// a node and at an owner, never holds more entries than the cap (nor heap
// items beyond a small multiple of it).
func TestKeyCapBoundsMemory(t *testing.T) {
	const maxKeys = 1000
	p := newPair(t, quota.ModeShared, maxKeys)
	own := ownerOnly(t, maxKeys)
	now := t0
	for i := range 100_000 {
		id := fmt.Sprintf("u-%d", i)
		mustDecide(t, own, now, id, 1+int64(i%10))
		mustDecide(t, p.gw, now, id, 1)
		if i%64 == 0 {
			p.pump(now)
		}
		if i%1000 == 0 {
			now += int64(time.Millisecond)
			own.Tick(now)
			p.gw.Tick(now)
			p.pump(now)
		}
		for _, c := range []*Coordinator{own, p.gw} {
			rk := c.keys["r"]
			if st := c.Stats(); st.Entries+st.Owned > maxKeys || rk.n != st.Entries+st.Owned {
				t.Fatalf("identity %d: %d entries + %d buckets (counted %d), cap %d", i, st.Entries, st.Owned, rk.n, maxKeys)
			}
			if len(rk.nodes)+len(rk.owners) > 4*maxKeys+2*evictTries {
				t.Fatalf("identity %d: %d heap items for %d entries", i, len(rk.nodes)+len(rk.owners), maxKeys)
			}
		}
	}
	so, sg := own.Stats(), p.gw.Stats()
	if so.OverCap != 0 || sg.OverCap != 0 {
		t.Fatalf("over the cap: owner %d, node %d", so.OverCap, sg.OverCap)
	}
	if so.EvictedForgiven == 0 || sg.EvictedIdle+sg.EvictedViews == 0 {
		t.Fatalf("no evictions: owner %+v, node %+v", so, sg)
	}
	if so.Degraded+sg.Degraded != 0 {
		t.Fatalf("degraded decisions: %d", so.Degraded+sg.Degraded)
	}
}

// TestKeyCapDefault: 0 means DefaultMaxKeys.
func TestKeyCapDefault(t *testing.T) {
	if c := NewCoordinator(CoordinatorConfig{Self: "a"}); c.cfg.MaxKeys != DefaultMaxKeys {
		t.Fatalf("MaxKeys %d, want %d", c.cfg.MaxKeys, DefaultMaxKeys)
	}
}

// TestWakeHeapOrder: the heap pops in time order.
func TestWakeHeapOrder(t *testing.T) {
	var h wakeHeap[int]
	xs := []int64{5, 3, 9, 1, 7, 3, 8, 2}
	for i, x := range xs {
		h.push(x, &xs2[i%len(xs2)])
	}
	last := int64(-1)
	for len(h) > 0 {
		it := h.pop()
		if it.at < last {
			t.Fatalf("popped %d after %d", it.at, last)
		}
		last = it.at
	}
}

var xs2 = make([]int, 8)

// TestLostReportsChargedOnce: a bucket that does not know a node's
// generation (evicted, or dropped full while the node's entry lived on)
// charges the report's cumulative total at most the pool ⌊a·L⌋ (a first
// report carries at most the node's slack), not the whole total again.
func TestLostReportsChargedOnce(t *testing.T) {
	rule := gcraRule("r", quota.ModeShared, 100, time.Second, 100)
	c := NewCoordinator(CoordinatorConfig{Self: "a"})
	c.SetRules(0, ruleParams(t, []quota.Rule{rule}))
	p := c.rules["r"]
	pool := p.Pool()
	if pool < 1 {
		t.Fatalf("pool %d: the test needs a shared rule with a pool", pool)
	}
	now := t0
	c.Step(now, "gw", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 7, Total: 500}}})
	oe := c.owned.get(entryKey{"r", "x"})
	if got, want := int64(oe.tat)-now, pool*p.gcra.Interval().Nanoseconds(); got != want {
		t.Fatalf("charged %d ns, want the pool's %d", got, want)
	}
	// The rest of the generation is charged as usual, and acknowledged.
	c.Step(now, "gw", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "x", Gen: 7, Total: 501}}})
	if got, want := int64(oe.tat)-now, (pool+1)*p.gcra.Interval().Nanoseconds(); got != want {
		t.Fatalf("charged %d ns, want %d", got, want)
	}
	rd := c.Ready()
	if len(rd.Messages) != 1 || len(rd.Messages[0].Msg.Acks) != 2 || rd.Messages[0].Msg.Acks[1].Total != 501 {
		t.Fatalf("acknowledgements %+v", rd.Messages)
	}
	// A first report within the pool is charged whole.
	c.Step(now, "gw", &Message{Syncs: []SyncItem{{Rule: "r", Identity: "y", Gen: 8, Total: pool}}})
	if got, want := int64(c.owned.get(entryKey{"r", "y"}).tat)-now, pool*p.gcra.Interval().Nanoseconds(); got != want {
		t.Fatalf("charged %d ns, want %d", got, want)
	}
}

// TestKeyCapKeepsHandedBucket: a bucket handed to a new owner and still
// spent (kept for peers whose ring has not changed yet) is not evicted;
// once full it may go.
func TestKeyCapKeepsHandedBucket(t *testing.T) {
	c := ownerOnly(t, 1)
	now := t0
	two, err := NewRing(2, []Member{{Name: "a", Addr: "a"}, {Name: "b", Addr: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	var x string
	for i := 0; x == ""; i++ {
		if id := fmt.Sprintf("x-%d", i); two.OwnerName(id) == "b" {
			x = id
		}
	}
	mustDecide(t, c, now, x, 5)
	c.SetTable(now, two)
	if oe := c.owned.get(entryKey{"r", x}); oe == nil || !oe.handed {
		t.Fatal("the moved bucket is not kept as handed over")
	}
	mustDecide(t, c, now, "y", 1)
	st := c.Stats()
	if c.owned.get(entryKey{"r", x}) == nil || st.OverCap != 1 || st.EvictedForgiven != 0 {
		t.Fatalf("%+v: the handed, spent bucket was evicted", st)
	}
	now += int64(time.Second)
	mustDecide(t, c, now, "z", 1)
	if c.owned.get(entryKey{"r", x}) != nil {
		t.Fatalf("%+v: the handed bucket, full again, was kept at the cap", c.Stats())
	}
}
