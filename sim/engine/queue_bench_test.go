package engine

import "testing"

// BenchmarkQueue: a pop and a push per event on a heap of 64 pending
// events, each rescheduled a random delay later, as message deliveries are.
func BenchmarkQueue(b *testing.B) {
	s := New(0, 1)
	r := s.Rand()
	var q queue
	var seq uint64
	for range 64 {
		seq++
		q.push(item{at: r.Int64N(400_000), seq: seq})
	}
	for b.Loop() {
		it := q.pop()
		seq++
		q.push(item{at: it.at + 100_000 + r.Int64N(300_000), seq: seq})
	}
}

// resched is an event that schedules itself again a delivery's delay
// later (100 to 400 µs), as the messages of a run do.
type resched struct{}

func (resched) Fire(s *Sim) { s.After(100_000+s.Rand().Int64N(300_000), resched{}) }

// BenchmarkSimQueue: one event fired and one scheduled per op, 64 pending,
// through the Sim: with the wheel (as runs are), and with the heap alone
// (span 0) for comparison in the same run.
func BenchmarkSimQueue(b *testing.B) {
	for _, bc := range []struct {
		name  string
		wheel bool
	}{{"wheel", true}, {"heap", false}} {
		b.Run(bc.name, func(b *testing.B) {
			s := New(0, 1)
			if !bc.wheel {
				s.wheel.span = 0
			}
			for range 64 {
				s.At(s.Rand().Int64N(400_000), resched{})
			}
			for b.Loop() {
				s.Step(1 << 62)
			}
		})
	}
}
