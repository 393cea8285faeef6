"""XXH3-128 (xxHash 0.8, default secret, seed 0) in pure Python.

Private to :mod:`mooncake.conductor`: vLLM's ``xxhash`` and ``xxhash_cbor`` prefix-caching
algorithms hash each block with ``xxhash.xxh3_128_digest``; :func:`xxh3_128_digest` returns
the same 16 bytes (the canonical form: the high 64 bits, then the low 64 bits, each
big-endian) without the C extension, so the client stays pure Python. Written from the
xxHash specification (XXH3_128bits: the 0, 1-3, 4-8, 9-16, 17-128, 129-240 and long-input
paths); checked against the engines' own vectors and the server's Go implementation.
"""

import struct

__all__ = ["xxh3_128_digest"]

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1

_P32_1 = 0x9E3779B1
_P32_2 = 0x85EBCA77
_P32_3 = 0xC2B2AE3D
_P64_1 = 0x9E3779B185EBCA87
_P64_2 = 0xC2B2AE3D27D4EB4F
_P64_3 = 0x165667B19E3779F9
_P64_4 = 0x85EBCA77C2B2AE63
_P64_5 = 0x27D4EB2F165667C5

# The default 192-byte secret (XXH3_kSecret).
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _r32(b, o):
    return _U32.unpack_from(b, o)[0]


def _r64(b, o):
    return _U64.unpack_from(b, o)[0]


def _avalanche(h):
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & _M64
    return h ^ (h >> 32)


def _xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * _P64_2) & _M64
    h ^= h >> 29
    h = (h * _P64_3) & _M64
    return h ^ (h >> 32)


def _mul_fold(a, b):
    p = a * b
    return (p ^ (p >> 64)) & _M64


def _mix16(data, o, so):
    return _mul_fold(_r64(data, o) ^ _r64(_SECRET, so), _r64(data, o + 8) ^ _r64(_SECRET, so + 8))


def _mix32(lo, hi, data, o1, o2, so):
    lo = (lo + _mix16(data, o1, so)) & _M64
    lo ^= (_r64(data, o2) + _r64(data, o2 + 8)) & _M64
    hi = (hi + _mix16(data, o2, so + 16)) & _M64
    hi ^= (_r64(data, o1) + _r64(data, o1 + 8)) & _M64
    return lo, hi


def _finish_mid(lo, hi, n):
    low = (lo + hi) & _M64
    high = (lo * _P64_1 + hi * _P64_4 + n * _P64_2) & _M64
    return _avalanche(low), (-_avalanche(high)) & _M64


def _hash_short(data, n):
    if n > 8:
        bitflipl = _r64(_SECRET, 32) ^ _r64(_SECRET, 40)
        bitfliph = _r64(_SECRET, 48) ^ _r64(_SECRET, 56)
        in_lo, in_hi = _r64(data, 0), _r64(data, n - 8)
        m = (in_lo ^ in_hi ^ bitflipl) * _P64_1
        m_lo, m_hi = m & _M64, m >> 64
        m_lo = (m_lo + ((n - 1) << 54)) & _M64
        in_hi ^= bitfliph
        m_hi = (m_hi + in_hi + (in_hi & _M32) * (_P32_2 - 1)) & _M64
        m_lo ^= int.from_bytes(m_hi.to_bytes(8, "little"), "big")
        h = m_lo * _P64_2
        h_lo, h_hi = h & _M64, ((h >> 64) + m_hi * _P64_2) & _M64
        return _avalanche(h_lo), _avalanche(h_hi)
    if n > 3:
        in64 = _r32(data, 0) + (_r32(data, n - 4) << 32)
        keyed = in64 ^ (_r64(_SECRET, 16) ^ _r64(_SECRET, 24))
        m = keyed * ((_P64_1 + (n << 2)) & _M64)
        lo, hi = m & _M64, m >> 64
        hi = (hi + (lo << 1)) & _M64
        lo ^= hi >> 3
        lo ^= lo >> 35
        lo = (lo * 0x9FB21C651E98DF25) & _M64
        lo ^= lo >> 28
        return lo, _avalanche(hi)
    if n > 0:
        c1, c2, c3 = data[0], data[n >> 1], data[n - 1]
        combl = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
        swapped = int.from_bytes(combl.to_bytes(4, "little"), "big")
        combh = ((swapped << 13) | (swapped >> 19)) & _M32
        lo = _xxh64_avalanche(combl ^ (_r32(_SECRET, 0) ^ _r32(_SECRET, 4)))
        hi = _xxh64_avalanche(combh ^ (_r32(_SECRET, 8) ^ _r32(_SECRET, 12)))
        return lo, hi
    return (_xxh64_avalanche(_r64(_SECRET, 64) ^ _r64(_SECRET, 72)),
            _xxh64_avalanche(_r64(_SECRET, 80) ^ _r64(_SECRET, 88)))


