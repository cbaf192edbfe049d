package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

type rec struct {
	log *[]int
	id  int
}

func (r rec) Fire(*Sim) { *r.log = append(*r.log, r.id) }

// TestOrder: events fire in time order, and events due at one time in the
// order they were scheduled.
func TestOrder(t *testing.T) {
	s := New(100, 1)
	var log []int
	times := []int64{150, 120, 150, 90, 120, 200, 150}
	for i, at := range times {
		s.At(at, rec{&log, i})
	}
	s.Run(180)
	// 90 is in the past: it fires at 100, first.
	if want := []int{3, 1, 4, 0, 2, 6}; !slices.Equal(log, want) {
		t.Fatalf("fired %v, want %v", log, want)
	}
	if s.Now() != 180 || s.Pending() != 1 {
		t.Fatalf("now %d, pending %d", s.Now(), s.Pending())
	}
}

type arrival struct {
	got     *[]int64
	dropped *int
}

func (a arrival) Fire(s *Sim)  { *a.got = append(*a.got, s.Now()) }
func (a arrival) Dropped(*Sim) { *a.dropped++ }

// TestNetwork: latency, loss and partitions (at send and at delivery).
func TestNetwork(t *testing.T) {
	s := New(0, 7)
	nw := NewNetwork(s, 3, Const{D: time.Millisecond})
	var got []int64
	var dropped int
	a := arrival{&got, &dropped}
	if at, ok := nw.Send(0, 1, a); !ok || at != int64(time.Millisecond) {
		t.Fatalf("send: %d %v", at, ok)
	}
	s.Run(int64(time.Second))
	if len(got) != 1 || got[0] != int64(time.Millisecond) {
		t.Fatalf("arrivals %v", got)
	}
	id := nw.Partition([]int{0, 1, 1})
	if nw.Reachable(0, 1) || !nw.Reachable(1, 2) {
		t.Fatal("partition sides wrong")
	}
	if _, ok := nw.Send(0, 2, a); ok {
		t.Fatal("sent across a partition")
	}
	nw.Heal(id)
	nw.Send(0, 2, a) // in flight when the partition starts again
	nw.Partition([]int{0, 1, 1})
	s.Run(int64(2 * time.Second))
	if len(got) != 1 || dropped != 1 {
		t.Fatalf("arrivals %v, dropped %d: the message should be cut at delivery", got, dropped)
	}
	nw2 := NewNetwork(New(0, 9), 2, Const{})
	nw2.SetLoss(1)
	if _, ok := nw2.Send(0, 1, a); ok || nw2.Lost != 1 {
		t.Fatal("loss 1 delivered a message")
	}
}

// direct is a message sent with SendDirect: it checks its own delivery.
type direct struct {
	nw      *Network
	a, b    int
	got     *[]int64
	dropped *int
}

func (d direct) Fire(s *Sim) {
	if !d.nw.Arrives(d.a, d.b) {
		*d.dropped++
		return
	}
	*d.got = append(*d.got, s.Now())
}

// TestSendDirect: SendDirect delivers as Send does, and Arrives cuts what
// a partition started in flight separates, counting it.
func TestSendDirect(t *testing.T) {
	s := New(0, 7)
	nw := NewNetwork(s, 3, Const{D: time.Millisecond})
	var got []int64
	var dropped int
	msg := func(a, b int) direct { return direct{nw, a, b, &got, &dropped} }
	if at, ok := nw.SendDirect(0, 1, msg(0, 1)); !ok || at != int64(time.Millisecond) {
		t.Fatalf("send: %d %v", at, ok)
	}
	s.Run(int64(time.Second))
	if len(got) != 1 || got[0] != int64(time.Millisecond) {
		t.Fatalf("arrivals %v", got)
	}
	id := nw.Partition([]int{0, 1, 1})
	if _, ok := nw.SendDirect(0, 2, msg(0, 2)); ok || nw.Cut != 1 {
		t.Fatal("sent across a partition")
	}
	nw.SendDirect(1, 2, msg(1, 2)) // the same side: arrives
	nw.Heal(id)
	nw.SendDirect(0, 2, msg(0, 2)) // in flight when the partition starts again
	s.Run(int64(time.Second) + int64(time.Millisecond)/2)
	nw.Partition([]int{0, 1, 1})
	s.Run(int64(2 * time.Second))
	if len(got) != 2 || dropped != 1 || nw.Cut != 2 || nw.Sent != 4 {
		t.Fatalf("arrivals %v, dropped %d, cut %d, sent %d: the last message should be cut at delivery", got, dropped, nw.Cut, nw.Sent)
	}
}

