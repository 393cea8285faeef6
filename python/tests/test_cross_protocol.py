"""HTTP and RPC agree: the same questions asked over the msgpack HTTP API (urllib +
msgpack) and over RPC (ConductorClient) get the same answers from the real binary.

The index is fed by real ZMQ publishers of every kind (vLLM on two DP ranks, SGLang with
three tiers, a Mooncake store for the shared tiers), registered half through each
protocol, so every tier figure, dp and rank_matches entry is compared. Hashes come from
hash_vectors.json (tokens 1..40); the constants are checked against the file
(testdata/vectors/).
"""

import json
import struct
import time
import urllib.error
import urllib.request

import msgpack
import pytest

from goldens import hit
from mooncake.conductor import INVALID_PARAMS, OK, SERVICE_NOT_FOUND, ConductorClient
from test_e2e import (  # noqa: F401  (zmq_ctx and publisher_factory are fixtures)
    CBOR_BS16_PLAIN,
    PROMPT,
    VECTORS,
    VLLM_PROFILE,
    block_stored,
    publisher_factory,
    wait_for,
    zmq_ctx,
)

# hash_vectors.json, vllm_v1 sha256_cbor: event_u64 of each block.
CBOR_BS16_SALT_S1 = [2098375440168515790, 13351230569374862786]
CBOR_BS16_LORA_A = [16148250904256190698, 11656050330326652032]
CBOR_BS4_PLAIN = [
    2164874634404590027, 17270480062156288726, 15775340307203827378, 4125428783492965790, 10960384027115658377,
    16320826738025969069, 8213842893286919025, 231109371203407685, 2721430728205400662, 15668721889557495406,
]
# hash_vectors.json, sglang page_size 16, unsalted: event_i64 of pages [0,16), [16,32), [32,40).
SGLANG_P16 = [8635429971592222890, 1256577331724852459, -1561588908352928808]

