package weir_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// BenchmarkDurableAllow measures Node.Allow on a durable rule against the
// same rule decided on the node alone (mode local), on gateways that are
// the three voters of a lease group on loopback (raft-boltdb, fsync on
// every commit), in one run (docs/durable.md):
//
//	local:              Allow, the rule with mode local (no network)
//	durable-leader:     Allow on the leader's gateway (one Raft commit)
//	durable-follower:   Allow on a follower's gateway (a gRPC hop to the
//	                    leader, then the commit)
//	interleaved:        one of each in turn, reporting p50 and p99 of each
//	                    and the ratios of the durable means to the local one
//
// Run: go test -run '^$' -bench DurableAllow -benchtime 2000x .
func BenchmarkDurableAllow(b *testing.B) {
	rule := func(id, path string, durable bool) quota.Rule {
		r := quota.Rule{ID: id, Match: quota.Match{Path: path}, Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Account"}},
			Limit: 5, Window: 15 * time.Minute, Burst: 5, OnFailure: quota.OnFailureClosed}
		if durable {
			r.Durable, r.Mode = true, quota.ModeExact
		} else {
			r.Mode = quota.ModeLocal
		}
		return r
	}
	rules := []quota.Rule{rule("otp-local", "/local", false), rule("otp-durable", "/durable", true)}
	var voters []raftgroup.Voter
	raftLis, rpcLis := map[string]net.Listener{}, map[string]net.Listener{}
	peers := map[string]string{}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	for i := range 3 {
		name := fmt.Sprintf("gw-%d", i)
		raftLis[name], rpcLis[name] = listen(), listen()
		peers[name] = rpcLis[name].Addr().String()
		voters = append(voters, raftgroup.Voter{Name: name, Addr: raftLis[name].Addr().String()})
	}
	var nodes []*weir.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i := range 3 {
		name := fmt.Sprintf("gw-%d", i)
		n, err := weir.New(weir.Config{Rules: rules, Lease: &weir.LeaseConfig{DurableTimeout: 30 * time.Second,
			Voter: &raftgroup.Config{Name: name, Dir: b.TempDir(), Voters: voters, RPCPeers: peers,
				RaftListener: raftLis[name], RPCListener: rpcLis[name], Machine: lease.Config{Regions: []string{"eu"}},
				TickInterval: -1, // no background entries in the measurement
				// Calm timeouts: a leader change would end the run.
				HeartbeatTimeout: 500 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond,
				LeaderLeaseTimeout: 250 * time.Millisecond}}})
		if err != nil {
			b.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	var leader, follower *weir.Node
	for deadline := time.Now().Add(30 * time.Second); leader == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("no leader within 30s")
		}
		for _, n := range nodes {
			if weir.LeaseGroupOf(n).Ready() {
				leader = n
			}
		}
	}
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}
	ctx := context.Background()
	i := 0
	decide := func(n *weir.Node, path string) {
		i++
		// A new account each time: every decision admits and charges.
		d := n.Allow(ctx, weir.Request{Method: "POST", Path: path, Header: http.Header{"X-Account": {fmt.Sprint("acct-", i)}}})
		if !d.Allowed || d.Degraded {
			b.Fatalf("%s: allowed %v, degraded %v", path, d.Allowed, d.Degraded)
		}
	}
	b.Run("local", func(b *testing.B) {
		for b.Loop() {
			decide(leader, "/local")
		}
	})
	b.Run("durable-leader", func(b *testing.B) {
		for b.Loop() {
			decide(leader, "/durable")
		}
	})
	b.Run("durable-follower", func(b *testing.B) {
		for b.Loop() {
			decide(follower, "/durable")
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		var tl, td, tf []time.Duration
		for b.Loop() {
			t0 := time.Now()
			decide(leader, "/local")
			t1 := time.Now()
			decide(leader, "/durable")
			t2 := time.Now()
			decide(follower, "/durable")
			tl, td, tf = append(tl, t1.Sub(t0)), append(td, t2.Sub(t1)), append(tf, time.Since(t2))
		}
		ml, md, mf := meanDur(tl), meanDur(td), meanDur(tf)
		b.ReportMetric(float64(ml.Nanoseconds()), "local-ns/op")
		b.ReportMetric(float64(md.Nanoseconds()), "durable-ns/op")
		b.ReportMetric(float64(md)/float64(ml), "durable/local")
		b.ReportMetric(float64(mf)/float64(ml), "follower/local")
		for _, s := range []struct {
			name string
			d    []time.Duration
		}{{"local", tl}, {"durable", td}, {"follower", tf}} {
			slices.Sort(s.d)
			b.ReportMetric(float64(s.d[len(s.d)/2].Nanoseconds())/1e3, s.name+"-p50-µs")
			b.ReportMetric(float64(s.d[min(len(s.d)*99/100, len(s.d)-1)].Nanoseconds())/1e3, s.name+"-p99-µs")
		}
	})
	for _, n := range nodes {
		for _, rc := range ops.Counts(n) {
			if rc.FailOpen != 0 {
				b.Errorf("rule %s: %d fail-open decisions in a run with no fault", rc.Rule, rc.FailOpen)
			}
		}
	}
}

func meanDur(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(max(len(d), 1))
}
