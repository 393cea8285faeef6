"""The query fast path (encode_query, decode_query_response) against the generic
struct_pack walker: same bytes out, same values and same rejections in."""

import array
import random

import pytest

import goldens as g
from mooncake import _conductor_wire as w


def generic_hits(value):
    """The generic decoder's QUERY_RESULT turned into the client's result shape."""
    out = {}
    for inst, hit in value[0].items():
        longest, dp, rank_matches, device, cpu_local, cpu_share, disk = hit
        out[inst] = g.hit(device, cpu_local, cpu_share, disk, {str(r): t for r, t in rank_matches.items()}, longest)
        # dp is its own field on the wire: carried as sent, not derived from the ranks.
        out[inst]["dp"] = {str(r): c for r, c in dp.items()}
    return out


def test_encode_query_matches_generic():
    rng = random.Random(3)
    # Token counts and string lengths straddle the 1/2/4-byte length widths.
    for n in (0, 1, 255, 256, 65535, 65536):
        for strlen in (0, 3, 300):
            for salt, filt in ((None, None), ("s", None), (None, "inst"), ("x" * strlen, "é" * 2)):
                toks = [rng.randrange(-(1 << 31), 1 << 31) for _ in range(n)]
                toks[:4] = [0, 1, -1, (1 << 31) - 1][: len(toks)]
                ctx = ("t" * strlen, "model", "lora", rng.randrange(1, 1 << 40))
                want = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (ctx, toks, salt, filt))
                for form in (toks, tuple(toks), array.array("i", toks), iter(toks)):
                    assert w.encode_query(*ctx, form, salt, filt) == want, (n, strlen, type(form))


def test_encode_query_golden():
    for body, (ctx, tokens, salt, filt) in ((g.QUERY_ARGS, g.QUERY_ARGS_VALUE), (g.QUERY_ARGS_SALT_FILTER, g.QUERY_ARGS_SALT_FILTER_VALUE)):
        assert w.encode_query(*ctx, tokens, salt, filt) == body


@pytest.mark.parametrize("tokens", [[1 << 31], [-(1 << 31) - 1], [True], [2, False], [1.0], ["1"], [None], b"\x01\x00\x00\x00", "abc", None, 5])
def test_encode_query_rejects_like_generic(tokens):
    with pytest.raises(w.WireError) as generic:
        w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, tokens, None, None))
    with pytest.raises(w.WireError) as fast:
        w.encode_query(*g.CONTEXT, tokens, None, None)
    assert str(fast.value) == str(generic.value)


def test_tokens_equal_to_bool_values_are_fine():
    # 0 and 1 (which bools equal) take the exact check and pass; an unaligned 0/1 byte
    # pattern (256 then 0-heavy ids) is only a false alarm.
    for toks in ([0, 1, 0, 1], [256, 65536, 1 << 24], [5, 0, 7]):
        want = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, toks, None, None))
        assert w.encode_query(*g.CONTEXT, toks, None, None) == want


def random_result(rng, n_inst, width_hint):
    hits = {}
    for i in range(n_inst):
        ranks = {r: tuple(rng.randrange(-(1 << 63), 1 << 63) for _ in range(4)) for r in rng.sample(range(-5, 1000), rng.randrange(0, 4))}
        dp = {r: t[0] for r, t in ranks.items()}
        name = ("inst-%d-" % i) + "é" * width_hint
        hits[name] = (rng.randrange(0, 1 << 40), dp, ranks, *(rng.randrange(0, 1 << 40) for _ in range(4)))
    return (hits,)


def test_decode_query_response_matches_generic():
    rng = random.Random(5)
    for n_inst in (0, 1, 8, 300):
        for width_hint in (0, 200, 40000):
            if n_inst > 8 and width_hint > 200:
                continue
            value = random_result(rng, n_inst, width_hint)
            body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, value))
            ok, got = w.decode_query_response(body)
            assert ok and got == generic_hits(w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, body)[1])
            assert len(got) == n_inst
    for code in (-1, -600, -2000):
        body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (False, code))
        assert w.decode_query_response(body) == (False, code)
    # The goldens decode to the client's documented result.
    assert w.decode_query_response(g.QUERY_RESP_ONE) == (True, g.QUERY_RESP_ONE_HITS)
    assert w.decode_query_response(g.QUERY_RESP_EMPTY) == (True, {})
    assert w.decode_query_response(g.QUERY_RESP_INVALID) == g.QUERY_RESP_INVALID_VALUE


