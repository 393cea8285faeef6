#!/bin/sh
# Medians of alternated runs of two commits' conductors:
#
#   bench/alternate.sh BASE HEAD MODE [conductor-bench flags...]
#
# builds bin/mooncake_conductor of BASE and of HEAD (any git revisions; "." is the working
# tree as it is, uncommitted changes included) into a temporary directory, builds
# conductor-bench from the working tree, and runs
#
#   conductor-bench MODE --alternate <BASE binary>,<HEAD binary> --rounds $ROUNDS [flags...]
#
# (MODE: ingest, idle or load; ROUNDS defaults to 3), which prints each figure's median per
# binary and HEAD/BASE. The temporary directory is removed at the end. Example:
#
#   bench/alternate.sh main . ingest --blocks 1000000 --publishers 8
set -eu

if [ $# -lt 3 ]; then
	sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
base=$1 head=$2 mode=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$(mktemp -d "${TMPDIR:-/tmp}/conductor-alternate-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# build REV NAME: the conductor of REV into $work/NAME/mooncake_conductor.
build() {
	mkdir -p "$work/$2/src"
	if [ "$1" = . ]; then
		echo "building the working tree's conductor" >&2
		go build -o "$work/$2/mooncake_conductor" ./cmd/mooncake_conductor
	else
		rev=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "alternate.sh: $1 is not a commit" >&2; exit 2; }
		echo "building $1 ($(git log -1 --format='%h %s' "$rev" | cut -c1-72))" >&2
		git archive "$rev" | tar -x -C "$work/$2/src"
		(cd "$work/$2/src" && go build -o "$work/$2/mooncake_conductor" ./cmd/mooncake_conductor)
		rm -rf "$work/$2/src"
	fi
}
build "$base" base
build "$head" head
go build -o "$work/conductor-bench" ./cmd/conductor-bench
echo "A = $base, B = $head (the binaries under $work, removed at the end)"
"$work/conductor-bench" "$mode" --alternate "$work/base/mooncake_conductor,$work/head/mooncake_conductor" \
	--rounds "${ROUNDS:-3}" "$@"
