// Package cluster is the pure core that makes a region's gateways act as one
// limiter: it decides, and package cluster/shell carries its decisions out
// over the network.
//
//   - Ring places identities on the region's live gateways: an immutable
//     value built from the member set and an epoch, rebuilt on every
//     membership change and swapped in whole.
//   - Coordinator is one node's decision core, a step machine: requests go
//     in through Decide, peers' messages through Step, time through Tick,
//     and what the node sends comes out of Ready. The owner's buckets
//     (owner.go) and the non-owner's view and slack (view.go, slack.go)
//     are its two roles; the key cap (keycap.go), sketch gating (sketch.go)
//     and the warm-up after a ring change (warmup.go) are parts of it.
//   - Links is the node's policy for talking to its peers: one exchange in
//     flight per peer with a Backlog for the next, Nagle's sending, and a
//     circuit breaker per peer, which decides when a rule's on_failure
//     applies.
//
// Nothing here reads a clock, starts a goroutine, locks, touches a socket
// or draws from a global random source (a test enforces it): time comes in
// as an argument, so the simulator in sim/ runs this very code under a
// virtual clock.
package cluster
