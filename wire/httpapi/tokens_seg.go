package httpapi

import (
	"encoding/binary"
	"unsafe"
)

// Segmented decoding of long token arrays.
//
// In a msgpack int array the only serial dependency is the position: where an element
// starts depends on the width of the one before, so one walk is a load-to-load latency
// chain (~11 cycles) per element whatever the decode around it costs. tokensSegmented cuts
// the array's bytes into segK segments and walks them as segK independent chains,
// interleaved in one loop, so that their latencies overlap.
//
// A segment starting at byte q has its first element start somewhere in q..q+4 (elements
// taken here are at most 5 bytes). segSync follows the five candidate chains from those
// offsets until they all land on one common start; for real data they merge within a few
// elements. That is only a guess: what makes it safe is that the chain of the segment
// before, which starts on a verified element start, must end exactly on it, through
// elements that are all of the forms taken here (any other element flags its value),
// before any of its values is accepted. A chain that does not is dropped with everything
// after it, and the exact path (tokensFast and decodeTokenArray's loop) goes on from the
// last verified start, so results and errors are the exact path's for every input.
//
// Each step is branch-free: the lead byte gives the element's length and the mask of its
// value, which is the 4 big-endian bytes ending where the next element starts. Elements
// not taken come out with bit 31 set (see segTables); a chain's values are checked for it
// before they count. Two tables: segUnsigned takes what Python's msgpack writes (positive
// fixint, uint8/16/32), segSigned also int16 (what Go's msgp writes for 128..32767),
// which costs a sign check per element; a round that meets an int16 in the first mode is
// redone in the second.

// segK is how many chains run interleaved.
const segK = 8

// segBytes is the largest byte length of one segment; segStride is how far apart in the
// scratch the values of consecutive chains start, and the most bytes a chain may cover
// (a chain runs past its segment to where the next one's candidates merge, and takes at
// least one byte per element). Constants, so that the interleaved chains share one
// output pointer.
const (
	segBytes  = 2048
	segStride = segBytes + 4*(segSyncSpan+5)
)

// segMinBytes is the shortest segment worth a round: shorter tails go the exact path. It
// keeps segSync's reads inside the round's bytes.
const segMinBytes = 96

// segMinElems is the fewest elements an array must have to be decoded in segments.
const segMinElems = 512

// segSyncSpan is how far past a segment's nominal start its candidate chains may run
// before they must have merged.
const segSyncSpan = 64

// segMaxRounds bounds the rounds of one array (each takes up to segK*segBytes bytes, or
// less as the array's end nears); the exact path decodes what is left.
const segMaxRounds = 64

// segScratch is the length of tokensSegmented's scratch: one round's provisional chain
// outputs (about 73 KiB).
const segScratch = segK * segStride

// segTables describe array elements by their lead byte c: an element led by c takes
// len[c] bytes and its value is the 4 big-endian bytes ending there, masked with
// mask[c]. A lead byte a table does not take (all of them are >= 0x80) gets length 4 and
// a mask of all ones: its "value" is the lead byte and the next three, with bit 31 set.
// uint32 and int32 keep all 32 bits: bit 31 set is a value above MaxInt32, or negative,
// neither taken either. sign[c] is bit 15 where it is the sign of the value (int16, only
// in segSigned): segStepSigned sign-extends such values.
type segTables struct {
	len  [256]uint8
	mask [256]uint32
	sign [256]uint32
}

// segUnsigned and segSigned are the tables of the two modes (see the comment at the
// top). Read-only after package initialisation.
var segUnsigned, segSigned = segTable(false), segTable(true)

func segTable(signed bool) *segTables {
	t := new(segTables)
	for c := range 256 {
		l, m := uint8(4), uint32(0xffffffff)
		switch {
		case c <= 0x7f:
			l, m = 1, 0xff
		case c == 0xcc:
			l, m = 2, 0xff
		case c == 0xcd:
			l, m = 3, 0xffff
		case c == 0xce, c == 0xd2:
			l = 5
		case c == 0xd1 && signed:
			l, m = 3, 0xffff
			t.sign[c] = 1 << 15
		}
		t.len[c], t.mask[c] = l, m
	}
	return t
}

