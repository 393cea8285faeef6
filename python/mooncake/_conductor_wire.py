"""coro_rpc framing and struct_pack bodies for the Conductor RPC service.

Private to :mod:`mooncake.conductor`. The wire is yalantinglibs coro_rpc over TCP
with struct_pack (release mode) bodies; see reference-notes.md section 2 for the
byte layout. Only field order and types travel, never names, so the schemas below
must mirror the upstream C++ declarations exactly: a changed field changes the type
code and the peer rejects the body.

Schemas are small tuples so that one generic walker can both encode and decode every
message (the tests rely on this to play the server side from the same definitions).
"""

import array
import struct
import sys

__all__ = [
    "WireError",
    "FUNC_QUERY",
    "FUNC_REGISTER",
    "FUNC_UNREGISTER",
    "FUNC_GET_GLOBAL_VIEW",
    "FUNC_LIST_SERVICES",
    "FUNC_REGISTER_EX",
    "FUNC_UNREGISTER_ADAPTER",
    "FUNC_LIST_SERVICE_DETAILS",
    "REQUEST_HEADER_SIZE",
    "RESPONSE_HEADER_SIZE",
    "encode",
    "decode",
    "pack_request_header",
    "unpack_response_header",
]


class WireError(ValueError):
    """A body or frame that does not match the expected struct_pack layout."""


# coro_rpc function ids: first 4 bytes of MD5("mooncake::conductor::kvevent::ConductorService::X"),
# read big-endian. The tests recompute them.
FUNC_QUERY = 0x479276FF
FUNC_REGISTER = 0x7027662F
FUNC_UNREGISTER = 0x3DFFB565
FUNC_GET_GLOBAL_VIEW = 0x8988FAF0
FUNC_LIST_SERVICES = 0x0F74B1BB
# Methods of this conductor beyond upstream's (an upstream conductor answers "function
# not registered"): struct_pack type codes hash a whole structure, so upstream's bodies
# cannot gain fields; these carry what they cannot (hash_profile fields of issue 25,
# index_media, one LoRA adapter's unregistration, the self-check of each service).
FUNC_REGISTER_EX = 0x7A86E5C5
FUNC_UNREGISTER_ADAPTER = 0xFF4FFBB5
FUNC_LIST_SERVICE_DETAILS = 0xD001F69E

#: coro_rpc framework error code of a call to a function the server does not have.
ERRC_FUNCTION_NOT_REGISTERED = 11

RPC_MAGIC = 21
REQUEST_HEADER_SIZE = 20
RESPONSE_HEADER_SIZE = 16

_REQ_HEADER = struct.Struct("<BBBBIIII")
_RESP_HEADER = struct.Struct("<BBBBIII")


def pack_request_header(seq, func_id, body_len):
    """Return the 20-byte coro_rpc request header (struct_pack, msg_type 0, no attachment)."""
    return _REQ_HEADER.pack(RPC_MAGIC, 0, 0, 0, seq & 0xFFFFFFFF, func_id, body_len, 0)


def unpack_response_header(data):
    """Parse a 16-byte response header into (err_code, seq, body_len, attach_len).

    Raises WireError on a bad magic or version: the stream is then out of step and
    the caller must drop the connection.
    """
    magic, version, err_code, _msg_type, seq, length, attach = _RESP_HEADER.unpack(data)
    if magic != RPC_MAGIC:
        raise WireError("response header: bad magic %d" % magic)
    if version != 0:
        raise WireError("response header: unsupported version %d" % version)
    return err_code, seq, length, attach


# ---------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------

I32 = ("i32",)
I64 = ("i64",)
U64 = ("u64",)
BOOL = ("bool",)
STR = ("str",)


def vec(elem):
    """std::vector<elem>: count, then elements."""
    return ("vec", elem)


def set_of(elem):
    """std::set<elem>: count, then ascending keys."""
    return ("set", elem)


def map_of(key, value):
    """std::map<key, value>: count, then ascending (key, value) pairs."""
    return ("map", key, value)


def opt(elem):
    """std::optional<elem>: presence byte, then the value when present."""
    return ("opt", elem)


def fields(*members):
    """A struct or tuple: members in declaration order, no framing."""
    return ("struct", tuple(members))


def expected(value):
    """tl::expected<value, ErrorCode>: 1 then value, or 0 then the int32 error code."""
    return ("expected", value)


