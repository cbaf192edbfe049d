package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// syncMsg is a message of one sync of identity id with total spent.
func syncMsg(id string, spent int64) Message {
	return Message{Syncs: []SyncItem{{Rule: "r", Identity: id, Total: spent}}}
}

// TestLinksOneExchangePerPeer: a message for a busy peer waits in its
// backlog and leaves as the next exchange, merged with what came after it
// (a newer cumulative sync of the same identity replacing the older one);
// the peer is idle once nothing waits.
func TestLinksOneExchangePerPeer(t *testing.T) {
	l := NewLinks(LinkConfig{})
	p, q := l.Peer("p"), l.Peer("q")
	if l.Peer("p") != p || l.Name(q) != "q" {
		t.Fatal("Peer does not keep a peer's index")
	}
	m := syncMsg("a", 1)
	if !l.Send(p, &m) {
		t.Fatal("first send to an idle peer did not start an exchange")
	}
	for i, m := range []Message{syncMsg("a", 2), syncMsg("b", 1), syncMsg("a", 3)} {
		if l.Send(p, &m) {
			t.Fatalf("send %d to a busy peer started a second exchange", i)
		}
	}
	if qm := syncMsg("x", 1); !l.Send(q, &qm) {
		t.Fatal("a busy peer held up another peer's exchange")
	}
	if st := l.Stats(); st.Busy != 2 || st.Backlogged != 1 {
		t.Fatalf("stats %+v, want 2 busy and 1 backlogged", st)
	}
	next, more := l.Next(p, &m)
	if !more {
		t.Fatal("the backlog did not leave as the next exchange")
	}
	got := fmt.Sprint(next.Syncs)
	if len(next.Syncs) != 2 || next.Syncs[0].Identity != "a" || next.Syncs[0].Total != 3 || next.Syncs[1].Identity != "b" {
		t.Fatalf("next exchange %s, want a's newest sync (3) then b's", got)
	}
	if _, more := l.Next(p, &next); more {
		t.Fatal("an empty backlog gave another exchange")
	}
	if st := l.Stats(); st.Busy != 1 || st.Backlogged != 0 {
		t.Fatalf("stats %+v, want 1 busy (q) and no backlog", st)
	}
	if m := syncMsg("c", 1); !l.Send(p, &m) {
		t.Fatal("an idle peer did not start an exchange")
	}
}

// TestLinksNagle: a decision that queued work flushes at once when nothing
// is in flight; while an exchange is, it leaves the work pending for the
// exchange's return and asks for one backstop flush at a time; a full
// batch flushes at once whatever is in flight.
func TestLinksNagle(t *testing.T) {
	l := NewLinks(LinkConfig{MaxBatch: 10})
	if n := l.Decided(false, false, 0); n != NudgeNone {
		t.Fatalf("nothing ready: %v, want none", n)
	}
	if n := l.Decided(true, true, 1); n != NudgeFlush {
		t.Fatalf("idle: %v, want a flush", n)
	}
	m := syncMsg("a", 1)
	l.Send(l.Peer("p"), &m)
	if n := l.Decided(false, true, 1); n != NudgeLinger {
		t.Fatalf("busy: %v, want the backstop", n)
	}
	if n := l.Decided(true, true, 2); n != NudgeNone {
		t.Fatalf("busy, backstop due: %v, want none", n)
	}
	if n := l.Decided(false, true, 10); n != NudgeFlush {
		t.Fatalf("a full batch: %v, want a flush", n)
	}
	if !l.Collect() || l.Collect() {
		t.Fatal("Collect: the pending work is collected once")
	}
	if l.Kick() {
		t.Fatal("Kick with the backstop due asked for another")
	}
	l.Lingered()
	if !l.Kick() {
		t.Fatal("Kick after the backstop fired did not ask for one")
	}
}

