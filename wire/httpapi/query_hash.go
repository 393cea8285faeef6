package httpapi

import (
	"encoding/binary"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// QueryByHashRequest is a decoded POST /query_by_hash body: the /query fields (with
// Tokens left empty) and the prompt's block keys instead of its token ids. Like
// QueryRequest it is decoded without allocation: strings alias the body, and so do
// BlockHashes when they came as a bin (read in place, see binView); an array is decoded
// into a buffer the request keeps. Release drops both kinds of reference.
type QueryByHashRequest struct {
	QueryRequest
	// BlockHashes are the projected keys of the prompt's consecutive blocks, each of which
	// stands for block_size tokens.
	BlockHashes []uint64
	// hashBuf is the decoded array's memory, kept across requests.
	hashBuf []uint64
}

// Release is QueryRequest.Release for the block keys too (maxHashes bounds the buffer
// kept).
func (q *QueryByHashRequest) Release(maxHashes int) {
	q.QueryRequest.Release(maxHashes)
	q.BlockHashes = nil
	if cap(q.hashBuf) > maxHashes {
		q.hashBuf = nil
	}
}

const (
	msgHashesType   = "block_hashes must be an array of unsigned integers or a binary of little-endian uint64"
	msgHashesBinLen = "block_hashes binary length must be a multiple of 8"
	msgHashRange    = "block_hashes element is outside the uint64 range"
	msgHashNotInt   = "block_hashes element must be an integer"
)

// DecodeQueryByHashRequest strictly decodes a POST /query_by_hash body into q. The rules
// and their order are those of DecodeQueryRequest with block_hashes in place of
// token_ids (token_ids is an unknown field here): an array of integers in 0..2^64-1, or a
// bin of little-endian uint64 values whose length is a multiple of 8.
func DecodeQueryByHashRequest(body []byte, q *QueryByHashRequest) *RequestError {
	q.Tokens = q.Tokens[:0]
	q.BlockHashes = q.hashBuf[:0]
	return decodeQueryBody(body, &q.QueryRequest, "block_hashes", &q.BlockHashes, func(b []byte) ([]uint64, []byte, tokenErr, bool) {
		return decodeHashes(b, &q.hashBuf)
	})
}

// decodeHashes decodes the block_hashes value at the start of b into dst, with the
// error conventions of decodeTokens (and its one-copy bin path on little-endian hosts).
func decodeHashes(b []byte, buf *[]uint64) (_ []uint64, _ []byte, terr tokenErr, ok bool) {
	return decodeList(b, buf, decodeHashArray, msgHashesType, msgHashesBinLen)
}

// decodeHashArray decodes an array of non-negative integers of any msgpack width.
func decodeHashArray(b []byte, dst []uint64) (_ []uint64, _ []byte, terr tokenErr, ok bool) {
	n32, rest, err := msgp.ReadArrayHeaderBytes(b)
	// Every element takes at least one byte: a larger count is a lie.
	if err != nil || uint64(n32) > uint64(len(rest)) {
		return dst, b, terr, false
	}
	n := int(n32)
	dst = slices.Grow(dst, n)[:n]
	for i := range n {
		if len(rest) == 0 {
			return dst[:i], rest, terr, false
		}
		c := rest[0]
		if c <= 0x7f {
			dst[i] = uint64(c)
			rest = rest[1:]
			continue
		}
		if c == 0xcf {
			if len(rest) < 9 {
				return dst[:i], rest, terr, false
			}
			dst[i] = binary.BigEndian.Uint64(rest[1:])
			rest = rest[9:]
			continue
		}
		v, kind, after := readInt(rest)
		switch {
		case kind == intShort:
			return dst[:i], rest, terr, false
		case kind == intNotInt:
			terr = tokenErr{ReasonInvalidType, msgHashNotInt, i}
			rest, ok = skip(rest, n-i)
			return dst[:i], rest, terr, ok
		case v < 0:
			terr = tokenErr{ReasonOutOfRange, msgHashRange, i}
			rest, ok = skip(after, n-i-1)
			return dst[:i], rest, terr, ok
		}
		dst[i] = uint64(v)
		rest = after
	}
	return dst, rest, terr, true
}