_FIXED = {"i32": struct.Struct("<i"), "i64": struct.Struct("<q"), "u64": struct.Struct("<Q")}
_INT_RANGE = {
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
    "u64": (0, (1 << 64) - 1),
}
_INT_NAMES = {"i32": "int32", "i64": "int64", "u64": "uint64"}

CONTEXT_KEY = fields(STR, STR, STR, I64)  # tenant_id, model_name, lora_name, block_size
QUERY_REQUEST = fields(CONTEXT_KEY, vec(I32), opt(STR), opt(STR))
RANK_HIT = fields(I64, I64, I64, I64)  # device(npu), cpu_local, cpu_share, disk
CACHE_HIT = fields(I64, map_of(I64, I64), map_of(I64, RANK_HIT), I64, I64, I64, I64)
QUERY_RESULT = fields(map_of(STR, CACHE_HIT))
QUERY_RESPONSE = expected(QUERY_RESULT)
# strategy, algorithm, python_hash_seed, root_digest, index_projection
HASH_PROFILE = fields(STR, STR, STR, STR, STR)
# endpoint, replay_endpoint, publisher_kind, model_name, lora_name, tenant_id,
# instance_id, block_size, dp_rank, cache_group, hash_profile
SERVICE_CONFIG = fields(STR, STR, I32, STR, STR, STR, STR, I64, I32, opt(I64), HASH_PROFILE)
REGISTER_RESPONSE = expected(fields(STR, BOOL))  # instance_id, is_new
UNREGISTER_ARGS = fields(STR, STR, I32)  # instance_id, tenant_id, dp_rank
UNREGISTER_RESPONSE = expected(fields(STR))  # removed_key
CONTEXT_VIEW = fields(CONTEXT_KEY, HASH_PROFILE, map_of(STR, set_of(I64)), U64)
GLOBAL_VIEW = fields(I32, vec(CONTEXT_VIEW))
SERVICE_LIST = vec(SERVICE_CONFIG)
# extra_keys, lora_path, lookahead_tokens
PROFILE_EXT = fields(STR, STR, I64)
# config, profile fields, index_media (absent: the publisher's default media)
REGISTER_EX_ARGS = fields(SERVICE_CONFIG, PROFILE_EXT, opt(vec(STR)))
UNREGISTER_ADAPTER_ARGS = fields(STR, STR, I32, STR)  # instance_id, tenant_id, dp_rank, lora_name
# config, profile fields, index_media, hash_check
SERVICE_DETAIL_LIST = vec(fields(SERVICE_CONFIG, PROFILE_EXT, vec(STR), STR))

# Type codes with the metainfo bit (bit 0) clear, as computed from the upstream types.
TC_QUERY_REQUEST = 0xF9001A1C
TC_QUERY_RESPONSE = 0xADD5D2CC
TC_SERVICE_CONFIG = 0xF2A72A10
TC_REGISTER_RESPONSE = 0xD89001A8
TC_UNREGISTER_ARGS = 0x9981CA1A
TC_UNREGISTER_RESPONSE = 0xF354385C
TC_GLOBAL_VIEW = 0x3A0BDE58
TC_SERVICE_LIST = 0x667842F8
TC_REGISTER_EX_ARGS = 0x5D787D80
TC_UNREGISTER_ADAPTER_ARGS = 0x6192B998
TC_SERVICE_DETAIL_LIST = 0x6A84E2DA

# Publisher kinds (int32 enum on the wire).
PUBLISHER_KINDS = {"vLLM": 0, "Mooncake": 1, "SGLang": 2}
PUBLISHER_NAMES = {v: k for k, v in PUBLISHER_KINDS.items()}

_LEN_FORMATS = {1: struct.Struct("<B"), 2: struct.Struct("<H"), 4: struct.Struct("<I"), 8: struct.Struct("<Q")}
_WIDTH_BITS = {1: 0x00, 2: 0x08, 4: 0x10, 8: 0x18}
_BITS_WIDTH = {v: k for k, v in _WIDTH_BITS.items()}

# array('i') is the fast path for token vectors; it is only usable when C int is 32 bits.
_FAST_I32 = array.array("i").itemsize == 4
_BIG_ENDIAN = sys.byteorder == "big"


