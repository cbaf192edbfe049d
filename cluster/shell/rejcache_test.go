package shell

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/cluster"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/quota"
)

// TestShellRejectCache: over real gRPC, a non-owner hammered on one
// identity answers most of its rejections from the reject cache (counted
// in Stats' ViewRejects), the cluster still admits no more than
// B + r·Δ + S, and nothing is degraded.
func TestShellRejectCache(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Run("hot", testShellRejectCache)
}

func testShellRejectCache(t *testing.T) {
	rule := gcraRule("api", quota.ModeShared, 200, time.Second, 20)
	nodes := startGRPCCluster(t, 3, rule)
	const id = "tenant-hot"
	owner := nodes[0].shell.Ring().OwnerName(id)
	p, _ := cluster.NewRuleParams(&rule, 1)
	S := 2 * p.Slack(3)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	const run = 800 * time.Millisecond
	for _, tn := range nodes {
		wg.Go(func() {
			for time.Since(start) < run {
				o, err := tn.shell.Decide(context.Background(), "api", id, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if o.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if upper := float64(rule.Burst+S) + 200*elapsed.Seconds(); float64(admitted.Load()) > upper+1 {
		t.Errorf("admitted %d in %v, above B + r·Δ + S = %.0f", admitted.Load(), elapsed, upper)
	}
	var fast uint64
	for _, tn := range nodes {
		st, _, failed := tn.shell.Stats()
		if st.Degraded != 0 || failed != 0 {
			t.Errorf("%s: %d degraded decisions, %d failed exchanges in a run with no fault", tn.name, st.Degraded, failed)
		}
		if tn.name == owner {
			continue
		}
		f := tn.shell.fastRejects.Load()
		if f == 0 || f > st.ViewRejects {
			t.Errorf("%s: %d rejections from the cache, %d view rejections in all", tn.name, f, st.ViewRejects)
		}
		fast += f
		t.Logf("%s: %d view rejections, %d of them from the cache; %d local admissions, %d forwarded", tn.name, st.ViewRejects, f, st.LocalAdmits, st.Forwarded)
	}
	if fast == 0 {
		t.Error("no rejection came from the cache")
	}
}
