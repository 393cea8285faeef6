package msgpack

import (
	"encoding/binary"
	"errors"
	"math"
)

// Structural failures: the buffer is not one well-formed msgpack value, so nothing
// after the failure point can be located.
var (
	// ErrTruncated means a msgpack value ran past the end of the buffer, or a
	// container header claims more elements than the remaining bytes could hold.
	ErrTruncated = errors.New("msgpack value truncated")
	// ErrInvalid means the buffer uses the msgpack reserved byte 0xc1.
	ErrInvalid = errors.New("msgpack reserved type byte 0xc1")
)

// Value-level failures: the value is well-formed but not what the caller asked for.
var (
	// ErrWrongType means the value has another msgpack type than the one asked for.
	ErrWrongType = errors.New("wrong msgpack type")
	// ErrOutOfRange means an integer does not fit the range asked for.
	ErrOutOfRange = errors.New("value out of range")
)

// Reader walks a msgpack buffer without copying: strings and bins it returns are
// sub-slices of Buf. Methods leave Pos untouched when they report a wrong type, but
// callers that Need to recover after a partial read should save Pos and use Skip.
// Callers may read Buf and advance Pos themselves (inlined fast paths), as long as Pos
// stays within Buf.
type Reader struct {
	// Buf is the buffer being read.
	Buf []byte
	// Pos is the offset of the next unread byte.
	Pos int
}

// Left is the number of unread bytes.
func (r *Reader) Left() int { return len(r.Buf) - r.Pos }

// Need reports whether n more bytes are available; n may come from a hostile header,
// so the comparison is done without adding to pos (no overflow).
func (r *Reader) Need(n int) bool { return n >= 0 && n <= len(r.Buf)-r.Pos }

// Peek returns the next byte without consuming it.
func (r *Reader) Peek() (byte, error) {
	if r.Pos >= len(r.Buf) {
		return 0, ErrTruncated
	}
	return r.Buf[r.Pos], nil
}

// ReadNil consumes a nil and reports whether it was one.
func (r *Reader) ReadNil() bool {
	if r.Pos < len(r.Buf) && r.Buf[r.Pos] == 0xc0 {
		r.Pos++
		return true
	}
	return false
}

// IsMap reports whether c is the lead byte of a map.
func IsMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// IsArray reports whether c is the lead byte of an array.
func IsArray(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }

// ReadArrayHeader reads an array header. Every element takes at least one byte, so a
// count above the remaining bytes is rejected before anyone sizes a buffer from it.
func (r *Reader) ReadArrayHeader() (int, error) { return r.readHeader(0x90, 0xdc, 0xdd, 1) }

// ReadMapHeader reads a map header; each entry takes at least two bytes.
func (r *Reader) ReadMapHeader() (int, error) { return r.readHeader(0x80, 0xde, 0xdf, 2) }

// readHeader reads a container header (fix form fixTag|n, then 16- and 32-bit forms) and
// checks that n entries of at least minBytes each can still follow.
func (r *Reader) readHeader(fixTag, op16, op32 byte, minBytes int) (int, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	var n, hdr int
	switch {
	case c&0xf0 == fixTag:
		n, hdr = int(c&0x0f), 1
	case c == op16:
		if !r.Need(3) {
			return 0, ErrTruncated
		}
		n, hdr = int(binary.BigEndian.Uint16(r.Buf[r.Pos+1:])), 3
	case c == op32:
		if !r.Need(5) {
			return 0, ErrTruncated
		}
		n, hdr = int(binary.BigEndian.Uint32(r.Buf[r.Pos+1:])), 5
	default:
		return 0, ErrWrongType
	}
	if !r.Need(hdr + minBytes*n) {
		return 0, ErrTruncated
	}
	r.Pos += hdr
	return n, nil
}

// ReadStr returns the bytes of a msgpack str (not bin: map keys and text fields are
// str on every format we read). The fixstr form (every map key) is read inline; the
// other forms, and every error, go through readBytes.
func (r *Reader) ReadStr() ([]byte, error) {
	if p := r.Pos; p < len(r.Buf) {
		if c := r.Buf[p]; c&0xe0 == 0xa0 && int(c&0x1f) < len(r.Buf)-p {
			r.Pos = p + 1 + int(c&0x1f)
			return r.Buf[p+1 : r.Pos : r.Pos], nil
		}
	}
	return r.readBytes(0xd9)
}

// ReadBin returns the bytes of a msgpack bin. The bin8 form (binary block hashes) is read
// inline; the other forms, and every error, go through readBytes.
func (r *Reader) ReadBin() ([]byte, error) {
	if p := r.Pos; p+1 < len(r.Buf) && r.Buf[p] == 0xc4 {
		if n := int(r.Buf[p+1]); n <= len(r.Buf)-p-2 {
			r.Pos = p + 2 + n
			return r.Buf[p+2 : r.Pos : r.Pos], nil
		}
	}
	return r.readBytes(0xc4)
}

