package cororpc

// struct_pack (yalantinglibs) primitives for the coro_rpc bodies. Only the subset the
// conductor RPC types need is implemented: release-mode bodies, fixed-width little-endian
// scalars, strings, vectors, sets, maps, optional and expected. Compatible fields and the
// debug-mode type literal are not supported and are rejected when decoding.
//
// Layout of one body: a 4-byte little-endian type code (an MD5 of the type structure with
// bit 0 cleared), then, only when bit 0 is set, one metainfo byte whose bits 3-4 give the
// width of every length in the body, then the payload. The width is chosen by the sender
// from the largest length in the object (bytes of a string, elements of a container):
// below 2^8 one byte and no metainfo, below 2^16 two bytes (metainfo 0x08), below 2^32
// four bytes (0x10), otherwise eight bytes (0x18).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"
)

// Errors returned (wrapped, with the message and field) by the struct_pack decoders, so
// callers can tell a hostile or broken peer from a version mismatch. A version mismatch:
var (
	// ErrStructPackTypeCode means the body starts with a type code of another type: the
	// peer was built from different struct definitions, or called another method.
	ErrStructPackTypeCode = errors.New("struct_pack: type code mismatch")
	// ErrStructPackMetainfo means the metainfo byte asks for features this codec does
	// not implement (compatible fields, debug type literals).
	ErrStructPackMetainfo = errors.New("struct_pack: unsupported metainfo")
)

// A broken (or hostile) peer:
var (
	// ErrStructPackTruncated means the body ends inside a value.
	ErrStructPackTruncated = errors.New("struct_pack: truncated body")
	// ErrStructPackLength means a string or container length exceeds what the remaining
	// bytes could possibly hold; it is checked before anything is allocated.
	ErrStructPackLength = errors.New("struct_pack: length exceeds remaining bytes")
	// ErrStructPackValue means a value that C++ could not have produced: a bool, optional
	// or expected flag other than 0/1, or map/set keys not strictly ascending.
	ErrStructPackValue = errors.New("struct_pack: invalid value")
	// ErrStructPackTrailing means bytes are left after the complete value.
	ErrStructPackTrailing = errors.New("struct_pack: trailing bytes")
)

// metaWidthMask selects the length-width bits of the metainfo byte; any other bit is a
// feature we do not implement.
const metaWidthMask = 0x18

// widthFor returns the length width (1, 2, 4 or 8 bytes) and metainfo byte struct_pack
// uses when maxLen is the largest string or container length in the object.
func widthFor(maxLen uint64) (width int, meta byte) {
	switch {
	case maxLen < 1<<8:
		return 1, 0
	case maxLen < 1<<16:
		return 2, 0x08
	case maxLen < 1<<32:
		return 4, 0x10
	default:
		return 8, 0x18
	}
}

// begin appends the type code (and the metainfo byte when lengths need more than one
// byte) and returns the width every later length must use.
func begin(dst []byte, code uint32, maxLen uint64) ([]byte, int) {
	w, meta := widthFor(maxLen)
	if w == 1 {
		return binary.LittleEndian.AppendUint32(dst, code&^1), 1
	}
	dst = binary.LittleEndian.AppendUint32(dst, code|1)
	return append(dst, meta), w
}

// appendLen appends n in the body's length width.
func appendLen(dst []byte, w int, n int) []byte {
	switch w {
	case 1:
		return append(dst, byte(n))
	case 2:
		return binary.LittleEndian.AppendUint16(dst, uint16(n))
	case 4:
		return binary.LittleEndian.AppendUint32(dst, uint32(n))
	default:
		return binary.LittleEndian.AppendUint64(dst, uint64(n))
	}
}

func appendString(dst []byte, w int, s string) []byte {
	return append(appendLen(dst, w, len(s)), s...)
}

func appendI32(dst []byte, v int32) []byte {
	return binary.LittleEndian.AppendUint32(dst, uint32(v))
}

func appendI64(dst []byte, v int64) []byte {
	return binary.LittleEndian.AppendUint64(dst, uint64(v))
}

// appendI32s appends the elements of a vector<int32> (the length is written by the
// caller), growing dst once instead of per element: token lists are the bulk of a query.
func appendI32s(dst []byte, v []int32) []byte {
	off := len(dst)
	dst = slices.Grow(dst, 4*len(v))[:off+4*len(v)]
	out := dst[off:]
	if hostLittleEndian && len(v) > 0 {
		copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
		return dst
	}
	putI32sLE(out, v)
	return dst
}

// putI32sLE is the portable encoding of int32s, used on big-endian hosts.
func putI32sLE(out []byte, v []int32) {
	for i, t := range v {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(t))
	}
}

