"""End to end: the client against the real conductor binary (skipped when it is not built).

These follow the Python API contract (docs/api.md). The first tests register endpoints where no
publisher runs: subscribing is asynchronous, so that succeeds and the instance shows up
in the views with zero counts. The later ones run a real ZMQ publisher that sends
vLLM-style msgpack events, and walk every error code the contract lists.
"""

import contextlib
import copy
import json
import os
import signal
import socket
import struct
import time
from pathlib import Path

import msgpack
import pytest
import zmq

import goldens as g
from mooncake.conductor import (
    CONDUCTOR_UNAVAILABLE,
    HEALTH_NOT_INITIALIZED,
    HEALTH_OK,
    HEALTH_UNREACHABLE,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    OK,
    RPC_FAIL,
    RPC_TIMEOUT,
    SERVICE_NOT_FOUND,
    ConductorClient,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
VECTORS = Path(os.environ.get("CONDUCTOR_VECTORS", REPO_ROOT / "testdata" / "vectors" / "hash_vectors.json"))

#: Prompt of hash_vectors.json: tokens 1..40 (two full blocks of 16 and an 8-token tail).
PROMPT = list(range(1, 41))
#: hash_vectors.json vllm_v1 sha256_cbor, block_size 16, variant plain: event_u64 of
#: blocks 0 and 1 (what vLLM publishes with PYTHONHASHSEED=0). Checked against the file
#: by test_vector_constants.
CBOR_BS16_PLAIN = [3236607068019569386, 2758186210834249151]

VLLM_PROFILE = {
    "strategy": "vllm_v1",
    "algorithm": "sha256_cbor",
    "python_hash_seed": "0",
    "index_projection": "low64_be",
}


def vllm_config(instance_id, endpoint, **changes):
    """The contract's register() example with the given identity and overrides."""
    cfg = {
        "instance_id": instance_id,
        "endpoint": endpoint,
        "publisher_type": "vLLM",
        "model_name": "my-model",
        "block_size": 16,
        "dp_rank": 0,
        "hash_profile": dict(VLLM_PROFILE),
    }
    cfg.update(changes)
    return cfg


def wait_for(fetch, accept, timeout=10.0, what="condition"):
    """Poll fetch() until accept(value) holds: events reach the conductor asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError("%s not reached within %.0fs; last value: %r" % (what, timeout, value))
        time.sleep(0.02)


class EventPublisher:
    """A KV event publisher on a free loopback port, framed like vLLM's ZmqEventPublisher:
    [topic, 8-byte big-endian sequence, msgpack batch]. It binds an XPUB socket so a test
    can wait for the conductor's subscription instead of sleeping (a plain PUB drops what
    it sends before the subscriber has joined).
    """

    def __init__(self, ctx, topic=b""):
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        # Report every subscription, also one to a topic another subscriber already holds
        # (a re-registration can subscribe before the old subscriber has left).
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = topic
        self.seq = 0

    def wait_subscribed(self, timeout=10.0):
        """Wait for the next subscription; unsubscriptions of earlier subscribers are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000), zmq.POLLIN):
                raise AssertionError("no subscriber reached %s" % self.endpoint)
            if self.sock.recv()[:1] == b"\x01":
                return

    def send(self, batch):
        """Send one already-built batch ([ts, events, dp_rank] for engines)."""
        payload = msgpack.packb(batch, use_bin_type=True)
        self.sock.send_multipart([self.topic, struct.pack(">Q", self.seq), payload])
        self.seq += 1

    def publish(self, events, dp_rank=0):
        """Send an engine batch [ts, events, dp_rank], as vLLM and SGLang do."""
        self.send([time.time(), events, dp_rank])

    def close(self):
        self.sock.close(linger=0)


@pytest.fixture
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def publisher_factory(zmq_ctx):
    """Factory: publisher_factory(**kwargs) -> EventPublisher, closed at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(contextlib.closing(EventPublisher(zmq_ctx, **kwargs)))


def block_stored(hashes, token_ids, block_size=16, medium="GPU"):
    """A vLLM BlockStored event as current vLLM encodes it (a msgpack map, post PR #42892)."""
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": None,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def block_removed(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, "group_idx": 0}


@pytest.fixture
def client(conductor):
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr) == OK, conductor.log()
        yield c


