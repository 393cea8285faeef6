package httpapi

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
	"github.com/conductor-go/conductor/wire/internal/tokenarray"
	"github.com/tinylib/msgp/msgp"
)

// QueryRequest is a decoded POST /query body. It is decoded without allocation: the
// strings alias the request body (valid only while the body is), and so does Tokens when
// the prompt came as a bin (its memory image on a little-endian host, read in place, see
// binView); an array is decoded into a buffer the request keeps and reuses across
// requests. Release drops both kinds of reference.
type QueryRequest struct {
	Model, LoraName, TenantID, InstanceID, CacheSalt string
	// HasInstanceID tells an explicit instance_id filter (even "") from none: upstream
	// filters on any instance_id sent, and an empty one matches no instance.
	HasInstanceID bool
	BlockSize     int64
	Tokens        []int32
	// buf is the decoded array's memory, kept across requests (never a view of a body).
	buf []int32
	// scratch is the working room of a long token array's segmented decode (see
	// tokensSegmented), reused across requests: a fixed size, needed only while the
	// array is decoded, and not part of the result.
	scratch []int32
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

// queryKeys are the /query keys of the q* slots.
var queryKeys = [qFields]string{qModel: "model", qBlockSize: "block_size", qTenantID: "tenant_id",
	qLoraName: "lora_name", qCacheSalt: "cache_salt", qInstanceID: "instance_id"}

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
	q.Tokens = q.buf[:0]
	return decodeQueryBody(body, q, "token_ids", &q.Tokens, func(b []byte) ([]int32, []byte, tokenErr, bool) {
		return decodeTokens(b, &q.buf, &q.scratch)
	})
}

// Release drops q's references into the last body (its strings, and Tokens when they
// were read in place from a bin) and, when the decoded-array buffer has grown past
// maxTokens elements, that buffer too, so that a pooled request neither pins a body nor
// keeps an outlier prompt's memory.
func (q *QueryRequest) Release(maxTokens int) {
	q.Model, q.LoraName, q.TenantID, q.InstanceID, q.CacheSalt = "", "", "", "", ""
	q.Tokens = nil
	if cap(q.buf) > maxTokens {
		q.buf = nil
	}
}

// decodeQueryBody walks a /query-shaped body whose prompt field is listKey (token_ids or
// block_hashes): list decodes that field's value at the start of its argument into *out
// and returns the bytes after it, a semantic failure (reported in order, after the
// fields checked before it) and ok=false when the bytes do not parse.
func decodeQueryBody[T int32 | uint64](body []byte, q *QueryRequest, listKey string, out *[]T,
	list func([]byte) ([]T, []byte, tokenErr, bool)) *RequestError {
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
				slot = slotOf(queryKeys[:], key)
			}
		}
		if slot == qTokenIDs {
			// A repeated list replaces the earlier one, like any duplicate key.
			*out, m.rest, tokErr, ok = list(m.rest)
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

// decodeTokens decodes the token_ids value at the start of b and returns the tokens and
// the bytes after it: an array is decoded into *buf (grown as needed and stored back), a
// bin is returned in place when binView allows it (else copied into *buf). A semantic failure (wrong type, element out of range, bad bin length)
// comes back in terr while the rest of the value is still stepped over, so that a later
// malformed byte can win; ok=false means b is not parsable.
// scratch is the working room of decodeTokenArray, grown on first use and kept there.
func decodeTokens(b []byte, buf *[]int32, scratch *[]int32) (_ []int32, _ []byte, terr tokenErr, ok bool) {
	array := func(b []byte, dst []int32) ([]int32, []byte, tokenErr, bool) {
		return decodeTokenArray(b, dst, scratch)
	}
	return decodeList(b, buf, array, msgTokensType, msgTokensBinLen)
}

// decodeList decodes a prompt list (token_ids, block_hashes) at the start of b, with
// decodeTokens' conventions: an array goes to array with (*buf)[:0] as its room (the
// result is stored back in *buf), a bin is read as little-endian words of T (its length
// must be a multiple of the word size: msgBinLen otherwise) in place when binView allows
// it, and any other type is reported with msgType.
func decodeList[T int32 | uint64](b []byte, buf *[]T, array func([]byte, []T) ([]T, []byte, tokenErr, bool),
	msgType, msgBinLen string) (_ []T, _ []byte, terr tokenErr, ok bool) {
	dst := (*buf)[:0]
	if len(b) == 0 {
		return dst, b, terr, false
	}
	switch lead := b[0]; {
	case lead&0xf0 == 0x90 || lead == 0xdc || lead == 0xdd:
		dst, rest, terr, ok := array(b, dst)
		*buf = dst
		return dst, rest, terr, ok
	case lead == 0xc4 || lead == 0xc5 || lead == 0xc6:
		v, rest, err := msgpack.Bin(b)
		if err != nil {
			return dst, b, terr, false
		}
		size := int(unsafe.Sizeof(T(0)))
		if len(v)%size != 0 {
			return dst, rest, tokenErr{ReasonInvalidValue, msgBinLen, -1}, true
		}
		n := len(v) / size
		if n > 0 && binView(v, size) {
			// The bin is the slice's memory image: read in place, no copy (the copy was
			// the largest cost of a miss with a bin prompt).
			return unsafe.Slice((*T)(unsafe.Pointer(&v[0])), n), rest, terr, true
		}
		dst = slices.Grow(dst, n)[:n]
		*buf = dst
		if hostLittleEndian && n > 0 {
			// The bin is the slice's memory image: one copy instead of a loop.
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), size*n), v)
			return dst, rest, terr, true
		}
		for i := range dst {
			if size == 4 {
				dst[i] = T(binary.LittleEndian.Uint32(v[4*i:]))
			} else {
				dst[i] = T(binary.LittleEndian.Uint64(v[8*i:]))
			}
		}
		return dst, rest, terr, true
	}
	rest, ok := skip(b, 1)
	return dst, rest, tokenErr{ReasonInvalidType, msgType, -1}, ok
}