// TestLinksBreaker: failures in a row open the breaker; it stays open
// through the cooldown; then half-open, where one failure reopens it; a
// success closes it and clears the count.
func TestLinksBreaker(t *testing.T) {
	cool := time.Second
	l := NewLinks(LinkConfig{BreakerFailures: 3, BreakerCooldown: cool})
	p := l.Peer("p")
	at := int64(10 * time.Second)
	for i := 1; i <= 2; i++ {
		if b := l.Outcome(at, p, false); b != BreakerSame {
			t.Fatalf("failure %d: %v", i, b)
		}
	}
	if b := l.Outcome(at, p, false); b != BreakerOpened || !l.Open(p) {
		t.Fatalf("third failure: %v, open %v", b, l.Open(p))
	}
	if b := l.Outcome(at+1, p, false); b != BreakerSame {
		t.Fatalf("failure while open: %v", b)
	}
	if got := l.Tick(at+int64(cool)-1, nil); len(got) != 0 {
		t.Fatalf("half-open before the cooldown: %v", got)
	}
	if got := l.Tick(at+int64(cool), nil); !slices.Equal(got, []string{"p"}) || l.Open(p) {
		t.Fatalf("after the cooldown: %v, open %v", got, l.Open(p))
	}
	if b := l.Outcome(at+int64(cool)+1, p, false); b != BreakerOpened {
		t.Fatalf("a failed trial: %v, want reopened at once", b)
	}
	l.Tick(at+3*int64(cool), nil)
	if b := l.Outcome(at+3*int64(cool), p, true); b != BreakerSame {
		t.Fatalf("a successful trial of a half-open breaker: %v (it was marked up at Tick)", b)
	}
	for i := 1; i <= 2; i++ {
		if b := l.Outcome(at, p, false); b != BreakerSame {
			t.Fatalf("after a success, failure %d: %v (the count was not cleared)", i, b)
		}
	}
	if b := l.Outcome(at, p, true); b != BreakerSame {
		t.Fatalf("success of a closed breaker: %v", b)
	}
	l.Outcome(at, p, false)
	l.Outcome(at, p, false)
	l.Outcome(at, p, false)
	if b := l.Outcome(at, p, true); b != BreakerClosed || l.Stats().Open != 0 {
		t.Fatalf("success of an open breaker: %v, %d open", b, l.Stats().Open)
	}
}

// TestLinksSetPeers: a peer back in the ring, or at a new address, gets a
// clean breaker (an open one is reported, to be marked up at once); a peer
// that stayed keeps its breaker; the link of a peer gone from the ring is
// forgotten once idle.
func TestLinksSetPeers(t *testing.T) {
	l := NewLinks(LinkConfig{BreakerFailures: 1})
	abc := []Member{{Name: "a", Addr: "a:1"}, {Name: "b", Addr: "b:1"}, {Name: "c", Addr: "c:1"}}
	l.SetPeers(abc, nil)
	for _, name := range []string{"c", "b", "a"} {
		l.Outcome(1, l.Peer(name), false)
	}
	if got := l.SetPeers(abc, nil); len(got) != 0 {
		t.Fatalf("the same ring reset %v", got)
	}
	got := l.SetPeers([]Member{{Name: "a", Addr: "a:2"}, {Name: "c", Addr: "c:1"}}, nil)
	if !slices.Equal(got, []string{"a"}) || !l.Open(l.Peer("b")) || !l.Open(l.Peer("c")) {
		t.Fatalf("a at a new address: reset %v; b open %v, c open %v", got, l.Open(l.Peer("b")), l.Open(l.Peer("c")))
	}
	if got := l.SetPeers(abc, nil); !slices.Equal(got, []string{"b"}) || l.Open(l.Peer("b")) || !l.Open(l.Peer("c")) {
		t.Fatalf("b back (a's breaker reset already): reset %v; b open %v, c open %v", got, l.Open(l.Peer("b")), l.Open(l.Peer("c")))
	}
	c := l.Peer("c")
	m := syncMsg("x", 1)
	l.Send(c, &m)
	l.Send(c, &m) // waits in the backlog
	l.SetPeers(abc[:2], nil)
	if !l.InFlight(c) || !l.Waiting(c) {
		t.Fatal("the exchange and backlog of a busy peer went when it left the ring")
	}
	if _, more := l.Next(c, nil); !more {
		t.Fatal("the backlog of a busy peer that left the ring was not sent")
	}
	l.Next(c, nil)
	if l.InFlight(c) || l.peers[c].q != nil {
		t.Fatal("the backlog of a peer gone from the ring was kept once idle")
	}
}

