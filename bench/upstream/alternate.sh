#!/bin/sh
# Medians of alternated /query load runs of the upstream C++ conductor and ours:
#
#   bench/upstream/alternate.sh UPSTREAM_BIN OUR_BIN[,OUR_BIN...] [conductor-bench load flags...]
#
# UPSTREAM_BIN is what bench/upstream/build.sh printed; each OUR_BIN a bin/mooncake_conductor
# (of any commit). Each of ROUNDS rounds (default 5) runs `conductor-bench load` with the
# flags once against each server in turn: upstream started fresh on a free port with no
# services and measured as an external conductor (--conductor, --pid), ours spawned
# (--conductor-bin). It prints every cell's server CPU per query (and p50, and with --floor
# the cell's floor) per run, then per cell the median of each server, ours / upstream and
# the floors' medians. Example (the figures in
# docs/performance.md, "Against the upstream conductor"):
#
#   bench/upstream/alternate.sh /tmp/conductor-upstream/build/mooncake_conductor bin/mooncake_conductor \
#       --blocks 1000000 --instances 8 --concurrency 1 --duration 3s --prompt-tokens 8192 \
#       --shapes hit,miss --memo warm,cold --cold-prompts 1900 --binary-tokens
set -eu

if [ $# -lt 2 ]; then
	sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
up=$1 ours=$2
shift 2
rounds=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
work=$(mktemp -d "${TMPDIR:-/tmp}/conductor-upstream-XXXXXX")
upid=
trap '[ -n "$upid" ] && kill "$upid" 2>/dev/null; rm -rf "$work"' EXIT INT TERM
go build -o "$work/conductor-bench" ./cmd/conductor-bench

# free_port: a TCP port nothing listens on now.
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_port PORT: wait up to 10 s for a listener on PORT.
wait_port() {
	python3 -c '
import socket, sys, time
end = time.time() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        break
    except OSError:
        if time.time() > end:
            sys.exit("upstream conductor did not listen on port " + sys.argv[1])
        time.sleep(0.05)
' "$1"
}

# rows NAME ROUND: prints the table rows of $work/out as "ROW round name tokens shape memo
# clients cpu p50 floor" (floor: the cell's floor CPU with --floor, else -) and keeps them
# in $work/rows.
rows() {
	awk -v r="$2" -v w="$1" '$1 ~ /^[0-9]+$/ && NF >= 11 { print "ROW", r, w, $1, $2, $3, $4, $9, $7, (NF >= 13 ? $12 : "-") }' "$work/out" >"$work/new"
	cat "$work/new" >>"$work/rows"
	cat "$work/new"
}

# Not in a pipeline: exit in a failed run ends the script, and the trap sees upid.
for r in $(seq 1 "$rounds"); do
	port=$(free_port)
	printf '{"http_server_port": %s, "kvevent_instance": {}}\n' "$port" >"$work/up.json"
	CONDUCTOR_CONFIG_PATH="$work/up.json" CONDUCTOR_LOG_LEVEL=INFO "$up" >"$work/up.log" 2>&1 &
	upid=$!
	wait_port "$port" || { cat "$work/up.log" >&2; exit 1; }
	"$work/conductor-bench" load --conductor "http://127.0.0.1:$port" --pid "$upid" "$@" >"$work/out" 2>"$work/err" ||
		{ cat "$work/err" >&2; exit 1; }
	kill "$upid"
	wait "$upid" 2>/dev/null || true
	upid=
	rows upstream "$r"
	i=0
	for bin in $(echo "$ours" | tr , ' '); do
		i=$((i + 1))
		"$work/conductor-bench" load --conductor-bin "$bin" "$@" >"$work/out" 2>"$work/err" ||
			{ cat "$work/err" >&2; exit 1; }
		rows "ours$i" "$r"
	done
done

echo "server CPU per query, us: medians of $rounds alternated runs (ours<i>: $ours)"
awk '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ cell = $4 " " $5 " " $6 " x" $7; v[cell, $3] = v[cell, $3] " " $8; if (!(cell in seen)) { seen[cell] = 1; order[++nc] = cell }
  if ($10 != "-") fl[cell, $3] = fl[cell, $3] " " $10
  if (!($3 in who)) { who[$3] = 1; names[++nw] = $3 } }
END {
	for (c = 1; c <= nc; c++) {
		line = sprintf("%-22s", order[c]); u = median(v[order[c], "upstream"])
		for (k = 1; k <= nw; k++) {
			m = median(v[order[c], names[k]])
			line = line sprintf("  %s %7.1f", names[k], m)
			if (names[k] != "upstream") line = line sprintf(" (%.2fx)", m / u)
			if ((order[c], names[k]) in fl) line = line sprintf(" [floor %.1f]", median(fl[order[c], names[k]]))
		}
		print line
	}
}' "$work/rows"