// decodeTokenArray decodes an array of int32-range integers of any msgpack width.
// The widths encoders pick for token ids (fixint and 8/16/32-bit) are decoded inline;
// the rest, and the tail where fewer than 8 bytes are left, go through readInt. Long
// arrays are decoded mostly a 59-byte window at a time by tokenarray.DecodeVBMI where
// the CPU has AVX-512 VBMI, else by tokensSegmented, with *scratch (grown to segScratch
// on first use) as its working room: dst itself stays exactly as long as the array, so
// that the decoded tokens stay within what the in-flight budget charges for a body.
func decodeTokenArray(b []byte, dst []int32, scratch *[]int32) (_ []int32, _ []byte, terr tokenErr, ok bool) {
	return decodeTokenArrayVia(b, dst, scratch, tokenarray.HasVBMI)
}

// decodeTokenArrayVia is decodeTokenArray, with tokenarray.DecodeVBMI first only if
// vbmi: the tests check both paths on a CPU that has it.
func decodeTokenArrayVia(b []byte, dst []int32, scratch *[]int32, vbmi bool) (_ []int32, _ []byte, terr tokenErr, ok bool) {
	n32, rest, err := msgp.ReadArrayHeaderBytes(b)
	// Every element takes at least one byte: a larger count is a lie, and believing it
	// would size the buffer from an attacker's header.
	if err != nil || uint64(n32) > uint64(len(rest)) {
		return dst, b, terr, false
	}
	n := int(n32)
	dst = slices.Grow(dst, n)[:n]
	i0 := 0
	if vbmi && n >= tokenarray.MinElems {
		// Up to the last 64 elements or 64 bytes, or an element it does not take.
		i, pos := tokenarray.DecodeVBMI(rest, dst)
		i0, rest = i, rest[pos:]
	}
	if n-i0 >= segMinElems {
		// Long arrays: a leading run of one width as such (a 32K-vocabulary prompt
		// without byte tokens is all uint16), then most elements in interleaved chains
		// (tokensSegmented), the rest (its last few hundred bytes, or from where it
		// could not verify) below.
		if cap(*scratch) < segScratch {
			*scratch = make([]int32, segScratch)
		}
		h := len(b) - len(rest)
		i, pos := tokensFast(rest, dst[i0:], false)
		j, end := tokensSegmented(b, h+pos, dst[i0+i:], (*scratch)[:segScratch])
		i0, rest = i0+i+j, rest[end-h:]
	}
	di, pos := tokensFast(rest, dst[i0:], true)
	i0 += di
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
// element's width disappears. Mixed widths (real prompts: fixint, uint16 and uint32 at
// random) go through tokensMixed, up to 256 elements per failed run check, so that a
// mixed array pays few mispredicted run tests; with mixed false it stops there instead.
func tokensFast(b []byte, dst []int32, mixed bool) (int, int) {
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
		if !mixed {
			return i, pos
		}
		// Not a run: the next elements through tokensMixed, without run checks.
		end := min(i+256, n)
		di, dp := tokensMixed(b[pos:], dst[i:end])
		i, pos = i+di, pos+dp
		if di == 0 {
			// Too few bytes or elements left for a window (the general loop's), or an
			// element tokensMixed leaves out: a negative one is taken here, so that a
			// signed array goes on at full speed; anything else is the general loop's.
			if c := b[pos]; n-i < mixedWindow || c < 0xd0 || c > 0xd3 && c < 0xe0 {
				return i, pos
			}
			v, kind, after := readInt(b[pos:])
			if kind != intOK || v < math.MinInt32 || v > math.MaxInt32 || len(after) < 9 {
				return i, pos
			}
			dst[i] = int32(v)
			i, pos = i+1, len(b)-len(after)
		}
	}
	return i, pos
}