// TestLinksInvariants drives Links through random calls and checks, after
// each, what holds whatever the sequence: the count of exchanges in flight
// is the number of busy links; only a busy link has a backlog; a message
// sent to a busy peer is never lost (Next returns it); the open count is
// the number of open breakers; and a decision with work to send while
// nothing is in flight flushes.
func TestLinksInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		l := NewLinks(LinkConfig{BreakerFailures: 2, BreakerCooldown: time.Millisecond, MaxBatch: 4})
		peers := []int{l.Peer("p0"), l.Peer("p1"), l.Peer("p2")}
		waiting := map[int]int{} // items sent to a busy peer and not yet taken by Next
		now := int64(0)
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			p := rapid.SampledFrom(peers).Draw(t, "peer")
			now += rapid.Int64Range(0, int64(time.Millisecond)).Draw(t, "dt")
			switch rapid.IntRange(0, 8).Draw(t, "op") {
			case 0, 1:
				m := syncMsg(rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(t, "id"), now)
				if !l.Send(p, &m) {
					waiting[p]++
				}
			case 2:
				next, more := l.Next(p, nil)
				if more != (waiting[p] > 0) {
					t.Fatalf("Next(%d): more %v with %d items sent while busy", p, more, waiting[p])
				}
				if more && len(next.Syncs) == 0 {
					t.Fatalf("Next(%d) returned an empty exchange", p)
				}
				waiting[p] = 0
			case 3:
				l.Outcome(now, p, rapid.Bool().Draw(t, "ok"))
			case 4:
				got := l.Tick(now, nil)
				if !slices.IsSorted(got) {
					t.Fatalf("Tick: %v not in name order", got)
				}
			case 5:
				pending := rapid.Bool().Draw(t, "pending")
				queued := rapid.IntRange(0, 5).Draw(t, "queued")
				busy := l.Busy()
				n := l.Decided(pending, pending || queued > 0, queued)
				if (pending || queued > 0) && busy == 0 && n != NudgeFlush {
					t.Fatalf("Decided with work and nothing in flight: %v", n)
				}
			case 6:
				l.Collect()
				l.Lingered()
			case 7:
				l.SetPeers([]Member{{Name: l.Name(p), Addr: l.Name(p)}}, nil)
			case 8:
				l.Drop(p)
				waiting[p] = 0
			}
			busy, backlogged, open := 0, 0, 0
			for i, k := range l.peers {
				if l.busy[i] {
					busy++
				}
				if k.waiting() {
					backlogged++
					if !l.busy[i] {
						t.Fatalf("%s: a backlog on an idle link", k.name)
					}
				}
				if k.open {
					open++
				}
			}
			unclean, gone := 0, 0
			for i, k := range l.peers {
				if k.failures > 0 || k.open {
					unclean++
				}
				if k.gone {
					gone++
					if !l.busy[i] {
						t.Fatalf("%s: marked gone while idle", k.name)
					}
				}
			}
			if gone != l.gone {
				t.Fatalf("%d peers marked gone, counted %d", gone, l.gone)
			}
			if unclean != l.unclean {
				t.Fatalf("%d breakers with failures or open, counted %d", unclean, l.unclean)
			}
			st := l.Stats()
			if st.Busy != busy || st.Backlogged != backlogged || st.Open != open {
				t.Fatalf("stats %+v; counted %d busy, %d backlogged, %d open", st, busy, backlogged, open)
			}
		}
	})
}
