package httpapi

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// segVocabElem appends one element as the encoders of real clients write a token id of
// a vocab-sized vocabulary: unsigned forms (Python's msgpack) or, if signed, the forms
// of Go's msgp (fixint, int16, int32).
func segVocabElem(b []byte, r *rand.Rand, vocab int, signed bool) []byte {
	v := int64(r.IntN(vocab))
	if signed {
		return msgp.AppendInt64(b, v)
	}
	return msgp.AppendUint64(b, uint64(v))
}

// segWidthElem appends a valid token id of one unsigned form: positive fixint, uint8,
// uint16 or uint32 (up to MaxInt32) for width 0 to 3.
func segWidthElem(b []byte, r *rand.Rand, width int) []byte {
	switch width {
	case 0:
		return append(b, byte(r.IntN(128)))
	case 1:
		return append(b, 0xcc, byte(r.IntN(256)))
	case 2:
		v := r.IntN(65536)
		return append(b, 0xcd, byte(v>>8), byte(v))
	}
	v := r.Uint32() >> 1
	return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// segArray builds an n-element array of the given style, with rare odd elements
// (tokenElem's kinds: negative, wide, out of range, not an integer) at random or at
// positions near the first round's segment starts, and returns it with the byte offset
// of each element.
func segArray(r *rand.Rand, n int, style int, odd int) (b []byte, offs []int) {
	b = msgp.AppendArrayHeader(nil, uint32(n))
	h := len(b)
	// Where the first round's segments start, for a 4-byte average.
	seg := min(segBytes, 3*n/segK)
	var hot []int
	for s := 1; s < segK; s++ {
		hot = append(hot, h+s*seg)
	}
	for i := 0; i < n; i++ {
		offs = append(offs, len(b))
		bad := odd > 0 && r.IntN(n) < odd
		if odd > 0 && !bad && len(hot) > 0 && r.IntN(4) == 0 {
			for _, q := range hot {
				if d := len(b) - q; d >= -6 && d <= 6 {
					bad = true
				}
			}
		}
		switch {
		case bad:
			b = tokenElem(b, r, []int{1, 4, 5, 6, 7, 8}[r.IntN(6)])
		case style == 0: // a 152K vocabulary, Python
			b = segVocabElem(b, r, 151936, false)
		case style == 1: // the same, Go's msgp
			b = segVocabElem(b, r, 151936, true)
		case style == 2: // a 32K vocabulary (mostly uint16)
			b = segVocabElem(b, r, 32000, r.IntN(2) == 0 && n%2 == 0)
		case style == 3: // fixint, uint16 and uint32 mixed element by element
			b = segWidthElem(b, r, []int{0, 0, 2, 2, 2, 2, 2, 3, 3, 3}[r.IntN(10)])
		case style == 4: // Python's forms with some int16/int32 (a signed run later)
			b = segVocabElem(b, r, 151936, i > n/3 && r.IntN(3) == 0)
		case style == 5: // runs of one width
			b = segWidthElem(b, r, i/97%4)
		default: // a long uint16 run (decoded as a run first), then a 152K vocabulary
			if i < n/2 {
				b = segWidthElem(b, r, 2)
			} else {
				b = segVocabElem(b, r, 151936, false)
			}
		}
	}
	return b, offs
}

// refOffsets is the offset after each of the first elements of the array at b (by
// msgp.Skip), as far as they parse.
func refOffsets(b []byte) []int {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil
	}
	var offs []int
	for range n {
		if rest, err = msgp.Skip(rest); err != nil {
			break
		}
		offs = append(offs, len(b)-len(rest))
	}
	return offs
}

// checkSegmented runs tokensSegmented on b and checks that every element it reports
// decoded is the reference's, and that it stops exactly after its last one.
func checkSegmented(t *testing.T, b []byte, what string) (i, n int) {
	t.Helper()
	n32, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, 0
	}
	n = int(n32)
	h := len(b) - len(rest)
	if n > len(rest) {
		return 0, n
	}
	dst := make([]int32, n)
	i, pos := tokensSegmented(b, h, dst, make([]int32, segScratch))
	if i == 0 {
		if pos != h {
			t.Fatalf("%s: no element, but stopped at %d, not %d", what, pos, h)
		}
		return 0, n
	}
	if i >= n {
		t.Fatalf("%s: decoded %d of %d elements: the last is the exact path's", what, i, n)
	}
	want, _, _, _ := refDecodeTokenArray(b)
	offs := refOffsets(b)
	if i > len(want) || i > len(offs) {
		t.Fatalf("%s: decoded %d elements, the reference only %d valid (%d parsed)", what, i, len(want), len(offs))
	}
	if !slices.Equal(dst[:i], want[:i]) {
		t.Fatalf("%s: the %d decoded elements differ from the reference", what, i)
	}
	if pos != offs[i-1] {
		t.Fatalf("%s: stopped at %d after %d elements, the reference at %d", what, pos, i, offs[i-1])
	}
	return i, n
}

// TestTokensSegmented: on long arrays of every style, with odd elements at random and
// next to segment starts, followed by other bytes or truncated, tokensSegmented decodes
// exactly the reference's leading elements and stops right after them; on arrays of
// real clients' shapes it decodes nearly all of them.
func TestTokensSegmented(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := range 600 {
		n := segMinElems + r.IntN(3000)
		if iter%10 == 0 {
			n = 8192 + r.IntN(30000)
		}
		style, odd := iter%7, 0
		if iter%3 == 1 {
			odd = 1 + r.IntN(4)
		}
		b, _ := segArray(r, n, style, odd)
		clean := odd == 0
		switch iter % 5 {
		case 1: // more body after the array: a string field, a map key, a nil
			b = msgp.AppendString(b, "cache_salt")
			b = msgp.AppendString(b, string(make([]byte, r.IntN(3000))))
			clean = clean && true
		case 2: // truncated
			b = b[:r.IntN(len(b)+1)]
			clean = false
		case 3: // a header that lies about the count
			b = append(msgp.AppendArrayHeader(nil, uint32(n+r.IntN(20)-10)), b[len(msgp.AppendArrayHeader(nil, uint32(n))):]...)
			clean = false
		}
		i, n := checkSegmented(t, b, "iter "+itoa(iter))
		// Runs of one width with uint32 values over the whole range (style 5) are
		// periodic enough to keep candidate chains apart: correct, not always fast.
		if clean && style != 5 && i < n-n/8-256 {
			t.Errorf("iter %d (style %d, %d elements, %d bytes): only %d decoded in segments", iter, style, n, len(b), i)
		}
	}
}

func itoa(i int) string { return string(msgp.AppendInt(nil, i)) }
