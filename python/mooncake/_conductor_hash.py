"""Client-side block keys: the 64-bit keys the engines publish and the conductor indexes.

Private to :mod:`mooncake.conductor` (exported there as ``block_keys``). Standard library
only: ``hashlib`` for SHA-256, ``pickle`` for vLLM's ``sha256`` and ``xxhash`` algorithms
(vLLM hashes CPython's own ``pickle.dumps(..., protocol=5)`` bytes, so the standard
pickler is the reference), a small canonical-CBOR writer for ``sha256_cbor`` and
``xxhash_cbor``, and a pure-Python XXH3-128 (:mod:`mooncake._conductor_xxh3`). The Go
package ``hashing/`` is the server's implementation; both are checked against the
engines' own vectors (``testdata/engines``).
"""

import hashlib
import pickle
import struct
import sys
import uuid

from mooncake import _conductor_wire as _wire
from mooncake._conductor_xxh3 import xxh3_128_digest

__all__ = ["block_keys"]

_STR_KEYS = ("strategy", "algorithm", "python_hash_seed", "index_projection", "root_digest", "extra_keys", "lora_path")
_PROFILE_KEYS = _STR_KEYS + ("lookahead_tokens",)
_SGLANG_SALT_PREFIX = b"sglang-cache-salt-v1\x00"
_SGLANG_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
_ROOT_FOLD_PREFIX = b"conductor-root-digest-v1\x00"
_SEED_UNSET = "unset"
_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_MAX_LOOKAHEAD = 256
_VLLM_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_U64_BE = struct.Struct(">Q")
_U64_LE = struct.Struct("<Q")


def _check_str(name, value):
    if not isinstance(value, str):
        raise ValueError("%s must be a str, got %s" % (name, type(value).__name__))
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("%s is not encodable as UTF-8" % name) from None


class _Profile:
    """A validated hash_profile (the fields that change keys)."""

    __slots__ = ("strategy", "algorithm", "seed", "tagged", "lora_path", "lookahead")

    def __init__(self, strategy, algorithm, seed=None, tagged=False, lora_path="", lookahead=0):
        self.strategy, self.algorithm, self.seed = strategy, algorithm, seed
        self.tagged, self.lora_path, self.lookahead = tagged, lora_path, lookahead


def _resolve(profile):
    """Validate a registration's hash_profile dict (the server's rules, hashing.ResolveSpec)."""
    if not isinstance(profile, dict):
        raise ValueError("hash_profile must be a dict, got %s" % type(profile).__name__)
    for key in profile:
        if key not in _PROFILE_KEYS:
            raise ValueError("unknown hash_profile key %r" % (key,))
        if key in _STR_KEYS:
            _check_str("hash_profile." + key, profile[key])
    lookahead = profile.get("lookahead_tokens", 0)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int):
        raise ValueError("hash_profile.lookahead_tokens must be an int, got %r" % (lookahead,))
    strategy = profile.get("strategy", "")
    algorithm = profile.get("algorithm", "")
    projection = profile.get("index_projection", "")
    extra_keys = profile.get("extra_keys", "untagged")
    lora_path = profile.get("lora_path", "")
    if "lora_path" in profile and not lora_path:
        raise ValueError("hash_profile.lora_path must not be empty")
    if strategy in ("sglang", "sglang_bigram"):
        if algorithm != "sha256_raw":
            raise ValueError("unsupported algorithm %r for strategy %s (want sha256_raw)" % (algorithm, strategy))
        if projection != "first64_be":
            raise ValueError("unsupported index_projection %r for strategy %s (want first64_be)" % (projection, strategy))
        if extra_keys != "untagged":
            raise ValueError("extra_keys %r is a vllm_v1 setting; strategy %s takes only untagged" % (extra_keys, strategy))
        if lookahead:
            raise ValueError("lookahead_tokens is a vllm_v1 setting; strategy %s takes only 0" % strategy)
        return _Profile(strategy, algorithm, lora_path=lora_path)
    if strategy != "vllm_v1":
        raise ValueError("unsupported strategy %r (want vllm_v1, sglang or sglang_bigram)" % (strategy,))
    if algorithm not in _VLLM_ALGORITHMS:
        raise ValueError("unsupported algorithm %r for strategy vllm_v1 (want %s)" % (algorithm, ", ".join(_VLLM_ALGORITHMS)))
    if projection != "low64_be":
        raise ValueError("unsupported index_projection %r for strategy vllm_v1 (want low64_be)" % (projection,))
    seed = profile.get("python_hash_seed")
    if seed is None:
        raise ValueError("hash_profile.python_hash_seed is required for vllm_v1")
    if seed not in ("random", _SEED_UNSET) and not (seed.isascii() and seed.isdigit() and int(seed) <= 0xFFFFFFFF):
        raise ValueError('python_hash_seed must be "random", "unset" or a decimal integer in 0..4294967295, got %r' % (seed,))
    if seed == _SEED_UNSET and algorithm.startswith("xxhash"):
        raise ValueError("python_hash_seed unset: vLLM seeds %s randomly per process; set PYTHONHASHSEED" % algorithm)
    if extra_keys not in ("untagged", "tagged"):
        raise ValueError("unsupported extra_keys %r (want untagged or tagged)" % (extra_keys,))
    if lora_path and extra_keys != "tagged":
        raise ValueError('lora_path is hashed only with extra_keys "tagged" (vLLM >= 0.31)')
    if not 0 <= lookahead <= _MAX_LOOKAHEAD:
        raise ValueError("lookahead_tokens %d is out of range 0..%d" % (lookahead, _MAX_LOOKAHEAD))
    return _Profile(strategy, algorithm, seed, extra_keys == "tagged", lora_path, lookahead)


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


