// Package shell runs a node's cluster core (package cluster) on real
// machines: it is the I/O shell around the pure Coordinators and Links.
//
//   - Node serialises calls into the core (sharded, one lock per shard),
//     reads the clock, drives Tick with a ticker, sends what the core has
//     ready through a Transport as the node's Links decide, feeds replies
//     back, and hands late decisions to the callers waiting for them.
//   - GRPCTransport is the Transport between gateways: a cached connection
//     per peer with long-lived streams for the exchanges, and the wire
//     codec of wire.go, which validates every batch from the network
//     before the core sees it.
//   - Membership is the region's member set and each member's metadata,
//     over hashicorp/memberlist.
//
// The shell decides nothing: what to send when, when a peer counts as down
// and how a request is decided are the core's, which the simulator runs
// too.
package shell