def _as_bytes(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WireError("string is not encodable as UTF-8: %s" % exc) from None
    raise WireError("expected str, got %s" % type(value).__name__)


def _i32_array(values):
    """Token ids as an int32 array (validated: integers only, no bools, in int32 range)."""
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        # array("i", b"...") would reinterpret raw bytes as machine ints.
        raise WireError("token ids must be a sequence of integers, not %s" % type(values).__name__)
    if isinstance(values, array.array) and values.typecode == "i" and _FAST_I32:
        return values
    if not isinstance(values, (list, tuple)):
        try:
            values = list(values)
        except TypeError:
            raise WireError("token ids must be a sequence of integers, not %s" % type(values).__name__) from None
    packed = _pack_i32_le(values)
    if packed is not None and _FAST_I32:
        out = array.array("i")
        out.frombytes(packed)
        if _BIG_ENDIAN:  # pragma: no cover - little-endian hosts only in CI
            out.byteswap()
        return out
    # Slow path, reached only by invalid input (or a platform whose C int is not 32
    # bits): the same checks one by one, for a precise error.
    if bool in set(map(type, values)):
        raise WireError("token ids must be integers, not bool")
    if _FAST_I32:
        try:
            return array.array("i", values)
        except (TypeError, OverflowError) as exc:
            raise WireError("token ids must be int32 integers: %s" % exc) from None
    lo, hi = _INT_RANGE["i32"]  # pragma: no cover - platforms where C int is not 32 bits
    for v in values:  # pragma: no cover
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > hi:
            raise WireError("token id %r is not an int32 integer" % (v,))
    return array.array("l", values)  # pragma: no cover


def _pack_i32_le(values):
    """values (a list or tuple) as little-endian int32 bytes, or None when one is not an
    int32 integer (a bool counts as not one).

    struct.pack checks type and range in one C loop. It takes bools as 0 and 1, whose
    packed words have a zero second byte; so only the elements with a zero byte there
    (found in the strided second-byte plane at memchr speed: ~1 in 256 ids of a prompt)
    are looked at one by one. A prompt with many such ids (more than len/16 + 64)
    falls back to one type scan.
    """
    try:
        packed = struct.pack("<%di" % len(values), *values)
    except struct.error:
        return None
    plane = packed[1::4]
    pos = plane.find(0)
    budget = (len(values) >> 4) + 64
    while pos >= 0:
        v = values[pos]
        if v is True or v is False:
            return None
        budget -= 1
        if not budget:
            return None if bool in set(map(type, values)) else packed
        pos = plane.find(0, pos + 1)
    return packed


def _max_len(schema, value):
    """Longest string or container in value: it fixes the width of every length."""
    tag = schema[0]
    if tag == "str":
        return len(value)
    if tag in ("i32", "i64", "u64", "bool"):
        return 0
    if tag == "vec":
        n = len(value)
        if schema[1][0] in _FIXED:
            return n
        return max([n] + [_max_len(schema[1], v) for v in value])
    if tag == "set":
        return max([len(value)] + [_max_len(schema[1], v) for v in value])
    if tag == "map":
        best = len(value)
        for k, v in value.items():
            best = max(best, _max_len(schema[1], k), _max_len(schema[2], v))
        return best
    if tag == "opt":
        return 0 if value is None else _max_len(schema[1], value)
    if tag == "struct":
        best = 0
        for sub, v in zip(schema[1], value):
            best = max(best, _max_len(sub, v))
        return best
    if tag == "expected":
        ok, v = value
        return _max_len(schema[1], v) if ok else 0
    raise AssertionError("unknown schema tag %r" % (tag,))


def _prepare(schema, value):
    """Validate value against schema and turn strings into bytes, token lists into arrays.

    Done once before sizing so the two passes see the same, already-checked data.
    """
    tag = schema[0]
    if tag == "str":
        return _as_bytes(value)
    if tag in _INT_RANGE:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError("expected %s integer, got %s" % (_INT_NAMES[tag], type(value).__name__))
        lo, hi = _INT_RANGE[tag]
        if value < lo or value > hi:
            raise WireError("%d out of %s range" % (value, _INT_NAMES[tag]))
        return value
    if tag == "bool":
        if not isinstance(value, bool):
            raise WireError("expected bool, got %s" % type(value).__name__)
        return value
    if tag == "vec":
        if schema[1] == I32:
            return _i32_array(value)
        return [_prepare(schema[1], v) for v in value]
    if tag == "set":
        items = [_prepare(schema[1], v) for v in value]
        return sorted(set(items))
    if tag == "map":
        items = [(_prepare(schema[1], k), _prepare(schema[2], v)) for k, v in value.items()]
        # std::map order: ascending keys; strings compare as unsigned bytes.
        items.sort(key=lambda kv: kv[0])
        return dict(items)
    if tag == "opt":
        return None if value is None else _prepare(schema[1], value)
    if tag == "struct":
        members = schema[1]
        if len(value) != len(members):
            raise WireError("expected %d fields, got %d" % (len(members), len(value)))
        return tuple(_prepare(sub, v) for sub, v in zip(members, value))
    if tag == "expected":
        ok, v = value
        if ok:
            return (True, _prepare(schema[1], v))
        return (False, _prepare(I32, v))
    raise AssertionError("unknown schema tag %r" % (tag,))


def _write(schema, value, out, lenfmt):
    tag = schema[0]
    if tag == "str":
        out += lenfmt.pack(len(value))
        out += value
    elif tag in _FIXED:
        out += _FIXED[tag].pack(value)
    elif tag == "bool":
        out.append(1 if value else 0)
    elif tag == "vec":
        out += lenfmt.pack(len(value))
        if schema[1] == I32:
            if _BIG_ENDIAN:  # pragma: no cover - little-endian hosts only in CI
                value = array.array(value.typecode, value)
                value.byteswap()
            if value.itemsize == 4:
                out += value.tobytes()
            else:  # pragma: no cover
                out += struct.pack("<%di" % len(value), *value)
        else:
            for v in value:
                _write(schema[1], v, out, lenfmt)
    elif tag == "set":
        out += lenfmt.pack(len(value))
        for v in value:
            _write(schema[1], v, out, lenfmt)
    elif tag == "map":
        out += lenfmt.pack(len(value))
        for k, v in value.items():
            _write(schema[1], k, out, lenfmt)
            _write(schema[2], v, out, lenfmt)
    elif tag == "opt":
        if value is None:
            out.append(0)
        else:
            out.append(1)
            _write(schema[1], value, out, lenfmt)
    elif tag == "struct":
        for sub, v in zip(schema[1], value):
            _write(sub, v, out, lenfmt)
    elif tag == "expected":
        ok, v = value
        if ok:
            out.append(1)
            _write(schema[1], v, out, lenfmt)
        else:
            out.append(0)
            out += _FIXED["i32"].pack(v)
    else:
        raise AssertionError("unknown schema tag %r" % (tag,))


def length_width(max_len):
    """Bytes per length field for an object whose longest string/container has max_len entries."""
    if max_len < 1 << 8:
        return 1
    if max_len < 1 << 16:
        return 2
    if max_len < 1 << 32:
        return 4
    return 8


def encode(schema, type_code, value):
    """Encode value as a release-mode struct_pack body with the given type code.

    Strings may be str or bytes; maps and sets are sorted as std::map/std::set would be.
    Raises WireError when value does not fit the schema (wrong type, integer overflow).
    """
    value = _prepare(schema, value)
    width = length_width(_max_len(schema, value))
    out = bytearray()
    if width == 1:
        out += struct.pack("<I", type_code & ~1)
    else:
        out += struct.pack("<I", type_code | 1)
        out.append(_WIDTH_BITS[width])
    _write(schema, value, out, _LEN_FORMATS[width])
    return bytes(out)


def _min_size(schema, width):
    """Smallest encoding of one element: bounds a count before anything is allocated."""
    tag = schema[0]
    if tag in ("i32",):
        return 4
    if tag in ("i64", "u64"):
        return 8
    if tag in ("bool", "opt", "expected"):
        return 1
    if tag in ("str", "vec", "set", "map"):
        return width
    if tag == "struct":
        return sum(_min_size(s, width) for s in schema[1])
    raise AssertionError("unknown schema tag %r" % (tag,))


class _Reader:
    __slots__ = ("buf", "pos", "lenfmt", "width")

    def __init__(self, buf, pos, width):
        self.buf = buf
        self.pos = pos
        self.width = width
        self.lenfmt = _LEN_FORMATS[width]

    def take(self, n, what):
        end = self.pos + n
        if end > len(self.buf):
            raise WireError("truncated body: %s needs %d bytes at offset %d, %d left" % (what, n, self.pos, len(self.buf) - self.pos))
        chunk = self.buf[self.pos:end]
        self.pos = end
        return chunk

    def count(self, elem_schema, what):
        (n,) = self.lenfmt.unpack(self.take(self.width, what + " length"))
        need = n * _min_size(elem_schema, self.width) if elem_schema is not None else n
        if need > len(self.buf) - self.pos:
            raise WireError("%s length %d exceeds the %d bytes left" % (what, n, len(self.buf) - self.pos))
        return n

    def read(self, schema):
        tag = schema[0]
        if tag == "str":
            n = self.count(None, "string")
            return bytes(self.take(n, "string")).decode("utf-8", "replace")
        if tag in _FIXED:
            fmt = _FIXED[tag]
            return fmt.unpack(self.take(fmt.size, tag))[0]
        if tag == "bool":
            return self.take(1, "bool")[0] != 0
        if tag == "vec":
            n = self.count(schema[1], "vector")
            if schema[1] == I32:
                raw = self.take(4 * n, "int32 vector")
                return list(struct.unpack("<%di" % n, raw))
            return [self.read(schema[1]) for _ in range(n)]
        if tag == "set":
            n = self.count(schema[1], "set")
            return {self.read(schema[1]) for _ in range(n)}
        if tag == "map":
            n = self.count(("struct", (schema[1], schema[2])), "map")
            out = {}
            for _ in range(n):
                k = self.read(schema[1])
                out[k] = self.read(schema[2])
            return out
        if tag == "opt":
            flag = self.take(1, "optional flag")[0]
            if flag == 0:
                return None
            if flag != 1:
                raise WireError("optional flag %d is neither 0 nor 1" % flag)
            return self.read(schema[1])
        if tag == "struct":
            return tuple(self.read(sub) for sub in schema[1])
        if tag == "expected":
            flag = self.take(1, "expected flag")[0]
            if flag == 1:
                return (True, self.read(schema[1]))
            if flag == 0:
                return (False, _FIXED["i32"].unpack(self.take(4, "error code"))[0])
            raise WireError("expected flag %d is neither 0 nor 1" % flag)
        raise AssertionError("unknown schema tag %r" % (tag,))


def decode(schema, type_code, body):
    """Decode a struct_pack body; strict about type code, lengths and trailing bytes.

    Structs come back as tuples, maps as dicts, sets as Python sets, optionals as
    None or the value, expected<T> as (True, T) or (False, error_code).
    """
    buf = memoryview(body).cast("B") if not isinstance(body, bytes) else body
    pos, width = _payload_start(buf, type_code)
    reader = _Reader(buf, pos, width)
    value = reader.read(schema)
    if reader.pos != len(buf):
        raise WireError("%d trailing bytes after the body" % (len(buf) - reader.pos))
    return value


# ---------------------------------------------------------------------------
# Query fast path: the same bytes as encode(QUERY_REQUEST, ...) and the same checks as
# decode(QUERY_RESPONSE, ...), written out for the one message that is on every
# request's path (tests compare both against the generic walker).
# ---------------------------------------------------------------------------

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_I64X4 = struct.Struct("<4q")
_I64X2 = struct.Struct("<2q")
_I64X9 = struct.Struct("<9q")
_LEN_CHARS = {1: "B", 2: "H", 4: "I", 8: "Q"}
_QLEN = {w: struct.Struct("<q" + c) for w, c in _LEN_CHARS.items()}
_QQLEN = {w: struct.Struct("<qq" + c) for w, c in _LEN_CHARS.items()}
# longest, dp count, (rank, device), rank_matches count, (rank, 4 tiers), 4 instance tiers
_ONE_RANK_HIT = {w: struct.Struct("<q%sqq%s9q" % (c, c)) for w, c in _LEN_CHARS.items()}


def _i32_bytes(tokens):
    """Little-endian int32 bytes of a token sequence (validated as _i32_array does)."""
    if type(tokens) is list or type(tokens) is tuple:
        packed = _pack_i32_le(tokens)
        if packed is not None:
            return len(tokens), packed
    arr = _i32_array(tokens)  # raises WireError with the precise reason
    if _BIG_ENDIAN or arr.itemsize != 4:  # pragma: no cover - little-endian hosts only in CI
        return len(arr), struct.pack("<%di" % len(arr), *arr)
    return len(arr), arr.tobytes()


def encode_query(tenant_id, model_name, lora_name, block_size, token_ids, cache_salt, instance_filter):
    """encode(QUERY_REQUEST, TC_QUERY_REQUEST, ((tenant, model, lora, block_size),
    token_ids, cache_salt, instance_filter)) without the generic walk; cache_salt and
    instance_filter are None when absent."""
    return b"".join(query_parts(tenant_id, model_name, lora_name, block_size, token_ids, cache_salt, instance_filter))


def query_parts(tenant_id, model_name, lora_name, block_size, token_ids, cache_salt, instance_filter):
    """encode_query's body as a list of bytes parts, so that the client joins it with
    the frame header in one copy."""
    return QueryTemplate(tenant_id, model_name, lora_name, block_size, cache_salt, instance_filter).parts(token_ids)


class QueryTemplate:
    """A query request's fields other than the token ids, validated and encoded once
    (per length width), so that a client asking about one context again only packs
    the tokens. Immutable once built; safe to share between threads."""

    __slots__ = ("_fields", "_maxlen", "_fixed")

    def __init__(self, tenant_id, model_name, lora_name, block_size, cache_salt, instance_filter):
        tenant, model, lora = _as_bytes(tenant_id), _as_bytes(model_name), _as_bytes(lora_name)
        salt = None if cache_salt is None else _as_bytes(cache_salt)
        filt = None if instance_filter is None else _as_bytes(instance_filter)
        block_size = _prepare(I64, block_size)
        self._fields = (tenant, model, lora, block_size, salt, filt)
        self._maxlen = max(len(tenant), len(model), len(lora), len(salt or b""), len(filt or b""))
        self._fixed = {}

    def _build(self, width):
        tenant, model, lora, block_size, salt, filt = self._fields
        lenfmt = _LEN_FORMATS[width]
        if width == 1:
            head = [_U32.pack(TC_QUERY_REQUEST & ~1)]
        else:
            head = [_U32.pack(TC_QUERY_REQUEST | 1), bytes((_WIDTH_BITS[width],))]
        head += (lenfmt.pack(len(tenant)), tenant, lenfmt.pack(len(model)), model, lenfmt.pack(len(lora)), lora,
                 _I64.pack(block_size))
        tail = []
        for opt_value in (salt, filt):
            if opt_value is None:
                tail.append(b"\x00")
            else:
                tail += (b"\x01", lenfmt.pack(len(opt_value)), opt_value)
        fixed = (b"".join(head), lenfmt.pack, b"".join(tail))
        self._fixed[width] = fixed
        return fixed

    def parts(self, token_ids):
        """The request body for token_ids as [fields before, token count, tokens, fields after]."""
        n, packed = _i32_bytes(token_ids)
        longest = n if n > self._maxlen else self._maxlen
        width = 1 if longest < 256 else length_width(longest)
        fixed = self._fixed.get(width) or self._build(width)
        return [fixed[0], fixed[1](n), packed, fixed[2]]


def _payload_start(buf, type_code):
    """Check a body's type code and metainfo byte against type_code; return the offset of
    the payload and the width of its lengths. buf is bytes or a byte memoryview."""
    if len(buf) < 4:
        raise WireError("body of %d bytes has no type code" % len(buf))
    (code,) = _U32.unpack_from(buf, 0)
    if code & ~1 != type_code & ~1:
        raise WireError("type code 0x%08x, want 0x%08x" % (code & ~1, type_code & ~1))
    if not code & 1:
        return 4, 1
    if len(buf) < 5:
        raise WireError("metainfo flag set but no metainfo byte")
    meta = buf[4]
    if meta & 0x03:
        raise WireError("metainfo 0x%02x: compatible fields are not part of this protocol" % meta)
    if meta & 0xE0:
        raise WireError("metainfo 0x%02x: reserved bits set" % meta)
    width = _BITS_WIDTH[meta & 0x18]
    if not meta & 0x04:
        return 5, width
    # Debug builds append the full type literal, NUL-terminated; skip it.
    end = bytes(buf[5:]).find(b"\x00")
    if end < 0:
        raise WireError("unterminated type information")
    return 5 + end + 1, width


def decode_query_response(body):
    """decode(QUERY_RESPONSE, ...) straight into the client's result shape:
    (True, {instance_id: hit dict}) or (False, error_code). Raises WireError like decode."""
    buf = body if isinstance(body, bytes) else bytes(body)
    size = len(buf)
    pos, width = _payload_start(buf, TC_QUERY_RESPONSE)
    lenfmt = _LEN_FORMATS[width]
    unpack_len = lenfmt.unpack_from
    unpack_i64, unpack_2, unpack_4 = _I64.unpack_from, _I64X2.unpack_from, _I64X4.unpack_from
    try:
        flag = buf[pos]
        pos += 1
        if flag == 0:
            (err,) = _FIXED["i32"].unpack_from(buf, pos)
            pos += 4
            value = (False, err)
        elif flag != 1:
            raise WireError("expected flag %d is neither 0 nor 1" % flag)
        else:
            (count,) = unpack_len(buf, pos)
            pos += width
            # Each entry takes at least a string length, 5 i64 and two map lengths.
            if count * (3 * width + 40) > size - pos:
                raise WireError("map length %d exceeds the %d bytes left" % (count, size - pos))
            hits = {}
            # An instance with one rank in dp and in rank_matches (the usual shape) is
            # read with one unpack after its name; any other shape one run at a time.
            unpack_qlen, unpack_qqlen = _QLEN[width].unpack_from, _QQLEN[width].unpack_from
            unpack_9, unpack_one = _I64X9.unpack_from, _ONE_RANK_HIT[width].unpack_from
            one_size = _ONE_RANK_HIT[width].size
            for _ in range(count):
                (n,) = unpack_len(buf, pos)
                pos += width
                if pos + n > size:
                    raise WireError("truncated body: string needs %d bytes at offset %d" % (n, pos))
                inst = buf[pos : pos + n].decode("utf-8", "replace")
                pos += n
                if pos + one_size <= size:
                    longest, ndp, rank, count_dev, nr, rank2, d, cl, cs, dk, d2, cl2, cs2, dk2 = unpack_one(buf, pos)
                    if ndp == 1 and nr == 1:
                        pos += one_size
                        key = str(rank)
                        hits[inst] = {"longest_matched": longest, "dp": {key: count_dev},
                                      "rank_matches": {key if rank2 == rank else str(rank2):
                                                       {"device": d, "cpu_local": cl, "cpu_share": cs, "disk": dk}},
                                      "device": d2, "cpu_local": cl2, "cpu_share": cs2, "disk": dk2}
                        continue
                longest, n = unpack_qlen(buf, pos)
                pos += 8 + width
                if n == 1:
                    rank, count_dev, n = unpack_qqlen(buf, pos)
                    pos += 16 + width
                    dp = {str(rank): count_dev}
                else:
                    if n * 16 > size - pos:
                        raise WireError("map length %d exceeds the %d bytes left" % (n, size - pos))
                    dp = {}
                    for _ in range(n):
                        rank, count_dev = unpack_2(buf, pos)
                        pos += 16
                        dp[str(rank)] = count_dev
                    (n,) = unpack_len(buf, pos)
                    pos += width
                if n == 1:
                    rank, d, cl, cs, dk, d2, cl2, cs2, dk2 = unpack_9(buf, pos)
                    pos += 72
                    ranks = {str(rank): {"device": d, "cpu_local": cl, "cpu_share": cs, "disk": dk}}
                    hits[inst] = {"longest_matched": longest, "dp": dp, "rank_matches": ranks,
                                  "device": d2, "cpu_local": cl2, "cpu_share": cs2, "disk": dk2}
                    continue
                if n * 40 > size - pos:
                    raise WireError("map length %d exceeds the %d bytes left" % (n, size - pos))
                ranks = {}
                for _ in range(n):
                    (rank,) = unpack_i64(buf, pos)
                    d, cl, cs, dk = unpack_4(buf, pos + 8)
                    pos += 40
                    ranks[str(rank)] = {"device": d, "cpu_local": cl, "cpu_share": cs, "disk": dk}
                d, cl, cs, dk = unpack_4(buf, pos)
                pos += 32
                hits[inst] = {"longest_matched": longest, "dp": dp, "rank_matches": ranks,
                              "device": d, "cpu_local": cl, "cpu_share": cs, "disk": dk}
            value = (True, hits)
    except (struct.error, IndexError):
        raise WireError("truncated body at offset %d" % pos) from None
    if pos != size:
        raise WireError("%d trailing bytes after the body" % (size - pos))
    return value
