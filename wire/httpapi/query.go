package httpapi

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
	"github.com/tinylib/msgp/msgp"
)

// QueryRequest is a decoded POST /query body. It is decoded without allocation: the
// strings alias the request body (valid only while the body is), and Tokens is the
// caller's buffer, reused across requests.
type QueryRequest struct {
	Model, LoraName, TenantID, InstanceID, CacheSalt string
	// HasInstanceID tells an explicit instance_id filter (even "") from none: upstream
	// filters on any instance_id sent, and an empty one matches no instance.
	HasInstanceID bool
	BlockSize     int64
	Tokens        []int32
}

// Slots of the /query fields other than token_ids, in validation order.
const (
	qModel = iota
	qBlockSize
	qTenantID
	qLoraName
	qCacheSalt
	qInstanceID
	qFields
)

// qTokenIDs marks the prompt field (token_ids, or block_hashes for /query_by_hash), which
// is decoded during the walk instead of being stored.
const qTokenIDs = -2

func querySlot(key []byte) int {
	switch string(key) {
	case "model":
		return qModel
	case "block_size":
		return qBlockSize
	case "tenant_id":
		return qTenantID
	case "lora_name":
		return qLoraName
	case "cache_salt":
		return qCacheSalt
	case "instance_id":
		return qInstanceID
	}
	return -1
}

// tokenErr is a token_ids failure found during the walk; it is reported only if the
// body parses and the fields checked before token_ids are valid, and it is a value so
// the success path allocates nothing.
type tokenErr struct {
	reason, msg string
	index       int
}

const (
	msgTokensType    = "token_ids must be an array of integers or a binary of little-endian int32"
	msgTokensBinLen  = "token_ids binary length must be a multiple of 4"
	msgTokenRange    = "token_ids element is outside the int32 range"
	msgTokenNotInt   = "token_ids element must be an integer"
	msgBlockSizeQury = "block_size must be a positive integer"
)

// DecodeQueryRequest strictly decodes a POST /query body into q: q.Tokens is truncated and
// refilled, the other fields are overwritten (and unspecified after an error). Checks run
// in upstream's order: body shape, unknown fields, model, block_size, token_ids,
// tenant_id, lora_name, cache_salt, instance_id. Token ids are decoded in the same pass
// that validates the body, so an 8K-token prompt is read once.
func DecodeQueryRequest(body []byte, q *QueryRequest) *RequestError {
	q.Tokens = q.Tokens[:0]
	return decodeQueryBody(body, q, "token_ids", func(b []byte) ([]byte, tokenErr, bool) {
		var terr tokenErr
		var ok bool
		q.Tokens, b, terr, ok = decodeTokens(b, q.Tokens[:0])
		return b, terr, ok
	})
}

