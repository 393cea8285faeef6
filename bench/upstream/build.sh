#!/bin/sh
# Builds the upstream C++ conductor, for side-by-side measurements only:
#
#   bench/upstream/build.sh [DIR]
#
# clones kvcache-ai/Mooncake at the last commit of its dev/conductor branch that holds a
# complete mooncake-conductor/ tree (msgpack HTTP, three tiers: gpu, cpu, disk; the later
# upstreaming series' HTTP server is not published) and yalantinglibs at the commit it pins,
# builds both under DIR (default /tmp/conductor-upstream) and prints the binary's path.
# Nothing of upstream's is kept in this repository: the sources are fetched at build time.
# Set MOONCAKE_GIT / YLT_GIT to a local mirror when GitHub cannot be reached. Debian
# packages it needs: cmake g++ libssl-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
# libgoogle-glog-dev libjsoncpp-dev libboost-dev.
#
# Run it (port 13333 unless the config file says otherwise) and measure it with the
# harness as an external conductor, e.g.
#
#   echo '{"http_server_port": 23333, "kvevent_instance": {}}' > /tmp/up.json
#   CONDUCTOR_CONFIG_PATH=/tmp/up.json CONDUCTOR_LOG_LEVEL=INFO $BIN &
#   go run ./cmd/conductor-bench load --conductor http://127.0.0.1:23333 --pid $! ...
#
# bench/upstream/alternate.sh runs it and a conductor of ours in turn.
set -eu

case ${1:-} in -*)
	sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

MOONCAKE_GIT=${MOONCAKE_GIT:-https://github.com/kvcache-ai/Mooncake.git}
YLT_GIT=${YLT_GIT:-https://github.com/alibaba/yalantinglibs.git}
# dev/conductor's last commit touching mooncake-conductor/ (2026-08-07): low-level SHA-256
# for the vLLM hash chain, lazy hash chain with early exit in /query, msgpack bodies.
MOONCAKE_REV=${MOONCAKE_REV:-19ffa6e4a}
dir=${1:-/tmp/conductor-upstream}
build_type=${BUILD_TYPE:-Release}

mkdir -p "$dir"
cd "$dir"
if [ ! -d mooncake ]; then
	git clone --quiet --no-checkout --branch dev/conductor "$MOONCAKE_GIT" mooncake
fi
git -C mooncake checkout --quiet "$MOONCAKE_REV" -- mooncake-conductor mooncake-common
ylt_rev=$(git -C mooncake ls-tree "$MOONCAKE_REV" extern/yalantinglibs | awk '{print $3}')
if [ ! -d ylt ]; then
	git clone --quiet --no-checkout "$YLT_GIT" ylt
fi
git -C ylt checkout --quiet "$ylt_rev"

# yalantinglibs is header-only; install its headers and CMake package under prefix/.
cmake -S ylt -B ylt/build -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF \
	-DCMAKE_INSTALL_PREFIX="$dir/prefix" >build.log 2>&1
cmake --build ylt/build -j"$(nproc)" >>build.log 2>&1
cmake --install ylt/build >>build.log 2>&1

# Debian's libmsgpack-cxx-dev ships its CMake package as "msgpack" (target msgpackc-cxx),
# not the "msgpack-cxx" upstream asks for: a one-target package of our own stands in for
# it (the headers are in /usr/include either way).
mkdir -p shim
cat >shim/msgpack-cxx-config.cmake <<'CMAKE'
if(NOT TARGET msgpack-cxx)
  add_library(msgpack-cxx INTERFACE IMPORTED)
  set_target_properties(msgpack-cxx PROPERTIES INTERFACE_COMPILE_DEFINITIONS MSGPACK_NO_BOOST)
endif()
CMAKE

cmake -S mooncake/mooncake-conductor -B build -DCMAKE_BUILD_TYPE="$build_type" \
	-DCMAKE_PREFIX_PATH="$dir/prefix" -Dmsgpack-cxx_DIR="$dir/shim" >>build.log 2>&1
cmake --build build -j"$(nproc)" --target mooncake_conductor >>build.log 2>&1
echo "$dir/build/mooncake_conductor"
