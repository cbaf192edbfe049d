package shell

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/weir-dev/weir/quota"
)

// testNode is one shell over the real gRPC transport on loopback.
type testNode struct {
	name  string
	shell *Node
	tr    *GRPCTransport
}

func startGRPCCluster(t *testing.T, n int, rules ...quota.Rule) []*testNode {
	t.Helper()
	return startGRPCClusterWith(t, n, nil, rules...)
}

// startGRPCClusterWith is startGRPCCluster with a change to every node's
// Config.
func startGRPCClusterWith(t *testing.T, n int, tweak func(*Config), rules ...quota.Rule) []*testNode {
	t.Helper()
	return startGRPCClusterParams(t, n, tweak, ruleParams(t, rules))
}

// startGRPCClusterParams is startGRPCClusterWith for rules made already.
func startGRPCClusterParams(t *testing.T, n int, tweak func(*Config), params []cluster.RuleParams) []*testNode {
	t.Helper()
	var nodes []*testNode
	var members []cluster.Member
	for i := range n {
		name := fmt.Sprintf("gw-%d", i)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tn := &testNode{name: name}
		tr, err := NewGRPCTransport(GRPCConfig{Self: name, Listener: ln,
			Handler: func(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
				return tn.shell.Handle(ctx, from, m)
			}})
		if err != nil {
			t.Fatal(err)
		}
		tn.tr = tr
		// Generous timeouts: CI runs this with -race on a loaded 2-core box.
		cfg := Config{Coordinator: cluster.CoordinatorConfig{Self: name, DecideTimeout: time.Second},
			Transport: tr, CallTimeout: 2 * time.Second}
		if tweak != nil {
			tweak(&cfg)
		}
		sh, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tn.shell = sh
		nodes = append(nodes, tn)
		members = append(members, cluster.Member{Name: name, Addr: tr.Addr()})
	}
	ring, err := cluster.NewRing(1, members)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range nodes {
		tn.shell.SetRules(params)
		tn.shell.SetRing(ring)
	}
	t.Cleanup(func() {
		for _, tn := range nodes {
			tn.shell.Close()
			tn.tr.Close()
		}
	})
	return nodes
}

