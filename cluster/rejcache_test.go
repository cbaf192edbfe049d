package cluster

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// TestViewRejectMatchesDecide: after a view rejection, ViewReject.Reject
// decides every later request of the same rule and identity costing at
// least as much exactly as Decide does, for as long as nothing but view
// rejections touched the coordinator (the Shell's reject cache forgets an
// identity on any other decision of it, and all of a shard on anything
// else or a dropped entry); whenever Reject says it would not reject, it
// leaves the request to Decide. Three nodes
// hammer one identity at random costs while time moves on, with messages
// delivered and ticks run now and then (which end the cached state).
func TestViewRejectMatchesDecide(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		rule := gcraRule("api", quota.ModeShared, 100, time.Second, 10)
		h := newHarness(t, 3, time.Millisecond, rule)
		r := rand.New(rand.NewPCG(seed, 99))
		cached := map[string]*ViewReject{}
		compared, rejected := 0, 0
		for range 20000 {
			if r.IntN(50) == 0 {
				h.step(time.Duration(r.IntN(3)+1) * time.Millisecond)
				clear(cached) // Step and Tick ran on every node
			} else {
				h.now += r.Int64N(int64(3 * time.Millisecond))
			}
			node := h.names[r.IntN(len(h.names))]
			c := h.nodes[node]
			cost := int64(1 + r.IntN(3))
			v := cached[node]
			var want bucket.Decision
			var predicted bool
			if v != nil {
				want, predicted = v.Reject(h.now, cost)
			}
			drops := c.Drops()
			o, err := c.Decide(h.now, "api", "customer-7", cost)
			if err != nil {
				t.Fatal(err)
			}
			if predicted {
				compared++
				if o.Pending || o.Source != SourceView || o.Decision != want {
					t.Fatalf("seed %d, %s at %d, cost %d: Reject gave %+v, Decide %+v", seed, node, h.now, cost, want, o)
				}
			}
			if o.Pending {
				h.waiting[node][o.Ticket] = cost
			} else {
				h.record(node, o, cost)
			}
			switch {
			case c.Drops() != drops:
				delete(cached, node) // the Shell invalidates the shard
			case o.Source != SourceView || o.RetryAfter == bucket.Never:
				delete(cached, node) // the Shell forgets the identity's slot
			default:
				rejected++
				lv := c.LastViewReject()
				if lv.Rule != "api" || lv.Identity != "customer-7" || lv.Cost != cost {
					t.Fatalf("LastViewReject after a view rejection of cost %d: %+v", cost, lv)
				}
				cached[node] = &lv
			}
			h.flush()
		}
		if compared < 1000 || rejected < 1000 {
			t.Fatalf("seed %d: only %d view rejections and %d predictions compared", seed, rejected, compared)
		}
		t.Logf("seed %d: %d view rejections, %d later decisions predicted and compared", seed, rejected, compared)
	}
}

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
	p, _ := NewRuleParams(&rule, 1)
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
