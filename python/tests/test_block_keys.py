"""mooncake.conductor.block_keys: against the shared vectors, and against the server
(keys computed here are the keys the conductor computes from the same token ids)."""

import json
import time
import os
import random
import urllib.request
from pathlib import Path

import msgpack
import pytest

from mooncake.conductor import OK, ConductorClient, block_keys
from test_e2e import publisher_factory, zmq_ctx  # noqa: F401 (fixtures)

REPO_ROOT = Path(__file__).resolve().parents[2]
VECTORS = Path(os.environ.get("CONDUCTOR_VECTORS", REPO_ROOT / "testdata" / "vectors" / "hash_vectors.json"))


def vllm_profile(algorithm, seed="0"):
    return {"strategy": "vllm_v1", "algorithm": algorithm, "python_hash_seed": seed, "index_projection": "low64_be"}


def sglang_profile(strategy="sglang"):
    return {"strategy": strategy, "algorithm": "sha256_raw", "index_projection": "first64_be"}


@pytest.fixture(scope="module")
def vectors():
    return json.loads(VECTORS.read_text())


def test_vllm_vectors(vectors):
    prompt = vectors["prompt_token_ids"]
    seed = vectors["vllm_v1"]["pythonhashseed"]
    checked = 0
    for case in vectors["vllm_v1"]["cases"]:
        if case.get("mm_features"):
            continue  # multimodal extra keys are not part of the query API
        got = block_keys(
            prompt,
            vllm_profile(case["algo"], seed),
            case["block_size"],
            lora_name=case["lora_name"] or "",
            cache_salt=case["cache_salt"] or "",
        )
        assert got == [b["event_u64"] for b in case["blocks"]], case["variant"]
        checked += 1
    assert checked == 16


def test_vllm_root_digest(vectors):
    """A profile as the views return it (with root_digest) is accepted when the root is right."""
    for algo, roots in vectors["vllm_v1"]["none_hash"].items():
        for seed, root in roots.items():
            prof = dict(vllm_profile(algo, seed), root_digest=root["hash_hex"])
            assert block_keys([1, 2, 3, 4], prof, 4) == block_keys([1, 2, 3, 4], vllm_profile(algo, seed), 4)
            with pytest.raises(ValueError, match="root_digest"):
                block_keys([1], dict(prof, root_digest="00" * 32), 1)


def test_sglang_vectors(vectors):
    prompt = vectors["prompt_token_ids"]
    checked = 0
    for case in vectors["sglang"]["cases"]:
        if case["variant"] == "unsalted":
            salt = ""
        elif case["variant"] == "event cache_salt=s1":
            salt = "s1"
        else:
            continue  # HiCache storage-namespace chains are not what engines publish as events
        strategy = "sglang_bigram" if case["bigram"] else "sglang"
        # lora_name is not part of SGLang event hashes.
        for lora in ("", "lora-a"):
            got = block_keys(prompt, sglang_profile(strategy), case["page_size"], lora_name=lora, cache_salt=salt)
            assert got == [p["first8_u64"] for p in case["pages"]], (strategy, case["variant"])
        checked += 1
    assert checked == 8


def test_pickle_multiframe(vectors):
    """A 20 000-token block (a >64 KiB pickle, several frames) hashes as vLLM's does."""
    check = vectors["vllm_v1"]["pickle_multiframe_check"]
    assert check["tokens"] == "range(100000,120000)"
    keys = block_keys(list(range(100000, 120000)), vllm_profile("sha256", vectors["vllm_v1"]["pythonhashseed"]), 20000)
    assert keys == [int(check["preimage_sha256"][-16:], 16)]


def test_shapes_and_partial_blocks():
    toks = list(range(1, 11))  # 10 tokens
    assert len(block_keys(toks, vllm_profile("sha256_cbor"), 4)) == 2  # vLLM: whole blocks only
    assert len(block_keys(toks, sglang_profile(), 4)) == 3  # SGLang: partial last page
    assert len(block_keys(toks, sglang_profile("sglang_bigram"), 3)) == 3  # 9 pairs
    assert block_keys([], vllm_profile("sha256"), 4) == []
    assert block_keys([7], sglang_profile("sglang_bigram"), 4) == []
    # Prefix property: a prompt's keys start with its prefix's keys.
    for prof in (vllm_profile("sha256"), vllm_profile("sha256_cbor"), sglang_profile(), sglang_profile("sglang_bigram")):
        long = block_keys(list(range(100, 164)), prof, 8, "l", "s")
        assert block_keys(list(range(100, 133)) + [9], prof, 8, "l", "s")[:4] == long[:4]
        assert all(0 <= k < 1 << 64 for k in long)
    # Negative and wide token ids encode in every width (vLLM).
    wide = [0, 23, 24, 255, 256, 65535, 65536, -1, -24, -25, -256, -257, -65536, -65537, 2**31 - 1, -(2**31)]
    assert len(block_keys(wide, vllm_profile("sha256_cbor"), 4)) == 4