// TestShellOverGRPC: three nodes on loopback gRPC limit one identity as one
// limiter: a client spread round-robin at about 3× the rate is admitted no
// more than B + r·Δ + S over the run (and close to r·Δ), and nothing is
// degraded when no fault is injected.
func TestShellOverGRPC(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, mode := range []quota.Mode{quota.ModeShared, quota.ModeExact} {
		t.Run(string(mode), func(t *testing.T) {
			rule := gcraRule("api", mode, 200, time.Second, 20)
			nodes := startGRPCCluster(t, 3, rule)
			p, _ := cluster.NewRuleParams(&rule, 1)
			var S int64
			if mode == quota.ModeShared {
				S = 2 * p.Slack(3)
			}
			const run = 1500 * time.Millisecond
			var mu sync.Mutex
			admitted := 0
			var wg sync.WaitGroup
			start := time.Now()
			for _, tn := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(5 * time.Millisecond) // 200/s per node: 3× the rate in all
					defer tick.Stop()
					for time.Since(start) < run {
						<-tick.C
						o, err := tn.shell.Decide(context.Background(), "api", "customer-7", 1)
						if err != nil {
							t.Error(err)
							return
						}
						if o.Allowed {
							mu.Lock()
							admitted++
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			upper := float64(rule.Burst+S) + 200*elapsed.Seconds()
			if float64(admitted) > upper+1 {
				t.Errorf("admitted %d in %v, above B + r·Δ + S = %.0f", admitted, elapsed, upper)
			}
			// A loose lower bound only: wall-clock scheduling on a loaded
			// machine is not the simulator.
			if float64(admitted) < 0.7*200*run.Seconds() {
				t.Errorf("admitted %d in %v: far below r·Δ = %.0f", admitted, elapsed, 200*run.Seconds())
			}
			for _, tn := range nodes {
				st, sent, failed := tn.shell.Stats()
				if st.Degraded != 0 || failed != 0 {
					t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", tn.name, st.Degraded, failed)
				}
				t.Logf("%s: local %d, forwarded %d, view rejects %d, syncs %d, exchanges %d", tn.name, st.LocalAdmits, st.Forwarded, st.ViewRejects, st.SyncsSent, sent)
			}
			t.Logf("admitted %d in %v (r·Δ = %.0f, bound %.0f)", admitted, elapsed, 200*elapsed.Seconds(), upper)
		})
	}
}

// TestShellOwnerDown: when the owner stops answering, callers get no error:
// after the breaker opens, decisions are made by on_failure and marked
// degraded; the degraded count equals the decisions made so.
func TestShellOwnerDown(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the cluster's own cleanup
	rule := gcraRule("api", quota.ModeExact, 300, time.Second, 30)
	nodes := startGRPCCluster(t, 3, rule)
	id := "customer-9"
	owner := nodes[0].shell.Ring().OwnerName(id)
	var caller *testNode
	for _, tn := range nodes {
		if tn.name == owner {
			tn.shell.Close()
			tn.tr.Close()
		} else {
			caller = tn
		}
	}
	degraded, admitted := 0, 0
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 200 && time.Now().Before(deadline); i++ {
		o, err := caller.shell.Decide(context.Background(), "api", id, 1)
		if err != nil {
			t.Fatalf("decision %d: %v (callers must see no error)", i, err)
		}
		if o.Degraded {
			degraded++
		}
		if o.Allowed {
			admitted++
		}
	}
	st, _, failed := caller.shell.Stats()
	if degraded == 0 || failed == 0 {
		t.Fatalf("owner down: %d degraded decisions, %d failed exchanges", degraded, failed)
	}
	if uint64(degraded) != st.Degraded {
		t.Errorf("degraded decisions seen %d, counted %d", degraded, st.Degraded)
	}
	// on_failure local: limit ÷ 3 nodes = 100/s with burst 10 on this node.
	if admitted > 10+100*5 {
		t.Errorf("admitted %d while the owner was down", admitted)
	}
	t.Logf("owner down: %d decisions degraded, %d admitted, %d exchanges failed", degraded, admitted, failed)
}

// TestShellBatchSize: forwarded decisions never wait for the linger (they go
// at once, with the exchange in flight's return, or at MaxBatch items), and
// a batch larger than MaxBatch — a leaving node's handoffs — is cut
// into exchanges of at most MaxBatch items that all arrive.
func TestShellBatchSize(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the nodes' cleanup
	rule := gcraRule("api", quota.ModeExact, 10, time.Minute, 5)
	// A linger far longer than the test: what does not go at once (no
	// exchange in flight) or when the exchange in flight returns must go
	// by the size trigger; nothing waits for the linger.
	nodes := startGRPCClusterWith(t, 2, func(c *Config) {
		c.MaxBatch = 8
		c.Linger = time.Hour
	}, rule)
	ring := nodes[0].shell.Ring()
	var theirs, ours []string
	for i := 0; len(theirs) < 8 || len(ours) < 2000; i++ {
		id := fmt.Sprintf("id-%d", i)
		if ring.OwnerName(id) == "gw-1" {
			theirs = append(theirs, id)
		} else {
			ours = append(ours, id)
		}
	}
	// Eight forwarded decisions fill one batch: it leaves at once.
	var wg sync.WaitGroup
	for _, id := range theirs[:8] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			o, err := nodes[0].shell.Decide(ctx, "api", id, 1)
			if err != nil || !o.Allowed || o.Degraded {
				t.Errorf("%s: allowed=%v degraded=%v err=%v", id, o.Allowed, o.Degraded, err)
			}
		}()
	}
	wg.Wait()
	// gw-0 owns 2000 spent buckets; leaving hands them to gw-1 in batches
	// of 8, which the wire would refuse as one message above MaxBatchItems
	// for larger fleets.
	for _, id := range ours[:2000] {
		if o, err := nodes[0].shell.Decide(context.Background(), "api", id, 1); err != nil || !o.Allowed {
			t.Fatalf("%s: %v %v", id, o.Allowed, err)
		}
	}
	_, before, _ := nodes[0].shell.Stats()
	nodes[0].shell.Leave()
	st, _, _ := nodes[1].shell.Stats()
	if st.Owned < 2000 {
		t.Errorf("gw-1 owns %d buckets after gw-0 left, want the 2000 handed over", st.Owned)
	}
	if _, after, failed := nodes[0].shell.Stats(); after-before < 2000/8 || failed != 0 {
		t.Errorf("%d exchanges (%d failed) for 2000 handoffs in batches of 8", after-before, failed)
	}
}

