"""Client-side block keys: the 64-bit keys the engines publish and the conductor indexes.

Private to :mod:`mooncake.conductor` (exported there as ``block_keys``). Standard library
only: ``hashlib`` for SHA-256, ``pickle`` for vLLM's ``sha256`` algorithm (vLLM hashes
CPython's own ``pickle.dumps(..., protocol=5)`` bytes, so the standard pickler is the
reference) and a small canonical-CBOR writer for ``sha256_cbor``. The Go package
``hashing/`` is the server's implementation; both are checked against the shared vectors.
"""

import hashlib
import pickle
import struct
import sys

from mooncake import _conductor_wire as _wire

__all__ = ["block_keys"]

_PROFILE_KEYS = ("strategy", "algorithm", "python_hash_seed", "index_projection", "root_digest")
_SGLANG_SALT_PREFIX = b"sglang-cache-salt-v1\x00"
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_U64_BE = struct.Struct(">Q")


def _check_str(name, value):
    if not isinstance(value, str):
        raise ValueError("%s must be a str, got %s" % (name, type(value).__name__))
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("%s is not encodable as UTF-8" % name) from None


def _resolve(profile):
    """Validate a registration's hash_profile dict; returns (strategy, algorithm, seed)."""
    if not isinstance(profile, dict):
        raise ValueError("hash_profile must be a dict, got %s" % type(profile).__name__)
    for key in profile:
        if key not in _PROFILE_KEYS:
            raise ValueError("unknown hash_profile key %r" % (key,))
        _check_str("hash_profile." + key, profile[key])
    strategy = profile.get("strategy", "")
    algorithm = profile.get("algorithm", "")
    projection = profile.get("index_projection", "")
    if strategy in ("sglang", "sglang_bigram"):
        if algorithm != "sha256_raw":
            raise ValueError("unsupported algorithm %r for strategy %s (want sha256_raw)" % (algorithm, strategy))
        if projection != "first64_be":
            raise ValueError("unsupported index_projection %r for strategy %s (want first64_be)" % (projection, strategy))
        return strategy, algorithm, None
    if strategy != "vllm_v1":
        raise ValueError("unsupported strategy %r (want vllm_v1, sglang or sglang_bigram)" % (strategy,))
    if algorithm not in ("sha256", "sha256_cbor"):
        raise ValueError("unsupported algorithm %r for strategy vllm_v1 (want sha256 or sha256_cbor)" % (algorithm,))
    if projection != "low64_be":
        raise ValueError("unsupported index_projection %r for strategy vllm_v1 (want low64_be)" % (projection,))
    seed = profile.get("python_hash_seed")
    if seed is None:
        raise ValueError("hash_profile.python_hash_seed is required for vllm_v1")
    if seed != "random" and not (seed.isascii() and seed.isdigit() and int(seed) <= 0xFFFFFFFF):
        raise ValueError('python_hash_seed must be "random" or a decimal integer in 0..4294967295, got %r' % (seed,))
    return strategy, algorithm, seed


def _cbor_head(major, value):
    """Canonical (shortest) CBOR head for a major type pre-shifted into the top 3 bits."""
    if value < 24:
        return bytes((major | value,))
    if value <= 0xFF:
        return bytes((major | 24, value))
    if value <= 0xFFFF:
        return bytes((major | 25,)) + value.to_bytes(2, "big")
    if value <= 0xFFFFFFFF:
        return bytes((major | 26,)) + value.to_bytes(4, "big")
    return bytes((major | 27,)) + value.to_bytes(8, "big")


def _cbor_text(b):
    return _cbor_head(0x60, len(b)) + b


def _cbor_int(v):
    return _cbor_head(0x00, v) if v >= 0 else _cbor_head(0x20, -1 - v)


def _cbor_extras(lora, salt):
    items = [s for s in (lora, salt) if s]
    if not items:
        return b"\xf6"  # null
    return _cbor_head(0x80, len(items)) + b"".join(_cbor_text(s) for s in items)


# Canonical CBOR of every int32 token, cached per value as it is first seen: prompts reuse
# a vocabulary, so the cache stays small and the per-token cost is one dict lookup.
_cbor_int_cache = {}


def _cbor_tokens(tokens):
    cache = _cbor_int_cache
    try:
        body = b"".join([cache[t] for t in tokens])
    except KeyError:
        if len(cache) > 1 << 20:
            cache.clear()
        for t in tokens:
            if t not in cache:
                cache[t] = _cbor_int(t)
        body = b"".join([cache[t] for t in tokens])
    return _cbor_head(0x80, len(tokens)) + body


