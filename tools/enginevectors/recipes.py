"""Independent re-derivation of every generated vector from the rules in FINDINGS.md.

Nothing here imports engine code: the rules are written out from reading it. The
generator runs every vector the engines produced through these functions and fails on
any difference, so the committed vectors and the documented byte recipes agree, and a
stub that silently changed the engines' behaviour would be caught.
"""

import hashlib
import pickle
import struct

import cbor2
import xxhash

MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------- vLLM

def vllm_serialize(obj, algorithm):
    """pickle protocol 5 for sha256 / xxhash; canonical CBOR for the *_cbor algorithms."""
    if algorithm.endswith("_cbor"):
        return cbor2.dumps(obj, canonical=True)
    return pickle.dumps(obj, protocol=5)


def vllm_digest(data, algorithm):
    """SHA-256 (32 bytes) or XXH3-128 in canonical big-endian byte order (16 bytes)."""
    if algorithm.startswith("sha256"):
        return hashlib.sha256(data).digest()
    return xxhash.xxh3_128_digest(data)


def vllm_none_hash_seed(facts, algorithm, python_hash_seed):
    """The text NONE_HASH is derived from, or None where the release draws it at random.

    ``python_hash_seed`` is the env value, or None for unset.
    """
    if python_hash_seed is not None:
        return python_hash_seed
    if facts["fixed_default_seed"] and algorithm.startswith("sha256"):
        return "vllm-none-hash"
    return None


def vllm_extra_keys(tagged, lora, cache_salt, mm, start, end):
    """Extra keys of the block [start, end): LoRA, then multimodal items, then the salt."""
    keys = []
    if lora is not None:
        keys.append(("lora", lora["name"], lora["path"]) if tagged else lora["name"])
    for identifier, offset, length in mm or []:
        if end > offset and start < offset + length:
            keys.append(("mm", identifier, offset - start) if tagged else (identifier, offset - start))
    if start == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt) if tagged else cache_salt)
    return tuple(keys) if keys else None


def vllm_untag(keys):
    """The untagged form events publish (vLLM >= 0.31 converts its tagged keys back)."""
    if keys is None:
        return None
    return tuple(k[1:] if isinstance(k, tuple) and k[0] == "mm" else
                 (k[1] if isinstance(k, tuple) and k[0] in ("lora", "cache_salt", "prompt_embeds") else k)
                 for k in keys)


def vllm_blocks(facts, case, tokens, none_hash):
    """Every full block's (extra_keys, preimage, hash) for one hash case."""
    bs = case["block_size"]
    lookahead = case.get("lookahead_tokens", 0)
    algorithm = case["algorithm"]
    parent = none_hash
    out = []
    start = 0
    while start + bs + lookahead <= len(tokens):
        end = start + bs
        if lookahead:
            window = vllm_extra_keys(facts["tagged_extra_keys"], case.get("lora"),
                                     case.get("cache_salt"), case.get("mm"), start, end + lookahead)
            extra = (window, *tokens[end:end + lookahead])
        else:
            extra = vllm_extra_keys(facts["tagged_extra_keys"], case.get("lora"),
                                    case.get("cache_salt"), case.get("mm"), start, end)
        pre = vllm_serialize((parent, tuple(tokens[start:end]), extra), algorithm)
        h = vllm_digest(pre, algorithm)
        out.append({"extra_keys": extra, "preimage": pre, "hash": h})
        parent = h
        start = end
    return out


def vllm_event_hash(h):
    """Block hash in events with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (the default)."""
    return int.from_bytes(h, "big") & MASK64


# -------------------------------------------------------------------------- SGLang

def sglang_page_digest(prior, units):
    """SHA-256(prior 32 raw bytes, if any || each token as u32 little-endian)."""
    flat = []
    for u in units:
        flat.extend(u if isinstance(u, (list, tuple)) else [u])
    data = b"".join(struct.pack("<I", t) for t in flat)
    return hashlib.sha256((prior or b"") + data).digest()


def _namespace_seed(tag, extra_key, cache_salt):
    """SHA256(tag || part(extra_key) || part(cache_salt)), or None when both are absent."""
    if extra_key is None and cache_salt is None:
        return None
    d = hashlib.sha256(tag)
    for part in (extra_key, cache_salt):
        d.update(_presence_part(part))
    return d.digest()


def sglang_storage_seed(extra_key, cache_salt):
    """Seed of a namespaced tree / storage chain (SGLang >= 0.5.20)."""
    return _namespace_seed(b"sglang-cache-namespace-v1", extra_key, cache_salt)


def sglang_event_namespace_seed(extra_key, cache_salt):
    """Seed of namespaced published hashes (SGLang >= 0.5.22)."""
    return _namespace_seed(b"sglang-kv-event-namespace-v1", extra_key, cache_salt)


def _presence_part(part):
    if part is None:
        return b"\x00"
    enc = part.encode("utf-8")
    return b"\x01" + len(enc).to_bytes(8, "little") + enc


def sglang_salt_seed(cache_salt):
    return hashlib.sha256(b"sglang-cache-salt-v1\0" + cache_salt.encode("utf-8")).digest()


def first8_i64(digest):
    return int.from_bytes(digest[:8], "big", signed=True)


def sglang_namespaced(value, seed):
    if seed is None:
        return value
    return first8_i64(hashlib.sha256(seed + value.to_bytes(8, "big", signed=True)).digest())


def sglang_pages(facts, case, pages):
    """Expected (tree hash, event-chain hash, published i64) of every page of a case."""
    lora = case.get("lora")
    extra_key = lora["extra_key"] if lora else None
    salt = case.get("cache_salt")
    tree_prior = sglang_storage_seed(extra_key, salt) if facts["namespaced_tree_chain"] else None
    if facts["event_chain_ignores_extra_key"] or extra_key is None:
        event_prior = sglang_salt_seed(salt) if salt is not None else None
        separate_event_chain = salt is not None or (extra_key is not None and facts["namespaced_tree_chain"])
    else:
        raise AssertionError("no release hashes extra_key into its event chain")
    if case.get("dynamo_format"):
        ns = sglang_event_namespace_seed(extra_key, salt)
    elif facts["default_format_namespaces_registered_lora"] and lora is not None and case.get("registered", True):
        ns = sglang_event_namespace_seed(extra_key, None)
    else:
        ns = None
    out = []
    tree_parent, event_parent = tree_prior, event_prior
    for page in pages:
        t = sglang_page_digest(tree_parent, page["units"])
        e = sglang_page_digest(event_parent, page["units"]) if separate_event_chain else t
        out.append((t.hex(), e.hex(), sglang_namespaced(first8_i64(e), ns)))
        tree_parent, event_parent = t, e
    return out
