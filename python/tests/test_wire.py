"""struct_pack codec and coro_rpc framing against the golden bytes, both directions."""

import hashlib
import struct

import pytest

import goldens as g
from mooncake import _conductor_wire as w

# (name, schema, type code, golden bytes, value)
SHORT_GOLDENS = [
    ("query_args", w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS, g.QUERY_ARGS_VALUE),
    ("query_args_salt_filter", w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS_SALT_FILTER, g.QUERY_ARGS_SALT_FILTER_VALUE),
    ("query_resp_empty", w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_EMPTY, g.QUERY_RESP_EMPTY_VALUE),
    ("query_resp_one", w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_ONE, g.QUERY_RESP_ONE_VALUE),
    ("query_resp_invalid", w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_INVALID, g.QUERY_RESP_INVALID_VALUE),
    ("register_args", w.SERVICE_CONFIG, w.TC_SERVICE_CONFIG, g.REGISTER_ARGS, g.REGISTER_ARGS_VALUE),
    ("register_resp_ok", w.REGISTER_RESPONSE, w.TC_REGISTER_RESPONSE, g.REGISTER_RESP_OK, g.REGISTER_RESP_OK_VALUE),
    ("unregister_args", w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, g.UNREGISTER_ARGS, g.UNREGISTER_ARGS_VALUE),
    (
        "unregister_resp_not_found",
        w.UNREGISTER_RESPONSE,
        w.TC_UNREGISTER_RESPONSE,
        g.UNREGISTER_RESP_NOT_FOUND,
        g.UNREGISTER_RESP_NOT_FOUND_VALUE,
    ),
    ("unregister_resp_ok", w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, g.UNREGISTER_RESP_OK, g.UNREGISTER_RESP_OK_VALUE),
    ("global_view_empty", w.GLOBAL_VIEW, w.TC_GLOBAL_VIEW, g.GLOBAL_VIEW_EMPTY, g.GLOBAL_VIEW_EMPTY_VALUE),
    ("list_services_empty", w.SERVICE_LIST, w.TC_SERVICE_LIST, g.LIST_SERVICES_EMPTY, g.LIST_SERVICES_EMPTY_VALUE),
    # long payloads given in full
    ("query_args_300", w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS_300, g.QUERY_ARGS_300_VALUE),
    ("query_args_long_model", w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS_LONG_MODEL, g.QUERY_ARGS_LONG_MODEL_VALUE),
    ("global_view_one", w.GLOBAL_VIEW, w.TC_GLOBAL_VIEW, g.GLOBAL_VIEW_ONE, g.GLOBAL_VIEW_ONE_VALUE),
    ("list_services_sglang", w.SERVICE_LIST, w.TC_SERVICE_LIST, g.LIST_SERVICES_SGLANG, g.LIST_SERVICES_SGLANG_VALUE),
]

# (name, schema, type code, Digest, value): goldens known by length, head and SHA-256.
DIGEST_GOLDENS = [
    ("query_args_70000", w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS_70000, g.QUERY_ARGS_70000_VALUE),
    ("query_resp_300", w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_300, g.QUERY_RESP_300_VALUE),
    ("global_view_300", w.GLOBAL_VIEW, w.TC_GLOBAL_VIEW, g.GLOBAL_VIEW_300, g.GLOBAL_VIEW_300_VALUE),
]


@pytest.mark.parametrize("name,schema,tc,golden,value", SHORT_GOLDENS, ids=[c[0] for c in SHORT_GOLDENS])
def test_encode_matches_golden(name, schema, tc, golden, value):
    assert w.encode(schema, tc, value).hex() == golden.hex()


@pytest.mark.parametrize("name,schema,tc,golden,value", SHORT_GOLDENS, ids=[c[0] for c in SHORT_GOLDENS])
def test_decode_golden(name, schema, tc, golden, value):
    assert w.decode(schema, tc, golden) == value


@pytest.mark.parametrize("name,schema,tc,digest,value", DIGEST_GOLDENS, ids=[c[0] for c in DIGEST_GOLDENS])
def test_long_golden_both_directions(name, schema, tc, digest, value):
    body = w.encode(schema, tc, value)
    assert digest.matches(body), (len(body), body[:24].hex(), hashlib.sha256(body).hexdigest())
    # body is now byte-identical to the golden, so decoding it decodes the golden.
    assert w.decode(schema, tc, body) == value