SGLANG_PROFILE = {"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"}
MC_TS = 1757500000250  # Mooncake batch timestamp (ms); every event repeats it

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def http(conductor, method, path, body=None):
    """One msgpack HTTP call: (status, decoded body)."""
    data = None if body is None else msgpack.packb(body, use_bin_type=True)
    req = urllib.request.Request(conductor.http_url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/msgpack")
    try:
        with _OPENER.open(req, timeout=10) as resp:
            assert "application/msgpack" in resp.headers.get("Content-Type", "")
            return resp.status, msgpack.unpackb(resp.read(), raw=False)
    except urllib.error.HTTPError as err:
        return err.code, msgpack.unpackb(err.read(), raw=False)


def sglang_stored(page_hash, page_len, medium):
    return {
        "type": "BlockStored",
        "block_hashes": [page_hash],
        "parent_block_hash": None,
        "token_ids": None,
        "block_size": page_len,
        "lora_id": None,
        "medium": medium,
    }


def mooncake_stored(block_hash, medium, object_key):
    """A Mooncake master "stored" event for context (default, m, "", 16), identified by
    its connector block hash."""
    return {
        "event_id": 1,
        "timestamp": MC_TS,
        "event_type": "stored",
        "model_name": "m",
        "block_size": 16,
        "additional_salt": None,
        "lora_name": None,
        "tenant_id": "default",
        "backend_id": "pool-a",
        "medium": medium,
        "dp_rank": 0,
        "group_id": None,
        "seq_hashes": [],
        "base_block_idx": None,
        "object_key": object_key,
        "connector_block_hash": "%016x" % block_hash,
        "parent_hash": None,
        "token_ids": None,
    }


def http_register(conductor, **fields):
    body = {"type": "vLLM", "modelname": "m", "block_size": 16, "dp_rank": 0, "hash_profile": dict(VLLM_PROFILE)}
    body.update(fields)
    status, resp = http(conductor, "POST", "/register", body)
    assert status == 200, resp


def rpc_register(client, **fields):
    cfg = {"publisher_type": "vLLM", "model_name": "m", "block_size": 16, "hash_profile": dict(VLLM_PROFILE)}
    cfg.update(fields)
    assert client.register(cfg) == OK


def zeros(*ranks):
    return hit(0, 0, 0, 0, {r: (0, 0, 0, 0) for r in ranks})


FULL = {
    # rank 0 holds both blocks on the GPU; rank 1 only block 0; the Mooncake store has
    # block 0 in CPU and block 1 on disk, shared by every instance of the context.
    "a": hit(32, 32, 32, 32, {"0": (32, 32, 32, 32), "1": (16, 16, 16, 32)}),
    "b": hit(16, 16, 16, 32, {"0": (16, 16, 16, 32)}),
}

# (name, query keyword arguments, expected hits or None to compare only)
QUERIES = [
    ("full hit", dict(model_name="m", block_size=16, token_ids=PROMPT), FULL),
    (
        "partial: one block of 20 tokens",
        dict(model_name="m", block_size=16, token_ids=PROMPT[:20]),
        {
            "a": hit(16, 16, 16, 16, {"0": (16, 16, 16, 16), "1": (16, 16, 16, 16)}),
            "b": hit(16, 16, 16, 16, {"0": (16, 16, 16, 16)}),
        },
    ),
    ("miss", dict(model_name="m", block_size=16, token_ids=list(range(100, 140))), {"a": zeros("0", "1"), "b": zeros("0")}),
    ("no tokens", dict(model_name="m", block_size=16, token_ids=[]), {"a": zeros("0", "1"), "b": zeros("0")}),
    ("filter a", dict(model_name="m", block_size=16, token_ids=PROMPT, instance_filter="a"), {"a": FULL["a"]}),
    ("filter unknown", dict(model_name="m", block_size=16, token_ids=PROMPT, instance_filter="nobody"), {}),
    ("filter Mooncake registration", dict(model_name="m", block_size=16, token_ids=PROMPT, instance_filter="pool"), {}),
    (
        "salt s1",
        dict(model_name="m", block_size=16, token_ids=PROMPT, cache_salt="s1"),
        {"a": zeros("0", "1"), "b": hit(32, 32, 32, 32, {"0": (32, 32, 32, 32)})},
    ),
    ("salt and filter", dict(model_name="m", block_size=16, token_ids=PROMPT, cache_salt="s1", instance_filter="b"), None),
    (
        "lora context",
        dict(model_name="m", lora_name="lora-a", block_size=16, token_ids=PROMPT),
        {"e": hit(32, 32, 32, 32, {"0": (32, 32, 32, 32)})},
    ),
    (
        "block size 4 context",
        dict(model_name="m", block_size=4, token_ids=PROMPT),
        {"d": hit(24, 24, 24, 24, {"0": (24, 24, 24, 24)})},
    ),
    (
        "SGLang tiers with a partial last page",
        dict(model_name="s", block_size=16, token_ids=PROMPT),
        {"c": hit(16, 32, 32, 40, {"0": (16, 32, 32, 40)})},
    ),
    ("SGLang other partial page", dict(model_name="s", block_size=16, token_ids=PROMPT[:36]), None),
    (
        "tenant t2",
        dict(model_name="m", tenant_id="t2", block_size=16, token_ids=PROMPT),
        {"a": hit(16, 16, 16, 16, {"0": (16, 16, 16, 16)})},
    ),
    ("explicit default tenant", dict(model_name="m", tenant_id="default", block_size=16, token_ids=PROMPT), FULL),
    ("unknown model", dict(model_name="x", block_size=16, token_ids=PROMPT), {}),
]


def http_query_body(model_name, block_size, token_ids, lora_name="", tenant_id="", cache_salt="", instance_filter=""):
    """The /query body of the same question as client.query(...): empty optional strings left out."""
    optional = {"lora_name": lora_name, "tenant_id": tenant_id, "cache_salt": cache_salt, "instance_id": instance_filter}
    return dict({"model": model_name, "block_size": block_size, "token_ids": list(token_ids)},
                **{key: value for key, value in optional.items() if value})


@pytest.fixture
def indexed(conductor, publisher_factory):
    """A conductor holding the index described in the module docstring, and an RPC client."""
    client = ConductorClient()
    assert client.setup(conductor.rpc_addr) == OK
    pubs = {name: publisher_factory() for name in ("a0", "a1", "b0", "d0", "e0", "c0", "t2", "pool")}
    rpc_register(client, instance_id="a", endpoint=pubs["a0"].endpoint)
    http_register(conductor, instance_id="a", endpoint=pubs["a1"].endpoint, dp_rank=1)
    rpc_register(client, instance_id="b", endpoint=pubs["b0"].endpoint, tenant_id="", cache_group=0)
    rpc_register(client, instance_id="d", endpoint=pubs["d0"].endpoint, block_size=4)
    http_register(conductor, instance_id="e", endpoint=pubs["e0"].endpoint, lora_name="lora-a")
    rpc_register(client, instance_id="c", endpoint=pubs["c0"].endpoint, publisher_type="SGLang", model_name="s",
                 hash_profile=dict(SGLANG_PROFILE))
    http_register(conductor, instance_id="a", endpoint=pubs["t2"].endpoint, tenant_id="t2")
    # A Mooncake master has no replay: the endpoint is kept in the listing but never used
    # (an engine registration would first try to catch up through it).
    http_register(conductor, instance_id="pool", endpoint=pubs["pool"].endpoint, type="Mooncake",
                  replay_endpoint="tcp://127.0.0.1:9")
    for pub in pubs.values():
        pub.wait_subscribed()

    pubs["a0"].publish([block_stored(CBOR_BS16_PLAIN, PROMPT[:32])])
    pubs["a1"].publish([block_stored(CBOR_BS16_PLAIN[:1], PROMPT[:16])], dp_rank=1)
    pubs["b0"].publish([block_stored(CBOR_BS16_PLAIN[:1], PROMPT[:16]), block_stored(CBOR_BS16_SALT_S1, PROMPT[:32])])
    pubs["d0"].publish([block_stored(CBOR_BS4_PLAIN[:6], PROMPT[:24], block_size=4)])
    lora = block_stored(CBOR_BS16_LORA_A, PROMPT[:32])
    lora.update(lora_id=1, lora_name="lora-a")
    pubs["e0"].publish([lora])
    pubs["c0"].publish(
        [
            sglang_stored(SGLANG_P16[0], 16, "GPU"),
            sglang_stored(SGLANG_P16[0], 16, "CPU_PINNED"),
            sglang_stored(SGLANG_P16[1], 16, "CPU_PINNED"),
            sglang_stored(SGLANG_P16[0], 16, "DISK"),
            sglang_stored(SGLANG_P16[1], 16, "DISK"),
            sglang_stored(SGLANG_P16[2], 8, "DISK"),
        ]
    )
    pubs["t2"].publish([block_stored(CBOR_BS16_PLAIN[:1], PROMPT[:16])])
    pubs["pool"].send(
        [MC_TS, [mooncake_stored(CBOR_BS16_PLAIN[0], "cpu", "obj-0"), mooncake_stored(CBOR_BS16_PLAIN[1], "disk", "obj-1")], 0]
    )
    # Every expected figure is reached over RPC before the protocols are compared.
    for name, kwargs, expected in QUERIES:
        if expected is not None:
            want = {"ret": OK, "hits": expected}
            wait_for(lambda: client.query(**kwargs), lambda r: r == want, what=name)  # noqa: B023 (called at once)
    yield client
    client.close()


def test_vector_constants():
    data = json.loads(VECTORS.read_text())

    def vllm(block_size, variant):
        case = next(
            c for c in data["vllm_v1"]["cases"]
            if c["algo"] == "sha256_cbor" and c["block_size"] == block_size and c["variant"] == variant
        )
        return [b["event_u64"] for b in case["blocks"]]

    assert vllm(16, "cache_salt=s1") == CBOR_BS16_SALT_S1
    assert vllm(16, "lora_name=lora-a") == CBOR_BS16_LORA_A
    assert vllm(4, "plain") == CBOR_BS4_PLAIN
    case = next(
        c for c in data["sglang"]["cases"] if c["page_size"] == 16 and not c["bigram"] and c["variant"] == "unsalted"
    )
    assert [p["event_i64"] for p in case["pages"]] == SGLANG_P16


@pytest.mark.parametrize("name,kwargs,expected", QUERIES, ids=[q[0] for q in QUERIES])
def test_query_agrees(conductor, indexed, name, kwargs, expected):
    rpc = indexed.query(**kwargs)
    assert rpc["ret"] == OK
    if expected is not None:
        assert rpc["hits"] == expected
    status, resp = http(conductor, "POST", "/query", http_query_body(**kwargs))
    assert status == 200, resp
    assert resp == {"instances": rpc["hits"]}


def test_query_token_ids_as_binary(conductor, indexed):
    """HTTP also takes token_ids as little-endian int32 bytes: same answer."""
    body = http_query_body("m", 16, PROMPT)
    body["token_ids"] = struct.pack("<%di" % len(PROMPT), *PROMPT)
    status, resp = http(conductor, "POST", "/query", body)
    assert status == 200, resp
    assert resp == {"instances": indexed.query("m", block_size=16, token_ids=PROMPT)["hits"]} == {"instances": FULL}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(model_name="", block_size=16, token_ids=PROMPT),
        dict(model_name="m", block_size=0, token_ids=PROMPT),
        dict(model_name="m", block_size=-16, token_ids=PROMPT),
        dict(model_name="s", block_size=16, token_ids=[1, -2, 3]),  # SGLang cannot hash negative tokens
    ],
    ids=["empty model", "block size 0", "negative block size", "negative token under SGLang"],
)
def test_invalid_query_agrees(conductor, indexed, kwargs):
    assert indexed.query(**kwargs) == {"ret": INVALID_PARAMS, "hits": {}}
    status, resp = http(conductor, "POST", "/query", http_query_body(**kwargs))
    assert status == 400 and "error" in resp, resp


