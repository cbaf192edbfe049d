#!/usr/bin/env bash
# Runs the shell commands of the docs (README.md and docs/*.md) as a reader
# would, and fails if one does not work as shown.
#
#   scripts/check-doc-commands.sh [--list] [FILE.md ...]   (default: README.md docs/*.md)
#
# --list prints each block's place and marker without running anything.
#
# What is a command. A fenced block whose language is sh, bash or shell is a
# script: every line of it runs, in one bash with -e and pipefail. In a
# console block only the lines starting with "$ " run (a following line
# starting with "> " continues one); the others are output. Shell commands
# belong in such blocks: an indented code block that starts with go, cd,
# curl, scripts/ or an environment assignment is reported as an error, so
# that no command escapes the check. Inline `code` in prose is not run.
#
# How it runs. Each file is one reader's session, its blocks in order: every
# block starts at the root of a copy of the working tree (kept in the git
# directory, or in DOC_COMMANDS_DIR, a path that stays the same from run to
# run, so that the Go build cache is reused), with the
# variables the earlier blocks of the file exported, and the processes an
# earlier block left running (a server started with &) keep running until the
# file is done. A `weir` built from the tree is on PATH, as docs/weir.md's
# install step would put it. Commands talk only to 127.0.0.1.
#
# Markers, an HTML comment on the last non-blank line before the block's
# opening fence (readers of the rendered page do not see them):
#   (none)                      a quick block: must exit 0 within
#                               DOC_QUICK_TIMEOUT seconds (default 180).
#   <!-- long -->               a sweep, soak or benchmark run: checked to
#                               start. It passes if it exits 0 or is still
#                               running after DOC_LONG_TIMEOUT seconds
#                               (default 6; then it is stopped); it fails if
#                               it exits non-zero first (a wrong flag, package
#                               or file). Its build counts in that time, so a
#                               cold build only shows that the command starts.
#   <!-- background: 127.0.0.1:PORT -->
#                               a server the next blocks talk to (run in the
#                               block, or started in it with &): it is left
#                               running and passes once PORT accepts a
#                               connection (within DOC_BG_TIMEOUT seconds,
#                               default 120); it fails if every process of
#                               the block is gone first, or the block exits
#                               non-zero.
#   <!-- not run: REASON -->    not run (it needs something absent here, such
#                               as a package install, a browser or a running
#                               cluster); REASON is printed.
# A block whose go test prints "no tests to run" fails too, and before a block
# runs, every -run or -bench pattern of its go test commands must name a test
# or benchmark of their packages (go test -list; this also builds them, so
# that a long block's time is spent running it). Exit status 1 if any block failed (its output's tail is
# printed).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

quick_timeout="${DOC_QUICK_TIMEOUT:-180}"
long_timeout="${DOC_LONG_TIMEOUT:-6}"
bg_timeout="${DOC_BG_TIMEOUT:-120}"

list=0
if [ "${1:-}" = --list ]; then list=1; shift; fi
if [ "$#" -gt 0 ]; then
	files=("$@")
else
	files=(README.md docs/*.md)
fi

work="${DOC_COMMANDS_DIR:-}"
if [ -z "$work" ]; then
	work="$(git rev-parse --absolute-git-dir 2>/dev/null || true)"
	if [ -n "$work" ]; then work="$work/doc-commands"; else work="$(mktemp -d)"; fi
fi
tree="$work/tree"
rm -rf "$work"
mkdir -p "$tree" "$work/blocks" "$work/bin"
git ls-files -z --cached --others --exclude-standard |
	tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tree"

# Extract the blocks: blocks/N.sh, and one index line per block:
# N <TAB> mode <TAB> file:line <TAB> argument.
awk -v dir="$work/blocks" '
BEGIN { n = 0; bad = 0 }
FNR == 1 { fence = ""; marker = ""; prevblank = 1 }
{
	line = $0
	if (fence != "") {
		if (line ~ "^[ \t]*" fence "[ \t]*$") {
			if (run) close(out)
			fence = ""; marker = line; prevblank = 0
			next
		}
		if (!run) next
		if (lang == "console") {
			if (line ~ /^\$ /) { print substr(line, 3) > out; cont = (line ~ /\\$/) }
			else if (cont && line ~ /^> /) { print substr(line, 3) > out; cont = (line ~ /\\$/) }
			else cont = 0
		} else print line > out
		next
	}
	if (match(line, /^[ \t]*(```+|~~~+)/)) {
		fence = substr(line, RSTART, RLENGTH); sub(/^[ \t]*/, "", fence)
		lang = substr(line, RSTART + RLENGTH); sub(/^[ \t]+/, "", lang); sub(/[ \t].*/, "", lang)
		run = (lang == "sh" || lang == "bash" || lang == "shell" || lang == "console")
		if (run) {
			n++; out = dir "/" n ".sh"; cont = 0
			printf "" > out
			mode = "quick"; arg = ""
			if (marker ~ /<!-- *long *-->/) mode = "long"
			else if (marker ~ /<!-- *not run:/) {
				mode = "skip"; arg = marker
				sub(/.*<!-- *not run: */, "", arg); sub(/ *-->.*/, "", arg)
			} else if (marker ~ /<!-- *background:/) {
				mode = "background"; arg = marker
				sub(/.*<!-- *background: */, "", arg); sub(/ *-->.*/, "", arg)
			}
			printf "%d\t%s\t%s:%d\t%s\n", n, mode, FILENAME, FNR, arg
		}
		marker = line
		next
	}
	if (line ~ /^(    |\t)(go |cd |curl |scripts\/|bash |[A-Z_][A-Z0-9_]*=)/ && prevblank) {
		print FILENAME ":" FNR ": an indented command; put it in a ```sh block so that it is checked" > "/dev/stderr"
		bad++
	}
	if (line !~ /^[ \t]*$/) marker = line
	prevblank = (line ~ /^[ \t]*$/)
}
END { if (bad) exit 1 }
' "${files[@]}" >"$work/index"

