// Package tokenarray decodes msgpack arrays of token ids (int32) a window of bytes at a
// time with AVX-512 VBMI (vbmi_amd64.s): the part of token-array decoding that every
// wire format with token ids shares (httpapi's /query bodies, kvevent's engine events).
// Each format keeps its own exact element-by-element path, which decides every error;
// DecodeVBMI only takes the elements that every path decodes the same way and leaves the
// rest to it.
//
// The only serial dependency of a msgpack int array is where each element starts, which
// depends on the width of the one before: a scalar walk pays a load-to-load latency per
// element (~11 cycles). DecodeVBMI takes the elements starting in a window of
// vbmiWindow bytes at once instead, with one 64-byte register holding the window and
// the 5 bytes after it (so every position it computes with stays below 64, the reach of
// a one-register byte permute):
//
//  1. For every byte of the window, the length an element led by it would take, and so
//     next[p], where such an element ends: one table permute (VPERMB). Positions past
//     the window map to themselves.
//  2. next composed with itself: next², next⁴, ... next⁶⁴, each one permute of the
//     previous by itself. None of this depends on where the window's first element
//     starts, so consecutive windows overlap in the core.
//  3. From the first element's start s (0..4 bytes into the window, carried from the
//     window before), the start of element k is next^k(s): lane k applies the powers
//     of the bits of k (six masked permutes). The elements that start in the window are
//     the lanes below vbmiWindow; next⁶⁴(s)-vbmiWindow is where the next window's first
//     element starts, the only value that passes from one window to the next.
//  4. Per element, the lead byte gives its form (fixint, uint8/16/32, int8/16/32, or one
//     not taken) and its value is the 4 big-endian bytes ending where the element ends,
//     masked to the form's width: one byte permute gathers them for 16 elements. A
//     value outside the int32 range or negative, and a form not taken, stop the decode
//     at that element.
//
// DecodeVBMI decodes only what every path decodes the same way and stops at anything
// else; the exact path goes on from there. It reads no byte outside b.
package tokenarray

// vbmiWindow is how many bytes' elements one window takes: an element starting in it
// ends by byte 63 of the register (5 bytes at most).
const vbmiWindow = 59

// MinElems is the fewest elements of room DecodeVBMI decodes into: a window may take up
// to 64.
const MinElems = 64

// vbmiTables holds the constants of DecodeVBMI's assembly, which reads them by offset
// (the field order and sizes are part of its code).
type vbmiTables struct {
	iota  [64]byte    // 0: lane numbers
	win   [64]byte    // 64: 0xff for the window's bytes, 0 for the 5 after it
	ones  [64]byte    // 128: the length of a fixint
	lenT  [64]byte    // 192: element length by lead byte & 63, for leads >= 0x80 (a lead not taken may read a taken one's length: its form stops the decode there)
	clsLo [64]byte    // 256: form by lead byte & 127 (leads >= 0x80), entries 0..63
	clsHi [64]byte    // 320: entries 64..127
	pat   [4][64]byte // 384: group g's dword lane k holds byte 16g+k in each of its bytes
	sub   [64]byte    // 640: 1, 2, 3, 4 in each dword: bytes E-1, E-2, E-3, E-4
	maskT [16]uint32  // 704: value mask by form
	signT [16]uint32  // 768: bits that must be clear by form
	all59 [64]byte    // 832: vbmiWindow in every byte
	inval [64]byte    // 896: the form not taken
	lanes [6]uint64   // 960: bit k set where lane k has bit j
	patE  [4][64]byte // 1008: pat plus one: element 16g+k+1's start is element 16g+k's end
}

// Forms of an array element, by lead byte.
const (
	formFixint = iota
	formUint8
	formUint16
	formUint32
	formInt8
	formInt16
	formInt32
	formOther
)

// vbmiTabs is read-only after package initialisation.
var vbmiTabs = func() (t vbmiTables) {
	for k := range 64 {
		t.iota[k], t.ones[k], t.all59[k], t.inval[k] = byte(k), 1, vbmiWindow, formOther
		if k < vbmiWindow {
			t.win[k] = 0xff
		}
		t.lenT[k] = 1
		t.sub[k] = byte(k%4 + 1)
		for g := range 4 {
			t.pat[g][k] = byte(16*g + k/4)
			t.patE[g][k] = byte(16*g + k/4 + 1)
		}
		for j := range 6 {
			if k>>j&1 == 1 {
				t.lanes[j] |= 1 << k
			}
		}
	}
	form := map[byte]byte{0xcc: formUint8, 0xcd: formUint16, 0xce: formUint32, 0xd0: formInt8, 0xd1: formInt16, 0xd2: formInt32}
	length := [...]byte{formUint8: 2, formUint16: 3, formUint32: 5, formInt8: 2, formInt16: 3, formInt32: 5}
	for c := 0x80; c < 0x100; c++ {
		f, ok := form[byte(c)]
		if !ok {
			f = formOther
		}
		if c-0x80 < 64 {
			t.clsLo[c-0x80] = f
		} else {
			t.clsHi[c-0xc0] = f
		}
		if ok {
			t.lenT[c&63] = length[f]
		}
	}
	t.maskT = [16]uint32{formFixint: 0xff, formUint8: 0xff, formUint16: 0xffff, formUint32: 0xffffffff,
		formInt8: 0xff, formInt16: 0xffff, formInt32: 0xffffffff}
	t.signT = [16]uint32{formUint32: 1 << 31, formInt8: 1 << 7, formInt16: 1 << 15, formInt32: 1 << 31}
	return t
}()
