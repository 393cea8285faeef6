# Conductor: build, run and test. `make run` and `make test` work on a fresh machine:
# they install libzmq (apt-get) and the Python test packages (into .venv) when missing.

GO        ?= go
VENV      ?= .venv
PY        := $(VENV)/bin/python
BIN       := bin/mooncake_conductor
CONFIG    ?= config/conductor.json
FUZZTIME  ?= 10s
# Python packages the tests need (pyzmq/msgspec publish events the way vLLM does).
PY_TEST_PKGS := pytest pyzmq msgspec msgpack

.PHONY: all build run test gotest nocgo pytest vet fmtcheck rules bench fuzz generate vectors deps-vectors deps deps-promtool deps-etcd venv clean

all: build

# libzmq (cgo, for github.com/pebbe/zmq4) and pkg-config, installed only when absent.
deps:
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
		echo "installing libzmq3-dev and pkg-config"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libzmq3-dev pkg-config; \
	fi

venv: $(VENV)/.stamp
$(VENV)/.stamp: python/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PY_TEST_PKGS)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e ./python
	touch $@

build: deps
	$(GO) build -o $(BIN) ./cmd/mooncake_conductor
	$(GO) build -o bin/conductorctl ./cmd/conductorctl

# Starts the conductor on the default ports (HTTP 13333, RPC 13334) with an empty service list.
run: build
	CONDUCTOR_CONFIG_PATH=$(CONFIG) ./$(BIN)

fmtcheck:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.venv/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: deps
	$(GO) vet ./...

gotest: deps deps-etcd
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./...
	# Race builds swap fastConn's raw system calls for syscall.Read/Write (the detector
	# must see socket happens-before): test the raw path the release binary runs too.
	$(GO) test -count=1 -run 'FastConn' ./server

# The packages that must build and test without cgo (CGO_ENABLED=0): all but the libzmq
# users' tests (ingest's subscriber tests, server's registration tests and bench/sim need
# real ZMQ sockets; without cgo those packages still build, with stubs that fail at run
# time with "ZMQ subscriptions need cgo"). This is the one list: a package that gains a
# cgo dependency fails `make nocgo`; one that loses its last cgo dependency is added here.
NOCGO_PKGS := ./arena ./bench/report ./engine ./hashing ./httpclient ./ingest/seqtrack \
	./ingest/translate ./ingest/zmqtransport ./internal/... ./rpcclient ./wire/...

# Build the whole tree, then vet and test NOCGO_PKGS, with cgo off (no -race: the race
# detector needs cgo; gotest runs these tests under it).
nocgo:
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet $(NOCGO_PKGS)
	CGO_ENABLED=0 $(GO) test -count=1 $(NOCGO_PKGS)

pytest: build venv
	CONDUCTOR_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest python/tests -q

# promtool (Debian package prometheus) for the alert rule tests, installed only when absent.
deps-promtool:
	@if ! command -v promtool >/dev/null 2>&1; then \
		echo "installing prometheus (promtool checks the alert rules)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; \
	fi

# etcd (Debian package etcd-server) for the cluster registry tests, which start a real etcd
# on free loopback ports; installed only when absent.
deps-etcd:
	@if ! command -v etcd >/dev/null 2>&1; then \
		echo "installing etcd-server (the cluster tests run a real etcd)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends etcd-server; \
	fi

# The Prometheus alert rules: syntax, and unit tests that fire each alert.
rules: deps-promtool
	promtool check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && promtool test rules alerts_test.yml

# Every test: formatting, vet, Go tests under the race detector (with a real etcd for the
# cluster tests), every benchmark once, the cgo-free packages without cgo, the alert
# rules, Python.
test: fmtcheck vet deps-promtool deps-etcd gotest nocgo rules pytest

# Microbenchmarks plus a short trace replay (see bench/README.md for the knobs; drop
# --max-requests for the full trace). The replay's JSON goes to bench/results/, with PNG
# plots beside it (matplotlib, installed into .venv for this target only).
bench: deps venv $(VENV)/.plot-stamp
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 200ms ./...
	@out=$$($(GO) run ./cmd/conductor-bench replay --trace ../shared/traces/conversation_trace.jsonl \
		--instances 16 --block-size 16 --max-requests 2000); status=$$?; echo "$$out"; test $$status = 0 && \
	$(PY) bench/plot.py $$(echo "$$out" | sed -n 's/^results: //p')

$(VENV)/.plot-stamp: $(VENV)/.stamp
	$(VENV)/bin/pip install -q --disable-pip-version-check matplotlib
	touch $@

# Each fuzz target for a bounded time (FUZZTIME per target).
fuzz: deps
	@set -e; for pkg in $$($(GO) list ./...); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
			echo "== $$pkg $$t"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

# Regenerates the committed generated code (httpclient/views_gen.go, tinylib/msgp) from
# the go:generate lines; the generators run at the versions those lines pin.
generate:
	$(GO) generate ./...

# Engine vectors (testdata/engines/): downloads the published vLLM and SGLang wheels from
# PyPI, runs their own hashing and KV-event code and rewrites the JSON files. Needs the
# network, g++ and the OpenSSL headers (SGLang's page hash is C++); not part of `make
# test`. The wheels' sources and the generator's venv live in VECTORS_CACHE (ignored).
VECTORS_CACHE ?= .cache/enginevectors
VECTORS_PY    := $(VECTORS_CACHE)/venv/bin/python
VECTORS_PKGS  := msgspec cbor2 xxhash pyzmq numpy pybind11 typing_extensions

deps-vectors:
	@if ! command -v g++ >/dev/null 2>&1 || [ ! -f /usr/include/openssl/sha.h ]; then \
		echo "installing g++ and libssl-dev (SGLang's page hash is compiled from its C++ source)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq g++ libssl-dev; \
	fi

$(VECTORS_CACHE)/venv/.stamp:
	python3 -m venv $(VECTORS_CACHE)/venv
	$(VECTORS_CACHE)/venv/bin/pip install -q --disable-pip-version-check $(VECTORS_PKGS)
	touch $@

vectors: deps-vectors $(VECTORS_CACHE)/venv/.stamp
	$(VECTORS_PY) tools/enginevectors/generate.py --cache $(VECTORS_CACHE) --out testdata/engines

clean:
	rm -rf bin $(VENV)