def test_function_ids_are_md5_of_qualified_names():
    prefix = "mooncake::conductor::kvevent::ConductorService::"
    for method, fid in [
        ("Query", w.FUNC_QUERY),
        ("Register", w.FUNC_REGISTER),
        ("Unregister", w.FUNC_UNREGISTER),
        ("GetGlobalView", w.FUNC_GET_GLOBAL_VIEW),
        ("ListServices", w.FUNC_LIST_SERVICES),
        ("RegisterEx", w.FUNC_REGISTER_EX),
        ("UnregisterAdapter", w.FUNC_UNREGISTER_ADAPTER),
        ("ListServiceDetails", w.FUNC_LIST_SERVICE_DETAILS),
    ]:
        digest = hashlib.md5((prefix + method).encode()).digest()
        assert int.from_bytes(digest[:4], "big") == fid, method
    assert w.pack_request_header(1, w.FUNC_QUERY, 0)[8:12] == bytes.fromhex("ff769247")


def test_request_header_layout():
    hdr = w.pack_request_header(0x01020304, w.FUNC_REGISTER, 77)
    assert len(hdr) == w.REQUEST_HEADER_SIZE == 20
    assert hdr == bytes([21, 0, 0, 0]) + struct.pack("<IIII", 0x01020304, 0x7027662F, 77, 0)
    # seq wraps at 32 bits rather than overflowing the field
    assert w.pack_request_header(1 << 32 | 5, 1, 0)[4:8] == struct.pack("<I", 5)


def test_response_header_parse_and_reject():
    raw = bytes([21, 0, 7, 0]) + struct.pack("<III", 9, 100, 3)
    assert w.unpack_response_header(raw) == (7, 9, 100, 3)
    with pytest.raises(w.WireError, match="magic"):
        w.unpack_response_header(bytes([22, 0, 0, 0]) + bytes(12))
    with pytest.raises(w.WireError, match="version"):
        w.unpack_response_header(bytes([21, 1, 0, 0]) + bytes(12))


# ---- metainfo and length widths ---------------------------------------------------------


def _args_with_model(n):
    return (("default", "x" * n, "", 16), [1], None, None)


@pytest.mark.parametrize(
    "n,width,meta",
    [(0, 1, None), (255, 1, None), (256, 2, 0x08), (65535, 2, 0x08), (65536, 4, 0x10)],
)
def test_string_length_switches_width(n, width, meta):
    body = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, _args_with_model(n))
    code = struct.unpack_from("<I", body)[0]
    if meta is None:
        assert code == w.TC_QUERY_REQUEST
        pos = 4
    else:
        assert code == w.TC_QUERY_REQUEST | 1
        assert body[4] == meta
        pos = 5
    # every length in the object uses the same width: tenant "default" comes first
    assert int.from_bytes(body[pos : pos + width], "little") == 7
    assert len(body) == pos + 3 * width + 7 + n + 8 + width + 4 + 2
    assert w.decode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, body) == _args_with_model(n)


@pytest.mark.parametrize("n,meta", [(255, None), (256, 0x08), (65535, 0x08), (65536, 0x10)])
def test_container_count_switches_width(n, meta):
    value = (("default", "m", "", 16), list(range(n)), None, None)
    body = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, value)
    assert (body[4] if meta else None) == meta
    assert w.decode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, body) == value


def test_nested_map_drives_width():
    # the longest container is deep inside a response: 300 instances
    body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_300_VALUE)
    assert body[:6] == bytes.fromhex("cdd2d5ad0801")


def test_decode_eight_byte_lengths():
    # LEN_SIZE 11: nobody sends it for real sizes, but a decoder must honour it.
    body = struct.pack("<I", w.TC_UNREGISTER_RESPONSE | 1) + bytes([0x18, 1]) + struct.pack("<Q", 3) + b"a|b"
    assert w.decode(w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, body) == (True, ("a|b",))
    assert w.length_width(1 << 32) == 8


def test_decode_skips_debug_type_info():
    # ADD_TYPE_INFO (debug builds): a NUL-terminated type literal follows the metainfo byte.
    body = struct.pack("<I", w.TC_UNREGISTER_RESPONSE | 1) + bytes([0x04]) + b"\x07\x08\x09\x00" + bytes([1, 1]) + b"k"
    assert w.decode(w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, body) == (True, ("k",))


def test_map_and_set_order_follows_std_map():
    value = (True, ({"z": g._HIT16, "é": g._HIT16, "a": g._HIT16, "B": g._HIT16},))
    body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, value)
    keys = list(w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, body)[1][0])
    assert keys == ["B", "a", "z", "é"]  # unsigned byte order: 0x42 < 0x61 < 0x7a < 0xc3
    gv = (1, [(g.CONTEXT, g.PROFILE_RESOLVED, {"e": {5, -1, 3}}, 1)])
    raw = w.encode(w.GLOBAL_VIEW, w.TC_GLOBAL_VIEW, gv)
    ranks = raw[-(8 + 3 * 8) : -8]
    assert [struct.unpack_from("<q", ranks, i)[0] for i in (0, 8, 16)] == [-1, 3, 5]