// decodeQueryBody walks a /query-shaped body whose prompt field is listKey (token_ids or
// block_hashes): list decodes that field's value at the start of its argument and returns
// the bytes after it, a semantic failure (reported in order, after the fields checked
// before it) and ok=false when the bytes do not parse.
func decodeQueryBody(body []byte, q *QueryRequest, listKey string, list func([]byte) ([]byte, tokenErr, bool)) *RequestError {
	if rerr := checkRoot(body); rerr != nil {
		return rerr
	}
	var m mapReader
	if rerr := m.open(body); rerr != nil {
		return rerr
	}
	var vals [qFields][]byte
	var st strictMap
	var tokErr tokenErr
	hasList := false
	for {
		key, done, ok := m.next()
		if !ok {
			return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
		}
		if done {
			break
		}
		slot := -1
		if key != nil {
			if string(key) == listKey {
				slot = qTokenIDs
			} else {
				slot = querySlot(key)
			}
		}
		if slot == qTokenIDs {
			// A repeated list replaces the earlier one, like any duplicate key.
			m.rest, tokErr, ok = list(m.rest)
			if !ok {
				return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
			}
			hasList = true
			continue
		}
		raw, ok := m.value()
		if !ok {
			return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
		}
		if slot >= 0 {
			vals[slot] = raw
		} else if key != nil && st.unknown == nil {
			st.unknown = key
		}
	}
	if len(m.rest) != 0 {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	st.hasBad = m.nonStringKey
	if rerr := st.finish(""); rerr != nil {
		return rerr
	}

	model, rerr := requiredBytes(vals[qModel], "model")
	if rerr != nil {
		return rerr
	}
	q.Model = alias(model)
	if q.BlockSize, rerr = positiveInt(vals[qBlockSize], "block_size", msgBlockSizeQury); rerr != nil {
		return rerr
	}
	if !hasList {
		return newRequestError(ReasonMissing, listKey, listKey+" is required")
	}
	if tokErr.reason != "" {
		return &RequestError{Msg: tokErr.msg, Reason: tokErr.reason, Field: listKey, Index: tokErr.index}
	}
	tenant, rerr := optionalBytes(vals[qTenantID], "tenant_id")
	if rerr != nil {
		return rerr
	}
	q.TenantID = alias(tenant)
	if q.TenantID == "" {
		q.TenantID = tenantDefault
	}
	lora, rerr := optionalBytes(vals[qLoraName], "lora_name")
	if rerr != nil {
		return rerr
	}
	q.LoraName = alias(lora)
	q.CacheSalt = ""
	if raw := vals[qCacheSalt]; raw != nil && raw[0] != 0xc0 {
		salt, ok := readString(raw)
		if !ok {
			return newRequestError(ReasonInvalidType, "cache_salt", "cache_salt must be a string or nil")
		}
		q.CacheSalt = alias(salt)
	}
	inst, rerr := optionalBytes(vals[qInstanceID], "instance_id")
	if rerr != nil {
		return rerr
	}
	q.InstanceID, q.HasInstanceID = alias(inst), vals[qInstanceID] != nil
	return nil
}

// alias views b as a string without copying; the caller owns the lifetime rule.
func alias(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// decodeTokens decodes the token_ids value at the start of b into dst and returns the
// bytes after it. A semantic failure (wrong type, element out of range, bad bin length)
// comes back in terr while the rest of the value is still stepped over, so that a later
// malformed byte can win; ok=false means b is not parsable.
func decodeTokens(b []byte, dst []int32) (_ []int32, _ []byte, terr tokenErr, ok bool) {
	if len(b) == 0 {
		return dst, b, terr, false
	}
	switch lead := b[0]; {
	case lead&0xf0 == 0x90 || lead == 0xdc || lead == 0xdd:
		return decodeTokenArray(b, dst)
	case lead == 0xc4 || lead == 0xc5 || lead == 0xc6:
		v, rest, err := msgpack.Bin(b)
		if err != nil {
			return dst, b, terr, false
		}
		if len(v)%4 != 0 {
			return dst, rest, tokenErr{ReasonInvalidValue, msgTokensBinLen, -1}, true
		}
		n := len(v) / 4
		dst = slices.Grow(dst, n)[:n]
		if hostLittleEndian && n > 0 {
			// The bin is the []int32's memory image: one copy instead of a loop (the
			// largest cost of a /query miss with a bin prompt).
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), v)
			return dst, rest, terr, true
		}
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint32(v[4*i:]))
		}
		return dst, rest, terr, true
	}
	rest, ok := skip(b, 1)
	return dst, rest, tokenErr{ReasonInvalidType, msgTokensType, -1}, ok
}

// decodeTokenArray decodes an array of int32-range integers of any msgpack width.
// The widths encoders pick for token ids (fixint and 8/16/32-bit) are decoded inline;
// the rest, and the tail where fewer than 8 bytes are left, go through readInt.
func decodeTokenArray(b []byte, dst []int32) (_ []int32, _ []byte, terr tokenErr, ok bool) {
	n32, rest, err := msgp.ReadArrayHeaderBytes(b)
	// Every element takes at least one byte: a larger count is a lie, and believing it
	// would size the buffer from an attacker's header.
	if err != nil || uint64(n32) > uint64(len(rest)) {
		return dst, b, terr, false
	}
	n := int(n32)
	dst = slices.Grow(dst, n)[:n]
	i0, pos := tokensFast(rest, dst)
	rest = rest[pos:]
	for i := i0; i < n; i++ {
		if len(rest) == 0 {
			return dst[:i], rest, terr, false
		}
		switch c := rest[0]; {
		case c <= 0x7f:
			dst[i] = int32(c)
			rest = rest[1:]
			continue
		case c >= 0xe0:
			dst[i] = int32(int8(c))
			rest = rest[1:]
			continue
		case len(rest) >= 8 && (uint(c)-0xcc < 3 || uint(c)-0xd0 < 3):
			// uint8/16/32 (what Python's msgpack writes) and int8/16/32 (what Go's
			// encoders write) with one 8-byte load and shifts: prompts mix 16- and 32-bit
			// ids at random, so a switch per width would mispredict; the signedness test
			// is stable within one client's array.
			nb := uint(0x040201) >> (8 * (uint(c) & 3)) & 0xff // value bytes: 1, 2 or 4
			x := binary.BigEndian.Uint64(rest) << 8            // value in the top nb bytes
			v := int64(x >> (64 - 8*nb))
			if c >= 0xd0 {
				v = int64(x) >> (64 - 8*nb)
			}
			if v <= math.MaxInt32 {
				dst[i] = int32(v)
				rest = rest[1+nb:]
				continue
			}
		}
		v, kind, after := readInt(rest)
		switch {
		case kind == intShort:
			return dst[:i], rest, terr, false
		case kind == intNotInt:
			terr = tokenErr{ReasonInvalidType, msgTokenNotInt, i}
			rest, ok = skip(rest, n-i)
			return dst[:i], rest, terr, ok
		case kind == intTooBig || v < math.MinInt32 || v > math.MaxInt32:
			terr = tokenErr{ReasonOutOfRange, msgTokenRange, i}
			rest, ok = skip(after, n-i-1)
			return dst[:i], rest, terr, ok
		}
		dst[i] = int32(v)
		rest = after
	}
	return dst, rest, terr, true
}

