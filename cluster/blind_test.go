package cluster

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// TestBlindSpreadKeepsNoEntries: many identities, each far from its limit,
// are admitted on every node with no entry anywhere, owner or node, and
// every blind report is charged and acknowledged: what a node holds for
// them is gone once the reports return.
func TestBlindSpreadKeepsNoEntries(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 100, time.Second, 100) // slack 1 on 3 nodes at 5 %
	h := newHarness(t, 3, time.Millisecond, rule)
	const ids = 20_000
	peak := 0
	for i := range ids {
		h.request(h.names[i%3], "api", fmt.Sprintf("user-%d", i), 1)
		if i%100 == 99 {
			h.step(100 * time.Microsecond)
			for _, c := range h.nodes {
				peak = max(peak, c.Stats().Entries+c.Stats().Owned)
			}
		}
	}
	for range 20 {
		h.step(time.Millisecond)
	}
	if len(h.admits) != ids {
		t.Fatalf("admitted %d of %d identities each far from its limit", len(h.admits), ids)
	}
	var st Stats
	for _, name := range h.names {
		c := h.nodes[name]
		s := c.Stats()
		st.Add(&s)
		if len(c.blindU) != 0 {
			t.Errorf("%s: %d identities with blind spend still unacknowledged", name, len(c.blindU))
		}
	}
	if peak != 0 || st.Entries+st.Owned != 0 {
		t.Errorf("entries: peak %d, at the end %d node + %d owner; want none", peak, st.Entries, st.Owned)
	}
	if st.BlindAdmits+st.BlindOwn != ids || st.BlindCharged != st.BlindAdmits {
		t.Errorf("blind admissions %d + own %d, charged %d, for %d identities", st.BlindAdmits, st.BlindOwn, st.BlindCharged, ids)
	}
	if st.BlindReports > st.BlindAdmits/10 {
		t.Errorf("%d reports for %d blind admissions: they do not batch", st.BlindReports, st.BlindAdmits)
	}
	if st.SyncsSent != 0 || st.Forwarded != 0 || st.AcksSent != 0 {
		t.Errorf("syncs %d, forwards %d, acks %d: the identities took the tracked path", st.SyncsSent, st.Forwarded, st.AcksSent)
	}
	t.Logf("%d identities: %d reports, %d admitted blind, %d by their owner's sketch", ids, st.BlindReports, st.BlindAdmits, st.BlindOwn)
}

// TestBlindIdleToHotStaysInEnvelope: an identity that goes from idle to
// saturating every node, again and again with pauses long enough for every
// entry to go, is admitted within B + r·Δ + S over every interval of the
// whole run: the blind spend each cycle starts with is charged as debt
// and paid back, so nothing accumulates (TestSketchTermMeasured shows the
// sketch gate's term, which does).
func TestBlindIdleToHotStaysInEnvelope(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1200, time.Second, 100) // slack 20 on 3 nodes
	h := newHarness(t, 3, time.Millisecond, rule)
	p, _ := NewRuleParams(&rule, 1)
	id := "pulse"
	var tracks uint64
	for cycle := range 8 {
		for range 300 { // 30 ms of saturation
			for _, n := range h.names {
				h.request(n, "api", id, 1)
			}
			h.step(100 * time.Microsecond)
		}
		for range 400 { // 400 ms idle: views full again, entries dropped
			h.step(time.Millisecond)
		}
		entries := 0
		for _, c := range h.nodes {
			entries += c.Stats().Entries
		}
		if entries != 0 {
			t.Fatalf("cycle %d: %d node entries left after the pause", cycle, entries)
		}
	}
	var blind uint64
	for _, c := range h.nodes {
		blind += c.Stats().BlindAdmits
		tracks += c.Stats().BlindTracks
	}
	if blind == 0 || tracks == 0 {
		t.Fatalf("blind admissions %d, tracks %d: the scenario does not start each cycle blind", blind, tracks)
	}
	S := 2 * p.Slack(3)
	rate := float64(rule.Limit) / float64(time.Second)
	if up := upperExcess(h.admits, rate); up > float64(rule.Burst+S)+0.01 {
		t.Errorf("excess over r·Δ %.2f, above B + S = %d", up, rule.Burst+S)
	} else {
		t.Logf("excess %.2f of B + S = %d over %d admissions; %d blind, %d tracks", up, rule.Burst+S, len(h.admits), blind, tracks)
	}
}