if [ "$list" = 1 ]; then
	cut -f2- "$work/index" | awk -F'\t' '{ printf "%-11s %s %s\n", $1, $2, $3 }'
	exit 0
fi

# The copy lives inside the git directory: no VCS stamp for what it builds.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

echo "building weir for PATH"
(cd "$tree" && go build -o "$work/bin/weir" ./cmd/weir)
export PATH="$work/bin:$PATH"

# The process groups of blocks that left a process running (a server started
# with &), stopped when their file is done.
groups=()
stop_group() {
	local g="$1" i
	kill -TERM -- "-$g" 2>/dev/null || return 0
	for i in 1 2 3 4 5 6 7 8 9 10; do
		kill -0 -- "-$g" 2>/dev/null || return 0
		sleep 0.3
	done
	kill -KILL -- "-$g" 2>/dev/null || true
}
stop_groups() {
	local g
	for g in "${groups[@]}"; do stop_group "$g"; done
	groups=()
}
trap stop_groups EXIT

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# list_check BLOCK: for every `go test` of the block with a -run or -bench
# pattern, `go test -list` must name at least one test or benchmark in its
# packages (a pattern that matches nothing otherwise passes silently, and a
# long block is stopped before it would show). It also builds the test
# binaries, so that a long block then starts within its time. Handles the
# forms the docs use: VAR=value prefixes, `cd DIR &&`, `(cd DIR && ...)`.
# Prints the first failure and returns 1.
list_check() {
	local line seg dir w pat alt i j out prefix
	local -a words segs pats kinds pkgs alts
	while IFS= read -r line || [ -n "$line" ]; do
		case "$line" in *'go test'*) ;; *) continue ;; esac
		line="${line#"${line%%[! ]*}"}"
		line="${line#(}"
		dir=.
		IFS=$'\n' read -r -d '' -a segs < <(printf '%s' "${line//&&/$'\n'}"; printf '\0') || true
		for seg in "${segs[@]}"; do
			seg="${seg%)}"
			set -f +u
			eval "words=($seg"$'\n'")" 2>/dev/null || { set +f -u; continue; }
			set +f -u
			i=0
			while [ "$i" -lt "${#words[@]}" ] && [[ "${words[$i]}" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do i=$((i + 1)); done
			if [ "${words[$i]:-}" = cd ]; then dir="${words[$((i + 1))]:-.}"; continue; fi
			[ "${words[$i]:-}" = go ] && [ "${words[$((i + 1))]:-}" = test ] || continue
			pats=(); kinds=(); pkgs=()
			i=$((i + 2))
			while [ "$i" -lt "${#words[@]}" ]; do
				w="${words[$i]}"
				case "$w" in
				-run | -bench) pats+=("${words[$((i + 1))]:-}"); kinds+=("$w"); i=$((i + 1)) ;;
				-run=* | -bench=*) pats+=("${w#*=}"); kinds+=("${w%%=*}") ;;
				-benchtime | -count | -timeout | -cpuprofile | -memprofile | -blockprofile | -coverprofile | -tags | -p | -parallel | -o | -exec) i=$((i + 1)) ;;
				-*) ;;
				*) pkgs+=("$w") ;;
				esac
				i=$((i + 1))
			done
			for j in "${!pats[@]}"; do
				[ "${pats[$j]}" = '^$' ] && continue
				IFS='|' read -r -a alts <<<"${pats[$j]}"
				pat=""
				for alt in "${alts[@]}"; do pat="${pat:+$pat|}${alt%%/*}"; done
				prefix='^(Test|Example|Fuzz)'
				[ "${kinds[$j]}" = -bench ] && prefix='^Benchmark'
				if ! out="$(cd "$tree/$dir" && go test -list "$pat" "${pkgs[@]}" 2>&1)"; then
					echo "go test -list '$pat' ${pkgs[*]} (in $dir) failed:"
					tail -n 15 <<<"$out"
					return 1
				fi
				if ! grep -Eq "$prefix" <<<"$out"; then
					echo "${kinds[$j]} '${pats[$j]}' matches nothing in ${pkgs[*]:-.} (in $dir): see go test -list"
					return 1
				fi
			done
		done
	done <"$1"
	return 0
}

