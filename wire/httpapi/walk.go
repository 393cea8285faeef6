package httpapi

import (
	"encoding/binary"
	"math"
	"runtime"
	"unsafe"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
	"github.com/tinylib/msgp/msgp"
)

// hostLittleEndian reports a little-endian host, where a bin of little-endian int32
// tokens (uint64 block keys) is the []int32's ([]uint64's) memory image. Tests flip it
// to cover the other hosts' path.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Messages shared by the strict request decoders. Upstream reports every unparsable body
// with the same text, whatever went wrong inside it.
const (
	msgInvalidMsgpack = "Invalid msgpack object"
	msgRootNotMap     = "request body must be a msgpack map"
	msgKeyNotString   = "map keys must be strings"
	tenantDefault     = "default"
)

// skip steps over count complete msgpack objects and returns what follows, or ok=false
// when b does not hold them. It is the shared iterative skipper (msgpack.Skip): msgp.Skip
// recurses once per nesting level (up to 100000 deep), and a request body is
// attacker-controlled.
func skip(b []byte, count int) ([]byte, bool) {
	rest, err := msgpack.Skip(b, count)
	return rest, err == nil
}

// intKind classifies what readInt found.
type intKind uint8

const (
	intOK     intKind = iota
	intTooBig         // a uint64 above math.MaxInt64: an integer, but out of range
	intNotInt         // a well-formed object of another type
	intShort          // truncated
)

// readInt reads an integer of any msgpack width. Integer-ness is decided by the lead
// byte, so a float or string is reported as intNotInt without decoding it.
func readInt(b []byte) (int64, intKind, []byte) {
	if len(b) == 0 {
		return 0, intShort, b
	}
	lead := b[0]
	if lead <= 0x7f {
		return int64(lead), intOK, b[1:]
	}
	if lead >= 0xe0 {
		return int64(int8(lead)), intOK, b[1:]
	}
	switch lead {
	case 0xcc, 0xcd, 0xce, 0xd0, 0xd1, 0xd2, 0xd3:
		v, rest, err := msgp.ReadInt64Bytes(b)
		if err != nil {
			return 0, intShort, b
		}
		return v, intOK, rest
	case 0xcf:
		v, rest, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, intShort, b
		}
		if v > math.MaxInt64 {
			return 0, intTooBig, rest
		}
		return int64(v), intOK, rest
	}
	return 0, intNotInt, b
}

// readString returns the bytes of a msgpack str (aliasing b), ok=false for any other type.
func readString(raw []byte) ([]byte, bool) {
	s, _, err := msgpack.Str(raw)
	return s, err == nil
}

// mapReader walks the entries of one msgpack map. Keys that are not strings do not stop the
// walk: upstream parses the whole body before looking at it, so a malformed byte later in
// the body must still win over a bad key earlier.
type mapReader struct {
	rest         []byte
	left         uint32
	nonStringKey bool
}

// checkRoot rejects a body whose root is not a map, reporting an unparsable body
// before a non-map one, as upstream does.
func checkRoot(body []byte) *RequestError {
	if msgp.NextType(body) == msgp.MapType {
		return nil
	}
	rest, ok := skip(body, 1)
	if !ok || len(rest) != 0 {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	return newRequestError(ReasonInvalidMsgpack, "", msgRootNotMap)
}

// open positions m on the entries of the map at the start of b (which must be a map).
func (m *mapReader) open(b []byte) *RequestError {
	n, rest, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	m.rest, m.left, m.nonStringKey = rest, n, false
	return nil
}

// next reads the next key. ok=false means the map is exhausted (done=true) or malformed.
// A non-string key is skipped and flagged; key is then nil and the caller skips the value.
func (m *mapReader) next() (key []byte, done, ok bool) {
	if m.left == 0 {
		return nil, true, true
	}
	m.left--
	k, rest, err := msgpack.Str(m.rest)
	if err == nil {
		m.rest = rest
		return k, false, true
	}
	if err != msgpack.ErrWrongType {
		return nil, false, false
	}
	rest, good := skip(m.rest, 1)
	if !good {
		return nil, false, false
	}
	m.rest = rest
	m.nonStringKey = true
	return nil, false, true
}

// value steps over the current value and returns its encoded bytes.
func (m *mapReader) value() ([]byte, bool) {
	start := m.rest
	rest, ok := skip(start, 1)
	if !ok {
		return nil, false
	}
	m.rest = rest
	return start[:len(start)-len(rest)], true
}

// strictMap holds the outcome of walking a map whose allowed keys are known: each
// known key's last value (duplicate keys: last wins, as in a decoded map) and the first
// offence, reported only after the whole map proved parsable.
type strictMap struct {
	unknown []byte // first key outside the allowed set
	hasBad  bool   // a non-string key was seen
}

// finish turns the walk's findings into the error upstream would report first; prefix is
// prepended to the name of an unknown field ("hash_profile." for the nested map).
func (s *strictMap) finish(prefix string) *RequestError {
	if s.hasBad {
		return newRequestError(ReasonInvalidMsgpack, "", msgKeyNotString)
	}
	if s.unknown != nil {
		name := prefix + string(s.unknown)
		return newRequestError(ReasonUnknownField, name, "unsupported request field: "+name)
	}
	return nil
}

// walkStrict walks the map at the start of b, storing the raw value of each of keys in
// vals (at the key's index in keys; any other key is unknown) and returning the bytes
// after the map.
func walkStrict(b []byte, keys []string, vals [][]byte, st *strictMap) ([]byte, *RequestError) {
	var m mapReader
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
		if i := slotOf(keys, key); i >= 0 {
			vals[i] = raw
		} else if st.unknown == nil {
			st.unknown = key
		}
	}
	st.hasBad = st.hasBad || m.nonStringKey
	return m.rest, nil
}

// slotOf returns the index of key in keys (its slot), or -1 for a key not among them.
func slotOf(keys []string, key []byte) int {
	for i, k := range keys {
		if k == string(key) {
			return i
		}
	}
	return -1
}

// decodeRoot walks a request body whose root must be a map with the given keys.
func decodeRoot(body []byte, keys []string, vals [][]byte) *RequestError {
	if rerr := checkRoot(body); rerr != nil {
		return rerr
	}
	var st strictMap
	rest, rerr := walkStrict(body, keys, vals, &st)
	if rerr != nil {
		return rerr
	}
	if len(rest) != 0 {
		return newRequestError(ReasonInvalidMsgpack, "", msgInvalidMsgpack)
	}
	return st.finish("")
}

// binInPlace lets a bin prompt be read in place (binView); tests clear it to cover the
// copying path that hosts without unaligned loads take for a misaligned bin.
var binInPlace = true

// unalignedLoads reports an architecture whose ordinary loads accept any alignment.
const unalignedLoads = runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"

// binView reports whether the bytes of a bin of size-byte words can serve as the decoded
// slice in place: on a little-endian host they are its memory image, and the words must
// be aligned unless the architecture loads unaligned words. A body is only read while the
// request is served (the engine copies nothing from it), so a view costs nothing, where a
// copy costs time in proportion to the prompt.
func binView(v []byte, size int) bool {
	if !hostLittleEndian || !binInPlace {
		return false
	}
	return unalignedLoads || uintptr(unsafe.Pointer(unsafe.SliceData(v)))%uintptr(size) == 0
}
