// Package envoyoracle checks weir's Envoy rate-limit service against
// envoyproxy/ratelimit itself: that project's own service (its settings,
// file provider, Redis backend and service packages, at the version pinned in
// go.mod) runs in the test process against a real redis-server on loopback,
// beside a `weir serve` process built from the root module, and both are fed
// the same descriptor files unchanged.
//
// Two tests compare answers:
//
//   - TestConfigCorpus loads every descriptor file shipped in the
//     envoyproxy/ratelimit module (examples/, test/config/, the integration
//     test's runtime directory) into both and compares accept or refuse.
//   - TestDifferential sends both the same seeded, randomized request
//     streams over gRPC and compares every response field.
//
// A third, TestSideBySide, measures them (it runs only with WEIR_SIDE=1):
// a 3-node `weir serve` cluster against three processes of
// envoyproxy/ratelimit's own service binary (built from
// github.com/envoyproxy/ratelimit/src/service_cmd, which go.mod lists as a
// tool so that its dependencies are pinned) sharing one redis-server, under
// one request stream: saturation, decisions per CPU-second of each system's
// processes, and latency at a fixed offered load.
//
// TestConfigCorpus and TestDifferential check the differences found
// against a table of known differences, exactly: a new difference fails the
// test, and so does a known one that is gone (then the table is out of date
// and must shrink). The tables are the current list of where weir's answers
// differ from envoyproxy/ratelimit's.
//
// The tests need redis-server on PATH (scripts/install-redis.sh); with
// CI=true a missing redis-server is a failure, otherwise a skip.
// WEIR_ORACLE=long runs the differential test for longer; WEIR_ORACLE_SEED
// replays one seed; WEIR_ORACLE_REQUESTS sets the request count.
package envoyoracle