// readBytes is the one str/bin reader: op8 is the 8-bit form's lead (str8 0xd9 or bin8
// 0xc4; the 16- and 32-bit forms follow it), and str adds the fixstr form. The result
// aliases Buf, capped so that an append by the caller cannot overwrite what follows.
func (r *Reader) readBytes(op8 byte) ([]byte, error) {
	c, err := r.Peek()
	if err != nil {
		return nil, err
	}
	var n, hdr int
	switch {
	case op8 == 0xd9 && c&0xe0 == 0xa0:
		n, hdr = int(c&0x1f), 1
	case c == op8:
		if !r.Need(2) {
			return nil, ErrTruncated
		}
		n, hdr = int(r.Buf[r.Pos+1]), 2
	case c == op8+1:
		if !r.Need(3) {
			return nil, ErrTruncated
		}
		n, hdr = int(binary.BigEndian.Uint16(r.Buf[r.Pos+1:])), 3
	case c == op8+2:
		if !r.Need(5) {
			return nil, ErrTruncated
		}
		n, hdr = int(binary.BigEndian.Uint32(r.Buf[r.Pos+1:])), 5
	default:
		return nil, ErrWrongType
	}
	if !r.Need(hdr + n) {
		return nil, ErrTruncated
	}
	start := r.Pos + hdr
	r.Pos = start + n
	return r.Buf[start:r.Pos:r.Pos], nil
}

// Str reads the str at the start of b: its bytes (aliasing b) and what follows.
func Str(b []byte) (s, rest []byte, err error) {
	r := Reader{Buf: b}
	s, err = r.ReadStr()
	return s, b[r.Pos:], err
}

// Bin reads the bin at the start of b: its bytes (aliasing b) and what follows.
func Bin(b []byte) (v, rest []byte, err error) {
	r := Reader{Buf: b}
	v, err = r.ReadBin()
	return v, b[r.Pos:], err
}

// ReadInt reads any msgpack integer encoding. The result is normalised the way
// msgpack-c does it: neg is true only for values below zero, in which case v holds the
// two's-complement bit pattern; a signed encoding of a non-negative value is positive.
func (r *Reader) ReadInt() (v uint64, neg bool, err error) {
	if r.Pos >= len(r.Buf) {
		return 0, false, ErrTruncated
	}
	b := r.Buf[r.Pos:]
	c := b[0]
	if c <= 0x7f {
		r.Pos++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.Pos++
		return uint64(int64(int8(c))), true, nil
	}
	var s int64
	switch c {
	case 0xcc:
		if len(b) < 2 {
			return 0, false, ErrTruncated
		}
		r.Pos += 2
		return uint64(b[1]), false, nil
	case 0xcd:
		if len(b) < 3 {
			return 0, false, ErrTruncated
		}
		r.Pos += 3
		return uint64(binary.BigEndian.Uint16(b[1:])), false, nil
	case 0xce:
		if len(b) < 5 {
			return 0, false, ErrTruncated
		}
		r.Pos += 5
		return uint64(binary.BigEndian.Uint32(b[1:])), false, nil
	case 0xcf:
		if len(b) < 9 {
			return 0, false, ErrTruncated
		}
		r.Pos += 9
		return binary.BigEndian.Uint64(b[1:]), false, nil
	case 0xd0:
		if len(b) < 2 {
			return 0, false, ErrTruncated
		}
		r.Pos += 2
		s = int64(int8(b[1]))
	case 0xd1:
		if len(b) < 3 {
			return 0, false, ErrTruncated
		}
		r.Pos += 3
		s = int64(int16(binary.BigEndian.Uint16(b[1:])))
	case 0xd2:
		if len(b) < 5 {
			return 0, false, ErrTruncated
		}
		r.Pos += 5
		s = int64(int32(binary.BigEndian.Uint32(b[1:])))
	case 0xd3:
		if len(b) < 9 {
			return 0, false, ErrTruncated
		}
		r.Pos += 9
		s = int64(binary.BigEndian.Uint64(b[1:]))
	default:
		return 0, false, ErrWrongType
	}
	return uint64(s), s < 0, nil
}

// ReadInt64 reads an integer that must fit int64.
func (r *Reader) ReadInt64() (int64, error) {
	v, neg, err := r.ReadInt()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, ErrOutOfRange
	}
	return int64(v), nil
}

// ReadUint64 reads a non-negative integer.
func (r *Reader) ReadUint64() (uint64, error) {
	v, neg, err := r.ReadInt()
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, ErrOutOfRange
	}
	return v, nil
}

// ReadFloat reads float32 or float64 (integers are refused: a float timestamp is how
// the engines' batches are told apart from Mooncake's integer milliseconds).
func (r *Reader) ReadFloat() (float64, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		if !r.Need(5) {
			return 0, ErrTruncated
		}
		f := math.Float32frombits(binary.BigEndian.Uint32(r.Buf[r.Pos+1:]))
		r.Pos += 5
		return float64(f), nil
	case 0xcb:
		if !r.Need(9) {
			return 0, ErrTruncated
		}
		f := math.Float64frombits(binary.BigEndian.Uint64(r.Buf[r.Pos+1:]))
		r.Pos += 9
		return f, nil
	}
	return 0, ErrWrongType
}