// segSync returns the element start that the five chains starting at q..q+4 of b all
// reach, and false if they have not merged by q+segSyncSpan. The caller keeps
// q+segSyncSpan+5 <= len(b).
func segSync(b []byte, q int) (int, bool) {
	c0, c1, c2, c3, c4 := q, q+1, q+2, q+3, q+4
	// Each pass moves the candidates furthest behind one element on, without branches
	// on the data: lo grows every pass, so the span bounds the passes.
	for range segSyncSpan + 1 {
		lo, hi := min(c0, c1, c2, c3, c4), max(c0, c1, c2, c3, c4)
		if lo == hi {
			return lo, true
		}
		if hi > q+segSyncSpan {
			break
		}
		l0, l1, l2 := segLenAt(b, c0), segLenAt(b, c1), segLenAt(b, c2)
		l3, l4 := segLenAt(b, c3), segLenAt(b, c4)
		if c0 == lo {
			c0 += l0
		}
		if c1 == lo {
			c1 += l1
		}
		if c2 == lo {
			c2 += l2
		}
		if c3 == lo {
			c3 += l3
		}
		if c4 == lo {
			c4 += l4
		}
	}
	return 0, false
}

// segLenAt is the length an element starting at b[p] takes (int16 included).
func segLenAt(b []byte, p int) int { return int(segSigned.len[b[p]]) }

// segStep decodes the element at p of the array whose bytes start at base with table t
// into *out and returns where the next element starts and the value written. The caller
// guarantees p-3 >= 0 and p+5 <= the length of the buffer.
func segStep(t *segTables, base unsafe.Pointer, p int, out *int32) (int, uint32) {
	c := *(*byte)(unsafe.Add(base, p))
	pn := p + int(t.len[c])
	x := binary.BigEndian.Uint32((*[4]byte)(unsafe.Add(base, pn-4))[:]) & t.mask[c]
	*out = int32(x)
	return pn, x
}

// segStepSigned is segStep with segSigned's sign check of int16 values.
func segStepSigned(t *segTables, base unsafe.Pointer, p int, out *int32) (int, uint32) {
	c := *(*byte)(unsafe.Add(base, p))
	pn := p + int(t.len[c])
	x := binary.BigEndian.Uint32((*[4]byte)(unsafe.Add(base, pn-4))[:]) & t.mask[c]
	x = x ^ t.sign[c] - t.sign[c] // int16: sign-extended (bit 31 set if negative)
	*out = int32(x)
	return pn, x
}

// segChains runs segK chains, chain s from p[s] to end[s], in lockstep while every chain
// has enough bytes left, then each to its end alone; chain s writes its values from
// out[s*segStride] on. It returns how many values each chain wrote and the OR of all of
// them, and leaves in p where each chain stopped (at or past its end). Every element a
// chain steps on starts before its end, and end[s] <= len(b)-4 for all chains; p[s] >= 3.
func segChains(base unsafe.Pointer, out []int32, p, end *[segK]int, signed bool) (count [segK]int, acc uint32) {
	o := unsafe.Pointer(unsafe.SliceData(out))
	_ = out[segK*segStride-1]
	p0, p1, p2, p3, p4, p5, p6, p7 := p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
	k := 0
	for {
		// Each step advances 1 to 5 bytes: with m steps, no chain starts an element
		// past its end.
		m := min(end[0]-p0, end[1]-p1, end[2]-p2, end[3]-p3, end[4]-p4, end[5]-p5, end[6]-p6, end[7]-p7) / 5
		if m < 4 {
			break
		}
		var x0, x1, x2, x3, x4, x5, x6, x7 uint32
		if signed {
			t := segSigned
			for stop := k + m; k < stop; k++ {
				w := unsafe.Add(o, 4*k)
				p0, x0 = segStepSigned(t, base, p0, (*int32)(w))
				p1, x1 = segStepSigned(t, base, p1, (*int32)(unsafe.Add(w, 4*segStride)))
				p2, x2 = segStepSigned(t, base, p2, (*int32)(unsafe.Add(w, 8*segStride)))
				p3, x3 = segStepSigned(t, base, p3, (*int32)(unsafe.Add(w, 12*segStride)))
				p4, x4 = segStepSigned(t, base, p4, (*int32)(unsafe.Add(w, 16*segStride)))
				p5, x5 = segStepSigned(t, base, p5, (*int32)(unsafe.Add(w, 20*segStride)))
				p6, x6 = segStepSigned(t, base, p6, (*int32)(unsafe.Add(w, 24*segStride)))
				p7, x7 = segStepSigned(t, base, p7, (*int32)(unsafe.Add(w, 28*segStride)))
				acc |= x0 | x1 | x2 | x3 | x4 | x5 | x6 | x7
			}
			continue
		}
		t := segUnsigned
		for stop := k + m; k < stop; k++ {
			w := unsafe.Add(o, 4*k)
			p0, x0 = segStep(t, base, p0, (*int32)(w))
			p1, x1 = segStep(t, base, p1, (*int32)(unsafe.Add(w, 4*segStride)))
			p2, x2 = segStep(t, base, p2, (*int32)(unsafe.Add(w, 8*segStride)))
			p3, x3 = segStep(t, base, p3, (*int32)(unsafe.Add(w, 12*segStride)))
			p4, x4 = segStep(t, base, p4, (*int32)(unsafe.Add(w, 16*segStride)))
			p5, x5 = segStep(t, base, p5, (*int32)(unsafe.Add(w, 20*segStride)))
			p6, x6 = segStep(t, base, p6, (*int32)(unsafe.Add(w, 24*segStride)))
			p7, x7 = segStep(t, base, p7, (*int32)(unsafe.Add(w, 28*segStride)))
			acc |= x0 | x1 | x2 | x3 | x4 | x5 | x6 | x7
		}
	}
	*p = [segK]int{p0, p1, p2, p3, p4, p5, p6, p7}
	for s := range segK {
		count[s] = k
		for p[s] < end[s] {
			var x uint32
			if signed {
				p[s], x = segStepSigned(segSigned, base, p[s], &out[s*segStride+count[s]])
			} else {
				p[s], x = segStep(segUnsigned, base, p[s], &out[s*segStride+count[s]])
			}
			acc |= x
			count[s]++
		}
	}
	return count, acc
}