def _accumulate(acc, data, o, so):
    for i in range(8):
        v = _r64(data, o + 8 * i)
        k = v ^ _r64(_SECRET, so + 8 * i)
        acc[i ^ 1] = (acc[i ^ 1] + v) & _M64
        acc[i] = (acc[i] + (k & _M32) * (k >> 32)) & _M64


def _scramble(acc):
    so = len(_SECRET) - 64
    for i in range(8):
        a = acc[i]
        a ^= a >> 47
        a ^= _r64(_SECRET, so + 8 * i)
        acc[i] = (a * _P32_1) & _M64


def _merge(acc, so, start):
    r = start
    for i in range(4):
        r = (r + _mul_fold(acc[2 * i] ^ _r64(_SECRET, so + 16 * i), acc[2 * i + 1] ^ _r64(_SECRET, so + 16 * i + 8))) & _M64
    return _avalanche(r)


def _hash_long(data, n):
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]
    stripes_per_block = (len(_SECRET) - 64) // 8
    block_len = 64 * stripes_per_block
    nb_blocks = (n - 1) // block_len
    for b in range(nb_blocks):
        for s in range(stripes_per_block):
            _accumulate(acc, data, b * block_len + 64 * s, 8 * s)
        _scramble(acc)
    for s in range(((n - 1) - block_len * nb_blocks) // 64):
        _accumulate(acc, data, nb_blocks * block_len + 64 * s, 8 * s)
    _accumulate(acc, data, n - 64, len(_SECRET) - 64 - 7)
    lo = _merge(acc, 11, (n * _P64_1) & _M64)
    hi = _merge(acc, len(_SECRET) - 64 - 11, ~(n * _P64_2) & _M64)
    return lo, hi


def xxh3_128_digest(data):
    """XXH3-128 of data (bytes-like) as 16 bytes: high 64 bits then low, big-endian."""
    data = bytes(data)
    n = len(data)
    if n <= 16:
        lo, hi = _hash_short(data, n)
    elif n <= 128:
        lo, hi = (n * _P64_1) & _M64, 0
        if n > 32:
            if n > 64:
                if n > 96:
                    lo, hi = _mix32(lo, hi, data, 48, n - 64, 96)
                lo, hi = _mix32(lo, hi, data, 32, n - 48, 64)
            lo, hi = _mix32(lo, hi, data, 16, n - 32, 32)
        lo, hi = _mix32(lo, hi, data, 0, n - 16, 0)
        lo, hi = _finish_mid(lo, hi, n)
    elif n <= 240:
        lo, hi = (n * _P64_1) & _M64, 0
        for i in range(4):
            lo, hi = _mix32(lo, hi, data, 32 * i, 32 * i + 16, 32 * i)
        lo, hi = _avalanche(lo), _avalanche(hi)
        for i in range(4, n // 32):
            lo, hi = _mix32(lo, hi, data, 32 * i, 32 * i + 16, 3 + 32 * (i - 4))
        lo, hi = _mix32(lo, hi, data, n - 16, n - 32, 136 - 17 - 16)
        lo, hi = _finish_mid(lo, hi, n)
    else:
        lo, hi = _hash_long(data, n)
    return hi.to_bytes(8, "big") + lo.to_bytes(8, "big")
