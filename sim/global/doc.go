// Package global simulates global limits across regions on the engine of
// sim/engine: the lease group's pure state machine (lease.Machine, the very
// code the Raft FSM calls through lease.Replica) leases each region a share
// of a global limit, and each region's owner runs the gateways' own
// lease.Regional (its Holders, the rescale of the owner's bucket across a
// change of share, the demand and debt it reports), enforcing the share
// with the owner's GCRA bucket as the coordinator does. Every run checks docs/global.md's invariant at every event, Machine.Check
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
//   - Regions: region r's owner is one lease.Regional (one reporter per
//     region: in-region ring changes are the region simulator's part). It
//     tracks an identity from the region's first request for it, and its
//     Report carries Regional's demand (what the owner was asked, scaled to
//     a window, raised while throttled), the newest epoch enforced and its
//     debt. The report loop is the gateway's: every Config.Refresh, and
//     early when Regional has a new identity, no sooner than a tenth of the
//     refresh after the last report; the slack spend is charged first. A
//     report with no reply after half a refresh is resent once with the
//     same sequence number. Each grant goes to Regional.Accept with the
//     region's own send time, echoed by the reply.
//   - The in-region cluster is the owner's bucket per (region, identity),
//     stepped at Regional.Share's parameters and observed as the
//     coordinator does (Share, step, Observe), plus an in-region slack
//     S_r = ⌊a·share⌋ that stands for the region's other nodes: a request
//     the bucket rejects is admitted while the unconfirmed spend plus its
//     cost fits in S_r and the bucket is not in debt, and the spend is
//     charged to the bucket (and observed) every Config.Sync, as the owner
//     charges the spend a sync reports. This is a simplification of the
//     two-tier coordinator with its worst case kept (the region simulator
//     covers the in-region part with real coordinators); it leaves out the
//     non-owners' slack while the region holds no share (the Z term of
//     docs/overshoot.md's envelope as built).
//   - Fallback: Regional's: while the Holder reports the fallback (no lease
//     yet, or an expired one) the owner enforces min(safe, last share), or
//     admits everything (open, counted as degraded and kept out of the
//     envelope), or nothing (closed).
//   - Network: one latency distribution for every cross-region link
//     (independent draws, so messages reorder), loss per message,
//     partitions that cut a region off from everyone. No bandwidth.
//   - Clocks: every region's and every leader's clock is the virtual
//     clock plus a constant offset drawn in ±Config.Skew/2; no drift. The
//     checks use the virtual clock; each Holder is asked on its region's.
//   - Demand: piecewise-constant rates per (identity, region), with evenly
//     spaced, Poisson (DemandPoisson, or any rate kind with Config.Poisson)
//     or once-a-second arrivals; moves, schedules and Doorman's random walk
//     change the rates at given times.
//
// Nothing here reads the wall clock, draws from the global math/rand or
// ranges over a map: the same seed gives the same bytes.
package global