def test_decode_query_response_rejects_like_generic():
    rng = random.Random(9)
    body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, random_result(rng, 3, 0)))
    wide = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, random_result(rng, 1, 300)))
    bad = [
        body[:3],
        body[:-1],
        body + b"\x00",
        b"\x00\x00\x00\x00" + body[4:],  # wrong type code
        body[:4] + b"\x02" + body[5:],  # expected flag 2
        body[:5] + b"\xff" + body[6:],  # map count beyond the body
        wide[:4] + bytes((wide[4] | 0x01,)) + wide[5:],  # compatible-fields bit
        wide[:4] + bytes((wide[4] | 0x20,)) + wide[5:],  # reserved bit
        wide[:4] + bytes((wide[4] | 0x04,)) + wide[5:],  # type info without its NUL
    ]
    for cut in range(len(body)):
        bad.append(body[:cut])
    for b in bad:
        with pytest.raises(w.WireError):
            w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, b)
        with pytest.raises(w.WireError):
            w.decode_query_response(b)


@pytest.mark.parametrize("tokens", [[0] * 200 + [True], [1] * 100 + [False] + [7], [5, 256, True], [0, 1, 0, False], [True] * 3])
def test_bools_hidden_among_zeros_and_ones_are_found(tokens):
    for form in (tokens, tuple(tokens)):
        with pytest.raises(w.WireError, match="bool"):
            w.encode_query(*g.CONTEXT, form, None, None)
    # and a long run of genuine 0/1 ids passes the exact check
    many = [0, 1] * 200
    assert w.encode_query(*g.CONTEXT, many, None, None) == w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, many, None, None))


@pytest.mark.parametrize("n", [10, 2000, 40000])
def test_many_low_byte_candidates_take_the_type_scan(n):
    # Every id has a zero second byte (1, 2, 65536 ...), so the per-candidate
    # budget runs out and the type scan decides: valid ids pass, one bool anywhere fails.
    toks = [(i % 3) << 16 | (i & 1) for i in range(n)]
    want = w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, toks, None, None))
    assert w.encode_query(*g.CONTEXT, toks, None, None) == want
    for at in (0, n // 2, n - 1):
        for b in (True, False):
            bad = list(toks)
            bad[at] = b
            with pytest.raises(w.WireError, match="bool"):
                w.encode_query(*g.CONTEXT, bad, None, None)
            with pytest.raises(w.WireError, match="bool"):
                w.encode_query(*g.CONTEXT, tuple(bad), None, None)


def test_bool_after_many_real_zero_and_one_ids_is_found():
    rng = random.Random(11)
    toks = [rng.choice((0, 1, 2, 255, 513, 65536, 1 << 24)) for _ in range(5000)]
    for at in (0, 17, 4999):
        bad = list(toks)
        bad[at] = bool(toks[at] & 1) if toks[at] < 2 else True
        with pytest.raises(w.WireError, match="bool"):
            w.encode_query(*g.CONTEXT, bad, None, None)
    assert w.encode_query(*g.CONTEXT, toks, None, None) == w.encode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, (g.CONTEXT, toks, None, None))


def test_decode_query_response_dp_and_rank_counts_differ():
    # The one-rank shortcut must not assume dp and rank_matches have the same length.
    t = (1, 2, 3, 4)
    for dp, ranks in (({0: 5}, {0: t, 1: t}), ({0: 5, 3: 6}, {7: t}), ({}, {0: t}), ({9: 1}, {}), ({0: 1}, {0: t}), ({4: 5}, {7: t})):
        for width_hint in (0, 300):
            value = ({"x" * (1 + width_hint): (9, dp, ranks, 11, 12, 13, 14), "y": (8, dp, ranks, 1, 2, 3, 4)},)
            body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, value))
            assert w.decode_query_response(body) == (True, generic_hits(w.decode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, body)[1]))
            for cut in range(len(body)):
                with pytest.raises(w.WireError):
                    w.decode_query_response(body[:cut])