// getI32sLE is the portable decoding of int32s, used on big-endian hosts.
func getI32sLE(dst []int32, src []byte) {
	for i := range dst {
		dst[i] = int32(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func appendU64(dst []byte, v uint64) []byte {
	return binary.LittleEndian.AppendUint64(dst, v)
}

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// appendOptString appends optional<string>: a presence byte, then the string if present.
func appendOptString(dst []byte, w int, present bool, s string) []byte {
	if !present {
		return append(dst, 0)
	}
	return appendString(append(dst, 1), w, s)
}

// reader decodes one struct_pack body. Errors are sticky: after the first failure every
// read returns a zero value, so decoders check err once per structure instead of per read,
// and the happy path stays branch-light and allocation-free.
type reader struct {
	b     []byte
	off   int
	w     int    // length width in bytes
	field string // what is being read, for error context
	err   error
}

// open checks the type code (bit 0 aside) and metainfo, returning a reader positioned at
// the first payload byte.
func open(body []byte, code uint32) reader {
	r := reader{b: body, w: 1, field: "type code"}
	if len(body) < 4 {
		r.fail(ErrStructPackTruncated)
		return r
	}
	got := binary.LittleEndian.Uint32(body)
	r.off = 4
	if got&^1 != code&^1 {
		r.err = fmt.Errorf("%w: got %#08x, want %#08x", ErrStructPackTypeCode, got&^1, code&^1)
		return r
	}
	if got&1 == 0 {
		return r
	}
	r.field = "metainfo"
	if len(body) < 5 {
		r.fail(ErrStructPackTruncated)
		return r
	}
	meta := body[4]
	r.off = 5
	if meta&^metaWidthMask != 0 {
		r.err = fmt.Errorf("%w: %#02x", ErrStructPackMetainfo, meta)
		return r
	}
	r.w = 1 << (meta >> 3)
	return r
}

func (r *reader) fail(base error) {
	if r.err == nil {
		r.err = fmt.Errorf("%s at offset %d: %w", r.field, r.off, base)
	}
}

// need reports whether n more bytes are available, failing the reader if not.
func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if len(r.b)-r.off < n {
		r.fail(ErrStructPackTruncated)
		return false
	}
	return true
}

func (r *reader) u8() byte {
	if !r.need(1) {
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

// flag reads a bool, optional or expected presence byte; only 0 and 1 are valid.
func (r *reader) flag() bool {
	v := r.u8()
	if v > 1 {
		r.off--
		r.fail(ErrStructPackValue)
		return false
	}
	return v == 1
}

func (r *reader) i32() int32 {
	if !r.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return int32(v)
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

// i32s reads a vector<int32> (length and elements) into dst[:0], reusing its capacity.
func (r *reader) i32s(dst []int32) []int32 {
	n := r.length(4)
	src := r.bytes(4 * n)
	if r.err != nil {
		return dst[:0]
	}
	dst = slices.Grow(dst[:0], n)[:n]
	if n == 0 {
		return dst
	}
	if hostLittleEndian {
		// The wire layout is the host layout: one memmove instead of n loads.
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), src)
		return dst
	}
	getI32sLE(dst, src)
	return dst
}

// hostLittleEndian is fixed per build target: on little-endian CPUs (amd64, arm64) a
// little-endian int32 vector (struct_pack, or an HTTP token bin) has the memory layout of
// an []int32, and is decoded with one memmove.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func (r *reader) i64() int64 { return int64(r.u64()) }

// length reads a string or container length and checks that n elements of at least
// minElem bytes each fit in what is left, so a hostile length never drives an allocation
// larger than the body itself (times a small per-type factor).
func (r *reader) length(minElem int) int {
	if !r.need(r.w) {
		return 0
	}
	var n uint64
	switch r.w {
	case 1:
		n = uint64(r.b[r.off])
	case 2:
		n = uint64(binary.LittleEndian.Uint16(r.b[r.off:]))
	case 4:
		n = uint64(binary.LittleEndian.Uint32(r.b[r.off:]))
	default:
		n = binary.LittleEndian.Uint64(r.b[r.off:])
	}
	r.off += r.w
	if minElem < 1 {
		minElem = 1
	}
	rem := uint64(len(r.b) - r.off)
	if n > rem/uint64(minElem) {
		r.err = fmt.Errorf("%s at offset %d: %w: %d elements of >= %d bytes, %d bytes left",
			r.field, r.off-r.w, ErrStructPackLength, n, minElem, rem)
		return 0
	}
	return int(n)
}

// bytes returns the next n bytes, aliasing the body.
func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// strAlias reads a string that aliases the body: no allocation, valid only while the body
// is neither modified nor reused.
func (r *reader) strAlias() string {
	n := r.length(1)
	b := r.bytes(n)
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// strCopy reads a string into fresh memory, for values the caller keeps.
func (r *reader) strCopy() string {
	n := r.length(1)
	return string(r.bytes(n))
}

// optStr reads optional<string>.
func (r *reader) optStr(copyStr bool) (string, bool) {
	if !r.flag() {
		return "", false
	}
	if copyStr {
		return r.strCopy(), true
	}
	return r.strAlias(), true
}

// finish fails on trailing bytes and returns the first error, if any.
func (r *reader) finish() error {
	if r.err == nil && r.off != len(r.b) {
		r.err = fmt.Errorf("%w: %d bytes after the value", ErrStructPackTrailing, len(r.b)-r.off)
	}
	return r.err
}

// maxLen returns the larger of a and b; the size pass folds every length through it.
func maxLen(a uint64, b int) uint64 {
	if uint64(b) > a {
		return uint64(b)
	}
	return a
}
