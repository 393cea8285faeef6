"""mooncake.conductor.block_keys against the engines' own block hashes (testdata/engines,
written by `make vectors` from the vLLM and SGLang wheels), with every hash_profile field
of issue 25; and root_digest against the server's (testdata/conductor/root_digests.json,
written by the Go tests)."""

import json

import pytest

from conftest import REPO_ROOT
from mooncake._conductor_xxh3 import xxh3_128_digest
from mooncake.conductor import block_keys

ENGINES = REPO_ROOT / "testdata" / "engines"
ROOT_DIGESTS = REPO_ROOT / "testdata" / "conductor" / "root_digests.json"


def load(name):
    return json.loads((ENGINES / name).read_text())


def vllm_files():
    return sorted(p.name for p in ENGINES.glob("vllm-*.json"))


def sglang_files():
    return sorted(p.name for p in ENGINES.glob("sglang-*.json"))


def vllm_profile_for(data, case):
    """The hash_profile a user of the release registers for the case."""
    seed = case["python_hash_seed"]
    prof = {"strategy": "vllm_v1", "algorithm": case["algorithm"], "index_projection": "low64_be",
            "python_hash_seed": "unset" if seed is None else seed}
    if data["facts"]["tagged_extra_keys"]:
        prof["extra_keys"] = "tagged"
        if case["lora"]:
            prof["lora_path"] = case["lora"]["path"]
    if case["lookahead_tokens"]:
        prof["lookahead_tokens"] = case["lookahead_tokens"]
    return prof


@pytest.mark.parametrize("name", vllm_files())
def test_vllm_engine_blocks(name):
    data = load(name)
    checked = 0
    for case in data["hash_cases"]:
        if case["mm"]:
            continue  # multimodal inputs are not part of a token query
        assert case["reproducible"]
        lora = case["lora"]["name"] if case["lora"] else ""
        got = block_keys(data["prompt_token_ids"], vllm_profile_for(data, case), case["block_size"],
                         lora_name=lora, cache_salt=case["cache_salt"] or "")
        assert got == [b["event_hash"] for b in case["blocks"]], case["id"]
        checked += 1
    assert checked >= 40


def test_vllm_profile_fields_matter():
    """The fields a release needs are needed: without them its tagged, salted, LoRA and
    lookahead blocks do not reproduce."""
    data = load("vllm-0.34.0.json")
    compared = 0
    for case in data["hash_cases"]:
        if case["mm"] or not (case["lora"] or case["cache_salt"] or case["lookahead_tokens"]):
            continue
        prof = vllm_profile_for(data, case)
        for key in ("extra_keys", "lora_path", "lookahead_tokens"):
            prof.pop(key, None)
        lora = case["lora"]["name"] if case["lora"] else ""
        got = block_keys(data["prompt_token_ids"], prof, case["block_size"], lora_name=lora,
                         cache_salt=case["cache_salt"] or "")
        assert got[:1] != [case["blocks"][0]["event_hash"]], case["id"]
        compared += 1
    assert compared >= 20


@pytest.mark.parametrize("name", sglang_files())
def test_sglang_engine_pages(name):
    data = load(name)
    checked = 0
    for case in data["page_cases"]:
        if case["format"] != "default" or case["id"].endswith(("lora-runtime", "lora-unregistered")):
            continue  # dynamo namespaces salts too; run-time adapters have a random id
        prof = {"strategy": "sglang_bigram" if case["bigram"] else "sglang", "algorithm": "sha256_raw",
                "index_projection": "first64_be"}
        lora = ""
        if case["lora"]:
            lora = case["lora"]["name"]
            if data["facts"]["default_format_namespaces_registered_lora"]:
                prof["lora_path"] = case["lora"]["path"]
        got = block_keys(case["tokens"], prof, case["page_size"], lora_name=lora, cache_salt=case["cache_salt"] or "")
        want = [p["event_i64"] & ((1 << 64) - 1) for p in case["pages"]]
        assert got == want, case["id"]
        checked += 1
    assert checked >= 8


def test_xxh3_against_engine_digests():
    """The pure XXH3-128 gives vLLM's digests (xxhash.xxh3_128_digest) for every recorded
    xxhash preimage, of every length the vectors hold."""
    checked = 0
    for name in vllm_files():
        data = load(name)
        for entry in data["none_hashes"]:
            if entry["reproducible"] and entry["algorithm"].startswith("xxhash"):
                assert xxh3_128_digest(bytes.fromhex(entry["preimage_hex"])).hex() == entry["none_hash_hex"]
                checked += 1
        for case in data["hash_cases"]:
            if case["algorithm"].startswith("xxhash"):
                for block in case["blocks"]:
                    assert xxh3_128_digest(bytes.fromhex(block["preimage_hex"])).hex() == block["hash_hex"]
                    checked += 1
    assert checked > 200


def test_root_digests_match_server():
    """root_digest of every kind of profile, as the Go hashing package derives it."""
    cases = json.loads(ROOT_DIGESTS.read_text())["cases"]
    assert len(cases) >= 10
    for c in cases:
        prof = dict(c["profile"], root_digest=c["root_digest"])
        block_keys([1, 2, 3, 4], prof, 4, lora_name=c.get("lora_name", ""))  # accepted
        with pytest.raises(ValueError, match="root_digest"):
            block_keys([1], dict(prof, root_digest="ab" * 32), 1, lora_name=c.get("lora_name", ""))


@pytest.mark.parametrize(
    "profile, lora, match",
    [
        ({"extra_keys": "sideways"}, "", "extra_keys"),
        ({"lora_path": "/a"}, "a", "tagged"),
        ({"extra_keys": "tagged"}, "a", "lora_path is required"),
        ({"extra_keys": "tagged", "lora_path": "/a"}, "", "needs a non-empty lora_name"),
        ({"extra_keys": "tagged", "lora_path": ""}, "a", "must not be empty"),
        ({"lookahead_tokens": -1}, "", "lookahead_tokens"),
        ({"lookahead_tokens": 257}, "", "lookahead_tokens"),
        ({"lookahead_tokens": "3"}, "", "lookahead_tokens"),
        ({"lookahead_tokens": True}, "", "lookahead_tokens"),
        ({"algorithm": "xxhash", "python_hash_seed": "unset"}, "", "unset"),
        ({"algorithm": "xxh3"}, "", "algorithm"),
        ({"python_hash_seed": "UNSET"}, "", "python_hash_seed"),
    ],
)
def test_invalid_new_fields(profile, lora, match):
    base = {"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "0", "index_projection": "low64_be"}
    with pytest.raises(ValueError, match=match):
        block_keys([1, 2, 3, 4], dict(base, **profile), 4, lora_name=lora)


def test_lookahead_blocks_need_following_tokens():
    prof = {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be",
            "lookahead_tokens": 3}
    toks = list(range(100, 140))  # 40 tokens, blocks of 4
    assert len(block_keys(toks, prof, 4)) == (40 - 3) // 4
    # Block i covers tokens up to (i+1)*4+3: changing token 10 changes blocks 1 and 2 only
    # from block 1 on (the chain carries it forward), not block 0.
    other = list(toks)
    other[10] += 1
    a, b = block_keys(toks, prof, 4), block_keys(other, prof, 4)
    assert a[0] == b[0] and a[1] != b[1]
    other = list(toks)
    other[6] += 1  # inside block 1, in block 0's lookahead window (tokens 4..6)
    assert block_keys(other, prof, 4)[0] != a[0]
