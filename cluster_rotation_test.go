package weir_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

// TestGossipKeyRotationUnderLoad: three nodes rotate their gossip key
// (AddKey, UseKey, RemoveKey, each on every node, as docs/cluster.md says)
// while deciding: after every step each node still sees all three and
// decides exact-mode identities owned by the others (a peer call per
// admission) with none decided fail-open.
func TestGossipKeyRotationUnderLoad(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32)
	rules := parseRules(t, clusterRules)
	label := fmt.Sprintf("rotation-load-%d", time.Now().UnixNano())
	var nodes []*weir.Node
	var rings []*memberlist.Keyring
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	for i := range 3 {
		kr, err := memberlist.NewKeyring(nil, oldKey)
		if err != nil {
			t.Fatal(err)
		}
		cc := &weir.ClusterConfig{Name: fmt.Sprintf("gw-%d", i), Region: "eu", LocalTiming: true, Label: label, Keyring: kr,
			DecideTimeout: 5 * time.Second, CallTimeout: 5 * time.Second} // generous: -race on a busy machine
		if i > 0 {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		nodes, rings = append(nodes, n), append(rings, kr)
	}
	whole := func() bool {
		for _, n := range nodes {
			if len(ops.Members(n)) != 3 {
				return false
			}
		}
		return true
	}
	waitFor(t, whole)
	decide := func(step string) {
		t.Helper()
		if !whole() {
			t.Fatalf("%s: the cluster split", step)
		}
		ctx := context.Background()
		for i, n := range nodes {
			for k := range 30 {
				h := http.Header{}
				h.Set("X-API-Key", fmt.Sprintf("key-%d", k))
				if d := n.Allow(ctx, weir.Request{Method: "GET", Path: "/exact", Header: h}); d.Degraded {
					t.Fatalf("%s: gw-%d decided key-%d degraded", step, i, k)
				}
			}
		}
	}
	decide("old key")
	steps := []struct {
		name string
		do   func(*memberlist.Keyring) error
	}{
		{"new key added", func(kr *memberlist.Keyring) error { return kr.AddKey(newKey) }},
		{"new key in use", func(kr *memberlist.Keyring) error { return kr.UseKey(newKey) }},
		{"old key removed", func(kr *memberlist.Keyring) error { return kr.RemoveKey(oldKey) }},
	}
	for si, s := range steps {
		for i, kr := range rings {
			if err := s.do(kr); err != nil {
				t.Fatalf("%s on gw-%d: %v", s.name, i, err)
			}
			decide(fmt.Sprintf("%s (through gw-%d)", s.name, i))
		}
		// Gossip still flows every way: a rule change on one node is
		// seen by the others.
		from, fromName := nodes[si%3], fmt.Sprintf("gw-%d", si%3)
		if err := from.SetRules(parseRules(t, clusterRules+fmt.Sprintf(`
  - id: extra-%d
    key: [ip]
    limit: 5
    window: 1s
`, si))); err != nil {
			t.Fatal(err)
		}
		want := from.Status().RulesVersion
		waitFor(t, func() bool {
			for _, n := range nodes {
				for _, p := range ops.Peers(n) {
					if p.Name == fromName && p.RulesVersion != want {
						return false
					}
				}
			}
			return true
		})
		decide(s.name)
	}
	for _, n := range nodes {
		for _, c := range ops.Counts(n) {
			if c.FailOpen != 0 {
				t.Errorf("rule %s: %d fail-open decisions", c.Rule, c.FailOpen)
			}
		}
	}
}
