package httpclient

import (
	"encoding/binary"
	"slices"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"
)

// QueryByHashRequest is the body of POST /query_by_hash: a /query whose prompt is given
// as its block keys (the projected hashes the engines publish, one per block_size tokens)
// instead of its token ids. Empty optional strings are left out as in QueryRequest;
// CacheSalt is accepted by the server but has no effect, since a salt is part of the keys.
type QueryByHashRequest struct {
	Model       string
	BlockSize   int64
	BlockHashes []uint64
	LoraName    string
	TenantID    string
	InstanceID  string
	CacheSalt   string
	// BinaryHashes sends block_hashes as a msgpack bin of little-endian uint64 values
	// instead of an array of integers.
	BinaryHashes bool
}

// AppendQueryByHashRequest appends q as a msgpack map to dst, allocating nothing once dst
// has room.
func AppendQueryByHashRequest(dst []byte, q *QueryByHashRequest) []byte {
	dst = appendQueryFields(dst, q.Model, q.BlockSize, q.LoraName, q.TenantID, q.InstanceID, q.CacheSalt, "block_hashes")
	if q.BinaryHashes {
		dst = appendBinHeader(dst, 8*len(q.BlockHashes))
		for _, k := range q.BlockHashes {
			dst = binary.LittleEndian.AppendUint64(dst, k)
		}
		return dst
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(q.BlockHashes)))
	dst = slices.Grow(dst, 9*len(q.BlockHashes)) // uint64 encodes in at most 9 bytes
	for _, k := range q.BlockHashes {
		dst = msgp.AppendUint64(dst, k)
	}
	return dst
}

// QueryByHash asks for the cached prefix of the blocks q.BlockHashes and decodes the
// answer (the same shape as Query's) into res, which may be reused across calls.
func (c *Client) QueryByHash(q *QueryByHashRequest, res *QueryResult) error {
	return c.postQuery(c.queryByHashURI, "/query_by_hash", res, func(b []byte) []byte { return AppendQueryByHashRequest(b, q) })
}

// NewByHashSession returns a Session whose requests go to POST /query_by_hash: use its
// QueryByHash, or QueryEncoded and QueryRaw with bodies from AppendQueryByHashRequest.
// (Its Query would send token ids to /query_by_hash, which the server refuses.)
func (c *Client) NewByHashSession() *Session {
	s := &Session{c: c, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	post(s.req, c.queryByHashURI)
	return s
}

// QueryByHash encodes q into the Session's request buffer, sends it and decodes the
// answer into res; the Session must come from NewByHashSession. In steady state it
// allocates nothing.
func (s *Session) QueryByHash(q *QueryByHashRequest, res *QueryResult) error {
	buf := s.req.SwapBody(nil)
	s.req.SwapBody(AppendQueryByHashRequest(buf[:0], q))
	return s.decode(res)
}