// TestSeeded: one seed, one sequence.
func TestSeeded(t *testing.T) {
	draw := func(seed uint64) []int64 {
		s := New(0, seed)
		l := LogNormal{Median: time.Millisecond, Sigma: 1}
		var out []int64
		for range 10 {
			out = append(out, l.Draw(s.PCG()))
		}
		return out
	}
	if !slices.Equal(draw(3), draw(3)) || slices.Equal(draw(3), draw(4)) {
		t.Fatal("draws do not follow the seed")
	}
}

// TestQueueOrder: the heap pops any mix of pushes and pops in (at, seq)
// order, the order a sorted list would give.
func TestQueueOrder(t *testing.T) {
	s := New(0, 5)
	r := s.Rand()
	var q queue
	var ref []item
	var seq uint64
	for range 20000 {
		if len(ref) == 0 || r.IntN(3) > 0 {
			seq++
			it := item{at: r.Int64N(500), seq: seq}
			q.push(it)
			ref = append(ref, it)
			continue
		}
		slices.SortFunc(ref, func(a, b item) int {
			if a.before(&b) {
				return -1
			}
			return 1
		})
		got := q.pop()
		if got.at != ref[0].at || got.seq != ref[0].seq {
			t.Fatalf("popped (%d, %d), want (%d, %d)", got.at, got.seq, ref[0].at, ref[0].seq)
		}
		ref = ref[1:]
	}
}

// TestProduct: every combination once, last index fastest, empty
// dimensions counted as one.
func TestProduct(t *testing.T) {
	var got []string
	Product([]int{2, 0, 3}, func(i []int) { got = append(got, fmt.Sprint(i)) })
	want := "[[0 0 0] [0 0 1] [0 0 2] [1 0 0] [1 0 1] [1 0 2]]"
	if fmt.Sprint(got) != want {
		t.Fatalf("Product = %v, want %s", got, want)
	}
	n := 0
	Product(nil, func([]int) { n++ })
	if n != 1 {
		t.Fatalf("Product of no dimensions visited %d times, want 1", n)
	}
}

// spawner fires and schedules more events at random offsets (zero
// included), some before every event already scheduled: the path through
// the Sim's front slot.
type spawner struct {
	log *[][2]int64
	id  int64
	n   *int64
}

func (e spawner) Fire(s *Sim) {
	*e.log = append(*e.log, [2]int64{s.Now(), e.id})
	for range s.Rand().IntN(3) {
		*e.n++
		s.After(s.Rand().Int64N(40), spawner{e.log, *e.n, e.n})
	}
}

// TestSimOrder: through Sim.At and Step (with the front slot), events fire
// in (time, scheduling order), every one of them, and Pending counts them.
func TestSimOrder(t *testing.T) {
	s := New(0, 3)
	var log [][2]int64
	var n int64
	for range 50 {
		n++
		s.At(s.Rand().Int64N(100), spawner{&log, n, &n})
	}
	s.Run(5000)
	for i := 1; i < len(log); i++ {
		a, b := log[i-1], log[i]
		if b[0] < a[0] || (b[0] == a[0] && b[1] < a[1]) {
			t.Fatalf("fired (%d, #%d) after (%d, #%d)", b[0], b[1], a[0], a[1])
		}
	}
	if int64(len(log))+int64(s.Pending()) != n {
		t.Fatalf("%d fired + %d pending, %d scheduled", len(log), s.Pending(), n)
	}
}

// chain is an event that logs itself and schedules more: at random delays
// (some of them fixed, some of them in the past), in a lane or not.
type chain struct {
	log   *[]string
	lanes []*Lane // nil: schedule everything with At
	id    int
	left  int
}

func (c *chain) Fire(s *Sim) {
	*c.log = append(*c.log, fmt.Sprintf("%d@%d", c.id, s.Now()))
	if c.left == 0 {
		return
	}
	r := s.Rand()
	for k := range 2 {
		next := &chain{log: c.log, lanes: c.lanes, id: c.id*2 + k, left: c.left - 1}
		var d int64
		switch r.IntN(4) {
		case 0:
			d = 50 // a fixed delay: in order within a lane
		case 1:
			d = r.Int64N(100)
		case 2:
			d = -r.Int64N(10) // in the past: fires now, after what is due
		default:
			d = 0
		}
		lane := r.IntN(3) // 2: no lane
		if c.lanes != nil && lane < len(c.lanes) {
			s.AfterIn(c.lanes[lane], d, next)
		} else {
			s.After(d, next)
		}
	}
}

