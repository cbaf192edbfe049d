package cluster

import (
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// fixedShares leases every identity of one rule at a fixed share and
// counts what its owner observes (Shares).
type fixedShares struct {
	rule string
	g    bucket.GCRA

	mu                sync.Mutex
	allowed, rejected int64
}

func (s *fixedShares) Leases(rule string) bool { return rule == s.rule }

func (s *fixedShares) Share(now int64, rule, identity string, tat *bucket.TAT) (bucket.GCRA, ShareMode) {
	return s.g, ShareEnforce
}

func (s *fixedShares) Observe(now int64, rule, identity string, cost int64, allowed bool, tat bucket.TAT) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if allowed {
		s.allowed += cost
	} else {
		s.rejected += cost
	}
}

// TestLeasedDemandCountsNodeRejections: requests a non-owner rejects on its
// view of a leased identity's bucket reach the owner in the node's syncs,
// so that the demand the owner observes for its region's report is every
// token the region was asked, not only those the owner decided and the
// spend it was charged.
func TestLeasedDemandCountsNodeRejections(t *testing.T) {
	rule := gcraRule("g", quota.ModeShared, 100, time.Second, 10)
	h := newHarness(t, 3, time.Millisecond, rule)
	g, err := bucket.NewGCRA(100, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	shares := map[string]*fixedShares{}
	params := ruleParams(t, []quota.Rule{rule})
	for _, name := range h.names {
		s := &fixedShares{rule: "g", g: g}
		shares[name] = s
		c := NewCoordinator(CoordinatorConfig{Self: name, SyncInterval: 20 * time.Millisecond, DecideTimeout: 50 * time.Millisecond, Shares: s})
		c.SetRules(0, params)
		c.SetTable(h.now, h.ring)
		h.nodes[name] = c
	}
	id := "partner"
	owner := h.ring.OwnerName(id)
	other := thirdNode(h, owner, "")
	// 1 000 tokens asked of the non-owner over 1 s, ten times the share.
	const asked = 1000
	for range asked {
		h.request(other, "g", id, 1)
		h.step(time.Millisecond)
	}
	for range 200 {
		h.step(time.Millisecond)
	}
	st := h.nodes[other].Stats()
	if st.ViewRejects == 0 {
		t.Fatal("the setup needs rejections on the node's view")
	}
	s := shares[owner]
	s.mu.Lock()
	seen := s.allowed + s.rejected
	s.mu.Unlock()
	// The owner's view of the demand: every token asked of the node, as
	// admitted spend, its own decisions of forwarded requests, or the
	// node's view rejections.
	if seen != asked {
		t.Fatalf("the owner observed %d tokens of demand (%d allowed, %d rejected), the node was asked %d (%d rejected on its view)",
			seen, s.allowed, s.rejected, asked, st.ViewRejects)
	}
	t.Logf("owner observed %d allowed + %d rejected = %d asked; %d rejected on the node's view", s.allowed, s.rejected, seen, st.ViewRejects)
}
