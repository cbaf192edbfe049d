// Package global simulates global limits across regions on the engine of
// sim/engine: the lease group's pure state machine (lease.Machine, the very
// code the Raft FSM calls) leases each region a share of a global limit,
// each region enforces its lease.Holder's share with a GCRA bucket, and
// every run checks docs/global.md's invariant at every event, Machine.Check
// after every Apply, and the global envelope of docs/overshoot.md
// ("Global limits across regions") over every interval. `go run ./sim
// -global` is its command line; `go run ./sim -global -doorman` runs
// Doorman's published scenario for comparison.
//
// # The usage loop
//
//	res, err := global.Run(global.Config{Regions: 3, Limit: 200, Demand: global.DemandMove,
//		Faults: faults, Duration: time.Minute, Seed: 7})
//	res.Summary(os.Stdout) // the same Config prints the same bytes
//	if !res.OK() { ... res.Violations; res.Config.Flags() reproduces it }
//
// # What is modelled, and the simplifications
//
//   - The leader: one lease.Machine, the replicated state. A report is
//     applied when it reaches the leader (Command.Now is the leader's
//     clock) and answered after Config.Commit, one Raft commit round; a
//     reply lost with a crashing leader is a committed entry whose answer
//     never left, a report that reaches a dead leader an entry never
//     proposed. Both are what Raft can do. The leader proposes Tick every
//     Config.Tick. Of three voters one leads; a crash stops it, and after
//     Config.Election the next voter applies Takeover on its own clock.
//     Regions find the new leader at once (discovery is not modelled).
//   - Regions: region r's owner reports every Config.Refresh with the next
//     sequence number (one reporter per region: in-region ring changes are
//     the region simulator's part), the tokens asked for since its last
//     report scaled to a window (admitted and rejected), the newest epoch
//     it enforces and its bucket's debt, after charging its slack spend. A
//     report with no reply after half a refresh is resent once with the
//     same sequence number. Each grant goes to the Holder with the region's
//     own send time, echoed by the reply.
//   - The in-region cluster is one GCRA bucket per (region, identity)
//     enforcing Holder.At(now) as rate share/W and burst, plus an
//     in-region slack S_r = ⌊a·share⌋: a request the bucket rejects is
//     admitted while the unconfirmed spend plus its cost fits in S_r and
//     the bucket is not in debt, and the spend is charged to the bucket
//     every Config.Sync. This is a simplification of the two-tier
//     coordinator with its worst case kept (the region simulator covers
//     the in-region part with real coordinators). A share change rebuilds
//     the bucket: tokens clamped to the new burst on a shrink, kept on a
//     grow, debt kept.
//   - Fallback: while the Holder reports the fallback (no lease yet, or an
//     expired one) the region enforces min(safe, last share), or admits
//     everything (open, counted as degraded and kept out of the envelope),
//     or nothing (closed).
//   - Network: one latency distribution for every cross-region link
//     (independent draws, so messages reorder), loss per message,
//     partitions that cut a region off from everyone. No bandwidth.
//   - Clocks: every region's and every leader's clock is the virtual
//     clock plus a constant offset drawn in ±Config.Skew/2; no drift. The
//     checks use the virtual clock; each Holder is asked on its region's.
//   - Demand: piecewise-constant rates per (identity, region), with evenly
//     spaced, Poisson or once-a-second arrivals; moves, schedules and
//     Doorman's random walk change the rates at given times.
//
// Nothing here reads the wall clock, draws from the global math/rand or
// ranges over a map: the same seed gives the same bytes.
package global