def _vllm_keys(algorithm, seed, bs, tokens, lora, salt):
    sha = hashlib.sha256
    n = len(tokens) // bs
    out = []
    if algorithm == "sha256":
        parent = sha(pickle.dumps(seed, protocol=5)).digest()
        lora_s = lora.decode("utf-8") if lora else ""
        salt_s = salt.decode("utf-8") if salt else ""
        first = tuple(s for s in (lora_s, salt_s) if s) or None
        later = (lora_s,) if lora_s else None
        for i in range(n):
            block = tuple(tokens[i * bs : (i + 1) * bs])
            parent = sha(pickle.dumps((parent, block, first if i == 0 else later), protocol=5)).digest()
            out.append(_U64_BE.unpack_from(parent, 24)[0])
        return out
    seed_b = seed.encode("utf-8")
    parent = sha(_cbor_text(seed_b)).digest()
    first = _cbor_extras(lora, salt)
    later = _cbor_extras(lora, b"")
    for i in range(n):
        pre = b"\x83\x58\x20" + parent + _cbor_tokens(tokens[i * bs : (i + 1) * bs]) + (first if i == 0 else later)
        parent = sha(pre).digest()
        out.append(_U64_BE.unpack_from(parent, 24)[0])
    return out


def _sglang_keys(bigram, bs, tokens, salt):
    if len(tokens) and min(tokens) < 0:
        i = next(i for i, t in enumerate(tokens) if t < 0)
        raise ValueError("token_ids[%d] = %d cannot be hashed: sglang encodes tokens as uint32" % (i, tokens[i]))
    sha = hashlib.sha256
    if sys.byteorder == "big":  # pragma: no cover - little-endian hosts only in CI
        tokens = type(tokens)(tokens.typecode, tokens)
        tokens.byteswap()
    raw = tokens.tobytes() if tokens.itemsize == 4 else struct.pack("<%dI" % len(tokens), *tokens)
    n = len(tokens)
    positions = max(n - 1, 0) if bigram else n
    parent = sha(_SGLANG_SALT_PREFIX + salt).digest() if salt else b""
    out = []
    for s in range(0, positions, bs):
        e = min(s + bs, positions)
        if bigram:
            # Unit j is the pair (t[j], t[j+1]): interleave the two shifted views.
            a = memoryview(raw)[4 * s : 4 * e]
            b = memoryview(raw)[4 * (s + 1) : 4 * (e + 1)]
            units = bytearray(8 * (e - s))
            units[0::8], units[1::8], units[2::8], units[3::8] = a[0::4], a[1::4], a[2::4], a[3::4]
            units[4::8], units[5::8], units[6::8], units[7::8] = b[0::4], b[1::4], b[2::4], b[3::4]
            data = parent + bytes(units)
        else:
            data = parent + raw[4 * s : 4 * e]
        parent = sha(data).digest()
        out.append(_U64_BE.unpack_from(parent, 0)[0])
    return out


def block_keys(token_ids, hash_profile, block_size, lora_name="", cache_salt=""):
    """The prompt's block keys as ints: what the engines publish, what /query_by_hash takes.

    hash_profile is a registration's profile dict (``strategy``, ``algorithm``,
    ``python_hash_seed``, ``index_projection``; a ``root_digest`` from a view is accepted
    and must match). vllm_v1 hashes complete blocks only; sglang also hashes the final
    partial block; sglang_bigram hashes adjacent token pairs. lora_name is part of vLLM
    hashes only; cache_salt salts block 0 (vLLM) or seeds the chain (SGLang).
    Raises ValueError for an invalid profile, block size or token.
    """
    strategy, algorithm, seed = _resolve(hash_profile)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError("block_size must be a positive int, got %r" % (block_size,))
    lora = _check_str("lora_name", lora_name)
    salt = _check_str("cache_salt", cache_salt)
    try:
        tokens = _wire._i32_array(token_ids)
    except _wire.WireError as exc:
        raise ValueError("token_ids: %s" % exc) from None
    if strategy == "vllm_v1":
        if "root_digest" in hash_profile:
            root = hashlib.sha256(pickle.dumps(seed, protocol=5) if algorithm == "sha256" else _cbor_text(seed.encode("utf-8")))
            if hash_profile["root_digest"] != root.hexdigest():
                raise ValueError("hash_profile.root_digest does not match the profile's python_hash_seed")
        return _vllm_keys(algorithm, seed, block_size, tokens.tolist(), lora, salt)
    if hash_profile.get("root_digest", "0" * 64) != "0" * 64:
        raise ValueError("hash_profile.root_digest must be zeros for %s" % strategy)
    return _sglang_keys(strategy == "sglang_bigram", block_size, tokens, salt)
