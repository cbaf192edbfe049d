package rls_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/rls"
)

// fwDescriptors is an envoyproxy/ratelimit config with one limit of 20 per
// second per client address.
const fwDescriptors = `
domain: fw
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 20
`

const (
	fwLimit  = 20
	fwWindow = time.Second
)

// fwTally is what a saturating run saw, by the end of the owner's window
// an answer was counted in (known from duration_until_reset: see
// windowEnds): admissions and rejections whose window is certain, and the
// admissions whose round trip spanned a window boundary (unsure: the first
// and last window end they may belong to).
type fwTally struct {
	admitted map[int64]int
	rejected map[int64]int
	unsure   [][2]int64
	answered [3]int // per server
	degraded int
}

// windowEnds returns the first and last aligned window end that the
// owner's window of an answer may have: the call was sent at sent and
// answered at done, with duration_until_reset reset (the owner's window end
// minus its now). The owner decided between sent and done, so its window
// ends in [sent+reset, done+reset], on a multiple of the window: one,
// unless the round trip was longer than a window.
func windowEnds(sent, done int64, reset time.Duration) (first, last int64) {
	w := int64(fwWindow)
	lo, hi := sent+int64(reset), done+int64(reset)
	return (lo + w - 1) / w * w, hi / w * w
}

// TestFixedWindowCluster: an envoyproxy/ratelimit config imported with
// Options.FixedWindow (every limit a fixed_window rule in exact mode),
// served by the RLS server of each of three clustered nodes on loopback,
// called by Envoy's generated client on all three with one client address.
// Every window admits at most 20 over the three servers (per node it would
// be up to 60), and every window the limit was reached in (a call was
// answered OVER_LIMIT in it) admitted exactly 20: as one envoyproxy/ratelimit
// counting in Redis would.
func TestFixedWindowCluster(t *testing.T) {
	d, err := envoyconf.Parse("fw.yaml", []byte(fwDescriptors))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Compile(envoyconf.Options{FixedWindow: true}, d)
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		// memberlist's Shutdown does not wait for a probe in flight,
		// which with LAN timing may run a probe interval (1s) more:
		// TestMain's leak check must not see it.
		deadline := time.Now().Add(5 * time.Second)
		for goleak.Find(ignore) != nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	})
	label := fmt.Sprintf("rls-fixed-window-%d", time.Now().UnixNano())
	var nodes []*weir.Node
	for i := range 3 {
		// LAN timing: the run saturates both cores, and the local
		// profile's 50ms probe timeout then declares busy nodes dead.
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("rls-%d", i), Region: "eu", Label: label,
			DecideTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: cfg.Rules(), Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	want := []string{"rls-0", "rls-1", "rls-2"}
	deadline := time.Now().Add(15 * time.Second)
	for !ringsAre(nodes, want) {
		if time.Now().After(deadline) {
			t.Fatal("the three nodes did not see each other within 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Past the handoff warm-up of the last ring change: an owner new to
	// an identity admits only within slack (none, in exact mode) until then.
	time.Sleep(1200 * time.Millisecond)
	var clients []rlsv3.RateLimitServiceClient
	for _, n := range nodes {
		srv, err := rls.Listen("127.0.0.1:0", rls.New(n, cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		clients = append(clients, client(t, srv.Addr()))
	}

	// A run in which a live node was declared dead (an overloaded
	// machine) is a run with a fault: it is tried again, at most three
	// times.
	var run fwTally
	for attempt := 1; ; attempt++ {
		var changed bool
		run, changed = fwRun(t, nodes, clients, want, 3*fwWindow+fwWindow/2)
		if !changed {
			break
		}
		if attempt == 3 {
			t.Fatal("membership changed under each of 3 attempts: the machine is too loaded")
		}
		t.Logf("membership changed during attempt %d; again", attempt)
		time.Sleep(1200 * time.Millisecond)
	}
	var ends []int64
	for end := range run.admitted {
		ends = append(ends, end)
	}
	for end := range run.rejected {
		if run.admitted[end] == 0 {
			ends = append(ends, end)
		}
	}
	slices.Sort(ends)
	reached := 0
	total := len(run.unsure)
	for _, end := range ends {
		got := run.admitted[end]
		total += got
		unsure := 0
		for _, u := range run.unsure {
			if u[0] <= end && end <= u[1] {
				unsure++
			}
		}
		t.Logf("window ending %d: %d admitted over the three servers (%d unsure), %d answered OVER_LIMIT", end, got, unsure, run.rejected[end])
		if got > fwLimit {
			t.Errorf("window ending %d: %d admitted over the three servers, more than %d", end, got, fwLimit)
		}
		if run.rejected[end] > 0 {
			reached++
			if got+unsure < fwLimit {
				t.Errorf("window ending %d: the limit was reached (OVER_LIMIT answered), yet %d admitted (%d unsure), want exactly %d", end, got, unsure, fwLimit)
			}
		}
	}
	if len(ends) > 0 {
		if n := int((ends[len(ends)-1]-ends[0])/int64(fwWindow)) + 1; total > n*fwLimit {
			t.Errorf("%d admitted in %d windows, more than %d each", total, n, fwLimit)
		}
	}
	if reached < 2 {
		t.Errorf("the limit was reached in %d windows, want at least 2: the run does not saturate", reached)
	}
	t.Logf("calls answered per server %v", run.answered)
	for i, n := range run.answered {
		if n == 0 {
			t.Errorf("server %d answered no call: the test does not spread the load", i)
		}
	}
	if run.degraded != 0 {
		t.Errorf("%d degraded answers with no fault", run.degraded)
	}
}

// ringsAre reports whether every node's ring holds exactly want.
func ringsAre(nodes []*weir.Node, want []string) bool {
	for _, n := range nodes {
		if !slices.Equal(ops.Members(n), want) {
			return false
		}
	}
	return true
}

// fwRun calls every server from four callers for dur, each call as soon as
// the last is answered, with one client address, and tallies the answers;
// changed reports whether any node's ring left want meanwhile.
func fwRun(t *testing.T, nodes []*weir.Node, clients []rlsv3.RateLimitServiceClient, want []string, dur time.Duration) (run fwTally, changed bool) {
	run = fwTally{admitted: map[int64]int{}, rejected: map[int64]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := time.Now().Add(dur)
	watchDone := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		for {
			if !ringsAre(nodes, want) {
				mu.Lock()
				changed = true
				mu.Unlock()
			}
			select {
			case <-watchDone:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	for i, c := range clients {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					sent := time.Now().UnixNano()
					resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fw",
						Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.9.9.9")}})
					done := time.Now().UnixNano()
					if err != nil {
						t.Errorf("server %d: %v", i, err)
						return
					}
					st := resp.GetStatuses()[0]
					if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != fwLimit {
						t.Errorf("current_limit %d, want %d", got, fwLimit)
					}
					first, last := windowEnds(sent, done, st.GetDurationUntilReset().AsDuration())
					mu.Lock()
					run.answered[i]++
					if resp.GetDynamicMetadata().GetFields()["weir.degraded"].GetBoolValue() {
						run.degraded++
					}
					switch {
					case resp.OverallCode == rlsv3.RateLimitResponse_OK && first == last:
						run.admitted[first]++
					case resp.OverallCode == rlsv3.RateLimitResponse_OK:
						run.unsure = append(run.unsure, [2]int64{first, last})
					case first == last:
						run.rejected[first]++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(watchDone)
	watch.Wait()
	return run, changed
}