// TestLanes: events scheduled in lanes fire in exactly the (at, seq)
// order they would fire in without lanes, including events that arrive
// out of a lane's order (they go to the heap).
func TestLanes(t *testing.T) {
	run := func(lanes bool) []string {
		s := New(0, 3)
		var log []string
		var ls []*Lane
		if lanes {
			ls = []*Lane{s.Lane(), s.Lane()}
		}
		for i := range 4 {
			s.At(int64(i*7), &chain{log: &log, lanes: ls, id: i + 1, left: 10})
		}
		s.Run(150)
		if lanes && s.Pending() == 0 {
			t.Fatal("nothing left pending at the cut")
		}
		s.Run(1 << 40)
		return log
	}
	plain, laned := run(false), run(true)
	if len(plain) < 1000 {
		t.Fatalf("only %d events fired", len(plain))
	}
	if !slices.Equal(plain, laned) {
		for i := range min(len(plain), len(laned)) {
			if plain[i] != laned[i] {
				t.Fatalf("event %d: %s with lanes, %s without (of %d, %d)", i, laned[i], plain[i], len(laned), len(plain))
			}
		}
		t.Fatalf("%d events with lanes, %d without", len(laned), len(plain))
	}
}

// wheelChain is chain at the wheel's scale: delays from nothing to several
// times the wheel's span, ties within a bucket, delays in the past, fixed
// delays in lanes.
type wheelChain struct {
	log   *[]string
	lanes []*Lane
	id    int
	left  int
}

func (c *wheelChain) Fire(s *Sim) {
	*c.log = append(*c.log, fmt.Sprintf("%d@%d", c.id, s.Now()))
	if c.left == 0 {
		return
	}
	r := s.Rand()
	const span = wheelSlots << wheelShift
	for k := range 2 {
		next := &wheelChain{log: c.log, lanes: c.lanes, id: c.id*2 + k, left: c.left - 1}
		var d int64
		switch r.IntN(6) {
		case 0:
			d = 1 << wheelShift // a fixed delay: in order within a lane
		case 1:
			d = r.Int64N(1 << wheelShift) // within a bucket or the next
		case 2:
			d = r.Int64N(span) // anywhere in the wheel
		case 3:
			d = span - 2<<wheelShift + r.Int64N(4<<wheelShift) // at its far edge
		case 4:
			d = r.Int64N(4 * span) // mostly beyond it: the heap
		default:
			d = -r.Int64N(10) // in the past: fires now, after what is due
		}
		lane := r.IntN(4) // 2, 3: no lane
		if c.lanes != nil && lane < len(c.lanes) {
			s.AfterIn(c.lanes[lane], d, next)
		} else {
			s.After(d, next)
		}
	}
}

// TestWheel: with the wheel, events fire in exactly the (at, seq) order
// they fire in with the heap alone, lanes or not, over many seeds.
func TestWheel(t *testing.T) {
	run := func(seed uint64, wheel, lanes bool) []string {
		s := New(0, seed)
		if !wheel {
			s.wheel.span = 0
		}
		var log []string
		var ls []*Lane
		if lanes {
			ls = []*Lane{s.Lane(), s.Lane()}
		}
		for i := range 6 {
			s.At(int64(i)*333, &wheelChain{log: &log, lanes: ls, id: i + 1, left: 9})
		}
		s.Run(3 << (wheelShift + 10)) // a cut with events pending
		if s.Pending() == 0 {
			t.Fatal("nothing left pending at the cut")
		}
		if wheel && s.wheel.n < 10 {
			t.Fatalf("the wheel held %d events at the cut", s.wheel.n)
		}
		s.Run(1 << 50)
		if wheel && len(s.wheel.nodes) < 3 {
			t.Fatalf("the buckets' lists held at most %d events at once", len(s.wheel.nodes))
		}
		return log
	}
	for seed := range uint64(20) {
		for _, lanes := range []bool{false, true} {
			heap, wheel := run(seed, false, lanes), run(seed, true, lanes)
			if len(heap) < 3000 {
				t.Fatalf("only %d events fired", len(heap))
			}
			if !slices.Equal(heap, wheel) {
				for i := range min(len(heap), len(wheel)) {
					if heap[i] != wheel[i] {
						t.Fatalf("seed %d lanes %v: event %d: %s with the wheel, %s without", seed, lanes, i, wheel[i], heap[i])
					}
				}
				t.Fatalf("seed %d: %d events with the wheel, %d without", seed, len(wheel), len(heap))
			}
		}
	}
}