def test_services_agree(conductor, indexed):
    rpc = indexed.list_services()
    status, resp = http(conductor, "GET", "/services")
    assert status == 200
    assert rpc["ret"] == OK
    assert {"count": rpc["count"], "services": rpc["services"]} == resp
    keys = ["%s|%s|%d" % (s["InstanceID"], s["TenantID"], s["DPRank"]) for s in rpc["services"]]
    assert keys == sorted(keys) == [
        "a|default|0", "a|default|1", "a|t2|0", "b|default|0", "c|default|0", "d|default|0", "e|default|0",
        "pool|default|0",
    ]
    by_key = dict(zip(keys, rpc["services"]))
    assert by_key["pool|default|0"]["ReplayEndpoint"] == "tcp://127.0.0.1:9"
    assert by_key["a|default|1"]["ReplayEndpoint"] == ""
    assert by_key["b|default|0"]["CacheGroup"] == 0 and by_key["a|default|0"]["CacheGroup"] is None
    assert by_key["c|default|0"]["Type"] == "SGLang" and by_key["pool|default|0"]["Type"] == "Mooncake"
    assert by_key["c|default|0"]["HashProfile"]["python_hash_seed"] == "0"
    assert by_key["e|default|0"]["LoraName"] == "lora-a" and by_key["d|default|0"]["BlockSize"] == 4


