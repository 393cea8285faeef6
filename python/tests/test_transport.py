"""The client's reply reader against a scripted socket: replies split at every byte,
longer than the receive buffer, with attachments, or followed by bytes a conforming
server would not send yet. Deterministic: the stub hands out exactly the scripted chunks."""

import struct

import pytest

import goldens as g
from mooncake import _conductor_wire as w
from mooncake.conductor import OK, RPC_FAIL, ConductorClient

RESP_HEADER = struct.Struct("<BBBBIII")


def frame(seq, body, attach=b"", err_code=0):
    return RESP_HEADER.pack(21, 0, err_code, 0, seq, len(body), len(attach)) + body + attach


class ScriptedSocket:
    """recv_into returns the scripted chunks in order (each cut to the space offered);
    send records what the client wrote."""

    def __init__(self, chunks):
        self.chunks = [bytes(c) for c in chunks]
        self.sent = bytearray()
        self.offered = []

    def settimeout(self, t):
        assert t > 0

    def send(self, data):
        self.sent += data
        return len(data)

    def recv_into(self, view):
        self.offered.append(len(view))
        assert self.chunks, "client read past the scripted reply"
        chunk = self.chunks[0]
        n = min(len(view), len(chunk))
        view[:n] = chunk[:n]
        if n == len(chunk):
            self.chunks.pop(0)
        else:
            self.chunks[0] = chunk[n:]
        return n

    def close(self):
        pass


def scripted_client(chunks):
    c = ConductorClient()
    c._target = ("127.0.0.1", 1)
    c._sock = ScriptedSocket(chunks)
    return c


def one_byte_chunks(data):
    return [data[i : i + 1] for i in range(len(data))]


def test_reply_split_at_every_byte():
    c = scripted_client(one_byte_chunks(frame(1, g.QUERY_RESP_ONE)))
    assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": g.QUERY_RESP_ONE_HITS}
    assert bytes(c._sock.sent[20:]) == g.QUERY_ARGS
    assert not c._sock.chunks


@pytest.mark.parametrize("split", [1, 7, 16, 17, 1000])
def test_reply_longer_than_the_buffer_is_read_exactly(split):
    value = g.QUERY_RESP_300_VALUE
    body = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, value)
    body_big = w.encode(w.QUERY_RESPONSE, w.TC_QUERY_RESPONSE, (True, ({"x" * 70000: value[1][0][next(iter(value[1][0]))]},)))
    assert len(body_big) > 1 << 16
    for b in (body, body_big):
        data = frame(1, b)
        trailer = frame(2, g.QUERY_RESP_EMPTY)
        # the reply's tail and the next reply arrive together: only the tail may be taken
        c = scripted_client([data[:split], data[split:], trailer])
        got = c.query("m", block_size=16, token_ids=[1, 2, 3])
        assert got["ret"] == OK and set(got["hits"]) == set(w.decode_query_response(b)[1])
        if len(data) > 1 << 16:
            assert c._sock.chunks == [trailer]
        assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": {}}
        assert not c._sock.chunks


@pytest.mark.parametrize("big", [False, True])
def test_attachment_is_not_part_of_the_body(big):
    attach = b"\xaa" * ((1 << 17) if big else 5)
    c = scripted_client([frame(1, g.QUERY_RESP_ONE, attach), frame(2, g.QUERY_RESP_EMPTY)])
    assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": g.QUERY_RESP_ONE_HITS}
    assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": {}}


def test_bytes_after_a_reply_are_the_next_reply_not_lost():
    # Two replies in one segment: the second answers the second call without a read.
    c = scripted_client([frame(1, g.QUERY_RESP_ONE) + frame(2, g.QUERY_RESP_EMPTY)])
    assert c.query("m", block_size=16, token_ids=[1, 2, 3])["hits"] == g.QUERY_RESP_ONE_HITS
    assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": OK, "hits": {}}
    assert len(c._sock.offered) == 1


def test_early_bytes_with_a_wrong_seq_fail_and_drop_the_connection():
    c = scripted_client([frame(1, g.QUERY_RESP_ONE) + frame(7, g.QUERY_RESP_EMPTY)])
    assert c.query("m", block_size=16, token_ids=[1, 2, 3])["ret"] == OK
    sock = c._sock
    assert c.query("m", block_size=16, token_ids=[1, 2, 3]) == {"ret": RPC_FAIL, "hits": {}}
    assert c._sock is None and c._rhave == 0
    assert not sock.chunks
