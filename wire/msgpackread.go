package wire

import (
	"encoding/binary"
	"errors"
	"math"
)

// Structural failures: the payload is not one well-formed msgpack value, so nothing
// after the failure point can be located and the whole message is dropped.
var (
	// ErrPayloadTruncated means a msgpack value ran past the end of the payload, or a
	// container header claims more elements than the remaining bytes could hold.
	ErrPayloadTruncated = errors.New("msgpack value truncated")
	// ErrPayloadInvalid means the payload uses the msgpack reserved byte 0xc1.
	ErrPayloadInvalid = errors.New("msgpack reserved type byte 0xc1")
)

// evReader walks a msgpack buffer without copying: strings and bins it returns are
// sub-slices of buf. Methods leave pos untouched when they report a wrong type, but
// callers that need to recover after a partial read should save pos and use skip.
type evReader struct {
	buf []byte
	pos int
}

func (r *evReader) left() int { return len(r.buf) - r.pos }

// need reports whether n more bytes are available; n may come from a hostile header,
// so the comparison is done without adding to pos (no overflow).
func (r *evReader) need(n int) bool { return n >= 0 && n <= len(r.buf)-r.pos }

func (r *evReader) peek() (byte, error) {
	if r.pos >= len(r.buf) {
		return 0, ErrPayloadTruncated
	}
	return r.buf[r.pos], nil
}

// readNil consumes a nil and reports whether it was one.
func (r *evReader) readNil() bool {
	if r.pos < len(r.buf) && r.buf[r.pos] == 0xc0 {
		r.pos++
		return true
	}
	return false
}

func evIsMap(c byte) bool   { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }
func evIsArray(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }

// readArrayHeader reads an array header. Every element takes at least one byte, so a
// count above the remaining bytes is rejected before anyone sizes a buffer from it.
func (r *evReader) readArrayHeader() (int, error) { return r.readHeader(0x90, 0xdc, 0xdd, 1) }

// readMapHeader reads a map header; each entry takes at least two bytes.
func (r *evReader) readMapHeader() (int, error) { return r.readHeader(0x80, 0xde, 0xdf, 2) }

// readHeader reads a container header (fix form fixTag|n, then 16- and 32-bit forms) and
// checks that n entries of at least minBytes each can still follow.
func (r *evReader) readHeader(fixTag, op16, op32 byte, minBytes int) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n, hdr int
	switch {
	case c&0xf0 == fixTag:
		n, hdr = int(c&0x0f), 1
	case c == op16:
		if !r.need(3) {
			return 0, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint16(r.buf[r.pos+1:])), 3
	case c == op32:
		if !r.need(5) {
			return 0, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint32(r.buf[r.pos+1:])), 5
	default:
		return 0, ErrEventWrongType
	}
	if !r.need(hdr + minBytes*n) {
		return 0, ErrPayloadTruncated
	}
	r.pos += hdr
	return n, nil
}

// readStr returns the bytes of a msgpack str (not bin: map keys and text fields are
// str on every publisher we read).
func (r *evReader) readStr() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n, hdr int
	switch {
	case c&0xe0 == 0xa0:
		n, hdr = int(c&0x1f), 1
	case c == 0xd9:
		if !r.need(2) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(r.buf[r.pos+1]), 2
	case c == 0xda:
		if !r.need(3) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint16(r.buf[r.pos+1:])), 3
	case c == 0xdb:
		if !r.need(5) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint32(r.buf[r.pos+1:])), 5
	default:
		return nil, ErrEventWrongType
	}
	if !r.need(hdr + n) {
		return nil, ErrPayloadTruncated
	}
	start := r.pos + hdr
	r.pos = start + n
	return r.buf[start:r.pos:r.pos], nil
}

// readBin returns the bytes of a msgpack bin.
func (r *evReader) readBin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n, hdr int
	switch c {
	case 0xc4:
		if !r.need(2) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(r.buf[r.pos+1]), 2
	case 0xc5:
		if !r.need(3) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint16(r.buf[r.pos+1:])), 3
	case 0xc6:
		if !r.need(5) {
			return nil, ErrPayloadTruncated
		}
		n, hdr = int(binary.BigEndian.Uint32(r.buf[r.pos+1:])), 5
	default:
		return nil, ErrEventWrongType
	}
	if !r.need(hdr + n) {
		return nil, ErrPayloadTruncated
	}
	start := r.pos + hdr
	r.pos = start + n
	return r.buf[start:r.pos:r.pos], nil
}

