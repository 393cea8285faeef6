"""ConductorClient over real sockets against in-test fake servers."""

import socket
import threading
import time

import pytest

import goldens as g
from fake_server import SILENT, Reply
from mooncake import _conductor_wire as w
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

# request body -> reply body, for every golden request
GOLDEN_REPLIES = {
    (w.FUNC_QUERY, g.QUERY_ARGS): g.QUERY_RESP_ONE,
    (w.FUNC_QUERY, g.QUERY_ARGS_SALT_FILTER): g.QUERY_RESP_EMPTY,
    (w.FUNC_QUERY, g.QUERY_ARGS_300): w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_300_VALUE),
    (w.FUNC_QUERY, g.QUERY_ARGS_LONG_MODEL): g.QUERY_RESP_INVALID,
    (w.FUNC_REGISTER, g.REGISTER_ARGS): g.REGISTER_RESP_OK,
    (w.FUNC_UNREGISTER, g.UNREGISTER_ARGS): g.UNREGISTER_RESP_OK,
    (w.FUNC_UNREGISTER, w.encode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, ("gone", "default", 0))): g.UNREGISTER_RESP_NOT_FOUND,
    (w.FUNC_GET_GLOBAL_VIEW, b""): g.GLOBAL_VIEW_ONE,
    (w.FUNC_LIST_SERVICES, b""): g.LIST_SERVICES_SGLANG,
}


# What an upstream conductor answers a function it does not have (this conductor's
# ListServiceDetails): coro_rpc's framework error "function not registered".
NOT_REGISTERED = Reply(w.encode(w.STR, 0x9DCFFA76, "the function is not registered"), err_code=w.ERRC_FUNCTION_NOT_REGISTERED)


def golden_handler(req):
    if req.func_id == w.FUNC_QUERY and g.QUERY_ARGS_70000.matches(req.body):
        return g.QUERY_RESP_EMPTY
    if req.func_id == w.FUNC_LIST_SERVICE_DETAILS:
        return NOT_REGISTERED
    try:
        return GOLDEN_REPLIES[(req.func_id, req.body)]
    except KeyError:
        raise AssertionError("no golden for function 0x%08x body %s" % (req.func_id, req.body.hex())) from None


@pytest.fixture
def golden_server(fake_server):
    return fake_server(golden_handler)


@pytest.fixture
def client():
    c = ConductorClient()
    yield c
    c.close()


