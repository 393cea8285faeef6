"""End to end: Python publishers shaped like vLLM's and SGLang's drive the real Go binary.

Registration and queries go over HTTP (msgpack); events go over ZMQ exactly as the engines
send them. Block hashes come from the shared vectors (tokens 1..40), so what the engine
publishes and what the conductor recomputes at query time must agree bit for bit.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest

from conftest import REPO_ROOT
from publishers import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    SglAllBlocksCleared,
    SglBlockRemoved,
    SglBlockStored,
    SglKVEventBatch,
    SglLegacyBlockStored,
    SglLegacyKVEventBatch,
    VllmKVEventBatch,
    ZmqPublisher,
    encode,
)

VECTORS = Path(os.environ.get("CONDUCTOR_VECTORS", REPO_ROOT / "testdata" / "vectors" / "hash_vectors.json"))
TOKENS = list(range(1, 41))
TS = 1757500000.25


@pytest.fixture(scope="module")
def vectors():
    return json.loads(VECTORS.read_text())


@pytest.fixture(scope="session")
def conductor_bin(tmp_path_factory):
    """CONDUCTOR_BIN if set, else a fresh `go build` of ./cmd/mooncake_conductor.

    Overrides conftest's fixture of the same name, which only looks for a prebuilt binary,
    so these tests never run against a stale one.
    """
    path = os.environ.get("CONDUCTOR_BIN")
    if path:
        if not os.access(path, os.X_OK):
            pytest.fail("CONDUCTOR_BIN is not an executable: %s" % path)
        return path
    go = shutil.which("go")
    if go is None:
        pytest.skip("go toolchain not found and CONDUCTOR_BIN not set")
    out = tmp_path_factory.mktemp("bin") / "mooncake_conductor"
    proc = subprocess.run(
        [go, "build", "-o", str(out), "./cmd/mooncake_conductor"],
        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail("go build failed:\n%s%s" % (proc.stdout, proc.stderr))
    return str(out)


def post(conductor, path, body):
    req = urllib.request.Request(
        conductor.http_url + path, data=msgpack.packb(body),
        headers={"Content-Type": "application/msgpack"}, method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, msgpack.unpackb(resp.read(), raw=False, strict_map_key=False)
    except urllib.error.HTTPError as err:
        return err.code, msgpack.unpackb(err.read(), raw=False, strict_map_key=False)


def register(conductor, pub, kind, instance, block_size, profile):
    status, resp = post(conductor, "/register", {
        "endpoint": pub.endpoint, "type": kind, "modelname": "m", "instance_id": instance,
        "block_size": block_size, "dp_rank": 0, "hash_profile": profile,
    })
    assert status == 200, (resp, conductor.log())
    assert resp == {"status": "registered successfully", "instance_id": instance}
    pub.wait_subscribed()


def query(conductor, block_size, tokens=TOKENS):
    status, resp = post(conductor, "/query", {"model": "m", "block_size": block_size, "token_ids": tokens})
    assert status == 200, resp
    return resp["instances"]


def wait_hit(conductor, instance, block_size, want, tokens=TOKENS):
    """Poll /query until the instance's tiers equal want (a dict of tier -> tokens)."""
    deadline = time.monotonic() + 10
    while True:
        inst = query(conductor, block_size, tokens).get(instance)
        got = None if inst is None else {k: inst[k] for k in want}
        if got == want:
            return inst
        if time.monotonic() > deadline:
            pytest.fail("instance %s: %r, want %r\n%s" % (instance, got, want, conductor.log()))
        time.sleep(0.02)


def tiers(device, cpu_local=None, cpu_share=None, disk=None):
    cpu_local = device if cpu_local is None else cpu_local
    cpu_share = cpu_local if cpu_share is None else cpu_share
    disk = cpu_share if disk is None else disk
    return {"device": device, "cpu_local": cpu_local, "cpu_share": cpu_share, "disk": disk,
            "longest_matched": disk}


@pytest.fixture
def publisher():
    pubs = []

    def make(**kwargs):
        p = ZmqPublisher(**kwargs)
        pubs.append(p)
        return p

    yield make
    for p in pubs:
        p.close()


def vllm_case(vectors, algo, block_size, variant="plain"):
    for case in vectors["vllm_v1"]["cases"]:
        if (case["algo"], case["block_size"], case["variant"]) == (algo, block_size, variant):
            return case
    raise KeyError((algo, block_size, variant))


def sglang_case(vectors, page_size):
    for case in vectors["sglang"]["cases"]:
        if case["page_size"] == page_size and not case["bigram"] and case["variant"] == "unsalted":
            return case
    raise KeyError(page_size)


def test_msgspec_encoding_matches_vectors(vectors):
    """The structs here encode the shared vectors' payloads byte for byte."""
    ex = vectors["event_examples"]
    hashes = [b["event_u64"] for b in vllm_case(vectors, "sha256", 16)["blocks"]]
    batch = VllmKVEventBatch(ts=TS, data_parallel_rank=0, events=[
        BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=TOKENS[:32], block_size=16,
                    lora_id=None, medium="GPU", lora_name=None, extra_keys=[None, None], group_idx=0,
                    kv_cache_spec_kind="full_attention"),
        BlockRemoved(block_hashes=hashes[:1], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ])
    assert encode(batch).hex() == ex["vllm_current_map_events_int_hashes"]["payload_hex"]

    # Byte hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) use the same structs.
    digests = [bytes.fromhex(b["hash_hex"]) for b in vllm_case(vectors, "sha256", 16)["blocks"]]
    batch.events[0].block_hashes = digests
    batch.events[1].block_hashes = digests[:1]
    assert encode(batch).hex() == ex["vllm_current_map_events_bytes_hashes"]["payload_hex"]

    minimal = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1], block_size=1,
                          lora_id=None, medium=None, lora_name=None)
    assert encode(minimal).hex() == ex["vllm_map_omit_defaults_example"]["payload_hex"]

    pages = sglang_case(vectors, 16)["pages"]
    legacy = SglLegacyKVEventBatch(ts=TS, attn_dp_rank=0, events=[
        SglLegacyBlockStored(block_hashes=[pages[0]["event_i64"]], parent_block_hash=None,
                             token_ids=TOKENS[:16], block_size=16, lora_id=None, medium="GPU"),
        SglLegacyBlockStored(block_hashes=[pages[1]["event_i64"]], parent_block_hash=pages[0]["event_i64"],
                             token_ids=TOKENS[16:32], block_size=16, lora_id=None, medium="GPU"),
    ])
    assert encode(legacy).hex() == ex["sglang_legacy_array_batch"]["payload_hex"]


