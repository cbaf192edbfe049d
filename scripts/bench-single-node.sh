#!/usr/bin/env bash
# Runs the single-node benchmarks in one go and prints a markdown table of
# medians with the ratios the targets are stated in. All figures come from
# this one run: the machine is shared and noisy, only ratios are comparable.
#
#   scripts/bench-single-node.sh [count] [benchtime]
set -euo pipefail
cd "$(dirname "$0")/.."
count="${1:-5}"
benchtime="${2:-300ms}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

# Interleave the families round by round so that load changes hit all alike.
for _ in $(seq "$count"); do
	go test -run '^$' -bench 'GCRAStoreLF|GCRAStoreAllow|XRate|KeyedXRate|Floor' -benchmem -benchtime "$benchtime" ./bucket/ >>"$out"
	go test -run '^$' -bench 'NodeAllow|BareKeyed' -benchmem -benchtime "$benchtime" . >>"$out"
done
go test -run '^$' -bench 'StoreMemory' -benchtime 1x ./bucket/ >>"$out"

awk '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	for (i = 2; i <= NF; i++) {
		if ($(i+1) == "ns/op") { v[name] = v[name] " " $i }
		if ($(i+1) == "allocs/op") { allocs[name] = $i }
		if ($(i+1) == "bytes/key") { bpk[name] = $i }
	}
}
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	if (n == 0) return 0
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
	for (k in v) if (k !~ /StoreMemory/) m[k] = median(v[k])
	print "| benchmark | median ns/op | allocs/op |"
	print "|---|---:|---:|"
	n = 0
	for (k in m) keys[++n] = k
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (keys[j] < keys[i]) { t = keys[i]; keys[i] = keys[j]; keys[j] = t }
	for (i = 1; i <= n; i++) printf "| %s | %.1f | %s |\n", keys[i], m[keys[i]], allocs[keys[i]]
	for (k in bpk) printf "| %s | %s bytes/key | |\n", k, bpk[k]
	print ""
	print "| target | ratio | goal |"
	print "|---|---:|---|"
	# The keyed decision is GCRAStore.Allow (allowed and retry-after, as
	# AllowN returns a bool; Node.Allow uses it too); GCRAStoreLF, Apply with
	# the whole Decision, is listed beside it.
	x = m["BenchmarkXRate/AllowN"]
	printf "| keyed GCRA (Allow) at 1k keys ÷ x/time/rate AllowN(now,1) | %.2f | ≤ 0.5 |\n", m["BenchmarkGCRAStoreAllow/keys=1k/serial"] / x
	printf "| keyed GCRA (Apply, whole Decision) at 1k keys ÷ AllowN(now,1) | %.2f | |\n", m["BenchmarkGCRAStoreLF/keys=1k/serial"] / x
	printf "| keyed GCRA at 1M keys ÷ map floor | %.2f | ≤ 1.5 |\n", m["BenchmarkGCRAStoreAllow/keys=1M/serial"] / m["BenchmarkFloor/keys=1M/serial"]
	printf "| keyed x/time/rate at 1M keys ÷ keyed GCRA | %.2f | ≥ 3 |\n", m["BenchmarkKeyedXRate/keys=1M/serial"] / m["BenchmarkGCRAStoreAllow/keys=1M/serial"]
	printf "| parallel speed-up, GCRA 1k (serial ÷ parallel) | %.2f | ≥ floor |\n", m["BenchmarkGCRAStoreAllow/keys=1k/serial"] / m["BenchmarkGCRAStoreAllow/keys=1k/parallel"]
	printf "| parallel speed-up, floor 1k | %.2f | |\n", m["BenchmarkFloor/keys=1k/serial"] / m["BenchmarkFloor/keys=1k/parallel"]
	printf "| parallel speed-up, GCRA 1M | %.2f | ≥ floor |\n", m["BenchmarkGCRAStoreAllow/keys=1M/serial"] / m["BenchmarkGCRAStoreAllow/keys=1M/parallel"]
	printf "| parallel speed-up, floor 1M | %.2f | |\n", m["BenchmarkFloor/keys=1M/serial"] / m["BenchmarkFloor/keys=1M/parallel"]
	printf "| node.Allow at 1k ÷ bare keyed decision | %.2f | ≤ 3 |\n", m["BenchmarkNodeAllow/keys=1k/serial"] / m["BenchmarkBareKeyed"]
}' "$out"