// readInt reads any msgpack integer encoding. The result is normalised the way
// msgpack-c does it: neg is true only for values below zero, in which case v holds the
// two's-complement bit pattern; a signed encoding of a non-negative value is positive.
func (r *evReader) readInt() (v uint64, neg bool, err error) {
	if r.pos >= len(r.buf) {
		return 0, false, ErrPayloadTruncated
	}
	b := r.buf[r.pos:]
	c := b[0]
	if c <= 0x7f {
		r.pos++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.pos++
		return uint64(int64(int8(c))), true, nil
	}
	var s int64
	switch c {
	case 0xcc:
		if len(b) < 2 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 2
		return uint64(b[1]), false, nil
	case 0xcd:
		if len(b) < 3 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 3
		return uint64(binary.BigEndian.Uint16(b[1:])), false, nil
	case 0xce:
		if len(b) < 5 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 5
		return uint64(binary.BigEndian.Uint32(b[1:])), false, nil
	case 0xcf:
		if len(b) < 9 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 9
		return binary.BigEndian.Uint64(b[1:]), false, nil
	case 0xd0:
		if len(b) < 2 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 2
		s = int64(int8(b[1]))
	case 0xd1:
		if len(b) < 3 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 3
		s = int64(int16(binary.BigEndian.Uint16(b[1:])))
	case 0xd2:
		if len(b) < 5 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 5
		s = int64(int32(binary.BigEndian.Uint32(b[1:])))
	case 0xd3:
		if len(b) < 9 {
			return 0, false, ErrPayloadTruncated
		}
		r.pos += 9
		s = int64(binary.BigEndian.Uint64(b[1:]))
	default:
		return 0, false, ErrEventWrongType
	}
	return uint64(s), s < 0, nil
}

// readInt64 reads an integer that must fit int64.
func (r *evReader) readInt64() (int64, error) {
	v, neg, err := r.readInt()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, ErrEventOutOfRange
	}
	return int64(v), nil
}

// readUint64 reads a non-negative integer.
func (r *evReader) readUint64() (uint64, error) {
	v, neg, err := r.readInt()
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, ErrEventOutOfRange
	}
	return v, nil
}

// readFloat reads float32 or float64 (integers are refused: a float timestamp is how
// the engines' batches are told apart from Mooncake's integer milliseconds).
func (r *evReader) readFloat() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		if !r.need(5) {
			return 0, ErrPayloadTruncated
		}
		f := math.Float32frombits(binary.BigEndian.Uint32(r.buf[r.pos+1:]))
		r.pos += 5
		return float64(f), nil
	case 0xcb:
		if !r.need(9) {
			return 0, ErrPayloadTruncated
		}
		f := math.Float64frombits(binary.BigEndian.Uint64(r.buf[r.pos+1:]))
		r.pos += 9
		return f, nil
	}
	return 0, ErrEventWrongType
}

// skip passes over one complete value of any type. It is iterative (a counter of
// values still owed instead of recursion), so hostile nesting depth cannot grow the
// stack, and it fails as soon as more values are owed than bytes remain.
func (r *evReader) skip() error {
	owed := 1
	for owed > 0 {
		owed--
		if r.pos >= len(r.buf) {
			return ErrPayloadTruncated
		}
		c := r.buf[r.pos]
		size := 0 // bytes taken by the item itself (header plus payload)
		switch {
		case c <= 0x7f || c >= 0xe0:
			size = 1
		case c <= 0x8f:
			owed += 2 * int(c&0x0f)
			size = 1
		case c <= 0x9f:
			owed += int(c & 0x0f)
			size = 1
		case c <= 0xbf:
			size = 1 + int(c&0x1f)
		default:
			switch c {
			case 0xc0, 0xc2, 0xc3:
				size = 1
			case 0xc1:
				return ErrPayloadInvalid
			case 0xc4, 0xd9:
				if !r.need(2) {
					return ErrPayloadTruncated
				}
				size = 2 + int(r.buf[r.pos+1])
			case 0xc5, 0xda:
				if !r.need(3) {
					return ErrPayloadTruncated
				}
				size = 3 + int(binary.BigEndian.Uint16(r.buf[r.pos+1:]))
			case 0xc6, 0xdb:
				if !r.need(5) {
					return ErrPayloadTruncated
				}
				size = 5 + int(binary.BigEndian.Uint32(r.buf[r.pos+1:]))
			case 0xc7:
				if !r.need(2) {
					return ErrPayloadTruncated
				}
				size = 3 + int(r.buf[r.pos+1])
			case 0xc8:
				if !r.need(3) {
					return ErrPayloadTruncated
				}
				size = 4 + int(binary.BigEndian.Uint16(r.buf[r.pos+1:]))
			case 0xc9:
				if !r.need(5) {
					return ErrPayloadTruncated
				}
				size = 6 + int(binary.BigEndian.Uint32(r.buf[r.pos+1:]))
			case 0xca, 0xce, 0xd2:
				size = 5
			case 0xcb, 0xcf, 0xd3:
				size = 9
			case 0xcc, 0xd0:
				size = 2
			case 0xcd, 0xd1:
				size = 3
			case 0xd4:
				size = 3
			case 0xd5:
				size = 4
			case 0xd6:
				size = 6
			case 0xd7:
				size = 10
			case 0xd8:
				size = 18
			case 0xdc, 0xde:
				if !r.need(3) {
					return ErrPayloadTruncated
				}
				n := int(binary.BigEndian.Uint16(r.buf[r.pos+1:]))
				if c == 0xde {
					n *= 2
				}
				owed += n
				size = 3
			case 0xdd, 0xdf:
				if !r.need(5) {
					return ErrPayloadTruncated
				}
				n := int(binary.BigEndian.Uint32(r.buf[r.pos+1:]))
				if c == 0xdf {
					n *= 2
				}
				owed += n
				size = 5
			}
		}
		if !r.need(size) {
			return ErrPayloadTruncated
		}
		r.pos += size
		if owed > r.left() {
			return ErrPayloadTruncated
		}
	}
	return nil
}