VLLM_PROFILE = {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0",
                "index_projection": "low64_be"}
SGLANG_PROFILE = {"strategy": "sglang", "algorithm": "sha256_raw", "python_hash_seed": "0",
                  "index_projection": "first64_be"}


def test_vllm_publisher(conductor, publisher, vectors):
    pub = publisher()
    register(conductor, pub, "vLLM", "vllm-py", 16, VLLM_PROFILE)
    h = [b["event_u64"] for b in vllm_case(vectors, "sha256_cbor", 16)["blocks"]]
    assert len(h) == 2  # 40 tokens: two full blocks, the 8-token tail is never hashed

    def batch(*events):
        return VllmKVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=0)

    pub.publish(batch(BlockStored(block_hashes=h, parent_block_hash=None, token_ids=TOKENS[:32],
                                  block_size=16, lora_id=None, medium="GPU", lora_name=None,
                                  extra_keys=[None, None], group_idx=0, kv_cache_spec_kind="full_attention")))
    inst = wait_hit(conductor, "vllm-py", 16, tiers(32))
    assert inst["dp"] == {"0": 32}
    assert inst["rank_matches"]["0"] == {"device": 32, "cpu_local": 32, "cpu_share": 32, "disk": 32}

    # Offloaded copies (medium CPU) are not indexed for vLLM; removing the GPU copy of
    # block 1 cuts the prefix at block 0.
    pub.publish(batch(BlockStored(block_hashes=h[1:], parent_block_hash=h[0], token_ids=TOKENS[16:32],
                                  block_size=16, lora_id=None, medium="CPU", lora_name=None),
                      BlockRemoved(block_hashes=h[1:], medium="GPU", group_idx=0)))
    wait_hit(conductor, "vllm-py", 16, tiers(16))

    pub.publish(batch(AllBlocksCleared()))
    wait_hit(conductor, "vllm-py", 16, tiers(0))

    # Array-encoded events (vLLM <= 0.23: the tag, then the fields in declaration
    # order) are decoded like maps: this one stores both blocks, the next removes block 1.
    pub.publish(msgpack.packb([time.time(), [["BlockStored", h, None, TOKENS[:32], 16, None, "GPU", None]], 0]))
    wait_hit(conductor, "vllm-py", 16, tiers(32))
    pub.publish(msgpack.packb([time.time(), [["BlockRemoved", h[1:], "GPU"]], 0]))
    wait_hit(conductor, "vllm-py", 16, tiers(16))

    status, resp = post(conductor, "/unregister", {"instance_id": "vllm-py", "dp_rank": 0})
    assert status == 200, resp
    assert query(conductor, 16) == {}


def test_sglang_publisher(conductor, publisher, vectors):
    pub = publisher(topic=b"kv-events")
    register(conductor, pub, "SGLang", "sgl-py", 16, SGLANG_PROFILE)
    pages = sglang_case(vectors, 16)["pages"]
    h = [p["event_i64"] for p in pages]
    assert [len(p["units"]) for p in pages] == [16, 16, 8]

    def batch(*events):
        return SglKVEventBatch(ts=time.time(), events=list(events), attn_dp_rank=0)

    def stored(i, medium):
        return SglBlockStored(block_hashes=[h[i]], parent_block_hash=h[i - 1] if i else None,
                              token_ids=TOKENS[16 * i:16 * (i + 1)], block_size=len(pages[i]["units"]),
                              lora_id=None, medium=medium)

    # One event per page, as the radix cache emits them; the last page is partial.
    pub.publish(batch(stored(0, "GPU"), stored(1, "GPU"), stored(2, "GPU")))
    wait_hit(conductor, "sgl-py", 16, tiers(40))

    # HiCache tiers: page 2 leaves the GPU but stays in host memory, page 1 also on disk.
    pub.publish(batch(stored(2, "CPU_PINNED"), SglBlockRemoved(block_hashes=[h[2]], medium="GPU"),
                      stored(1, "DISK")))
    wait_hit(conductor, "sgl-py", 16, tiers(32, 40))

    # Page 1 now only on disk: the memory tiers stop at page 0, the disk walk goes on
    # through page 1 (disk) and page 2 (host memory counts for the lower tier too).
    pub.publish(batch(SglBlockRemoved(block_hashes=[h[1]], medium="GPU")))
    wait_hit(conductor, "sgl-py", 16, tiers(16, 16, 16, 40))

    pub.publish(batch(SglAllBlocksCleared()))
    wait_hit(conductor, "sgl-py", 16, tiers(0))
    # medium omitted (None) means the GPU.
    pub.publish(batch(stored(0, None)))
    wait_hit(conductor, "sgl-py", 16, tiers(16))
