package raftgroup

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir/lease"
)

// BenchmarkDurable measures a durable decision's latency through a 3-voter
// group on loopback (raft-boltdb, fsync on every commit) against the
// reference, a plain raft.Apply of a no-op entry on the same group in the
// same run (docs/durable.md):
//
//	raft-noop:          raft.Apply of a no-op entry on the leader
//	durable:            Group.Durable on the leader
//	durable-forwarded:  the same on a follower (one gRPC hop to the leader)
//	durable-client:     Client.Durable (a non-voter: one hop to a voter,
//	                    which forwards when it does not lead)
//	interleaved:        a no-op, a durable decision on the leader and one on
//	                    a follower in turn, reporting each one's p50 and p99
//	                    and the ratios of their means to the no-op's
//
// Run: go test ./lease -run '^$' -bench Durable -benchtime 2000x
func BenchmarkDurable(b *testing.B) {
	c := newCluster(b, 3, func(cfg *Config) {
		// Calmer timeouts than the tests': a leader change would end the run.
		cfg.TickInterval = -1
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond
	})
	l := c.leader()
	f := c.follower(l)
	cl, err := NewClient(ClientConfig{Voters: []string{f.RPCAddr()}, Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	rule := lease.DurableRule{ID: "otp", Limit: 5, Window: 15 * time.Minute, Burst: 5}
	i := 0
	durable := func(svc DurableService) {
		i++
		// A new identity each time: every decision admits and charges.
		if _, err := svc.Durable(ctx, rule, fmt.Sprint("user-", i), 1); err != nil {
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
	b.Run("durable", func(b *testing.B) {
		for b.Loop() {
			durable(l)
		}
	})
	b.Run("durable-forwarded", func(b *testing.B) {
		for b.Loop() {
			durable(f)
		}
	})
	b.Run("durable-client", func(b *testing.B) {
		for b.Loop() {
			durable(cl)
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		var tn, td, tf []time.Duration
		for b.Loop() {
			t0 := time.Now()
			noop()
			t1 := time.Now()
			durable(l)
			t2 := time.Now()
			durable(f)
			tn, td, tf = append(tn, t1.Sub(t0)), append(td, t2.Sub(t1)), append(tf, time.Since(t2))
		}
		mn, md, mf := mean(tn), mean(td), mean(tf)
		b.ReportMetric(float64(mn.Nanoseconds()), "noop-ns/op")
		b.ReportMetric(float64(md.Nanoseconds()), "durable-ns/op")
		b.ReportMetric(float64(md)/float64(mn), "durable/noop")
		b.ReportMetric(float64(mf)/float64(mn), "forwarded/noop")
		for _, s := range []struct {
			name string
			d    []time.Duration
		}{{"noop", tn}, {"durable", td}, {"forwarded", tf}} {
			b.ReportMetric(float64(quantile(s.d, 0.5).Microseconds()), s.name+"-p50-µs")
			b.ReportMetric(float64(quantile(s.d, 0.99).Microseconds()), s.name+"-p99-µs")
		}
	})
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(max(len(d), 1))
}

// quantile returns the q-quantile of d (sorting it).
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(int(q*float64(len(d))), len(d)-1)]
}
