"""A router's view of the HTTP API: msgpack bodies over plain urllib against the real binary.

This is how a cache-aware router talks to Conductor without the Python client: POST
/register for each engine, POST /query per request, pick the instance with the longest
match. Skipped when the binary has not been built (see conftest.py).
"""

import hashlib
import struct
import time
import urllib.error
import urllib.request

import msgpack
import pytest

import goldens as g

MSGPACK = "application/msgpack"
VLLM_PROFILE = {
    "strategy": "vllm_v1",
    "algorithm": "sha256_cbor",
    "python_hash_seed": "0",
    "index_projection": "low64_be",
}
ROOT_SEED0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"


def post(conductor, path, body, content_type=MSGPACK):
    """POST a msgpack body; return (status, decoded msgpack map)."""
    req = urllib.request.Request(
        conductor.http_url + path,
        data=msgpack.packb(body) if not isinstance(body, bytes) else body,
        headers={"Content-Type": content_type},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"] == MSGPACK
            return resp.status, msgpack.unpackb(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, msgpack.unpackb(err.read())


def get(conductor, path):
    with urllib.request.urlopen(conductor.http_url + path, timeout=10) as resp:
        return resp.status, msgpack.unpackb(resp.read())


def registration(endpoint, instance_id, dp_rank=0):
    return {
        "endpoint": endpoint,
        "type": "vLLM",
        "modelname": "router-model",
        "instance_id": instance_id,
        "block_size": 16,
        "dp_rank": dp_rank,
        "tenant_id": "",
        "hash_profile": dict(VLLM_PROFILE),
    }


def query(tokens, **extra):
    return dict({"model": "router-model", "block_size": 16, "token_ids": tokens}, **extra)


def cbor_uint(major, n):
    """CBOR head with the shortest argument encoding."""
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, "B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(size)):
            return bytes([major << 5 | extra]) + struct.pack(size, n)
    raise ValueError(n)


def vllm_block_keys(tokens, block_size=16):
    """The low64 block keys vLLM (sha256_cbor, PYTHONHASHSEED=0) publishes for a prompt."""
    root = hashlib.sha256(cbor_uint(3, 1) + b"0").digest()
    assert root.hex() == ROOT_SEED0
    parent, keys = root, []
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        block = tokens[start : start + block_size]
        enc = cbor_uint(4, 3) + cbor_uint(2, len(parent)) + parent + cbor_uint(4, len(block))
        for t in block:
            enc += cbor_uint(0, t) if t >= 0 else cbor_uint(1, -1 - t)
        enc += b"\xf6"  # no extra keys
        parent = hashlib.sha256(enc).digest()
        keys.append(int.from_bytes(parent[24:], "big"))
    return keys


def test_router_register_and_query(conductor):
    tokens = list(range(1000, 1040))
    status, body = post(conductor, "/register", registration("tcp://127.0.0.1:1", "engine-a"))
    assert (status, body) == (200, {"status": "registered successfully", "instance_id": "engine-a"})
    # A router re-registers on restart: an identical registration is accepted again.
    assert post(conductor, "/register", registration("tcp://127.0.0.1:1", "engine-a"))[0] == 200

    status, body = post(conductor, "/query", query(tokens))
    assert status == 200
    assert body == {"instances": {"engine-a": g.hit(0, 0, 0, 0, {"0": (0, 0, 0, 0)})}}
    # token_ids as a binary of little-endian int32, as a router holding an array sends it.
    packed = struct.pack("<%di" % len(tokens), *tokens)
    assert post(conductor, "/query", query(packed))[1] == body
    # Another model or a filter on an unknown instance: empty.
    assert post(conductor, "/query", dict(query(tokens), model="other")) == (200, {"instances": {}})
    assert post(conductor, "/query", query(tokens, instance_id="nobody")) == (200, {"instances": {}})

    status, services = get(conductor, "/services")
    assert status == 200 and services["count"] == 1
    assert services["services"][0]["HashProfile"]["root_digest"] == ROOT_SEED0

    # Validation errors carry reason and field.
    status, err = post(conductor, "/query", query(tokens), content_type="application/json")
    assert status == 400 and err["reason"] == "unsupported_content_type"
    status, err = post(conductor, "/query", query([1, 2, 2**31]))
    assert status == 400 and (err["reason"], err["field"], err["index"]) == ("out_of_range", "token_ids", 2)
    status, err = post(conductor, "/register", dict(registration("tcp://127.0.0.1:2", "x"), cache_group=1))
    assert status == 400 and (err["reason"], err["field"]) == ("unsupported", "cache_group")

    status, body = post(conductor, "/unregister", {"instance_id": "engine-a", "dp_rank": 0})
    assert status == 200
    assert body == {"status": "unregistered successfully", "removed_instances": ["engine-a|default|0"]}
    assert post(conductor, "/unregister", {"instance_id": "engine-a", "dp_rank": 0})[0] == 404


def test_router_sees_published_blocks(conductor):
    """Events from a vLLM-style ZMQ publisher show up as hits in the router's /query."""
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        endpoint = "tcp://127.0.0.1:%d" % port
        assert post(conductor, "/register", registration(endpoint, "engine-b", dp_rank=1))[0] == 200

        tokens = list(range(5000, 5040))  # 2 full blocks and a partial one
        keys = vllm_block_keys(tokens)
        assert len(keys) == 2
        event = {
            "type": "BlockStored",
            "block_hashes": keys,
            "parent_block_hash": None,
            "token_ids": tokens[:32],
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }
        deadline = time.monotonic() + 10
        seq = 0
        while True:
            # Re-publish until the subscription is up (PUB drops messages before that);
            # storing the same blocks again is idempotent.
            pub.send_multipart([b"", struct.pack(">Q", seq), msgpack.packb([time.time(), [event], 1])])
            seq += 1
            status, body = post(conductor, "/query", query(tokens))
            assert status == 200
            hit = body["instances"]["engine-b"]
            if hit["device"] == 32:
                break
            assert time.monotonic() < deadline, (body, conductor.log())
            time.sleep(0.05)
        assert hit == g.hit(32, 32, 32, 32, {"1": (32, 32, 32, 32)})
        # A prompt that diverges in the second block matches only the first.
        assert post(conductor, "/query", query(tokens[:16] + [7] * 24))[1]["instances"]["engine-b"]["device"] == 16
        assert post(conductor, "/unregister", {"instance_id": "engine-b", "dp_rank": 1})[0] == 200
    finally:
        pub.close(linger=0)
        ctx.term()