// fastTail is how many bytes tokensFast keeps in hand: every load of one step
// (at most 20 bytes of elements plus an 8-byte load) stays inside b.
const fastTail = 32

// tokensFast decodes the leading elements of a token array body b into dst while
// they are integers in the int32 range in the widths encoders use for token ids, and
// returns how many elements it decoded and the bytes they took. It stops (leaving the rest
// to the general loop, which also reports errors) at anything else and when fewer than
// fastTail bytes are left.
//
// Runs of one width are decoded four (uint16, uint32) or eight (positive fixint) elements
// at a time with independent loads: one client's ids under 65536 (a 32K-vocabulary model)
// are all uint16, and there the per-element dependency of the position on the previous
// element's width disappears. Mixed widths (ids either side of 65535 at random) go one at
// a time without a branch on the width, sixteen per failed run check, so that mixed
// arrays pay few mispredicted run tests.
func tokensFast(b []byte, dst []int32) (int, int) {
	n := len(dst)
	i, pos := 0, 0
	for i < n && len(b)-pos >= fastTail {
		w := b[pos : pos+fastTail : pos+fastTail]
		switch c := w[0]; {
		case c == 0xcd && w[3] == 0xcd && w[6] == 0xcd && w[9] == 0xcd && i+4 <= n:
			dst[i] = int32(binary.BigEndian.Uint16(w[1:]))
			dst[i+1] = int32(binary.BigEndian.Uint16(w[4:]))
			dst[i+2] = int32(binary.BigEndian.Uint16(w[7:]))
			dst[i+3] = int32(binary.BigEndian.Uint16(w[10:]))
			i, pos = i+4, pos+12
			continue
		case c == 0xce && w[5] == 0xce && w[10] == 0xce && w[15] == 0xce && i+4 <= n &&
			(w[1]|w[6]|w[11]|w[16])&0x80 == 0: // all four <= MaxInt32
			dst[i] = int32(binary.BigEndian.Uint32(w[1:]))
			dst[i+1] = int32(binary.BigEndian.Uint32(w[6:]))
			dst[i+2] = int32(binary.BigEndian.Uint32(w[11:]))
			dst[i+3] = int32(binary.BigEndian.Uint32(w[16:]))
			i, pos = i+4, pos+20
			continue
		case c < 0x80 && i+8 <= n:
			if x := binary.LittleEndian.Uint64(w); x&0x8080808080808080 == 0 {
				for k := range 8 {
					dst[i+k] = int32(byte(x >> (8 * k)))
				}
				i, pos = i+8, pos+8
				continue
			}
		}
		// Not a run: the next elements one at a time, without run checks.
		end := min(i+16, n)
		for ; i < end && len(b)-pos >= 9; i++ {
			c := b[pos]
			switch {
			case c <= 0x7f:
				dst[i] = int32(c)
				pos++
			case c >= 0xe0:
				dst[i] = int32(int8(c))
				pos++
			case uint(c)-0xcc < 3 || uint(c)-0xd0 < 3:
				// uint8/16/32 and int8/16/32 with one 8-byte load and shifts (see
				// decodeTokenArray).
				nb := uint(0x040201) >> (8 * (uint(c) & 3)) & 0xff
				x := binary.BigEndian.Uint64(b[pos+1:])
				v := int64(x >> (64 - 8*nb))
				if c >= 0xd0 {
					v = int64(x) >> (64 - 8*nb)
				}
				if v > math.MaxInt32 {
					return i, pos
				}
				dst[i] = int32(v)
				pos += 1 + int(nb)
			default:
				return i, pos
			}
		}
	}
	return i, pos
}