// TestBlindReportChargedOnce: a blind report whose reply is lost is sent
// again after a sync interval, and its owner charges it once.
func TestBlindReportChargedOnce(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1200, time.Second, 100)
	h := newHarness(t, 3, time.Millisecond, rule)
	id := "once"
	owner := h.ring.OwnerName(id)
	other := thirdNode(h, owner, "")
	for range 5 {
		h.request(other, "api", id, 1)
	}
	h.flush()
	// The report reaches the owner; its reply is lost.
	h.cut[other] = true
	h.step(time.Millisecond)
	h.cut[other] = false
	if len(h.nodes[other].blindU) == 0 {
		t.Fatal("the setup needs the acknowledgement lost")
	}
	for range 60 {
		h.step(time.Millisecond)
	}
	if n := len(h.nodes[other].blindU); n != 0 {
		t.Fatalf("blind spend still unacknowledged after a resend: %d identities", n)
	}
	oc := h.nodes[owner]
	r := oc.rules["api"]
	var idx tatSlots
	r.bs.slots(r.blindHash(id), &idx)
	// Charged once: 5 tokens of 1/1200 s each from the first charge's
	// time; a second charge of the resent report would add 5 more.
	got := r.bs.estimate(&idx) - (t0 + int64(time.Millisecond))
	if want := 5 * r.gcra.Interval().Nanoseconds(); got != want {
		t.Fatalf("the owner's sketch holds %v of spend, want %v (charged once)", time.Duration(got), time.Duration(want))
	}
	if st := h.nodes[other].Stats(); st.BlindReports < 2 {
		t.Fatalf("%d reports sent: the lost reply did not bring a resend", st.BlindReports)
	}
}

// TestBlindOwnerLeaves: blind spend in flight to an owner that leaves the
// ring is reported again to the identity's new owner (or charged by the
// node itself when it owns the identity now).
func TestBlindOwnerLeaves(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1200, time.Second, 100)
	h := newHarness(t, 3, time.Millisecond, rule)
	gone := h.names[2]
	var ids []string
	for i := 0; len(ids) < 50; i++ {
		if id := fmt.Sprintf("id-%d", i); h.ring.OwnerName(id) == gone {
			ids = append(ids, id)
		}
	}
	h.cut[gone] = true // its reports never come back
	for _, id := range ids {
		h.request(h.names[0], "api", id, 1)
	}
	h.step(time.Millisecond)
	if n := len(h.nodes[h.names[0]].blindU); n != len(ids) {
		t.Fatalf("%d identities with blind spend in flight, want %d", n, len(ids))
	}
	two, err := NewRing(2, []Member{{Name: h.names[0], Addr: h.names[0]}, {Name: h.names[1], Addr: h.names[1]}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range h.names[:2] {
		h.nodes[n].SetTable(h.now, two)
	}
	for range 10 {
		h.step(time.Millisecond)
	}
	if n := len(h.nodes[h.names[0]].blindU); n != 0 {
		t.Fatalf("%d identities' blind spend still waits for the departed owner", n)
	}
	var charged uint64
	for _, n := range h.names[:2] {
		charged += h.nodes[n].Stats().BlindCharged
	}
	if charged != uint64(len(ids)) {
		t.Fatalf("%d blind items charged by the new owners, want %d", charged, len(ids))
	}
}

// TestBlindRefund: a blind admission refunded before its report leaves is
// given back on the node.
func TestBlindRefund(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 1200, time.Second, 100)
	h := newHarness(t, 3, time.Millisecond, rule)
	id := "refund"
	owner := h.ring.OwnerName(id)
	other := thirdNode(h, owner, "")
	c := h.nodes[other]
	// A report in flight first, so that the next admission waits.
	if o, _ := c.Decide(h.now, "api", id, 1); o.Source != SourceSlack {
		t.Fatalf("source %d, want a slack admission", o.Source)
	}
	h.flush()
	if o, _ := c.Decide(h.now, "api", id, 3); o.Source != SourceSlack {
		t.Fatalf("source %d, want a slack admission", o.Source)
	}
	c.Refund(h.now, "api", id, 3, SourceSlack)
	if u := c.blindSpend(c.rules["api"], id); u != 1 {
		t.Fatalf("unacknowledged blind spend %d after the refund, want 1", u)
	}
}

