"""The committed engine vectors (testdata/engines/, written by `make vectors`) are consistent.

No network and no engine code: every SHA-256 block hash is recomputed from its recorded
preimage, every chain link and event projection is checked, every SGLang page hash is
recomputed from its token ids, and every recorded ZMQ payload is decoded again and
compared with the JSON view stored beside it. A hand edit or a generator bug that left a
file internally inconsistent fails here.
"""

import hashlib
import json
import struct

import msgpack
import pytest

from conftest import REPO_ROOT

VECTORS = sorted((REPO_ROOT / "testdata" / "engines").glob("*.json"))


def load(path):
    with open(path) as f:
        return json.load(f)


def json_view(value):
    """The generator's JSON view of a decoded msgpack value (bytes as {"bytes_hex": ...})."""
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, (list, tuple)):
        return [json_view(v) for v in value]
    if isinstance(value, dict):
        return {k: json_view(v) for k, v in value.items()}
    return value


def test_every_release_is_present():
    names = {p.stem for p in VECTORS}
    for want in ("vllm-0.23.0", "vllm-0.24.0", "vllm-0.28.0", "vllm-0.29.0", "vllm-0.31.0",
                 "vllm-0.33.0", "vllm-0.34.0", "sglang-0.5.19", "sglang-0.5.22", "sglang-0.5.23"):
        assert want in names


@pytest.mark.parametrize("path", [p for p in VECTORS if p.stem.startswith("vllm-")], ids=lambda p: p.stem)
def test_vllm_hash_chains(path):
    data = load(path)
    assert f"vllm-{data['version']}" == path.stem
    for entry in data["none_hashes"]:
        if entry["reproducible"] and entry["algorithm"].startswith("sha256"):
            pre = bytes.fromhex(entry["preimage_hex"])
            assert hashlib.sha256(pre).hexdigest() == entry["none_hash_hex"]
    assert data["hash_cases"]
    for case in data["hash_cases"]:
        digest_len = 32 if case["algorithm"].startswith("sha256") else 16
        # The head in front of the parent digest: pickle SHORT_BINBYTES (43 <len>), or a
        # CBOR byte string (58 20 for 32 bytes; 50 for 16, a length below 24 sits in the head).
        if case["algorithm"].endswith("_cbor"):
            parent_tag = bytes([0x58, 32]) if digest_len == 32 else bytes([0x40 | digest_len])
        else:
            parent_tag = bytes([0x43, digest_len])
        parent = case["none_hash_hex"]
        bs, look = case["block_size"], case["lookahead_tokens"]
        assert len(case["blocks"]) == (len(data["prompt_token_ids"]) - look) // bs
        for block in case["blocks"]:
            assert block["parent_hash_hex"] == parent, case["id"]
            pre = bytes.fromhex(block["preimage_hex"])
            assert parent_tag + bytes.fromhex(parent) in pre, case["id"]
            h = bytes.fromhex(block["hash_hex"])
            assert len(h) == digest_len
            if digest_len == 32:
                assert hashlib.sha256(pre).digest() == h, case["id"]
            assert block["event_hash"] == int.from_bytes(h[-8:], "big"), case["id"]
            parent = block["hash_hex"]


def check_frames(case):
    assert len(case["frames"]) == len(case["decoded"])
    for seq, (frames, view) in enumerate(zip(case["frames"], case["decoded"])):
        topic, seq_bytes, payload = (bytes.fromhex(f) for f in frames)
        assert topic == case["topic"].encode()
        assert int.from_bytes(seq_bytes, "big") == seq
        assert json_view(msgpack.unpackb(payload, raw=False, strict_map_key=False)) == view
    end = [bytes.fromhex(f) for f in case["replay_frames"][-1]]
    assert end[-2:] == [b"\xff" * 8, b""]


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_event_payloads_decode_to_their_views(path):
    data = load(path)
    assert data["event_cases"]
    for case in data["event_cases"]:
        check_frames(case)


def sg_page(prior, units):
    flat = [t for u in units for t in (u if isinstance(u, list) else [u])]
    return hashlib.sha256((prior or b"") + b"".join(struct.pack("<I", t) for t in flat)).digest()


def sg_seed(tag, extra_key, salt):
    d = hashlib.sha256(tag)
    for part in (extra_key, salt):
        if part is None:
            d.update(b"\x00")
        else:
            enc = part.encode()
            d.update(b"\x01" + len(enc).to_bytes(8, "little") + enc)
    return d.digest()


def i64(digest):
    return int.from_bytes(digest[:8], "big", signed=True)


@pytest.mark.parametrize("path", [p for p in VECTORS if p.stem.startswith("sglang-")], ids=lambda p: p.stem)
def test_sglang_page_chains(path):
    data = load(path)
    facts = data["facts"]
    for case in data["page_cases"] + data["event_cases"]:
        lora = case["lora"]
        extra_key = lora["extra_key"] if lora else None
        salt = case["cache_salt"]
        tree = sg_seed(b"sglang-cache-namespace-v1", extra_key, salt) \
            if facts["namespaced_tree_chain"] and (extra_key or salt) else None
        event = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest() if salt else None
        if case["format"] == "dynamo" and (extra_key or salt):
            ns = sg_seed(b"sglang-kv-event-namespace-v1", extra_key, salt)
        elif facts["default_format_namespaces_registered_lora"] and lora and case["lora_registered"]:
            ns = sg_seed(b"sglang-kv-event-namespace-v1", extra_key, None)
        else:
            ns = None
        for page in case["pages"]:
            tree = sg_page(tree, page["units"])
            assert page["tree_hash_hex"] == tree.hex(), case["id"]
            if salt or (extra_key and facts["namespaced_tree_chain"]):
                event = sg_page(event, page["units"])
            else:
                event = tree
            assert page["event_chain_hash_hex"] == event.hex(), case["id"]
            value = i64(event)
            if ns is not None:
                value = i64(hashlib.sha256(ns + value.to_bytes(8, "big", signed=True)).digest())
            assert page["event_i64"] == value, case["id"]
