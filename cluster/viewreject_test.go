package cluster

import (
	"math/rand/v2"
	"testing"
	"time"

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