// randomMessage draws a message of every kind of item; its blind reports
// are of 1 to 12 items each.
func randomMessage(t *rapid.T) cluster.Message {
	m := cluster.Message{Epoch: 7, HandedOver: rapid.Uint64Range(0, 2).Draw(t, "marker")}
	for i := range rapid.IntRange(0, 20).Draw(t, "handoffs") {
		m.Handoffs = append(m.Handoffs, cluster.HandoffItem{Identity: fmt.Sprint("h", i)})
	}
	for seq := range uint64(rapid.IntRange(0, 5).Draw(t, "reports")) {
		for i := range rapid.IntRange(1, 12).Draw(t, "report items") {
			m.Blinds = append(m.Blinds, cluster.BlindItem{Stream: 3, Seq: seq + 1, Identity: fmt.Sprint("b", i)})
		}
	}
	for i := range rapid.IntRange(0, 20).Draw(t, "syncs") {
		m.Syncs = append(m.Syncs, cluster.SyncItem{Identity: fmt.Sprint("s", i)})
	}
	for i := range rapid.IntRange(0, 20).Draw(t, "decides") {
		m.Decides = append(m.Decides, cluster.DecideItem{Ticket: uint64(i + 1)})
	}
	for i := range rapid.IntRange(0, 20).Draw(t, "acks") {
		m.Acks = append(m.Acks, cluster.AckItem{Identity: fmt.Sprint("a", i)})
	}
	for i := range rapid.IntRange(0, 5).Draw(t, "blind acks") {
		m.BlindAcks = append(m.BlindAcks, cluster.BlindAck{Stream: 3, Seq: uint64(i + 1)})
	}
	for i := range rapid.IntRange(0, 10).Draw(t, "tracks") {
		m.Tracks = append(m.Tracks, cluster.TrackItem{Identity: fmt.Sprint("t", i)})
	}
	for i := range rapid.IntRange(0, 20).Draw(t, "results") {
		m.Results = append(m.Results, cluster.ResultItem{Ticket: uint64(i + 1)})
	}
	return m
}

// TestMessageSplit: Split keeps every item, in order, handoffs first, in
// parts of at most n items, and never cuts a blind report: a part longer
// than n is one report alone.
func TestMessageSplit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := randomMessage(t)
		n := rapid.IntRange(1, 30).Draw(t, "n")
		parts := m.Split(n)
		var joined cluster.Message
		joined.Epoch = 7
		for i, p := range parts {
			if p.Items() == 0 && m.Items() > 0 {
				t.Fatalf("part %d is empty", i)
			}
			if p.Items() > n && (p.Items() != len(p.Blinds) || cluster.BlindReportLen(p.Blinds) != len(p.Blinds)) {
				t.Fatalf("part %d has %d items (n = %d), not one blind report alone", i, p.Items(), n)
			}
			if p.Epoch != 7 {
				t.Fatalf("part %d lost the epoch", i)
			}
			if i > 0 && len(p.Handoffs) > 0 && parts[i-1].Items() != n {
				t.Fatalf("part %d: handoffs after a part that was not full", i)
			}
			if k := len(joined.Blinds); k > 0 && len(p.Blinds) > 0 && joined.Blinds[k-1].Seq == p.Blinds[0].Seq {
				t.Fatalf("part %d: blind report %d cut between parts", i, p.Blinds[0].Seq)
			}
			if p.HandedOver != 0 && i != len(parts)-1 {
				t.Fatalf("part %d of %d carries the handed-over marker", i, len(parts))
			}
			joined.Handoffs = append(joined.Handoffs, p.Handoffs...)
			joined.Blinds = append(joined.Blinds, p.Blinds...)
			joined.Syncs = append(joined.Syncs, p.Syncs...)
			joined.Decides = append(joined.Decides, p.Decides...)
			joined.Acks = append(joined.Acks, p.Acks...)
			joined.BlindAcks = append(joined.BlindAcks, p.BlindAcks...)
			joined.Tracks = append(joined.Tracks, p.Tracks...)
			joined.Results = append(joined.Results, p.Results...)
			joined.HandedOver |= p.HandedOver
		}
		if !reflect.DeepEqual(normal(joined), normal(m)) {
			t.Fatalf("joined parts differ from the message")
		}
	})
}

