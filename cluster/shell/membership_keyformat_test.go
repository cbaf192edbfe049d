package shell

import (
	"fmt"
	"testing"
)

// TestMembershipKeyFormat checks that every member sees the key format each
// one speaks, that a node gossiping none (as nodes that predate key formats
// do) reads as format 1, and that such a mixed cluster forms: memberlist's
// protocol check accepts it, and every Meta still decodes.
func TestMembershipKeyFormat(t *testing.T) {
	checkLeaks(t)
	formats := map[string]uint8{"a": 2, "b": 0, "c": 2}
	a := startNode(t, "a", nil, func(c *MembershipConfig) { c.KeyFormat = formats["a"] })
	b := startNode(t, "b", []string{a.GossipAddr()}, func(c *MembershipConfig) { c.KeyFormat = formats["b"] })
	c := startNode(t, "c", []string{b.GossipAddr()}, func(c *MembershipConfig) { c.KeyFormat = formats["c"] })
	nodes := []node{a, b, c}
	waitMembers(t, nodes, "a,b,c")
	for _, n := range nodes {
		got := ""
		for _, mi := range n.Members() {
			got += fmt.Sprintf("%s=%d,%s ", mi.Name, mi.KeyFormat, mi.Meta.RPCAddr)
		}
		if want := "a=2,a.rpc:7000 b=1,b.rpc:7000 c=2,c.rpc:7000 "; got != want {
			t.Errorf("%s sees %q, want %q", n.LocalName(), got, want)
		}
		if m := n.MalformedMeta(); m != 0 {
			t.Errorf("%s counted %d malformed metadata", n.LocalName(), m)
		}
	}
}
