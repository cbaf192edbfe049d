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
