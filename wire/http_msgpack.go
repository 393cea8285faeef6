package wire

import (
	"encoding/binary"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// Messages shared by the strict request decoders. Upstream reports every unparsable body
// with the same text, whatever went wrong inside it.
const (
	msgInvalidMsgpack = "Invalid msgpack object"
	msgRootNotMap     = "request body must be a msgpack map"
	msgKeyNotString   = "map keys must be strings"
	tenantDefault     = "default"
)

// httpSkip steps over count complete msgpack objects and returns what follows, or
// ok=false when b does not hold them. It is iterative on purpose: msgp.Skip recurses once
// per nesting level (up to 100000 deep), and a request body is attacker-controlled. Every
// pending object needs at least one byte, so a header that declares more elements than
// bytes left fails at once instead of looping.
func httpSkip(b []byte, count uint64) ([]byte, bool) {
	pending := count
	for pending > 0 {
		if pending > uint64(len(b)) {
			return b, false
		}
		pending--
		lead := b[0]
		var size int // bytes taken by this object, header included
		switch {
		case lead <= 0x7f || lead >= 0xe0 || lead == 0xc0 || lead == 0xc2 || lead == 0xc3:
			size = 1 // fixints, nil, bools
		case lead <= 0x8f: // fixmap
			pending += 2 * uint64(lead&0x0f)
			size = 1
		case lead <= 0x9f: // fixarray
			pending += uint64(lead & 0x0f)
			size = 1
		case lead <= 0xbf: // fixstr
			size = 1 + int(lead&0x1f)
		default:
			var ok bool
			size, pending, ok = httpSkipSized(b, lead, pending)
			if !ok {
				return b, false
			}
		}
		if size > len(b) {
			return b, false
		}
		b = b[size:]
	}
	return b, true
}

// httpSkipSized handles the 0xc1..0xdf leads, whose length lives in the bytes after the
// lead; it returns the object's byte size and the updated pending count.
func httpSkipSized(b []byte, lead byte, pending uint64) (int, uint64, bool) {
	u8 := func() (int, bool) {
		if len(b) < 2 {
			return 0, false
		}
		return int(b[1]), true
	}
	u16 := func() (int, bool) {
		if len(b) < 3 {
			return 0, false
		}
		return int(binary.BigEndian.Uint16(b[1:])), true
	}
	u32 := func() (int, bool) {
		if len(b) < 5 {
			return 0, false
		}
		return int(binary.BigEndian.Uint32(b[1:])), true
	}
	switch lead {
	case 0xc4, 0xd9: // bin8, str8
		n, ok := u8()
		return 2 + n, pending, ok
	case 0xc5, 0xda: // bin16, str16
		n, ok := u16()
		return 3 + n, pending, ok
	case 0xc6, 0xdb: // bin32, str32
		n, ok := u32()
		return 5 + n, pending, ok
	case 0xc7: // ext8: length, type, data
		n, ok := u8()
		return 3 + n, pending, ok
	case 0xc8: // ext16
		n, ok := u16()
		return 4 + n, pending, ok
	case 0xc9: // ext32
		n, ok := u32()
		return 6 + n, pending, ok
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return 5, pending, true
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return 9, pending, true
	case 0xcc, 0xd0: // uint8, int8
		return 2, pending, true
	case 0xcd, 0xd1: // uint16, int16
		return 3, pending, true
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return 2 + 1<<(lead-0xd4), pending, true
	case 0xdc: // array16
		n, ok := u16()
		return 3, pending + uint64(n), ok
	case 0xdd: // array32
		n, ok := u32()
		return 5, pending + uint64(n), ok
	case 0xde: // map16
		n, ok := u16()
		return 3, pending + 2*uint64(n), ok
	case 0xdf: // map32
		n, ok := u32()
		return 5, pending + 2*uint64(n), ok
	default: // 0xc1 is never used
		return 0, pending, false
	}
}

// httpIntKind classifies what httpReadInt found.
type httpIntKind uint8

const (
	httpIntOK     httpIntKind = iota
	httpIntTooBig             // a uint64 above math.MaxInt64: an integer, but out of range
	httpIntNotInt             // a well-formed object of another type
	httpIntShort              // truncated
)

// httpReadInt reads an integer of any msgpack width. Integer-ness is decided by the lead
// byte, so a float or string is reported as httpIntNotInt without decoding it.
func httpReadInt(b []byte) (int64, httpIntKind, []byte) {
	if len(b) == 0 {
		return 0, httpIntShort, b
	}
	lead := b[0]
	if lead <= 0x7f {
		return int64(lead), httpIntOK, b[1:]
	}
	if lead >= 0xe0 {
		return int64(int8(lead)), httpIntOK, b[1:]
	}
	switch lead {
	case 0xcc, 0xcd, 0xce, 0xd0, 0xd1, 0xd2, 0xd3:
		v, rest, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, httpIntShort, b
		}
		return v, httpIntOK, rest
	case 0xcf:
		v, rest, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, httpIntShort, b
		}
		if v > math.MaxInt64 {
			return 0, httpIntTooBig, rest
		}
		return int64(v), httpIntOK, rest
	}
	return 0, httpIntNotInt, b
}

