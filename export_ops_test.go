package weir

import "github.com/weir-dev/weir/lease/raftgroup"

// LeaseGroupOf is, for the external tests, the lease group n is a voter of.
func LeaseGroupOf(n *Node) *raftgroup.Group { return n.leaseGroup() }

// SetLeaseShareSource sets, for the external tests, where n's status page
// reads lease shares.
func SetLeaseShareSource(n *Node, s leaseShareSource) { n.setLeaseShareSource(s) }
