package msgpack

import "encoding/binary"

// Skip passes over one complete value of any type.
func (r *Reader) Skip() error { return r.SkipN(1) }

// Skip steps over count complete values at the start of b and returns what follows;
// on failure it returns b and ErrTruncated or ErrInvalid.
func Skip(b []byte, count int) ([]byte, error) {
	r := Reader{Buf: b}
	if err := r.SkipN(count); err != nil {
		return b, err
	}
	return b[r.Pos:], nil
}

// SkipN passes over count complete values of any type: the one skip of wire/. It is
// iterative (a counter of values still owed instead of recursion), so hostile nesting
// depth cannot grow the stack, and it fails as soon as more values are owed than bytes
// remain (every value takes at least one byte), so a lying header cannot make it loop.
func (r *Reader) SkipN(count int) error {
	owed := count
	if owed > r.Left() {
		return ErrTruncated
	}
	for owed > 0 {
		owed--
		if r.Pos >= len(r.Buf) {
			return ErrTruncated
		}
		c := r.Buf[r.Pos]
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
				return ErrInvalid
			case 0xc4, 0xd9:
				if !r.Need(2) {
					return ErrTruncated
				}
				size = 2 + int(r.Buf[r.Pos+1])
			case 0xc5, 0xda:
				if !r.Need(3) {
					return ErrTruncated
				}
				size = 3 + int(binary.BigEndian.Uint16(r.Buf[r.Pos+1:]))
			case 0xc6, 0xdb:
				if !r.Need(5) {
					return ErrTruncated
				}
				size = 5 + int(binary.BigEndian.Uint32(r.Buf[r.Pos+1:]))
			case 0xc7:
				if !r.Need(2) {
					return ErrTruncated
				}
				size = 3 + int(r.Buf[r.Pos+1])
			case 0xc8:
				if !r.Need(3) {
					return ErrTruncated
				}
				size = 4 + int(binary.BigEndian.Uint16(r.Buf[r.Pos+1:]))
			case 0xc9:
				if !r.Need(5) {
					return ErrTruncated
				}
				size = 6 + int(binary.BigEndian.Uint32(r.Buf[r.Pos+1:]))
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
				if !r.Need(3) {
					return ErrTruncated
				}
				n := int(binary.BigEndian.Uint16(r.Buf[r.Pos+1:]))
				if c == 0xde {
					n *= 2
				}
				owed += n
				size = 3
			case 0xdd, 0xdf:
				if !r.Need(5) {
					return ErrTruncated
				}
				n := int(binary.BigEndian.Uint32(r.Buf[r.Pos+1:]))
				if c == 0xdf {
					n *= 2
				}
				owed += n
				size = 5
			}
		}
		if !r.Need(size) {
			return ErrTruncated
		}
		r.Pos += size
		if owed > r.Left() {
			return ErrTruncated
		}
	}
	return nil
}
