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
			// Forms with a length after the code take w bytes of it (big-endian), then
			// extra bytes before the payload (ext's type); an array's or a map's length
			// counts the values owed per element, not bytes.
			w, extra, per := 0, 0, 0
			switch c {
			case 0xc0, 0xc2, 0xc3:
				size = 1
			case 0xc1:
				return ErrInvalid
			case 0xc4, 0xc5, 0xc6: // bin 8/16/32
				w = 1 << (c - 0xc4)
			case 0xd9, 0xda, 0xdb: // str 8/16/32
				w = 1 << (c - 0xd9)
			case 0xc7, 0xc8, 0xc9: // ext 8/16/32
				w, extra = 1<<(c-0xc7), 1
			case 0xdc, 0xdd: // array 16/32
				w, per = 2<<(c-0xdc), 1
			case 0xde, 0xdf: // map 16/32
				w, per = 2<<(c-0xde), 2
			case 0xca, 0xce, 0xd2:
				size = 5
			case 0xcb, 0xcf, 0xd3:
				size = 9
			case 0xcc, 0xd0:
				size = 2
			case 0xcd, 0xd1:
				size = 3
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1/2/4/8/16: a type byte, then the data
				size = 2 + 1<<(c-0xd4)
			}
			if w > 0 {
				if !r.Need(1 + w) {
					return ErrTruncated
				}
				n := bigEndianLength(r.Buf[r.Pos+1:], w)
				if per > 0 {
					owed += per * n
					size = 1 + w
				} else {
					size = 1 + w + extra + n
				}
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

// bigEndianLength reads the w-byte (1, 2 or 4) big-endian length at the start of b.
func bigEndianLength(b []byte, w int) int {
	switch w {
	case 1:
		return int(b[0])
	case 2:
		return int(binary.BigEndian.Uint16(b))
	}
	return int(binary.BigEndian.Uint32(b))
}
