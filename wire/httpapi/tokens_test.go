package httpapi

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// refDecodeTokenArray is an independent reference for decodeTokenArray built on msgp's
// generic reader: the tokens before the first bad element, that element's error, and
// whether the array parses at all.
func refDecodeTokenArray(b []byte) (toks []int32, terr tokenErr, rest []byte, ok bool) {
	n, rest, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || uint64(n) > uint64(len(rest)) {
		return nil, terr, b, false
	}
	toks = []int32{}
	for i := 0; i < int(n); i++ {
		v, after, err := msgp.ReadIntfBytes(rest)
		if err != nil {
			return toks, terr, rest, false
		}
		if terr.reason == "" {
			var x int64
			isInt := true
			switch t := v.(type) {
			case int64:
				x = t
			case uint64:
				x = math.MaxInt64
				if t <= math.MaxInt32 {
					x = int64(t)
				}
			default:
				isInt = false
			}
			switch {
			case !isInt:
				terr = tokenErr{ReasonInvalidType, msgTokenNotInt, i}
			case x < math.MinInt32 || x > math.MaxInt32:
				terr = tokenErr{ReasonOutOfRange, msgTokenRange, i}
			default:
				toks = append(toks, int32(x))
			}
		}
		rest = after
	}
	return toks, terr, rest, true
}

// tokenElem appends one array element of the given kind.
func tokenElem(b []byte, r *rand.Rand, kind int) []byte {
	switch kind {
	case 0: // positive fixint
		return append(b, byte(r.IntN(128)))
	case 1: // negative fixint
		return append(b, byte(0xe0+r.IntN(32)))
	case 2:
		return append(b, 0xcc, byte(r.IntN(256)))
	case 3:
		v := r.IntN(65536)
		return append(b, 0xcd, byte(v>>8), byte(v))
	case 4: // uint32, sometimes above MaxInt32
		v := r.Uint32()
		if r.IntN(4) != 0 {
			v = 65536 + uint32(r.IntN(150000))
		}
		return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case 5: // int8/16/32
		w := []byte{0xd0, 0xd1, 0xd2}[r.IntN(3)]
		b = append(b, w)
		for range 1 << (w - 0xd0) {
			b = append(b, byte(r.Uint32()))
		}
		return b
	case 6: // uint64 / int64, in or out of range
		if r.IntN(2) == 0 {
			return msgp.AppendUint64(append(b, 0xcf, 0, 0, 0, 0)[:len(b)], r.Uint64()>>uint(r.IntN(64)))
		}
		x := int64(r.Uint64()) >> uint(r.IntN(64))
		b = append(b, 0xd3)
		for s := 56; s >= 0; s -= 8 {
			b = append(b, byte(x>>s))
		}
		return b
	case 7: // not an integer
		return msgp.AppendString(b, "x")
	}
	return msgp.AppendFloat64(b, 1.5)
}

// TestTokenArrayFastPathMatchesReference: arrays built of runs of one width (the fast
// paths) and of mixed widths, with every integer width, out-of-range and non-integer
// elements, and truncated at random, decode exactly as the reference does.
func TestTokenArrayFastPathMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	var dst []int32
	for iter := range 4000 {
		n := r.IntN(300)
		b := msgp.AppendArrayHeader(nil, uint32(n))
		common := []int{0, 3, 4}[r.IntN(3)] // the width most elements take
		for i := 0; i < n; {
			run := 1 + r.IntN(40)
			kind := common
			if r.IntN(3) == 0 {
				kind = r.IntN(6)
			}
			if r.IntN(200) == 0 {
				kind = 6 + r.IntN(3) // rare: wide, or not an integer
			}
			for ; run > 0 && i < n; run, i = run-1, i+1 {
				b = tokenElem(b, r, kind)
			}
		}
		b = append(b, 0xc0) // a following value
		if iter%5 == 0 {
			b = b[:r.IntN(len(b)+1)]
		}
		want, wantErr, wantRest, wantOK := refDecodeTokenArray(b)
		got, rest, gotErr, gotOK := decodeTokenArray(b, dst[:0])
		dst = got
		if gotOK != wantOK {
			t.Fatalf("iter %d: ok %v, reference %v", iter, gotOK, wantOK)
		}
		if !wantOK {
			continue
		}
		if gotErr != wantErr || len(rest) != len(wantRest) {
			t.Fatalf("iter %d: error %+v rest %d, reference %+v rest %d", iter, gotErr, len(rest), wantErr, len(wantRest))
		}
		if wantErr.reason == "" && !slices.Equal(got, want) {
			t.Fatalf("iter %d: tokens differ", iter)
		}
		if wantErr.reason != "" && !slices.Equal(got[:len(want)], want) {
			t.Fatalf("iter %d: tokens before the error differ", iter)
		}
	}
}

// FuzzTokenArray: any bytes decode as the reference decodes them.
func FuzzTokenArray(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, kind := range []int{0, 3, 4, 5} {
		b := msgp.AppendArrayHeader(nil, 40)
		for range 40 {
			b = tokenElem(b, r, kind)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, wantErr, wantRest, wantOK := refDecodeTokenArray(b)
		got, rest, gotErr, gotOK := decodeTokenArray(b, nil)
		if gotOK != wantOK || (wantOK && (gotErr != wantErr || len(rest) != len(wantRest))) {
			t.Fatalf("ok %v err %+v rest %d, reference ok %v err %+v rest %d", gotOK, gotErr, len(rest), wantOK, wantErr, len(wantRest))
		}
		if wantOK && !slices.Equal(got[:len(want)], want) {
			t.Fatal("tokens differ")
		}
	})
}
