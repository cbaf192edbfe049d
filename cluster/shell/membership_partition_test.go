package shell

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/weir-dev/weir/internal/faultnet"
)

// TestMembershipHealsAfterPartition: two sides of a partition declare each
// other dead; once it heals they find each other again (the reconnect loop:
// memberlist alone stops gossiping to the dead, so the cluster would stay
// split for good, each side owning every identity of its region). The
// partition is injected by internal/faultnet under memberlist's transport.
func TestMembershipHealsAfterPartition(t *testing.T) {
	checkLeaks(t)
	fn := faultnet.New()
	var nodes []node
	for i, name := range []string{"a", "b", "c"} {
		h, err := fn.Host(name, net.IPv4(127, 0, 0, byte(40+i)).String())
		if err != nil {
			t.Fatal(err)
		}
		if l, err := net.Listen("tcp", h.Addr(0)); err != nil {
			t.Skipf("cannot bind a second loopback address here: %v", err)
		} else {
			l.Close()
		}
		var join []string
		if len(nodes) > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		nodes = append(nodes, startNode(t, name, join, func(c *MembershipConfig) {
			c.BindAddr = h.Addr(0)
			c.WrapTransport = func(tr memberlist.NodeAwareTransport) memberlist.NodeAwareTransport { return h.Gossip(tr) }
		}))
	}
	waitMembers(t, nodes, "a,b,c")

	fn.Partition([]string{"a", "b"}, []string{"c"})
	waitMembers(t, nodes[:2], "a,b")
	waitMembers(t, nodes[2:], "c")
	// Past GossipToTheDeadTime (1 s in ProfileLocal): memberlist no
	// longer gossips to the members it declared dead.
	time.Sleep(2 * time.Second)

	fn.Heal()
	waitMembers(t, nodes, "a,b,c")
	if s := fn.Stats(); s.Dropped == 0 {
		t.Fatalf("faultnet dropped no datagram across the partition: %+v", s)
	}
}
