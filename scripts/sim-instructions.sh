#!/usr/bin/env bash
# Counts the instructions the simulator spends per simulated decision in the
# steady state of issue 4's measure (100 nodes, 1 000 Zipf identities,
# 100 000 decisions per simulated second), with cachegrind: it runs the first
# 2 and 4 simulated seconds and takes the difference (200 000 decisions), so
# that start-up is left out. Unlike CPU time on a shared machine, the count
# repeats to about ±1 %. The Go runtime's collector and scheduler are left out
# of the sum (when they run varies from run to run); its map, hash, memclr and
# memmove code, which the simulator's work calls, stays in.
#
#   scripts/sim-instructions.sh [SIM_BINARY]   (default: builds ./sim)
#
# Needs valgrind (Debian's package; installed when missing and apt-get is
# there). Prints the count and the 25 costliest functions.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
	echo "valgrind missing: installing Debian's package"
	sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
	$sudo apt-get install -y -q valgrind >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
bin="${1:-}"
if [ -z "$bin" ]; then
	bin="$work/sim"
	go build -o "$bin" ./sim
fi
# One P, no collector, no GOMAXPROCS updates: Go 1.26's runtime spins on a
# lock with RDTSCP, which valgrind 3.19 does not decode, and this keeps it
# off that path almost always; a run that still hits it is run again.
count() {
	local d=$1
	for try in 1 2 3 4 5; do
		if GOMAXPROCS=1 GOGC=off GODEBUG=updatemaxprocs=0 valgrind --tool=cachegrind --cache-sim=no \
			--cachegrind-out-file="$work/cg.$d" "$bin" -nodes 100 -limit 100 -traffic zipf -ids 1000 \
			-rate 100000 -duration "$d" -tick 50ms -seed 1 -quiet >/dev/null 2>"$work/err.$d"; then
			return 0
		fi
		echo "valgrind failed on the $d run (try $try), running it again" >&2
	done
	cat "$work/err.$d" >&2
	return 1
}
count 2s
count 4s
cg_diff "$work/cg.2s" "$work/cg.4s" >"$work/cg.diff" 2>/dev/null
cg_annotate --threshold=0 "$work/cg.diff" 2>/dev/null >"$work/cg.txt"
awk '
	/PROGRAM TOTALS/ { next }
	$1 ~ /^-?[0-9,]+$/ && $NF ~ /:/ {
		ir = $1; gsub(",", "", ir); fn = $NF
		if (fn ~ /\/src\/runtime\// && fn !~ /(memclrNoHeapPointers|memmove|aeshashbody|strhash|memequal|memeqbody|growslice)$/) { rt += ir; next }
		tot += ir
		if (n < 25) { top[n++] = sprintf("%8.0f  %s", ir / 200000, fn) }
	}
	END {
		printf "instructions per simulated decision: %.0f (the runtime'"'"'s collector and scheduler left out: %.0f more)\n", tot / 200000, rt / 200000
		print "costliest functions, instructions per decision:"
		for (i = 0; i < n; i++) print top[i]
	}' "$work/cg.txt"
