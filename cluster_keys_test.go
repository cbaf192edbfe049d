package weir_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

// TestGossipKeyRotation: nodes embedding weir rotate their gossip key with no
// downtime through the Keyring they passed in; afterwards a node with only
// the new key joins, and a node with only the old key cannot.
func TestGossipKeyRotation(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	rules := parseRules(t, clusterRules)
	start := func(name string, kr *memberlist.Keyring, join ...string) (*weir.Node, error) {
		return weir.New(weir.Config{Rules: rules, Cluster: &weir.ClusterConfig{
			Name: name, Region: "eu", LocalTiming: true, Label: "key-rotation", Keyring: kr, Join: join,
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second}})
	}
	var nodes []*weir.Node
	var rings []*memberlist.Keyring
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	for i := range 2 {
		kr, err := memberlist.NewKeyring(nil, oldKey)
		if err != nil {
			t.Fatal(err)
		}
		var join []string
		if i > 0 {
			join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := start(fmt.Sprintf("gw-%d", i), kr, join...)
		if err != nil {
			t.Fatal(err)
		}
		nodes, rings = append(nodes, n), append(rings, kr)
	}
	waitFor(t, func() bool { return len(ops.Members(nodes[0])) == 2 && len(ops.Members(nodes[1])) == 2 })

	// The three steps, each on every node.
	for _, kr := range rings {
		if err := kr.AddKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	for _, kr := range rings {
		if err := kr.UseKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	for _, kr := range rings {
		if err := kr.RemoveKey(oldKey); err != nil {
			t.Fatal(err)
		}
	}
	// Still one cluster: a rule change on one node reaches the other.
	if err := nodes[1].SetRules(parseRules(t, clusterRules+`
  - id: extra
    key: [ip]
    limit: 5
    window: 1s
`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, p := range ops.Peers(nodes[0]) {
			if p.Name == "gw-1" {
				return p.RulesVersion == 2
			}
		}
		return false
	})

	// A node with the old key only is refused...
	stale, _ := memberlist.NewKeyring(nil, oldKey)
	if n, err := start("gw-stale", stale, ops.GossipAddr(nodes[0])); err == nil {
		nodes = append(nodes, n)
		time.Sleep(300 * time.Millisecond)
		if len(ops.Members(nodes[0])) != 2 || len(ops.Members(n)) != 1 {
			t.Errorf("a node with the retired key joined: %v / %v", ops.Members(nodes[0]), ops.Members(n))
		}
	}
	// ...and one with the new key joins.
	fresh, _ := memberlist.NewKeyring(nil, newKey)
	n, err := start("gw-2", fresh, ops.GossipAddr(nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	nodes = append(nodes, n)
	waitFor(t, func() bool { return len(ops.Members(nodes[0])) == 3 && len(ops.Members(n)) == 3 })
}