func normal(m cluster.Message) cluster.Message {
	if len(m.Handoffs) == 0 {
		m.Handoffs = nil
	}
	if len(m.Syncs) == 0 {
		m.Syncs = nil
	}
	if len(m.Decides) == 0 {
		m.Decides = nil
	}
	if len(m.Acks) == 0 {
		m.Acks = nil
	}
	if len(m.Results) == 0 {
		m.Results = nil
	}
	if len(m.Blinds) == 0 {
		m.Blinds = nil
	}
	if len(m.BlindAcks) == 0 {
		m.BlindAcks = nil
	}
	if len(m.Tracks) == 0 {
		m.Tracks = nil
	}
	return m
}

// TestShellShards: with identities spread over several shards, every
// forwarded decision comes back to the shard and the caller that asked (the
// ticket carries its shard), so `exact` admits each identity's burst and
// not one token more, whatever the number of shards; and every shard's
// counters are summed.
func TestShellShards(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const ids, tries, burst = 48, 4, 5
	for _, shards := range []int{1, 8} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			rule := gcraRule("api", quota.ModeExact, burst, time.Hour, burst)
			nodes := startGRPCClusterWith(t, 3, func(c *Config) { c.Shards = shards }, rule)
			admitted := make([]int, ids)
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range ids {
				for _, tn := range nodes {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range tries {
							o, err := tn.shell.Decide(context.Background(), "api", fmt.Sprintf("id-%d", i), 1)
							if err != nil {
								t.Error(err)
								return
							}
							if o.Allowed {
								mu.Lock()
								admitted[i]++
								mu.Unlock()
							}
						}
					}()
				}
			}
			wg.Wait()
			for i, n := range admitted {
				if n != burst {
					t.Errorf("id-%d: %d admitted of %d asked, want exactly the burst %d", i, n, tries*len(nodes), burst)
				}
			}
			var forwarded, remote uint64
			for _, tn := range nodes {
				st, _, failed := tn.shell.Stats()
				if st.Degraded != 0 || failed != 0 {
					t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", tn.name, st.Degraded, failed)
				}
				forwarded += st.Forwarded
				remote += st.RemoteResults
			}
			// Every decision of a non-owner went to the owner and came back.
			if want := uint64(ids * tries * (len(nodes) - 1)); forwarded != want || remote != want {
				t.Errorf("forwarded %d, results %d; want %d each", forwarded, remote, want)
			}
		})
	}
}

// TestShellConfigShards: the shard count is a power of two in range.
func TestShellConfigShards(t *testing.T) {
	for _, n := range []int{-1, 3, 12, MaxShards * 2} {
		_, err := New(Config{Coordinator: cluster.CoordinatorConfig{Self: "a"}, Transport: NewInmemNetwork().Transport("a", nil), Shards: n})
		if err == nil {
			t.Errorf("Shards %d accepted", n)
		}
	}
}

// TestStatsAddEveryField: Stats.add sums every field, so a counter added
// to Stats later cannot be lost in the Node's sum over shards.
func TestStatsAddEveryField(t *testing.T) {
	var one cluster.Stats
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		case reflect.Uint64:
			f.SetUint(1)
		default:
			t.Fatalf("Stats.%s: kind %s not handled by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	var sum cluster.Stats
	sum.Add(&one)
	sum.Add(&one)
	w := reflect.ValueOf(sum)
	for i := range w.NumField() {
		if f := w.Field(i); !(f.CanInt() && f.Int() == 2) && !(f.CanUint() && f.Uint() == 2) {
			t.Errorf("Stats.%s = %v after adding 1 twice, want 2", w.Type().Field(i).Name, f)
		}
	}
}
