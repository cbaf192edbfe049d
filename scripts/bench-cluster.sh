#!/usr/bin/env bash
# Runs the cluster benchmark (a single node, a 3-node loopback cluster and a
# bare gRPC round trip, all in one process and one run) and prints the
# medians of its figures and the target ratios. Every ratio is taken inside
# one run, between figures measured minutes apart at most: the machine is
# shared and noisy, only ratios are comparable.
#
#   scripts/bench-cluster.sh [count] [benchtime]
#
# About 20–27 s per count at the default benchtime. Pass a file of earlier
# output as BENCH_OUT=file to summarise it without running.
set -euo pipefail
cd "$(dirname "$0")/.."
count="${1:-2}"
benchtime="${2:-1s}"
if [[ -n "${BENCH_OUT:-}" ]]; then
	out="$BENCH_OUT"
else
	out="$(mktemp)"
	trap 'rm -f "$out"' EXIT
	go test -run '^$' -bench 'BenchmarkCluster' -benchmem -benchtime "$benchtime" -count "$count" . | tee "$out"
	echo
fi

awk '
/^BenchmarkCluster\// {
	name = $1; sub(/^BenchmarkCluster\//, "", name); sub(/-[0-9]+$/, "", name)
	if (!(name in seen)) { seen[name] = 1; order[++nb] = name }
	for (i = 3; i < NF; i += 2) {
		unit = $(i+1)
		if (unit == "B/op" || unit == "allocs/op") continue
		k = name SUBSEP unit
		if (!(k in v)) { units[name] = units[name] " " unit }
		v[k] = v[k] " " $i
	}
}
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	if (n == 0) return ""
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function m(name, unit) { return median(v[name SUBSEP unit]) }
function verdict(ok) { return ok ? "met" : "**missed**" }
END {
	if (nb == 0) { print "no BenchmarkCluster results" > "/dev/stderr"; exit 1 }
	print "| benchmark | medians |"
	print "|---|---|"
	for (b = 1; b <= nb; b++) {
		name = order[b]; line = ""
		nu = split(units[name], us, " ")
		for (u = 1; u <= nu; u++) line = line sprintf("%s%g %s", (u > 1 ? ", " : ""), m(name, us[u]), us[u])
		printf "| %s | %s |\n", name, line
	}
	print ""
	print "| target | measured | goal | |"
	print "|---|---:|---|---|"
	# Ratios of the medians: with -count, each sub-benchmark runs its rounds
	# back to back, so a per-round ratio would pair every round with the last
	# round of the reference.
	r = m("shared-decision/cluster/serial", "ns/op") / m("shared-decision/single/serial", "ns/op")
	printf "| shared decision ÷ single-node decision (serial) | %.2f | ≤ 2 | %s |\n", r, verdict(r <= 2)
	r = m("shared-decision/cluster/parallel", "ns/op") / m("shared-decision/single/parallel", "ns/op")
	printf "| shared decision ÷ single-node decision (parallel) | %.2f | ≤ 2 | %s |\n", r, verdict(r <= 2)
	r = m("hot-identity/alternating", "ratio-to-single")
	printf "| hot identity, cluster decisions/s ÷ single node (turns of 0.1 s, alternated) | %.2f | ≥ 1 | %s |\n", r, verdict(r >= 1)
	printf "| (the same per CPU-second) | %.2f | | |\n", m("hot-identity/alternating", "cpu-ratio-to-single")
	printf "| (measured one after the other: %.2f, per CPU-second %.2f) | | | |\n", m("hot-identity/cluster", "decisions/s") / m("hot-identity/single", "decisions/s"), m("hot-identity/cluster", "decisions/cpu-s") / m("hot-identity/single", "decisions/cpu-s")
	r = m("exact-via-peer/open-loop", "p99-µs") / m("grpc-rtt/sequential", "p99-µs")
	printf "| exact via a peer at %.0f/s, p99 ÷ bare gRPC p99 (sequential) | %.2f | ≤ 3 | %s |\n", m("exact-via-peer/open-loop", "offered/s"), r, verdict(r <= 3)
	printf "| (bare unary gRPC offered %.0f/s achieves %.0f/s, p99 %g µs) | | | |\n", m("exact-via-peer/open-loop", "offered/s"), m("grpc-rtt/open-loop", "offered/s"), m("grpc-rtt/open-loop", "p99-µs")
	r = m("exact-via-peer/open-loop-low", "p99-µs") / m("grpc-rtt/open-loop-low", "p99-µs")
	printf "| exact via a peer at %.0f/s, p99 ÷ bare gRPC p99 at the same offered load and generator | %.2f | (context) | |\n", m("exact-via-peer/open-loop-low", "offered/s"), r
	s = m("hot-identity/cluster", "syncs/s"); bd = m("hot-identity/cluster", "bound-syncs/s")
	printf "| hot identity, syncs/s at the owner vs the bound | %.1f vs %.1f | ≤ bound | %s |\n", s, bd, verdict(s <= bd)
	printf "| hot identity, owner CPU for its syncs (upper bound) | %.2f %% of a core | | |\n", m("owner-cpu/sync-exchange", "owner-core-%")
}' "$out"