def test_global_view_agrees(conductor, indexed):
    rpc = indexed.get_global_view()
    status, resp = http(conductor, "GET", "/global_view")
    assert status == 200 and rpc["ret"] == OK
    assert rpc["context_count"] == resp["context_count"] == len(resp["contexts"]) == 5
    for ctx in rpc["contexts"]:
        assert all(isinstance(r, set) for r in ctx["instances"].values())
    as_lists = [dict(c, instances={k: sorted(v) for k, v in c["instances"].items()}) for c in rpc["contexts"]]
    assert as_lists == resp["contexts"]
    summary = [
        (c["tenant_id"], c["model_name"], c["lora_name"], c["block_size"], c["prefix_count"], c["instances"])
        for c in rpc["contexts"]
    ]
    assert summary == [
        ("default", "m", "", 4, 6, {"d": {0}}),
        ("default", "m", "", 16, 4, {"a": {0, 1}, "b": {0}}),  # 2 plain + 2 salted keys
        ("default", "m", "lora-a", 16, 2, {"e": {0}}),
        ("default", "s", "", 16, 3, {"c": {0}}),
        ("t2", "m", "", 16, 1, {"a": {0}}),
    ]


def test_unregister_seen_by_both(conductor, indexed):
    assert indexed.unregister("a", dp_rank=1) == OK
    status, resp = http(conductor, "POST", "/unregister", {"instance_id": "a", "dp_rank": 1})
    assert status == 404, resp
    status, resp = http(conductor, "POST", "/unregister", {"instance_id": "b", "dp_rank": 0})
    assert status == 200 and resp["removed_instances"] == ["b|default|0"], resp
    assert indexed.unregister("b") == SERVICE_NOT_FOUND
    rpc = indexed.query("m", block_size=16, token_ids=PROMPT)
    status, resp = http(conductor, "POST", "/query", http_query_body("m", 16, PROMPT))
    assert resp == {"instances": rpc["hits"]} == {"instances": {"a": hit(32, 32, 32, 32, {"0": (32, 32, 32, 32)})}}
    assert indexed.list_services()["count"] == http(conductor, "GET", "/services")[1]["count"] == 6