def _cbor_extras(lora, path, salt, tagged):
    """vLLM's extra keys of a block in canonical CBOR: null, or the array of its parts."""
    items = []
    if lora:
        items.append(_cbor_head(0x80, 3) + _cbor_text(b"lora") + _cbor_text(lora) + _cbor_text(path) if tagged else _cbor_text(lora))
    if salt:
        items.append(_cbor_head(0x80, 2) + _cbor_text(b"cache_salt") + _cbor_text(salt) if tagged else _cbor_text(salt))
    if not items:
        return b"\xf6"  # null
    return _cbor_head(0x80, len(items)) + b"".join(items)


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


def _fresh(b):
    """A new str object for b's text: vLLM hands each request field its own object, and
    pickle writes a back-reference for an object it already wrote (CPython's cached
    one-character strings are shared either way, as in the engine)."""
    return b.decode("utf-8") if b else ""


def _none_hash(prof):
    """vLLM's NONE_HASH: the hash of the seed text (the fixed default when unset)."""
    text = _DEFAULT_NONE_HASH_SEED if prof.seed == _SEED_UNSET else prof.seed
    if prof.algorithm.endswith("_cbor"):
        pre = _cbor_text(text.encode("utf-8"))
    else:
        pre = pickle.dumps(text, protocol=5)
    return _digest(prof.algorithm, pre)


def _digest(algorithm, pre):
    if algorithm.startswith("xxhash"):
        return xxh3_128_digest(pre)
    return hashlib.sha256(pre).digest()


def _vllm_keys(prof, bs, tokens, lora, salt):
    L = prof.lookahead
    n = max(len(tokens) - L, 0) // bs
    out = []
    parent = _none_hash(prof)
    path = prof.lora_path.encode("utf-8") if prof.tagged else b""
    if not prof.algorithm.endswith("_cbor"):
        lora_s, path_s, salt_s = _fresh(lora), _fresh(path), _fresh(salt)

        def extras(with_salt):
            keys = []
            if lora_s:
                keys.append(("lora", lora_s, path_s) if prof.tagged else lora_s)
            if with_salt and salt_s:
                keys.append(("cache_salt", salt_s) if prof.tagged else salt_s)
            return tuple(keys) if keys else None

        first, later = extras(True), extras(False)
        for i in range(n):
            e = first if i == 0 else later
            if L:
                e = (e, *tokens[(i + 1) * bs : (i + 1) * bs + L])
            block = tuple(tokens[i * bs : (i + 1) * bs])
            parent = _digest(prof.algorithm, pickle.dumps((parent, block, e), protocol=5))
            out.append(_U64_BE.unpack_from(parent, len(parent) - 8)[0])
        return out
    first = _cbor_extras(lora, path, salt, prof.tagged)
    later = _cbor_extras(lora, path, b"", prof.tagged)
    if L:
        head = _cbor_head(0x80, 1 + L)
        first, later = head + first, head + later
    for i in range(n):
        pre = b"\x83" + _cbor_head(0x40, len(parent)) + parent + _cbor_tokens(tokens[i * bs : (i + 1) * bs]) + (first if i == 0 else later)
        if L:
            pre += b"".join(_cbor_int(t) for t in tokens[(i + 1) * bs : (i + 1) * bs + L])
        parent = _digest(prof.algorithm, pre)
        out.append(_U64_BE.unpack_from(parent, len(parent) - 8)[0])
    return out