// tokensSegmented decodes leading elements of the len(dst)-element token array at b[h:]
// (h >= 3: the array header is before it) into dst, using scratch (segScratch long) for
// the chains' values, and returns how many elements it decoded and the offset in b after
// them. It stops where it
// cannot verify a segment, and before the last few hundred bytes; the exact path decodes
// the rest.
func tokensSegmented(b []byte, h int, dst, scratch []int32) (int, int) {
	n := len(dst)
	if h < 3 || n < segMinElems || len(scratch) != segScratch || len(b) < h+1 {
		return 0, h
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	// Go's msgp writes 128..32767 as int16: start in the mode the first element tells.
	signed := b[h] >= 0xd0 && b[h] <= 0xd2
	i, pos := 0, h
	// Elements start before limit (a step reads up to 4 bytes past its start). A round
	// that reaches past the array's end lowers it to where its chain went.
	limit := len(b) - 4
	for round := 0; ; round++ {
		// The region of this round: the array has n-i elements left, at least one byte
		// each. The first round guesses three bytes each (token ids of a large
		// vocabulary take more); later rounds estimate where the array ends from the
		// density so far, and stay a little short of that. A round that overshoots
		// only wastes its chains past the end.
		left := n - i
		region := min(limit-pos, 3*left)
		if i > 0 {
			region = min(limit-pos, int(uint64(left)*uint64(pos-h)/uint64(i)*15/16))
		}
		seg := min(segBytes, region/segK)
		if seg < segMinBytes || round == segMaxRounds {
			return i, pos
		}
		// One round: segK chains from pos (verified) and from each later segment's
		// merge point.
		var p, end [segK]int
		p[0] = pos
		for s := 1; s < segK; s++ {
			// Where candidates do not merge (periodic data can keep a wrong phase),
			// further on in the segment.
			// A chain may cover at most segStride bytes (its values' room).
			q, ok := 0, false
			for at := pos + s*seg; !ok && at+segSyncSpan <= p[s-1]+segStride &&
				at+segSyncSpan+5 <= pos+(s+1)*seg; at += segSyncSpan + 5 {
				q, ok = segSync(b, at)
			}
			if !ok {
				return i, pos
			}
			p[s], end[s-1] = q, q
		}
		end[segK-1] = pos + segK*seg
		for s := range segK {
			if end[s]-p[s] > segStride {
				return i, pos // cannot happen: the room of each chain's values
			}
		}
		count, acc := segChains(base, scratch, &p, &end, signed)
		// Accept the chains in order while each leaves at least one element for the
		// exact path, holds no flagged value and ends on the next one's start (the
		// last one anywhere past its end). A chain reaching the array's last element means
		// the round went past the array's end: the next round stays before its end.
		for s := range segK {
			c := count[s]
			if i+c >= n {
				// The array ends before p[s] (and its last element starts before
				// end[s]): the next round ends before this one did.
				limit = min(limit, p[s], end[s]-1)
				break
			}
			vals := scratch[s*segStride : s*segStride+c]
			if int32(acc) < 0 && segFlagged(vals) {
				if signed {
					return i, pos
				}
				// Perhaps an int16 (which also threw the chain off its path): the
				// rest of the array in the signed mode.
				signed = true
				break
			}
			if s < segK-1 && p[s] != end[s] {
				return i, pos
			}
			copy(dst[i:i+c], vals)
			i, pos = i+c, p[s]
		}
	}
}

// segFlagged reports whether any of vals has bit 31 set: an element segStep does not take.
func segFlagged(vals []int32) bool {
	var f int32
	for _, v := range vals {
		f |= v
	}
	return f < 0
}
