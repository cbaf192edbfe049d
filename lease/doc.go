// Package lease is the lease group's core: how a global limit ("customer X:
// 10 000/min worldwide") is shared among regions without a cross-region round
// trip per decision. It is pure: no goroutine, lock, socket, clock or Raft;
// its shell, the Raft group with its forwarding service, client and rules
// admin API, is lease/raftgroup.
//
// Machine is the replicated state, a pure state machine in the style of
// etcd-io/raft: every change is a Command carrying the proposing leader's
// clock, and Apply is deterministic, so the simulator drives the same code
// as the group. Replica is a replica's whole state (the Machine, the
// RuleStore and the DurableStore), and Replica.Apply is what a log entry
// does to it: the Raft FSM only decodes the entry (DecodeLogEntry, the
// codec of this package) and calls it. Snapshots are Replica.State and
// Replica.Restore. Holder is a region's side of one lease: the share it
// enforces at a given time on its own clock; Regional is a region's
// enforcement of every lease it holds (the shares, the rescale of a
// bucket across a change of share, the demand it reports). Allocate is the
// pure allocation (max-min fair with a floor per active region, Floor).
//
// The loop, as the adapter runs it:
//
//  1. The node that owns a global identity in its region's ring reports the
//     region's demand for it, and acknowledges the newest lease it enforces,
//     in a Report (with a sequence number: retries are idempotent).
//  2. The leader proposes Command{Now: its clock, Report: ...} through Raft;
//     every replica applies it; the leader answers the node with the
//     Result's Grants.
//  3. The node hands each Grant to its Holder with the time it sent the
//     report, and enforces Holder.At(now) as the identity's rate and burst in
//     its region. If it cannot renew, the Holder falls back by itself when
//     the lease runs out.
//  4. Between periodic reports, Regional.ReportDue reports off cycle, at
//     most once per gap, the identities whose demand or lease changed: new
//     ones, a smaller grant to acknowledge, a throttled region waiting for
//     capacity the leader said is pending (Grant.Pending), and a region
//     whose demand stopped, which gives its share back by capping itself
//     before the report leaves (Holder.Cap, ReportItem.Capped).
//  5. The leader proposes Tick periodically (expiries, reallocation), and
//     Takeover when it becomes leader.
//
// The invariant every step keeps, faults included, stated in docs/global.md:
// Σᵣ max(unexpired shareᵣ, fallbackᵣ) ≤ L; Machine.Check verifies it, and
// TestInvariantUnderFaults checks that the shares the regions really enforce
// never sum above L through lost and reordered messages, expiries and leader
// changes with skewed clocks.
package lease