@pytest.mark.parametrize(
    "args, match",
    [
        (([1], {"strategy": "x"}, 4), "strategy"),
        (([1], dict(vllm_profile("sha256"), algorithm="sha256_raw"), 4), "algorithm"),
        (([1], dict(vllm_profile("sha256"), index_projection="first64_be"), 4), "index_projection"),
        (([1], {"strategy": "vllm_v1", "algorithm": "sha256", "index_projection": "low64_be"}, 4), "python_hash_seed"),
        (([1], vllm_profile("sha256", "4294967296"), 4), "python_hash_seed"),
        (([1], vllm_profile("sha256", "-1"), 4), "python_hash_seed"),
        (([1], dict(vllm_profile("sha256"), extra="x"), 4), "unknown"),
        (([1], "vllm", 4), "dict"),
        (([1], vllm_profile("sha256"), 0), "block_size"),
        (([1], vllm_profile("sha256"), True), "block_size"),
        (([1], vllm_profile("sha256"), 4.0), "block_size"),
        (([1 << 31], vllm_profile("sha256"), 4), "int32"),
        (([True], vllm_profile("sha256"), 4), "bool"),
        ((b"abcd", vllm_profile("sha256"), 4), "sequence"),
        (([1, -2], sglang_profile(), 4), r"token_ids\[1\]"),
        (([1], vllm_profile("sha256"), 4, 5), "lora_name"),
        (([1], vllm_profile("sha256"), 4, "", None), "cache_salt"),
    ],
)
def test_invalid_input(args, match):
    with pytest.raises(ValueError, match=match):
        block_keys(*args)


def _signed(k):
    return k - (1 << 64) if k >= 1 << 63 else k


SERVER_CASES = [
    ("vLLM", vllm_profile("sha256", "42"), "lora-a", "salt-1"),
    ("vLLM", vllm_profile("sha256_cbor", "0"), "", "s"),
    ("SGLang", sglang_profile(), "", "salt-2"),
    ("SGLang", sglang_profile("sglang_bigram"), "", ""),
]


@pytest.mark.parametrize("kind, profile, lora, salt", SERVER_CASES, ids=lambda v: str(v)[:24])
def test_same_keys_as_server(conductor, publisher_factory, kind, profile, lora, salt):
    """Publish the blocks under the keys block_keys computes; the server, hashing the token
    ids itself, must find every block (and /query_by_hash with the same keys too)."""
    bs = 16
    rng = random.Random(7)
    prompt = [rng.randrange(0, 150000) for _ in range(8 * bs + (1 if profile["strategy"] == "sglang_bigram" else 0))]
    keys = block_keys(prompt, profile, bs, lora_name=lora, cache_salt=salt)
    assert len(keys) == 8
    pub = publisher_factory()
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr) == OK
        cfg = {
            "instance_id": "e0", "endpoint": pub.endpoint, "publisher_type": kind, "model_name": "m",
            "lora_name": lora, "block_size": bs, "dp_rank": 0, "hash_profile": profile,
        }
        assert c.register(cfg) == OK
        pub.wait_subscribed()
        hashes = keys if kind == "vLLM" else [_signed(k) for k in keys]
        event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                 "token_ids": prompt[: 8 * bs], "block_size": bs, "lora_id": None, "medium": "GPU"}
        if kind == "vLLM":
            event.update(lora_name=lora or None, extra_keys=[None] * 8, group_idx=0)
        pub.publish([event])
        want = 8 * bs
        deadline = time.monotonic() + 10
        while True:
            got = c.query("m", lora_name=lora, block_size=bs, token_ids=prompt, cache_salt=salt)
            if got["ret"] == OK and got["hits"].get("e0", {}).get("device") == want:
                break
            assert time.monotonic() < deadline, (got, conductor.log())
            time.sleep(0.02)
        # Control: another salt gives other keys, hence no hit.
        other = c.query("m", lora_name=lora, block_size=bs, token_ids=prompt, cache_salt=salt + "x")
        assert other["hits"]["e0"]["device"] == 0
    body = msgpack.packb({"model": "m", "lora_name": lora, "block_size": bs, "block_hashes": keys})
    req = urllib.request.Request(conductor.http_url + "/query_by_hash", data=body,
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        answer = msgpack.unpackb(resp.read())
    assert answer["instances"]["e0"]["device"] == want