// tokenLead describes, for each lead byte, an array element decoded by
// mixedWindowDecode without a branch on its width: bit 0 where its value starts (0 for a
// positive fixint, which is its own lead byte, 1 after the lead otherwise), bits 8-13 the
// right shift that brings the value out of the 8 big-endian bytes loaded there, and bits
// 32-63 the bound the value read as unsigned must stay under: the form's range for
// uint8/16, the int32 range for uint32, and for the signed forms (what Go encoders write
// for token ids) the non-negative half, where the unsigned reading is the value. Negative
// values (negative fixint, signed forms with the sign bit set) and every other lead byte
// get bound 0: the general loop decodes them, or reports the element. Read-only after
// package initialisation.
var tokenLead = func() (t [256]uint64) {
	ent := func(off, shr, bound uint64) uint64 { return off | shr<<8 | bound<<32 }
	for c := range 0x80 {
		t[c] = ent(0, 56, 1<<7)
	}
	t[0xcc] = ent(1, 56, 1<<8)
	t[0xcd] = ent(1, 48, 1<<16)
	t[0xce] = ent(1, 32, 1<<31)
	t[0xd0] = ent(1, 56, 1<<7)
	t[0xd1] = ent(1, 48, 1<<15)
	t[0xd2] = ent(1, 32, 1<<31)
	return t
}()

// elementEnds returns, for each byte c of x (little-endian order) at offset base+k, where
// an array element whose lead byte were c would end: base+k+1 for a fixint and
// base+k+2, +3 or +5 for an 8-, 16- or 32-bit integer (either sign); other lead bytes get
// a meaningless value (tokensMixed's decode rejects them before it is used). SWAR on the
// 8 bytes at once: intLen = 2+t+t/2 with t = c&3 gives 2, 3, 5 for t = 0, 1, 2, and it
// applies where c has its top bit set and is not a negative fixint (0xe0..0xff).
func elementEnds(x uint64, base uint64) uint64 {
	const ones = 0x0101010101010101
	t := x & (3 * ones)
	intLen := 2*ones + t + (t >> 1 & ones)
	isInt := (x >> 7 & ones) &^ (x >> 5 & (x >> 6) & (x >> 7) & ones)
	mask := isInt<<8 - isInt // 0xff in the bytes of integer leads
	return ones + (intLen-ones)&mask + 0x0706050403020100 + base*ones
}

// mixedWindow is how many bytes tokensMixed finds element boundaries in at once.
const mixedWindow = 64

// tokensMixed decodes leading elements of b into dst while they are fixints or 8/16/32-bit
// integers in the int32 range, and returns how many it decoded and the bytes they took.
// It stops at any other element, and when fewer than mixedWindow+9 bytes or mixedWindow
// elements are left.
//
// The only serial dependency of a mixed-width array is the position: where an element
// starts depends on the width of the one before. Here it costs one load per element:
// for each window of mixedWindow bytes, the end of an element that would start at each
// byte is computed first (elementEnds, eight bytes at a time), then the walk chains
// through those ends. Each element's value then takes one lookup of its lead byte, one
// 8-byte load, one shift and one compare (tokenLead): the only branches are the
// (predictable) exits, so prompts that mix widths at random pay no mispredictions.
func tokensMixed(b []byte, dst []int32) (int, int) {
	i, pos := 0, 0
	for len(b)-pos >= mixedWindow+9 && len(dst)-i >= mixedWindow {
		n, p, ok := mixedWindowDecode((*[mixedWindow + 9]byte)(b[pos:]), (*[mixedWindow]int32)(dst[i:]))
		i, pos = i+n, pos+p
		if !ok {
			break
		}
	}
	return i, pos
}

// mixedWindowDecode decodes the elements that start in the first mixedWindow bytes of w
// into dst (at most mixedWindow of them) and returns how many, the offset after them (the
// last may end past the window) and ok=false if it stopped at an element it does not
// take.
func mixedWindowDecode(w *[mixedWindow + 9]byte, dst *[mixedWindow]int32) (n, p int, ok bool) {
	var next [mixedWindow]uint8
	for j := 0; j < mixedWindow; j += 8 {
		binary.LittleEndian.PutUint64(next[j:], elementEnds(binary.LittleEndian.Uint64(w[j:]), uint64(j)))
	}
	for p < mixedWindow {
		e := tokenLead[w[p]]
		v := binary.BigEndian.Uint64(w[p+int(e&1):]) >> (e >> 8 & 63)
		if v >= e>>32 {
			return n, p, false
		}
		dst[n&(mixedWindow-1)] = int32(v)
		n++
		p = int(next[p])
	}
	return n, p, true
}
