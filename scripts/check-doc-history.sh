#!/usr/bin/env bash
# Finds words of the work's history in the user docs (README.md and docs/*.md):
# the docs describe the software as it is; how it got there belongs in commit
# messages. Prints file:line:text of every hit and exits 1 on any.
#
#   scripts/check-doc-history.sh [FILE.md ...]     (default: README.md docs/*.md)
#
# What counts as history (matched case-insensitively, on whole words):
#   - numbered rounds: "round 3", "Round 2", "rounds 4-6", "first round",
#     "ninth round", "5th round", "this round", "previous/earlier/later round";
#   - dated experiments: a heading with a date ("## 2026-11-30", "### Nov 30
#     run") and, in prose, a calendar date (2026-11-30), except a timestamp
#     (2026-11-30T03:30:00Z) as a sample output shows it;
#   - who measured what: "we measured", "I tried", "we dropped", "measured by
#     me", "helper", "session", "stop 12.", "of ours", "other engineers";
#   - lab-notebook phrasing: "was tried", "earlier attempt", "tried and
#     dropped", "lab notebook", "it used to", "used to be", "before this change",
#     "review fixes", "after the merge", "a first run", "first saw", "the same
#     day", "the latest run", "**Fixed:", "issue 7", "yesterday".
# Not history, and not matched: "round trip", "round robin", "rounds to zero",
# "the other way round", and a benchmark's rounds as its method ("medians of 3
# rounds", "each round", "the same round", "rounds interleave the systems"):
# those describe how a figure is made, not when. Nor "TLS session" or "sticky
# session". Fenced code blocks are skipped (sample output has timestamps, and
# code may name a variable "session"); indented blocks and HTML comments are
# read like prose.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -gt 0 ]; then
	files=("$@")
else
	files=(README.md docs/*.md)
fi

awk '
BEGIN {
	B = "(^|[^a-z0-9_])"; E = "([^a-z0-9_]|$)"
	months = "(jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\\.?"
	n = 0
	# Patterns for every line outside fenced code.
	pat[n++] = B "rounds? [0-9]+" E
	pat[n++] = B "(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[0-9]+(st|nd|rd|th)|this|previous|earlier|later|latest) rounds?" E
	pat[n++] = B "(helpers?|sessions?)" E
	pat[n++] = B "(we|i) (measured|tried|ran|found|saw|timed|profiled|benchmarked|dropped|removed|replaced|changed|added|fixed|started|rewrote|switched|reverted|attempted)" E
	pat[n++] = B "measured (it |them |this )?by (me|us|hand|someone)" E
	pat[n++] = B "stop [0-9]+([^a-z0-9 ]|$)"
	pat[n++] = B "(of ours|other engineers)" E
	pat[n++] = B "(was|were|been) tried" E
	pat[n++] = B "earlier attempts?" E
	pat[n++] = B "tried and (dropped|abandoned|reverted|failed|rejected)" E
	pat[n++] = B "lab notebook" E
	pat[n++] = B "(we|it|this|that|weir|they|which|there) used to" E
	pat[n++] = B "used to (be|have)" E
	pat[n++] = B "(before|after) (this|that) (fix|fixes|change|rewrite|review)" E
	pat[n++] = B "(before|after) the (fix|fixes|rewrite|review)" E
	pat[n++] = B "review fix(es)?" E
	pat[n++] = B "((after|before) the merge|this page\047s work)" E
	pat[n++] = B "(a first run|first saw|not yet been run|was run again|were run again)" E
	pat[n++] = B "(the same day|that day|the latest (full )?runs?|\\*\\*fixed:)" 
	pat[n++] = B "issue #?[0-9]+" E
	pat[n++] = B "(yesterday|this morning|last night|last week)" E
	pat[n++] = B "20[0-9][0-9]-[01][0-9]-[0-3][0-9]([^t0-9]|$)"
	# Patterns for headings only: a date in any common form.
	hpat[0] = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
	hpat[1] = B months " [0-9][0-9]?" E
	hpat[2] = B "[0-9][0-9]? " months E
	hits = 0
}
FNR == 1 { fence = "" }
{
	line = $0
	if (fence != "") {
		if (line ~ ("^[ \t]*" fence)) fence = ""
		next
	}
	if (match(line, /^[ \t]*(```+|~~~+)/)) {
		fence = substr(line, RSTART, RLENGTH); sub(/^[ \t]*/, "", fence)
		next
	}
	t = tolower(line)
	gsub(/round[- ]trips?|round[- ]robin|rounds? to |(other|wrong) way round|tls sessions?|sticky sessions?/, " ", t)
	hit = 0
	for (i = 0; i < n; i++) if (t ~ pat[i]) hit = 1
	if (t ~ /^#+ /) for (i in hpat) if (t ~ hpat[i]) hit = 1
	if (hit) { print FILENAME ":" FNR ":" line; hits++ }
}
END {
	if (hits > 0) {
		print hits " line(s) tell the history of the work; describe the software as it is (see the header of scripts/check-doc-history.sh)" > "/dev/stderr"
		exit 1
	}
}
' "${files[@]}"