failures=0
ran=0
skipped=0
current=""
start_all=$SECONDS
while IFS=$'\t' read -r n mode where arg; do
	file="${where%%:*}"
	if [ "$file" != "$current" ]; then
		stop_groups
		current="$file"
		: >"$work/env"
	fi
	if [ "$mode" = skip ]; then
		echo "skip  $where: not run: $arg"
		skipped=$((skipped + 1))
		continue
	fi
	driver="$work/blocks/$n.driver"
	{
		echo "cd \"$tree\""
		echo ". \"$work/env\""
		echo "set -e -o pipefail"
		cat "$work/blocks/$n.sh"
		echo
		echo "export -p | grep -Ev '^declare -x (PWD|OLDPWD|SHLVL|_)=' >\"$work/env.new\" || true"
	} >"$driver"
	log="$work/blocks/$n.log"
	if ! why="$(list_check "$work/blocks/$n.sh")"; then
		printf 'FAIL  %s (%s): %s\n' "$where" "$mode" "$(head -n 1 <<<"$why")"
		tail -n +2 <<<"$why" | sed 's/^/      > /'
		failures=$((failures + 1))
		continue
	fi
	if [ "$mode" = background ] && port_open "${arg%:*}" "${arg##*:}"; then
		printf 'FAIL  %s (background): %s is already in use by another process\n' "$where" "$arg"
		failures=$((failures + 1))
		continue
	fi
	t0=$SECONDS
	setsid bash "$driver" >"$log" 2>&1 </dev/null &
	pid=$!
	limit=$quick_timeout
	[ "$mode" = long ] && limit=$long_timeout
	[ "$mode" = background ] && limit=$bg_timeout
	status=""
	exited=0
	while [ $((SECONDS - t0)) -lt "$limit" ]; do
		if [ "$exited" = 0 ] && ! kill -0 "$pid" 2>/dev/null; then
			exited=1
			rc=0; wait "$pid" || rc=$?
			if [ "$rc" -eq 0 ]; then status=ok; else status="exit $rc"; fi
			# A background block may end once it has started its server.
			if [ "$mode" != background ] || [ "$rc" -ne 0 ]; then break; fi
		fi
		if [ "$mode" = background ]; then
			if port_open "${arg%:*}" "${arg##*:}"; then status=listening; break; fi
			if [ "$exited" = 1 ] && ! kill -0 -- "-$pid" 2>/dev/null; then break; fi
		fi
		sleep 0.2
	done
	took=$((SECONDS - t0))
	if [ "$mode" = background ] && [ "$status" = ok ] && kill -0 -- "-$pid" 2>/dev/null; then status=""; fi
	ok=1
	case "$mode:$status" in
	quick:ok) msg="ok" ;;
	long:ok) msg="ok (finished)" ;;
	long:) msg="ok (still running at ${limit}s: started)" ;;
	background:listening) msg="ok ($arg is listening)" ;;
	background:ok) ok=0; msg="its processes ended before $arg listened" ;;
	quick:) ok=0; msg="still running after ${limit}s (mark it <!-- long --> if it is meant to run long)" ;;
	background:) ok=0; msg="$arg not listening after ${limit}s" ;;
	long:exit*) ok=0; msg="$status before ${limit}s" ;;
	*) ok=0; msg="$status" ;;
	esac
	if [ "$ok" = 1 ] && grep -q 'no tests to run' "$log"; then
		ok=0; msg="a go test -run pattern matches no test (testing: warning: no tests to run)"
	fi
	if [ "$mode" = background ] && [ "$status" = listening ]; then
		groups+=("$pid")
	elif [ -z "$status" ]; then
		stop_group "$pid"
		wait "$pid" 2>/dev/null || true
	elif kill -0 -- "-$pid" 2>/dev/null; then
		groups+=("$pid")
	fi
	if [ -s "$work/env.new" ]; then mv "$work/env.new" "$work/env"; fi
	if [ "$ok" = 1 ]; then
		printf 'ok    %s (%s, %ss): %s\n' "$where" "$mode" "$took" "$msg"
		ran=$((ran + 1))
	else
		printf 'FAIL  %s (%s, %ss): %s\n' "$where" "$mode" "$took" "$msg"
		sed 's/^/      | /' "$work/blocks/$n.sh"
		echo "      output (last 20 lines):"
		tail -n 20 "$log" | sed 's/^/      > /'
		failures=$((failures + 1))
	fi
done <"$work/index"
stop_groups

echo "doc commands: $ran blocks passed, $failures failed, $skipped not run ($((SECONDS - start_all))s)"
[ "$failures" -eq 0 ]