def test_vector_constants():
    cases = json.loads(VECTORS.read_text())["vllm_v1"]["cases"]
    case = next(
        c for c in cases if c["algo"] == "sha256_cbor" and c["block_size"] == 16 and c["variant"] == "plain"
    )
    assert [b["event_u64"] for b in case["blocks"]] == CBOR_BS16_PLAIN
    assert json.loads(VECTORS.read_text())["prompt_token_ids"] == PROMPT


def test_empty_index(client):
    assert client.health_check() == HEALTH_OK
    assert client.query("my-model", block_size=16, token_ids=list(range(32))) == {"ret": OK, "hits": {}}
    assert client.query("my-model", block_size=16, token_ids=[]) == {"ret": OK, "hits": {}}
    assert client.list_services() == {"ret": OK, "count": 0, "services": []}
    assert client.get_global_view() == {"ret": OK, "context_count": 0, "contexts": []}


def test_invalid_requests(client):
    assert client.query("", block_size=16, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.query("m", block_size=0, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.query("m", block_size=-16, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.register({}) == INVALID_PARAMS
    assert client.register(dict(g.REGISTER_CONFIG, block_size=0)) == INVALID_PARAMS
    assert client.unregister("nobody") == SERVICE_NOT_FOUND


def test_register_view_query_unregister(client):
    cfg = copy.deepcopy(g.REGISTER_CONFIG)
    cfg.update(instance_id="vllm-0", endpoint="tcp://127.0.0.1:1", tenant_id="")
    assert client.register(cfg) == OK
    assert client.register(cfg) == OK  # identical duplicate succeeds

    services = client.list_services()
    assert services["ret"] == OK and services["count"] == 1
    svc = services["services"][0]
    assert svc["InstanceID"] == "vllm-0" and svc["TenantID"] == "default" and svc["Type"] == "vLLM"
    assert svc["HashProfile"]["root_digest"] == g.ROOT_VLLM_CBOR_SEED0
    assert svc["CacheGroup"] is None

    view = client.get_global_view()
    assert view["ret"] == OK and view["context_count"] == 1
    ctx = view["contexts"][0]
    assert (ctx["model_name"], ctx["tenant_id"], ctx["block_size"]) == ("m", "default", 16)
    assert ctx["instances"] == {"vllm-0": {0}}

    result = client.query("m", block_size=16, token_ids=list(range(32)))
    assert result["ret"] == OK
    hit = result["hits"]["vllm-0"]
    assert hit["longest_matched"] == hit["disk"] == 0
    assert hit["device"] == hit["cpu_local"] == hit["cpu_share"] == 0

    assert client.unregister("vllm-0", "", 0) == OK
    assert client.unregister("vllm-0") == SERVICE_NOT_FOUND
    assert client.list_services()["count"] == 0


def test_quick_start(conductor, publisher_factory):
    """The contract's Quick Start, verbatim apart from the ports, then its register() example."""
    pub = publisher_factory()
    with ConductorClient() as client:
        rc = client.setup(conductor.rpc_addr)
        assert rc == OK

        result = client.query("my-model", block_size=16, token_ids=list(range(32)))
        assert result["ret"] == OK
        assert result["hits"] == {}  # {} while no engine instances are registered

        rc = client.register(vllm_config("vllm-0", pub.endpoint))
        assert rc == OK
        # Registration starts event consumption; it does not itself add cached blocks.
        result = client.query("my-model", block_size=16, token_ids=list(range(32)))
        assert result["ret"] == OK
        assert set(result["hits"]) == {"vllm-0"}
        assert result["hits"]["vllm-0"]["longest_matched"] == 0
    # Leaving the with block closed the client but did not unregister anything.
    assert client.health_check() == HEALTH_NOT_INITIALIZED
    assert client.query("my-model", block_size=16, token_ids=[1])["ret"] == CONDUCTOR_UNAVAILABLE
    with ConductorClient() as other:
        assert other.setup(conductor.rpc_addr) == OK
        assert other.list_services()["count"] == 1


def test_vllm_publisher_events_become_hits(client, publisher_factory):
    pub = publisher_factory()
    assert client.register(vllm_config("vllm-0", pub.endpoint)) == OK
    pub.wait_subscribed()
    pub.publish([block_stored(CBOR_BS16_PLAIN, PROMPT[:32])])

    def query():
        return client.query("my-model", block_size=16, token_ids=PROMPT)

    result = wait_for(query, lambda r: r["hits"].get("vllm-0", {}).get("device") == 32, what="2 blocks indexed")
    assert result == {"ret": OK, "hits": {"vllm-0": g.hit(32, 32, 32, 32, {"0": (32, 32, 32, 32)})}}
    # Only complete blocks count: 31 tokens cover one block; a different prefix misses.
    assert client.query("my-model", block_size=16, token_ids=PROMPT[:31])["hits"]["vllm-0"]["device"] == 16
    miss = client.query("my-model", block_size=16, token_ids=[7] + PROMPT[1:])["hits"]["vllm-0"]
    assert miss["device"] == miss["longest_matched"] == 0 and miss["dp"] == {"0": 0}
    # Filters and identity dimensions.
    assert set(client.query("my-model", block_size=16, token_ids=PROMPT, instance_filter="vllm-0")["hits"]) == {"vllm-0"}
    assert client.query("my-model", block_size=16, token_ids=PROMPT, instance_filter="other") == {"ret": OK, "hits": {}}
    assert client.query("my-model", block_size=16, token_ids=PROMPT, tenant_id="")["hits"]["vllm-0"]["device"] == 32
    assert client.query("my-model", block_size=16, token_ids=PROMPT, tenant_id="t2") == {"ret": OK, "hits": {}}
    assert client.query("my-model", block_size=32, token_ids=PROMPT) == {"ret": OK, "hits": {}}
    assert client.query("my-model", lora_name="lora-a", block_size=16, token_ids=PROMPT) == {"ret": OK, "hits": {}}
    salted = client.query("my-model", block_size=16, token_ids=PROMPT, cache_salt="s1")["hits"]["vllm-0"]
    assert salted["device"] == 0  # the salt changes every block hash

    services = client.list_services()
    assert services == {
        "ret": OK,
        "count": 1,
        "services": [
            {
                "Endpoint": pub.endpoint,
                "ReplayEndpoint": "",
                "Type": "vLLM",
                "ModelName": "my-model",
                "LoraName": "",
                "TenantID": "default",
                "InstanceID": "vllm-0",
                "BlockSize": 16,
                "DPRank": 0,
                "CacheGroup": None,
                "HashProfile": dict(VLLM_PROFILE, root_digest=g.ROOT_VLLM_CBOR_SEED0),
                # This conductor's (ListServiceDetails): the media indexed, and the
                # self-check of the engine's hashes against the registered profile.
                "IndexMedia": ["GPU"],
                "HashCheck": "ok",
            }
        ],
    }
    view = client.get_global_view()
    assert view == {
        "ret": OK,
        "context_count": 1,
        "contexts": [
            {
                "model_name": "my-model",
                "lora_name": "",
                "block_size": 16,
                "tenant_id": "default",
                "prefix_count": 2,
                "hash_profile": dict(VLLM_PROFILE, root_digest=g.ROOT_VLLM_CBOR_SEED0),
                "instances": {"vllm-0": {0}},
            }
        ],
    }
    assert isinstance(view["contexts"][0]["instances"]["vllm-0"], set)

    # BlockRemoved of the second block cuts the prefix to one block.
    pub.publish([block_removed(CBOR_BS16_PLAIN[1:])])
    wait_for(query, lambda r: r["hits"]["vllm-0"]["device"] == 16, what="block 1 removed")

    assert client.unregister("vllm-0") == OK
    assert query() == {"ret": OK, "hits": {}}
    assert client.list_services() == {"ret": OK, "count": 0, "services": []}
    ctx = client.get_global_view()["contexts"][0]
    assert ctx["instances"] == {} and ctx["prefix_count"] == 0
    assert client.unregister("vllm-0") == SERVICE_NOT_FOUND


def test_data_parallel_ranks(client, publisher_factory):
    """Two DP ranks of one instance: per-rank figures keyed by decimal strings, instance
    figures the maximum over ranks; unregistering one rank keeps the other. A batch whose
    dp_rank contradicts its registration marks that source stale: its entries are
    retracted until it is registered again (upstream's rule)."""
    pubs = [publisher_factory(), publisher_factory()]
    for rank, pub in enumerate(pubs):
        assert client.register(vllm_config("vllm-0", pub.endpoint, dp_rank=rank)) == OK
        pub.wait_subscribed()
    pubs[0].publish([block_stored(CBOR_BS16_PLAIN[:1], PROMPT[:16])], dp_rank=0)
    pubs[1].publish([block_stored(CBOR_BS16_PLAIN, PROMPT[:32])], dp_rank=1)

    def query():
        return client.query("my-model", block_size=16, token_ids=PROMPT)

    def dp():
        return query()["hits"]["vllm-0"]["dp"]

    hit = wait_for(
        query, lambda r: r["hits"].get("vllm-0", {}).get("dp") == {"0": 16, "1": 32}, what="both ranks"
    )["hits"]["vllm-0"]
    assert hit == g.hit(32, 32, 32, 32, {"0": (16, 16, 16, 16), "1": (32, 32, 32, 32)})
    assert client.get_global_view()["contexts"][0]["instances"] == {"vllm-0": {0, 1}}
    assert [s["DPRank"] for s in client.list_services()["services"]] == [0, 1]

    assert client.unregister("vllm-0", dp_rank=1) == OK
    assert dp() == {"0": 16}
    assert query()["hits"]["vllm-0"]["device"] == 16
    assert client.get_global_view()["contexts"][0]["instances"] == {"vllm-0": {0}}

    pubs[0].publish([block_stored(CBOR_BS16_PLAIN, PROMPT[:32])], dp_rank=1)
    wait_for(dp, lambda d: d == {"0": 0}, what="stale rank 0 retracted")
    assert client.list_services()["count"] == 1  # still registered, but stale

    # Registering again starts a fresh subscription that indexes new events.
    assert client.unregister("vllm-0") == OK
    assert client.register(vllm_config("vllm-0", pubs[0].endpoint)) == OK
    pubs[0].wait_subscribed()
    pubs[0].publish([block_stored(CBOR_BS16_PLAIN, PROMPT[:32])], dp_rank=0)
    wait_for(dp, lambda d: d == {"0": 32}, what="re-registered rank 0 indexed")


# ---- every error code ---------------------------------------------------------------------


def test_code_ok_everywhere(client, publisher_factory):
    pub = publisher_factory()
    assert client.health_check() == HEALTH_OK
    assert client.register(vllm_config("i", pub.endpoint)) == OK
    assert client.query("my-model", block_size=16, token_ids=PROMPT)["ret"] == OK
    assert client.list_services()["ret"] == OK
    assert client.get_global_view()["ret"] == OK
    assert client.unregister("i") == OK
    assert client.close() == OK


@pytest.mark.parametrize(
    "changes",
    [
        {"model_name": ""},
        {"endpoint": ""},
        {"instance_id": ""},
        {"block_size": 0},
        {"block_size": -16},
        {"dp_rank": -1},
        {"cache_group": 1},
        {"hash_profile": dict(VLLM_PROFILE, strategy="nope")},
        {"hash_profile": dict(VLLM_PROFILE, algorithm="sha256_raw")},
        {"hash_profile": dict(VLLM_PROFILE, index_projection="first64_be")},
        {"hash_profile": dict(VLLM_PROFILE, python_hash_seed="4294967296")},
        {"hash_profile": dict(VLLM_PROFILE, python_hash_seed="")},
        {"hash_profile": {"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "low64_be"}},
        {"hash_profile": {}},
    ],
    ids=lambda c: ",".join("%s=%r" % kv for kv in c.items()),
)
def test_code_invalid_params_from_server_register(client, changes):
    cfg = vllm_config("i", "tcp://127.0.0.1:1")
    cfg.update(changes)
    assert client.register(cfg) == INVALID_PARAMS
    assert client.list_services()["count"] == 0


def test_code_invalid_params_from_server_conflicts(client, publisher_factory):
    a, b = publisher_factory(), publisher_factory()
    assert client.register(vllm_config("i", a.endpoint)) == OK
    # Same service key, different configuration.
    assert client.register(vllm_config("i", a.endpoint, block_size=32)) == INVALID_PARAMS
    # Another service on an endpoint already in use.
    assert client.register(vllm_config("j", a.endpoint)) == INVALID_PARAMS
    # Same context, different hash profile.
    profile = dict(VLLM_PROFILE, algorithm="sha256")
    assert client.register(vllm_config("j", b.endpoint, hash_profile=profile)) == INVALID_PARAMS
    assert client.list_services()["count"] == 1


def test_code_invalid_params_from_server_query_and_unregister(client):
    assert client.query("", block_size=16, token_ids=PROMPT) == {"ret": INVALID_PARAMS, "hits": {}}
    assert client.query("m", block_size=0, token_ids=PROMPT) == {"ret": INVALID_PARAMS, "hits": {}}
    assert client.query("m", block_size=-1, token_ids=PROMPT) == {"ret": INVALID_PARAMS, "hits": {}}
    assert client.unregister("i", dp_rank=-1) == INVALID_PARAMS
    assert client.unregister("") == INVALID_PARAMS


def test_code_invalid_params_bad_address():
    with ConductorClient() as c:
        assert c.setup("127.0.0.1") == INVALID_PARAMS
        assert c.health_check() == HEALTH_NOT_INITIALIZED


def test_code_service_not_found(client):
    assert client.unregister("nobody") == SERVICE_NOT_FOUND
    assert client.unregister("nobody", "tenant-x", 3) == SERVICE_NOT_FOUND


def test_code_conductor_unavailable_before_setup_and_after_close(conductor):
    c = ConductorClient()
    for _ in range(2):  # before setup, then after close
        assert c.health_check() == HEALTH_NOT_INITIALIZED
        assert c.query("m", block_size=16, token_ids=[1]) == {"ret": CONDUCTOR_UNAVAILABLE, "hits": {}}
        assert c.register(vllm_config("i", "tcp://127.0.0.1:1")) == CONDUCTOR_UNAVAILABLE
        assert c.unregister("i") == CONDUCTOR_UNAVAILABLE
        assert c.get_global_view() == {"ret": CONDUCTOR_UNAVAILABLE, "context_count": 0, "contexts": []}
        assert c.list_services() == {"ret": CONDUCTOR_UNAVAILABLE, "count": 0, "services": []}
        assert c.setup(conductor.rpc_addr) == OK
        assert c.health_check() == HEALTH_OK
        assert c.close() == OK
    # The refused register never reached the server.
    with ConductorClient() as other:
        assert other.setup(conductor.rpc_addr) == OK
        assert other.list_services()["count"] == 0


def test_code_rpc_fail_dead_server(conductor):
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr) == OK
        assert c.health_check() == HEALTH_OK
        conductor.proc.terminate()
        conductor.proc.wait(timeout=10)
        assert c.query("m", block_size=16, token_ids=[1]) == {"ret": RPC_FAIL, "hits": {}}
        assert c.register(vllm_config("i", "tcp://127.0.0.1:1")) == RPC_FAIL
        assert c.unregister("i") == RPC_FAIL
        assert c.get_global_view()["ret"] == RPC_FAIL
        assert c.list_services()["ret"] == RPC_FAIL
        assert c.health_check() == HEALTH_UNREACHABLE
        # A fresh setup cannot connect either.
        assert c.setup(conductor.rpc_addr) == RPC_FAIL
        assert c.health_check() == HEALTH_NOT_INITIALIZED


def _all_threads_stopped(pid):
    """True once every thread of pid is in state T (stopped) per /proc."""
    task = "/proc/%d/task" % pid
    for tid in os.listdir(task):
        try:
            with open("%s/%s/stat" % (task, tid)) as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # the thread exited
        # The state follows the parenthesised command name, which may hold spaces.
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True


def test_code_rpc_timeout_stopped_server(conductor):
    """SIGSTOP the binary: the kernel still accepts and buffers, nothing answers."""
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr, request_timeout_ms=300) == OK
        os.kill(conductor.proc.pid, signal.SIGSTOP)
        try:
            # SIGSTOP is delivered asynchronously: until every thread shows as stopped,
            # one may still answer the query.
            wait_for(lambda: _all_threads_stopped(conductor.proc.pid), lambda ok: ok, what="SIGSTOP")
            started = time.monotonic()
            assert c.query("m", block_size=16, token_ids=[1]) == {"ret": RPC_TIMEOUT, "hits": {}}
            elapsed = time.monotonic() - started
            assert 0.25 <= elapsed < 3, elapsed
            assert c.unregister("i") == RPC_TIMEOUT
            assert c.health_check() == HEALTH_UNREACHABLE
        finally:
            os.kill(conductor.proc.pid, signal.SIGCONT)
        # The client reconnects on its own once the server answers again.
        assert wait_for(c.health_check, lambda h: h == HEALTH_OK, what="recovery") == HEALTH_OK
        assert c.query("m", block_size=16, token_ids=[1]) == {"ret": OK, "hits": {}}


def test_code_rpc_timeout_silent_socket():
    """A listener that accepts and never answers."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        with ConductorClient() as c:
            assert c.setup("127.0.0.1:%d" % srv.getsockname()[1], request_timeout_ms=200) == OK
            assert c.list_services() == {"ret": RPC_TIMEOUT, "count": 0, "services": []}
            assert c.get_global_view() == {"ret": RPC_TIMEOUT, "context_count": 0, "contexts": []}


@pytest.mark.parametrize("endpoint", ["not-a-valid-endpoint", "tcp://127.0.0.1:notaport", "tcp://*:5557",
                                      "tcp://127.0.0.1:5557/x", "tcp://127.0.0.1:70000", "tcp:/127.0.0.1:5557"])
def test_code_invalid_params_malformed_endpoint(client, endpoint):
    """An endpoint that names no publisher (no tcp://host:port or ipc://path, a wildcard
    host, something after the port, a port outside 1..65535) is a client error, refused
    before any socket is opened, and nothing is left registered."""
    assert client.register(vllm_config("i", endpoint)) == INVALID_PARAMS
    assert client.list_services()["count"] == 0
    assert client.get_global_view()["context_count"] == 0


def test_code_internal_error_unsubscribable_endpoint(client):
    """A well-formed endpoint that libzmq cannot connect (an ipc path longer than a socket
    address holds). Upstream maps a subscribe error that starts with "failed to start ZMQ
    client" to INTERNAL_ERROR, not INVALID_PARAMS, and nothing is left registered."""
    assert client.register(vllm_config("i", "ipc:///tmp/" + "x" * 200)) == INTERNAL_ERROR
    assert client.list_services()["count"] == 0
    assert client.get_global_view()["context_count"] == 0


def test_unresolvable_ip_literal_registers(client):
    """tcp://256.0.0.1:1 is syntactically a TCP endpoint; libzmq resolves and connects in
    the background, so subscribing succeeds (as upstream, whose client is also libzmq)."""
    assert client.register(vllm_config("i", "tcp://256.0.0.1:1")) == OK
    assert client.list_services()["services"][0]["Endpoint"] == "tcp://256.0.0.1:1"
    assert client.unregister("i") == OK