// httpString returns the bytes of a msgpack str (aliasing b), ok=false for any other type.
func httpString(raw []byte) ([]byte, bool) {
	if msgp.NextType(raw) != msgp.StrType {
		return nil, false
	}
	s, _, err := msgp.ReadStringZC(raw)
	if err != nil {
		return nil, false
	}
	return s, true
}

// httpMap walks the entries of one msgpack map. Keys that are not strings do not stop the
// walk: upstream parses the whole body before looking at it, so a malformed byte later in
// the body must still win over a bad key earlier.
type httpMap struct {
	rest         []byte
	left         uint32
	nonStringKey bool
}

// httpCheckRoot rejects a body whose root is not a map, reporting an unparsable body
// before a non-map one, as upstream does.
func httpCheckRoot(body []byte) *RequestError {
	if msgp.NextType(body) == msgp.MapType {
		return nil
	}
	rest, ok := httpSkip(body, 1)
	if !ok || len(rest) != 0 {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	return newRequestError(ReasonInvalidMsgpack, "", msgRootNotMap)
}

// open positions m on the entries of the map at the start of b (which must be a map).
func (m *httpMap) open(b []byte) *RequestError {
	n, rest, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	m.rest, m.left, m.nonStringKey = rest, n, false
	return nil
}

// next reads the next key. ok=false means the map is exhausted (done=true) or malformed.
// A non-string key is skipped and flagged; key is then nil and the caller skips the value.
func (m *httpMap) next() (key []byte, done, ok bool) {
	if m.left == 0 {
		return nil, true, true
	}
	m.left--
	if len(m.rest) > 0 && (m.rest[0]&0xe0 == 0xa0 || m.rest[0] == 0xd9 || m.rest[0] == 0xda || m.rest[0] == 0xdb) {
		k, rest, err := msgp.ReadStringZC(m.rest)
		if err != nil {
			return nil, false, false
		}
		m.rest = rest
		return k, false, true
	}
	rest, good := httpSkip(m.rest, 1)
	if !good {
		return nil, false, false
	}
	m.rest = rest
	m.nonStringKey = true
	return nil, false, true
}

// value steps over the current value and returns its encoded bytes.
func (m *httpMap) value() ([]byte, bool) {
	start := m.rest
	rest, ok := httpSkip(start, 1)
	if !ok {
		return nil, false
	}
	m.rest = rest
	return start[:len(start)-len(rest)], true
}

// httpStrictMap holds the outcome of walking a map whose allowed keys are known: each
// known key's last value (duplicate keys: last wins, as in a decoded map) and the first
// offence, reported only after the whole map proved parsable.
type httpStrictMap struct {
	unknown []byte // first key outside the allowed set
	hasBad  bool   // a non-string key was seen
}

// finish turns the walk's findings into the error upstream would report first; prefix is
// prepended to the name of an unknown field ("hash_profile." for the nested map).
func (s *httpStrictMap) finish(prefix string) *RequestError {
	if s.hasBad {
		return newRequestError(ReasonInvalidMsgpack, "", msgKeyNotString)
	}
	if s.unknown != nil {
		name := prefix + string(s.unknown)
		return newRequestError(ReasonUnknownField, name, "unsupported request field: "+name)
	}
	return nil
}

// httpWalkStrict walks the map at the start of b, storing each allowed key's raw value in
// vals (slot chosen by slot, -1 for unknown keys) and returning the bytes after the map.
func httpWalkStrict(b []byte, slot func(key []byte) int, vals [][]byte, st *httpStrictMap) ([]byte, *RequestError) {
	var m httpMap
	if rerr := m.open(b); rerr != nil {
		return nil, rerr
	}
	for {
		key, done, ok := m.next()
		if !ok {
			return nil, newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
		}
		if done {
			break
		}
		raw, ok := m.value()
		if !ok {
			return nil, newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
		}
		if key == nil {
			continue
		}
		if i := slot(key); i >= 0 {
			vals[i] = raw
		} else if st.unknown == nil {
			st.unknown = key
		}
	}
	st.hasBad = st.hasBad || m.nonStringKey
	return m.rest, nil
}

// httpDecodeRoot walks a request body whose root must be a map with the given keys.
func httpDecodeRoot(body []byte, slot func(key []byte) int, vals [][]byte) *RequestError {
	if rerr := httpCheckRoot(body); rerr != nil {
		return rerr
	}
	var st httpStrictMap
	rest, rerr := httpWalkStrict(body, slot, vals, &st)
	if rerr != nil {
		return rerr
	}
	if len(rest) != 0 {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	return st.finish("")
}