// TestTATSketchGrows: a sketch whose cells are mostly live grows, to
// about four cells per live identity when it is far too narrow, starting
// its cells anew while the old ones last, so that no identity's estimate
// falls and the new cells count only what is charged after; once the old
// cells are past they are forgotten, and a sketch mostly idle halves its
// width again.
func TestTATSketchGrows(t *testing.T) {
	s := newTATSketch(maxBlindWidth(DefaultMaxKeys))
	now := int64(1_000_000)
	var idx tatSlots
	raise := func(n int, tat func(i int) int64) {
		for i := range n {
			s.slots(uint64(i)*0x9e3779b97f4a7c15, &idx)
			s.raise(&idx, tat(i))
		}
	}
	raise(4*blindMinWidth, func(i int) int64 { return now + int64(i) + 1 })
	est := map[uint64]int64{}
	for i := range uint64(4 * blindMinWidth) {
		h := i * 0x9e3779b97f4a7c15
		s.slots(h, &idx)
		est[h] = s.estimate(&idx)
	}
	s.check(now)
	w1 := s.cur.width
	if w1 < 8*blindMinWidth || w1 > 32*blindMinWidth || s.old.width != blindMinWidth {
		t.Fatalf("width %d (old %d) after a sample of cells nearly all live with 4 identities per cell, want 8 to 32 times %d (old %d)",
			w1, s.old.width, blindMinWidth, blindMinWidth)
	}
	for h, e := range est {
		s.slots(h, &idx)
		if got := s.estimate(&idx); got < e {
			t.Fatalf("estimate fell from %d to %d when the sketch grew", e, got)
		}
	}
	// While the old cells last the width stays, however live the new ones.
	raise(4*w1, func(int) int64 { return now + 1<<40 })
	s.check(now + 1)
	if s.cur.width != w1 {
		t.Fatalf("width %d while the old cells last, want %d", s.cur.width, w1)
	}
	// Past the old cells' latest TAT: they are gone, and a live sketch
	// grows again, the cells of the last width old now.
	s.check(now + 4*blindMinWidth + 1)
	w2 := s.cur.width
	if s.old.width != w1 || w2 < 2*w1 {
		t.Fatalf("old width %d, width %d, want %d and at least %d", s.old.width, w2, w1, 2*w1)
	}
	// Every TAT past: the sketch halves once its old cells are gone.
	idle := now + 1<<41
	for range 3 {
		s.check(idle)
	}
	if s.cur.width >= w2 {
		t.Fatalf("width %d after idle checks, want it below %d", s.cur.width, w2)
	}
	for live := range blindSample {
		if g := grownWidth(1024, live); g < 2048 || g&(g-1) != 0 || (live > 0 && g < grownWidth(1024, live-1)) {
			t.Fatalf("grownWidth(1024, %d) = %d: want a power of two, at least 2048, not below the last", live, g)
		}
	}
	if maxBlindWidth(100) != blindMinWidth || maxBlindWidth(1000) != 2048 || maxBlindWidth(1<<30) != blindMaxWidth {
		t.Fatalf("maxBlindWidth: %d %d %d", maxBlindWidth(100), maxBlindWidth(1000), maxBlindWidth(1<<30))
	}
}

// BenchmarkTATSketchCharge: the charge of one blind item (its cells, the
// estimate, the raise) in reports of maxBlindReport random identities, on
// sketches of 4 rows of 16 K and 256 K cells (512 KB, within a core's
// second-level cache, and 8 MB, beyond it, as an owner's sketches of all
// its shards are together), plain and with the cells of the item
// blindAhead later prefetched as takeBlinds does. Compare ns/op of
// prefetched to plain at each width.
func BenchmarkTATSketchCharge(b *testing.B) {
	for _, w := range []int{1 << 14, 1 << 18} {
		for _, ahead := range []bool{false, true} {
			b.Run(fmt.Sprintf("width=%d/prefetch=%v", w, ahead), func(b *testing.B) {
				s := newTATSketch(w)
				s.cur = newTATRows(w)
				hs := make([]uint64, maxBlindReport)
				rng := uint64(1)
				var idx tatSlots
				now := int64(1_000_000)
				b.ResetTimer()
				for n := 0; n < b.N; {
					b.StopTimer()
					for i := range hs {
						rng = bucket.Splitmix64(rng)
						hs[i] = rng
					}
					b.StartTimer()
					for i := 0; i < len(hs) && n < b.N; i, n = i+1, n+1 {
						if ahead && i+blindAhead < len(hs) {
							s.prefetch(hs[i+blindAhead])
						}
						s.slots(hs[i], &idx)
						s.raise(&idx, max(s.estimate(&idx), now)+10)
					}
				}
			})
		}
	}
}

// TestBlindBucketCopiesIdentity: the shell decodes a blind report's
// identities as substrings of one string; a bucket the owner makes for one
// of them keeps a copy, so that it does not hold the whole report's string.
func TestBlindBucketCopiesIdentity(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 100, time.Second, 100)
	h := newHarness(t, 3, time.Millisecond, rule)
	report := "cold-onehot-two"
	hot := report[5:11]
	owner := h.ring.OwnerName(hot)
	oc := h.nodes[owner]
	from := thirdNode(h, owner, "")
	items := []BlindItem{
		{Stream: 7, Seq: 1, Rule: "api", Identity: report[:4], Cost: 1},
		{Stream: 7, Seq: 1, Rule: "api", Identity: hot, Cost: 60}, // past half of 100: a bucket
	}
	oc.takeBlinds(t0, from, items)
	r := oc.rules["api"]
	oe := oc.ownedOf(r).GetH(hashID(hot), hot)
	if oe == nil {
		t.Fatal("no bucket for an identity charged past half its burst")
	}
	if oe.key.identity != hot {
		t.Fatalf("the bucket's identity is %q, want %q", oe.key.identity, hot)
	}
	if unsafe.StringData(oe.key.identity) == unsafe.StringData(hot) {
		t.Fatal("the bucket holds the report's string, not a copy of its identity")
	}
}
