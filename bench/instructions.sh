#!/bin/bash
# instructions.sh: instructions per benchmark op, counted by valgrind's cachegrind, for
# comparing code on a machine too noisy to time it (a shared VM: the same binary's time
# varies 2x between runs; its instruction count does not). It runs the benchmark twice,
# with -test.benchtime 2x and (N+2)x (both run the benchmark function twice: b.N=1 then
# b.N=n, so the set-up cancels out), and divides the difference by N.
#
# usage: bench/instructions.sh TESTBIN BENCH N [test flags...]
#   go test -c -o /tmp/engine.test ./engine
#   cd engine && FUNCS="$(cat ../bench/query-funcs.re)" ../bench/instructions.sh /tmp/engine.test QueryWarm 200 -coldblocks 131072
# With SIM=yes it also reports D1 and LL data-cache misses per op (simulated caches).
# With FUNCS=regex it also reports the instructions per op of the functions whose
# "file:function" matches regex (e.g. FUNCS=conductor-go): the whole-process count includes
# the runtime's background work, which grows with wall time under valgrind and varies
# by some percent between runs; the query path's own functions do not.
set -euo pipefail
if [ $# -lt 3 ]; then
	sed -n '2,17p' "$0"
	exit 2
fi
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
T=$1 B=$2 N=$3
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {
	local n=$1
	shift
	valgrind --tool=cachegrind --cache-sim="${SIM:-no}" --cachegrind-out-file="$out/cg.$n" \
		"$T" -test.run '^$' -test.bench "$B" -test.benchtime "${n}x" -test.cpu 1 "$@" 2>&1 |
		grep -E "I +refs|D1 +misses|LLd +misses" | sed 's/==[0-9]*==//; s/,//g'
}
a=$(run 2 "$@")
b=$(run $((N + 2)) "$@")
ia=$(echo "$a" | awk '/I +refs/ {print $3}')
ib=$(echo "$b" | awk '/I +refs/ {print $3}')
echo "$B $*: $(((ib - ia) / N)) instructions/op"
if [ -n "${FUNCS:-}" ]; then
	cg_diff "$out/cg.2" "$out/cg.$((N + 2))" >"$out/diff" 2>/dev/null
	cg_annotate "$out/diff" 2>/dev/null | awk -v n="$N" -v re="$FUNCS" '
		/file:function/ {f = 1; next}
		f && NF >= 2 && $NF ~ re {v = $1; gsub(",", "", v); s += v}
		END {printf "  in functions matching %s: %d instructions/op\n", re, s / n}'
fi
if [ "${SIM:-no}" = yes ]; then
	da=$(echo "$a" | awk '/D1 +misses/ {print $3}'); db=$(echo "$b" | awk '/D1 +misses/ {print $3}')
	la=$(echo "$a" | awk '/LLd +misses/ {print $3}'); lb=$(echo "$b" | awk '/LLd +misses/ {print $3}')
	echo "  D1 misses/op $(((db - da) / N)), LLd misses/op $(((lb - la) / N))"
fi