def test_utf8_strings_round_trip():
    value = ("实例-0", "tenant-é", 3)
    body = w.encode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, value)
    assert body[4] == len("实例-0".encode())
    assert w.decode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, body) == value


# ---- strict decoding --------------------------------------------------------------------


def test_decode_rejects_wrong_type_code():
    with pytest.raises(w.WireError, match="type code"):
        w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.REGISTER_RESP_OK)


@pytest.mark.parametrize("golden", [g.QUERY_RESP_ONE, g.REGISTER_ARGS, g.GLOBAL_VIEW_ONE, g.LIST_SERVICES_SGLANG])
def test_decode_rejects_every_truncation(golden):
    schema, tc = {
        g.QUERY_RESP_ONE: (w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE),
        g.REGISTER_ARGS: (w.SERVICE_CONFIG, w.TC_SERVICE_CONFIG),
        g.GLOBAL_VIEW_ONE: (w.GLOBAL_VIEW, w.TC_GLOBAL_VIEW),
        g.LIST_SERVICES_SGLANG: (w.SERVICE_LIST, w.TC_SERVICE_LIST),
    }[golden]
    for cut in range(len(golden)):
        with pytest.raises(w.WireError):
            w.decode(schema, tc, golden[:cut])


def test_decode_rejects_trailing_bytes():
    with pytest.raises(w.WireError, match="trailing"):
        w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, g.QUERY_RESP_EMPTY + b"\x00")


def test_decode_rejects_oversize_length_without_allocating():
    # a 4-byte count of 2^32-1 instances in a tiny body
    body = struct.pack("<I", w.TC_QUERY_RESPONSE | 1) + bytes([0x10, 1]) + struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(w.WireError, match="exceeds"):
        w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, body)
    body = struct.pack("<I", w.TC_UNREGISTER_RESPONSE) + bytes([1, 200]) + b"short"
    with pytest.raises(w.WireError, match="exceeds"):
        w.decode(w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, body)


@pytest.mark.parametrize(
    "body,match",
    [
        (g.QUERY_RESP_EMPTY[:4] + b"\x02\x00", "expected flag"),
        (g.QUERY_ARGS[:-1] + b"\x02", "optional flag"),
        (struct.pack("<I", w.TC_QUERY_RESPONSE | 1) + b"\x01" + b"\x01\x00", "compatible"),
        (struct.pack("<I", w.TC_QUERY_RESPONSE | 1) + b"\x20" + b"\x01\x00", "reserved"),
        (struct.pack("<I", w.TC_QUERY_RESPONSE | 1), "metainfo"),
        (struct.pack("<I", w.TC_QUERY_RESPONSE | 1) + b"\x04\x01\x02", "unterminated"),
        (b"\xcc\xd2", "type code"),
    ],
)
def test_decode_rejects_malformed(body, match):
    schema, tc = (w.QUERY_REQUEST, w.TC_QUERY_REQUEST) if body[:4] == g.QUERY_ARGS[:4] else (w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE)
    with pytest.raises(w.WireError, match=match):
        w.decode(schema, tc, body)


def test_encode_rejects_values_that_do_not_fit():
    with pytest.raises(w.WireError, match="int32"):
        w.encode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, ("e", "t", 1 << 31))
    with pytest.raises(w.WireError, match="bool"):
        w.encode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, ("e", "t", True))
    with pytest.raises(w.WireError, match="str"):
        w.encode(w.UNREGISTER_ARGS, w.TC_UNREGISTER_ARGS, (5, "t", 1))
    for tokens in ([1 << 31], [-(1 << 31) - 1], [True], [1.0], ["1"], b"\x01\x00\x00\x00", "abc", None):
        with pytest.raises(w.WireError):
            w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, tokens, None, None))


def test_token_sequences_of_any_iterable_kind():
    import array

    expected = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, g.QUERY_ARGS_VALUE)
    for tokens in ((1, 2, 3), range(1, 4), iter([1, 2, 3]), array.array("i", [1, 2, 3])):
        assert w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, tokens, None, None)) == expected
    # int32 bounds themselves are fine
    edge = (g.CONTEXT, [-(1 << 31), (1 << 31) - 1], None, None)
    assert w.decode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, edge)) == edge
