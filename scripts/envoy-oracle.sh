#!/usr/bin/env bash
# weir serve checked against envoyproxy/ratelimit itself (envoyoracle/, its
# own module; docs/envoy.md, "Checked against envoyproxy/ratelimit"): every
# descriptor file of envoyproxy/ratelimit's module loaded by both, then the
# same seeded random request streams to both over gRPC, envoyproxy/ratelimit
# on a redis-server of its own on loopback. Prints the accept/refuse table
# and the mismatch counts by cause; fails on a difference not in the tests'
# tables of known differences, or on a known one that is gone.
#
#   scripts/envoy-oracle.sh                      2000 random requests (CI)
#   WEIR_ORACLE=long scripts/envoy-oracle.sh     10 000
#   WEIR_ORACLE_SEED=7 WEIR_ORACLE_REQUESTS=50000 scripts/envoy-oracle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-redis.sh
cd envoyoracle
go vet ./...
go test -count=1 -v -timeout 15m -run 'TestConfigCorpus|TestDifferential' . 2>&1 |
	grep -v -e '^=== ' -e '^    --- PASS' |
	sed -e 's/^    [a-z_]*_test.go:[0-9]*: /    /'
