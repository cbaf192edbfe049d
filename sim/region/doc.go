// Package region simulates one region of weir gateways on the engine of
// sim/engine: every node runs the real cluster.Coordinator, the requests go
// to one exact GCRA bucket per identity as well (the reference), and the
// checks of docs/overshoot.md run over every interval of every identity.
// `go run ./sim` is its command line.
//
// # The usage loop
//
//	res, err := region.Run(region.Config{Nodes: 5, Traffic: region.TrafficUneven,
//		Faults: faults, Duration: time.Minute, Seed: 7})
//	res.Summary(os.Stdout) // the same seed prints the same bytes
//	if !res.OK() { ... res.Violations, res.Config.Flags() reproduces it }
//
// # What is modelled, and the simplifications
//
//   - Nodes: each node runs the real cluster.Coordinator and the real
//     cluster.Links, the policy of the exchanges with its peers (Nagle's
//     sending with the linger backstop, one exchange in flight per peer
//     with its cluster.Backlog, the circuit breaker with cooldown and
//     half-open trial, the breaker reset of a peer back in the ring). The
//     adapter around them (node.go) carries out what they decide, as
//     shell.Node does on a gateway; shell.Node's goroutines and locks are
//     gone: the loop is the only goroutine, so an exchange's work at the
//     receiver happens at the instant of its arrival. A reply carries what
//     the receiver has for the sender. shell.Node's cutting of a batch
//     larger than its MaxBatch into several exchanges is not modelled: the
//     simulator has no wire limit.
//   - Tick: every node ticks every Config.Tick (10 ms like the Shell by
//     default). Big runs may tick less often: a tick only sends
//     interval-due syncs, expires forwarded requests and drops idle
//     entries, so a coarser tick delays those by up to one tick and
//     changes no bound (the slack bound does not depend on time). A node
//     with no entry, no owned bucket and no pending request skips Tick,
//     which is then a no-op.
//   - Network: one latency distribution for every link, independent
//     draws (so messages reorder), loss per message, partitions checked at
//     send and at delivery. No bandwidth or queueing.
//   - Membership: each node's view follows the truth after a delay it
//     draws per change (detection for a crash or a cut, gossip for a join,
//     a leave or a heal); flaps shorter than the delay are not seen, as
//     with memberlist's suspicion. A view change builds a new ring with the
//     node's own epoch counter, as the gateway does. A (re)started node
//     knows only itself until gossip reaches it.
//   - Owners: the rendezvous ring of cluster.NewRing, wrapped in a cache of
//     its answers (the coordinator asks on every decision). The ring has no
//     random seed to inject.
//   - Clocks: each node's clock is the virtual clock plus its skew, which
//     a fault may step. The reference and the checks use the virtual clock.
//   - Traffic goes to the initial nodes; a request for a node that is down
//     or has left goes to the next serving node, as a load balancer sends
//     it. Requests at a node that crashes while they wait are lost, not
//     admissions.
//   - Admissions count at the virtual time of the decision: local and
//     on_failure decisions when made, remote ones when the owner made them.
//   - One rule per run: the request policy of several rules
//     (internal/policy) is not exercised here; its property test and the
//     Node's model test hold it.
package region
