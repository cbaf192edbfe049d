// Package region simulates one region of weir gateways on the engine of
// sim/engine: every node runs the shipped cluster.Coordinator, the shipped
// link machine (cluster.Links) and, for requests that carry several rules,
// the shipped request policy (internal/policy); the requests go to exact
// GCRA buckets as well (the reference), and the checks of
// docs/overshoot.md run over every interval of every identity of every
// rule. `go run ./sim` is its command line.
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
//     admissions (the charges a multi-rule request's rules made before
//     the crash stand, and count as those rules' admissions).
//   - Admissions count at the virtual time of the decision: local and
//     on_failure decisions when made, remote ones when the owner made them.
//   - Rules: a run has one GCRA cluster rule, or with Config.Rules
//     (`-rules`) several that every request carries, the main rule first:
//     a per-identity rule, a second one on the same identity, or a
//     per-tenant one whose identity is the request's tenant. Each node
//     then decides a request with internal/policy's Request, step by step,
//     as weir.Node does: the rules are charged one by one
//     (Coordinator.DecideInto); a charge that waits for its owner (exact
//     mode, or a forward in shared mode) keeps the request's policy state
//     until the completion arrives, and the policy continues in an event
//     of its own at that instant (the completion's flush is not
//     re-entered); a rejection refunds the rules admitted before it
//     (Coordinator.Refund). Whether the coordinator gave a refund back
//     itself is read from its own state (Coordinator.Inspect) before and
//     after; a refund it asked of a remote owner holds its charge until
//     the owner gives the range back (CoordinatorConfig.OnRefund: refunded
//     then, at that instant) or can no longer (a decide timeout, a tick
//     and two call timeouts after the ask: the charge stood). The
//     reference is the same policy over exact buckets. A one-rule run
//     charges its rule directly: the policy of one enforced rule is that
//     one Take (policy.Single), as in weir.Node. Every rule is a cluster
//     rule with the main rule's mode and settings: local, durable and
//     shadow rules (the policy's looks, durable charges and shadow
//     reports) are not simulated, nor sketch gating or the key cap beside
//     several rules.
//   - Checks with several rules: each rule's envelope is checked on its
//     own, with its own S and fault terms, over its charges that stood
//     (admitted, not given back): a refunded charge admitted nothing. A
//     refund puts tokens back into a bucket, so over [t₁, t₂] a rule's
//     charges that stood are bounded by B + r·Δ (+ S and the terms) plus
//     the tokens refunded in (t₁, t₂] of charges made before t₁; each
//     identity's excess is scored beyond its refund term, the most tokens
//     of its charges made by one instant and refunded after it. The lower
//     bound is not checked: a rule's admissions are held down by the
//     other rules too.
//
// What the simulator models rather than ships: the network (latency, loss,
// partitions), the gRPC call timeout, membership convergence (a delay per
// view change instead of memberlist's gossip), clock skew, the load
// balancer in front of the gateways, and the shell's goroutines, locks and
// shards (node.go's adapter carries out what the link machine decides,
// under the virtual clock).
package region