def dead_port():
    """A port on which nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_unavailable(c):
    assert c.health_check() == HEALTH_NOT_INITIALIZED
    assert c.query("m", block_size=16, token_ids=[1]) == {"ret": CONDUCTOR_UNAVAILABLE, "hits": {}}
    assert c.register(g.REGISTER_CONFIG) == CONDUCTOR_UNAVAILABLE
    assert c.unregister("e") == CONDUCTOR_UNAVAILABLE
    assert c.get_global_view() == {"ret": CONDUCTOR_UNAVAILABLE, "context_count": 0, "contexts": []}
    assert c.list_services() == {"ret": CONDUCTOR_UNAVAILABLE, "count": 0, "services": []}


def test_constants():
    assert (OK, INTERNAL_ERROR, INVALID_PARAMS, RPC_FAIL, RPC_TIMEOUT, CONDUCTOR_UNAVAILABLE, SERVICE_NOT_FOUND) == (
        0, -1, -600, -900, -901, -2000, -2001,
    )
    assert (HEALTH_OK, HEALTH_NOT_INITIALIZED, HEALTH_UNREACHABLE) == (0, 1, 2)


def test_before_setup_and_after_close(golden_server, client):
    assert_unavailable(client)
    assert client.setup(golden_server.address) == OK
    assert client.health_check() == HEALTH_OK
    assert client.close() == OK
    assert client.close() == OK  # repeated close is safe
    assert_unavailable(client)
    assert golden_server.wait_closed(1)
    # only the health probe reached the server
    assert [r.func_id for r in golden_server.requests] == [w.FUNC_LIST_SERVICES]
    # setup again after close reconnects
    assert client.setup(golden_server.address) == OK
    assert client.health_check() == HEALTH_OK


def test_golden_round_trips(golden_server, client):
    assert client.setup(golden_server.address) == OK
    assert client.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": g.QUERY_RESP_ONE_HITS}
    assert client.query("m", block_size=16, token_ids=[1, 2, 3], cache_salt="s", instance_filter="e") == {"ret": OK, "hits": {}}
    assert client.query("x" * 300, block_size=16, token_ids=[7]) == {"ret": INVALID_PARAMS, "hits": {}}
    big = client.query("m", block_size=16, token_ids=list(range(1, 301)))
    assert big["ret"] == OK and len(big["hits"]) == 300
    assert big["hits"]["i123"] == g.hit(16, 16, 16, 16, {"0": (16, 16, 16, 16)})
    # 70000 tokens: 4-byte lengths (metainfo 0x10), 280039-byte body checked by digest
    assert client.query("m", block_size=16, token_ids=range(-35000, 35000)) == {"ret": OK, "hits": {}}
    assert client.register(g.REGISTER_CONFIG) == OK
    assert client.unregister("e") == OK
    assert client.unregister("gone", "default", 0) == SERVICE_NOT_FOUND
    assert client.get_global_view() == {
        "ret": OK,
        "context_count": 1,
        "contexts": [
            {
                "model_name": "m",
                "lora_name": "",
                "block_size": 16,
                "tenant_id": "default",
                "prefix_count": 42,
                "hash_profile": {
                    "strategy": "vllm_v1",
                    "algorithm": "sha256_cbor",
                    "python_hash_seed": "0",
                    "root_digest": g.ROOT_VLLM_CBOR_SEED0,
                    "index_projection": "low64_be",
                },
                "instances": {"e": {0, 1}},
            }
        ],
    }
    assert client.list_services() == {
        "ret": OK,
        "count": 1,
        "services": [
            {
                "Endpoint": "tcp://127.0.0.1:5557",
                "ReplayEndpoint": "tcp://127.0.0.1:5558",
                "Type": "SGLang",
                "ModelName": "m",
                "LoraName": "",
                "TenantID": "default",
                "InstanceID": "e",
                "BlockSize": 16,
                "DPRank": 1,
                "CacheGroup": 0,
                "HashProfile": {
                    "strategy": "sglang",
                    "algorithm": "sha256_raw",
                    "python_hash_seed": "0",
                    "root_digest": "0" * 64,
                    "index_projection": "first64_be",
                },
            }
        ],
    }
    reqs = golden_server.requests
    # one connection, seq numbers strictly increasing, every frame well formed
    assert {r.conn_id for r in reqs} == {1}
    assert [r.seq for r in reqs] == sorted({r.seq for r in reqs})
    assert all(r.length == len(r.body) for r in reqs)


def test_query_hits_shape_for_many_ranks(fake_server, client):
    hit = (64, {0: 32, 1: 64}, {1: (64, 64, 64, 64), 0: (32, 48, 48, 64)}, 64, 64, 64, 64)
    reply = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, ({"a": hit},)))
    srv = fake_server(lambda req: reply)
    assert client.setup(srv.address) == OK
    hits = client.query("m", block_size=16, token_ids=list(range(64)))["hits"]
    assert hits["a"]["dp"] == {"0": 32, "1": 64}
    assert hits["a"]["rank_matches"]["0"] == {"device": 32, "cpu_local": 48, "cpu_share": 48, "disk": 64}
    assert list(hits["a"]) == ["longest_matched", "dp", "rank_matches", "device", "cpu_local", "cpu_share", "disk"]


def test_business_errors_pass_through(fake_server, client):
    replies = {
        w.FUNC_QUERY: w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (False, CONDUCTOR_UNAVAILABLE)),
        w.FUNC_REGISTER: w.encode(w.REGISTER_RESPONSE, w.TC_REGISTER_RESPONSE, (False, INTERNAL_ERROR)),
        w.FUNC_UNREGISTER: w.encode(w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, (False, INTERNAL_ERROR)),
    }
    srv = fake_server(lambda req: replies[req.func_id])
    assert client.setup(srv.address) == OK
    assert client.query("m", block_size=16, token_ids=[]) == {"ret": CONDUCTOR_UNAVAILABLE, "hits": {}}
    assert client.register(g.REGISTER_CONFIG) == INTERNAL_ERROR
    assert client.unregister("e") == INTERNAL_ERROR


def test_context_manager(golden_server):
    with ConductorClient() as c:
        assert isinstance(c, ConductorClient)
        assert c.health_check() == HEALTH_NOT_INITIALIZED  # entering does not set up
        assert c.setup(golden_server.address) == OK
        assert c.health_check() == HEALTH_OK
    assert_unavailable(c)
    assert golden_server.wait_closed(1)

    with pytest.raises(RuntimeError, match="boom"):
        with ConductorClient() as c2:
            assert c2.setup(golden_server.address) == OK
            raise RuntimeError("boom")
    assert c2.health_check() == HEALTH_NOT_INITIALIZED
    assert golden_server.wait_closed(2)


@pytest.mark.parametrize("addr", ["127.0.0.1", "", "localhost", "127.0.0.1:", "127.0.0.1:abc", "127.0.0.1:70000", ":5000", "[]:5000"])
def test_bad_address(golden_server, client, addr):
    assert client.setup(golden_server.address) == OK
    assert client.setup(addr) == INVALID_PARAMS
    assert_unavailable(client)  # a failed setup leaves the client uninitialised


def test_connection_refused(golden_server, client):
    assert client.setup(golden_server.address) == OK
    assert client.setup("127.0.0.1:%d" % dead_port(), connect_timeout_ms=500) == RPC_FAIL
    assert client.health_check() == HEALTH_NOT_INITIALIZED
    assert_unavailable(client)
    # a failed setup can be retried
    assert client.setup(golden_server.address) == OK
    assert client.health_check() == HEALTH_OK


def test_setup_replaces_previous_connection(golden_server, fake_server, client):
    other = fake_server(golden_handler)
    assert client.setup(golden_server.address) == OK
    assert client.setup(other.address) == OK
    assert golden_server.wait_closed(1)
    assert client.health_check() == HEALTH_OK
    assert len(other.requests) == 1 and golden_server.requests == []


def test_setup_rejects_non_positive_timeouts(golden_server, client):
    assert client.setup(golden_server.address, connect_timeout_ms=0) == INVALID_PARAMS
    assert client.setup(golden_server.address, request_timeout_ms=-1) == INVALID_PARAMS
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_hostname_and_ipv6_addresses(golden_server, fake_server, client):
    # names resolve; every resolved address is tried, so ::1 first still reaches 127.0.0.1
    assert client.setup("localhost:%d" % golden_server.port) == OK
    assert client.health_check() == HEALTH_OK
    try:
        v6 = fake_server(golden_handler, host="::1", family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback")
    assert client.setup(v6.address) == OK
    assert v6.address.startswith("[::1]:")
    assert client.health_check() == HEALTH_OK


def test_request_timeout_drops_connection_and_recovers(fake_server, client):
    state = {"silent": True}

    def handler(req):
        return SILENT if state["silent"] else golden_handler(req)

    srv = fake_server(handler)
    assert client.setup(srv.address, request_timeout_ms=300) == OK
    start = time.monotonic()
    assert client.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": RPC_TIMEOUT, "hits": {}}
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 2.5  # generous: the test machine is shared
    # the timed-out connection is closed so a late reply cannot be mistaken for the next one
    assert srv.wait_closed(1)
    assert client.health_check() == HEALTH_UNREACHABLE  # still set up, probe times out
    state["silent"] = False
    assert client.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": g.QUERY_RESP_ONE_HITS}
    assert srv.accepted == 3  # setup, reconnect after the first timeout, reconnect after the probe


def test_each_call_times_out_separately(fake_server, client):
    srv = fake_server(lambda req: SILENT)
    assert client.setup(srv.address, request_timeout_ms=150) == OK
    for call in (
        lambda: client.register(g.REGISTER_CONFIG),
        lambda: client.unregister("e"),
        lambda: client.get_global_view()["ret"],
        lambda: client.list_services()["ret"],
    ):
        start = time.monotonic()
        assert call() == RPC_TIMEOUT
        assert 0.15 <= time.monotonic() - start < 2.0


def test_server_gone_after_setup(fake_server, client):
    srv = fake_server(golden_handler)
    assert client.setup(srv.address) == OK
    srv.stop()
    assert client.query("m", block_size=16, token_ids=[1, 2, 3])["ret"] == RPC_FAIL
    assert client.health_check() == HEALTH_UNREACHABLE  # reconnect refused
    assert client.register(g.REGISTER_CONFIG) == RPC_FAIL


def test_server_closes_mid_reply(fake_server, client):
    def handler(req):
        raise ConnectionAbortedError("drop")  # server thread ends and closes the socket

    srv = fake_server(handler)
    assert client.setup(srv.address) == OK
    assert client.list_services() == {"ret": RPC_FAIL, "count": 0, "services": []}
    srv.errors.clear()


def test_framework_error_keeps_connection(fake_server, client):
    # err_code != 0 (e.g. "function not found"): body is a struct_pack string
    def handler(req):
        if req.func_id == w.FUNC_GET_GLOBAL_VIEW:
            return Reply(b"\x00\x00\x00\x00\x09not found", err_code=4)
        return golden_handler(req)

    srv = fake_server(handler)
    assert client.setup(srv.address) == OK
    assert client.get_global_view() == {"ret": RPC_FAIL, "context_count": 0, "contexts": []}
    assert client.health_check() == HEALTH_OK
    assert srv.accepted == 1


@pytest.mark.parametrize(
    "reply",
    [
        Reply(g.LIST_SERVICES_EMPTY, seq=0xDEAD),  # seq mismatch: stream out of step
        Reply(g.LIST_SERVICES_EMPTY, magic=20),  # not a coro_rpc response
    ],
    ids=["seq", "magic"],
)
def test_desynchronised_reply_drops_connection(fake_server, client, reply):
    calls = []

    def handler(req):
        calls.append(req)
        return reply if len(calls) == 1 else golden_handler(req)

    srv = fake_server(handler)
    assert client.setup(srv.address) == OK
    assert client.list_services()["ret"] == RPC_FAIL
    assert srv.wait_closed(1)
    assert client.list_services()["ret"] == OK
    assert srv.accepted == 2


@pytest.mark.parametrize(
    "body",
    [g.REGISTER_RESP_OK, g.LIST_SERVICES_EMPTY + b"\x00", g.LIST_SERVICES_SGLANG[:-3], b""],
    ids=["wrong-type", "trailing", "truncated", "empty"],
)
def test_undecodable_reply_is_rpc_fail(fake_server, client, body):
    srv = fake_server(lambda req: body)
    assert client.setup(srv.address) == OK
    assert client.list_services() == {"ret": RPC_FAIL, "count": 0, "services": []}
    assert client.health_check() == HEALTH_UNREACHABLE


def test_concurrent_use_from_threads(golden_server, client):
    assert client.setup(golden_server.address) == OK
    expected_gv = client.get_global_view()
    failures = []
    calls = [
        (lambda: client.query("m", block_size=16, token_ids=[1, 2, 3]), {"ret": OK, "hits": g.QUERY_RESP_ONE_HITS}),
        (lambda: client.query("m", block_size=16, token_ids=[1, 2, 3], cache_salt="s", instance_filter="e"), {"ret": OK, "hits": {}}),
        (lambda: client.register(g.REGISTER_CONFIG), OK),
        (lambda: client.unregister("gone"), SERVICE_NOT_FOUND),
        (lambda: client.get_global_view(), expected_gv),
        (lambda: client.health_check(), HEALTH_OK),
    ]

    def worker(offset):
        for i in range(60):
            call, want = calls[(offset + i) % len(calls)]
            got = call()
            if got != want:
                failures.append((offset, i, got))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures[:3]
    reqs = golden_server.requests
    assert len(reqs) == 1 + 8 * 60
    assert len({r.seq for r in reqs}) == len(reqs)  # no seq reused
    assert {r.conn_id for r in reqs} == {1}


def test_close_from_another_thread_during_use(golden_server, client):
    assert client.setup(golden_server.address) == OK
    stop = threading.Event()
    seen = set()

    def worker():
        while not stop.is_set():
            seen.add(client.query("m", block_size=16, token_ids=[1, 2, 3])["ret"])

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.1)
    client.close()
    time.sleep(0.05)
    stop.set()
    t.join(timeout=10)
    assert seen <= {OK, CONDUCTOR_UNAVAILABLE} and CONDUCTOR_UNAVAILABLE in seen


def test_query_fields_cache_same_bytes_and_same_rejections(fake_server, client):
    # The client keeps each context's encoded fields; a repeated context (any token
    # count, across the 1/2/4-byte length widths) sends what the generic encoder does,
    # and values equal to a cached one but of another type are still rejected.
    server = fake_server(lambda req: g.QUERY_RESP_EMPTY)
    assert client.setup(server.address) == OK
    sent = []
    for n in (3, 255, 256, 3, 65536, 2):
        for lora, salt, filt, tenant in (("", "", "", "default"), ("l", "s", "i", ""), ("", "", "", "t" * 300)):
            toks = list(range(n))
            assert client.query("m", lora_name=lora, block_size=16, tenant_id=tenant, token_ids=toks,
                                cache_salt=salt, instance_filter=filt) == {"ret": OK, "hits": {}}
            sent.append(w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST,
                                 ((tenant or "default", "m", lora, 16), toks, salt or None, filt or None)))
    assert [r.body for r in server.requests] == sent
    for bad in (16.0, True):
        with pytest.raises(ValueError):
            client.query("m", block_size=bad, token_ids=[1])
    assert client.query("m", block_size=1, token_ids=[1])["ret"] == OK
    with pytest.raises(ValueError):
        client.query("m", block_size=True, token_ids=[1])

    class Name(str):
        pass

    with pytest.raises(ValueError):
        client.query("m", block_size=16, token_ids=[True])
    assert client.query(Name("m"), block_size=16, token_ids=[1])["ret"] == OK
    assert server.requests[-1].body == w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (("default", "m", "", 16), [1], None, None))
    assert len(server.requests) == len(sent) + 2