def _sglang_namespace(lora, path):
    """SGLang >= 0.5.23's kv-event namespace of an adapter from --lora-paths: its id is
    uuid5(NAMESPACE_URL, name + NUL + path), the request's whole extra_key."""
    extra_key = uuid.uuid5(uuid.NAMESPACE_URL, lora + "\x00" + path).hex.encode("ascii")
    return hashlib.sha256(_SGLANG_NAMESPACE_TAG + b"\x01" + _U64_LE.pack(len(extra_key)) + extra_key + b"\x00").digest()


def _sglang_keys(bigram, bs, tokens, salt, namespace=None):
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
        if namespace is None:
            out.append(_U64_BE.unpack_from(parent, 0)[0])
        else:
            out.append(_U64_BE.unpack_from(sha(namespace + parent[:8]).digest(), 0)[0])
    return out


def _root_digest(prof):
    """root_digest as views show it: NONE_HASH (zeros for SGLang) unless the profile uses a
    field NONE_HASH does not cover (an xxhash algorithm, tagged extra keys, lora_path,
    lookahead), then SHA-256 of a fold of NONE_HASH and those fields (hashing.RootDigest)."""
    root = _none_hash(prof) if prof.strategy == "vllm_v1" else bytes(32)
    if not (prof.algorithm.startswith("xxhash") or prof.tagged or prof.lora_path or prof.lookahead):
        return root.hex()
    path = prof.lora_path.encode("utf-8")
    alg = prof.algorithm.encode("ascii")
    fold = (_ROOT_FOLD_PREFIX + bytes([len(alg)]) + alg + root + bytes([1 if prof.tagged else 0])
            + _U64_LE.pack(len(path)) + path + _U64_LE.pack(prof.lookahead))
    return hashlib.sha256(fold).hexdigest()


def block_keys(token_ids, hash_profile, block_size, lora_name="", cache_salt=""):
    """The prompt's block keys as ints: what the engines publish, what /query_by_hash takes.

    hash_profile is a registration's profile dict (``strategy``, ``algorithm``,
    ``python_hash_seed``, ``index_projection``, and optionally ``extra_keys``
    (``"untagged"``/``"tagged"``), ``lora_path``, ``lookahead_tokens``; a ``root_digest``
    from a view is accepted and must match). vllm_v1 hashes complete blocks only, and with
    ``lookahead_tokens`` L only those followed by L tokens; sglang also hashes the final
    partial block; sglang_bigram hashes adjacent token pairs. lora_name is part of vLLM
    hashes (with ``lora_path`` when tagged) and of SGLang >= 0.5.23's when the profile has
    ``lora_path``; cache_salt salts block 0 (vLLM) or seeds the chain (SGLang).
    Raises ValueError for an invalid profile, block size or token.
    """
    prof = _resolve(hash_profile)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError("block_size must be a positive int, got %r" % (block_size,))
    lora = _check_str("lora_name", lora_name)
    salt = _check_str("cache_salt", cache_salt)
    if prof.lora_path and not lora:
        raise ValueError("lora_path needs a non-empty lora_name")
    if prof.tagged and lora and not prof.lora_path:
        raise ValueError('lora_path is required with extra_keys "tagged" and a lora_name')
    try:
        tokens = _wire._i32_array(token_ids)
    except _wire.WireError as exc:
        raise ValueError("token_ids: %s" % exc) from None
    if "root_digest" in hash_profile and hash_profile["root_digest"] != _root_digest(prof):
        raise ValueError("hash_profile.root_digest does not match the profile")
    if prof.strategy == "vllm_v1":
        return _vllm_keys(prof, block_size, tokens.tolist(), lora, salt)
    namespace = _sglang_namespace(lora_name, prof.lora_path) if lora and prof.lora_path else None
    return _sglang_keys(prof.strategy == "sglang_bigram", block_size, tokens, salt, namespace)
