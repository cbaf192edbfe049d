package raftgroup

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
)

// BenchmarkPropose measures one Report's latency through a 3-voter group
// on loopback (raft-boltdb, fsync on every commit) against the reference,
// a plain raft.Apply of a no-op entry on the same group in the same run:
//
//	raft-noop:        raft.Apply of a no-op entry on the leader
//	report:           Propose of a one-item Report on the leader
//	report-forwarded: the same, proposed on a follower (one gRPC hop more)
//	interleaved:      a no-op and a Report in turn, reporting their ratio
//
// Run: go test ./lease -run '^$' -bench Propose -benchtime 2000x
func BenchmarkPropose(b *testing.B) {
	c := newCluster(b, 3, func(cfg *Config) {
		// Calmer timeouts than the tests': a leader change would end the run.
		cfg.TickInterval = -1
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond
	})
	l := c.leader()
	f := c.follower(l)
	propose(b, l, rulesCmd)
	ctx := context.Background()
	seq := uint64(0)
	report := func(g *Group) {
		seq++
		_, err := g.Propose(ctx, lease.Command{Report: &lease.Report{Reporter: "bench", Seq: seq, Region: "eu",
			Items: []lease.ReportItem{{Rule: "global", Identity: "cust", Demand: int64(seq % 1000)}}}})
		if err != nil {
			b.Fatal(err)
		}
	}
	noop := func() {
		if err := l.raft.Apply(noopEntry, 0).Error(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("raft-noop", func(b *testing.B) {
		for b.Loop() {
			noop()
		}
	})
	b.Run("report", func(b *testing.B) {
		for b.Loop() {
			report(l)
		}
	})
	b.Run("report-forwarded", func(b *testing.B) {
		for b.Loop() {
			report(f)
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		var tn, tr time.Duration
		for b.Loop() {
			t0 := time.Now()
			noop()
			t1 := time.Now()
			report(l)
			tn, tr = tn+t1.Sub(t0), tr+time.Since(t1)
		}
		n := float64(b.N)
		b.ReportMetric(float64(tn.Nanoseconds())/n, "noop-ns/op")
		b.ReportMetric(float64(tr.Nanoseconds())/n, "report-ns/op")
		b.ReportMetric(float64(tr)/float64(tn), "report/noop")
	})
}
