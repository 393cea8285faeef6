package httpapi

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/conductor-go/conductor/wire/internal/tokenarray"
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
		var v any = "not an integer"
		var after []byte
		var err error
		if t := msgp.NextType(rest); t == msgp.IntType || t == msgp.UintType {
			v, after, err = msgp.ReadIntfBytes(rest)
		} else {
			// Skip, not ReadIntfBytes: a map with non-string keys is well-formed
			// msgpack (ReadIntfBytes refuses it).
			after, err = msgp.Skip(rest)
		}
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
	var dst, scratch []int32
	for iter := range 4000 {
		n := r.IntN(300)
		if iter%7 == 0 {
			n = r.IntN(2000) // several windows of tokensMixed
		}
		b := msgp.AppendArrayHeader(nil, uint32(n))
		common := []int{0, 3, 4}[r.IntN(3)] // the width most elements take
		for i := 0; i < n; {
			run := 1 + r.IntN(40)
			if iter%3 == 0 {
				run = 1 // widths mixed element by element, as in real prompts
			}
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
		checkTokenArray(t, iter, b, &dst, &scratch)
	}
}

// checkTokenArray decodes b on every path (vbmiModes) and fails unless each decodes it
// as refDecodeTokenArray does: whether it parses, the error, where the value ends, the
// tokens before the error, and all of them when there is none.
func checkTokenArray(t testing.TB, iter int, b []byte, dst, scratch *[]int32) {
	t.Helper()
	want, wantErr, wantRest, wantOK := refDecodeTokenArray(b)
	for _, vbmi := range vbmiModes() {
		got, rest, gotErr, gotOK := decodeTokenArrayVia(b, (*dst)[:0], scratch, vbmi)
		*dst = got
		switch {
		case gotOK != wantOK:
			t.Fatalf("iter %d (vbmi %v): ok %v, reference %v", iter, vbmi, gotOK, wantOK)
		case !wantOK:
		case gotErr != wantErr || len(rest) != len(wantRest):
			t.Fatalf("iter %d (vbmi %v): error %+v rest %d, reference %+v rest %d", iter, vbmi, gotErr, len(rest), wantErr, len(wantRest))
		case !equalPrefix(got, want) || wantErr.reason == "" && len(got) != len(want):
			t.Fatalf("iter %d (vbmi %v): tokens differ", iter, vbmi)
		}
	}
}

// TestTokenArraySegmentedMatchesReference: long arrays (decoded mostly in segments) of
// every style, with odd elements at random and next to segment starts, followed by more
// body, truncated, or under a header that lies about the count, decode exactly as the
// reference does: tokens, error and where the value ends.
func TestTokenArraySegmentedMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	var dst, scratch []int32
	for iter := range 500 {
		n := segMinElems - 10 + r.IntN(4000)
		if iter%8 == 0 {
			n = 8192 + r.IntN(24000)
		}
		odd := 0
		if iter%3 != 0 {
			odd = 1 + r.IntN(3)
		}
		b, _ := segArray(r, n, iter%7, odd)
		switch iter % 4 {
		case 1:
			b = msgp.AppendString(b, string(make([]byte, r.IntN(2000))))
		case 2:
			b = b[:r.IntN(len(b)+1)]
		case 3:
			h := len(msgp.AppendArrayHeader(nil, uint32(n)))
			b = append(msgp.AppendArrayHeader(nil, uint32(max(0, n+r.IntN(40)-20))), b[h:]...)
			b = append(b, 0xc0, 0xc0, 0xa1, 'x')
		}
		checkTokenArray(t, iter, b, &dst, &scratch)
	}
}

// TestElementEnds: for every lead byte tokensMixed decodes, at every position of a word
// and whatever the other bytes, elementEnds gives where the element ends.
func TestElementEnds(t *testing.T) {
	lengths := map[byte]uint64{0xcc: 2, 0xcd: 3, 0xce: 5, 0xd0: 2, 0xd1: 3, 0xd2: 5}
	for c := range 128 {
		lengths[byte(c)] = 1
	}
	r := rand.New(rand.NewPCG(7, 8))
	for c, want := range lengths {
		if tokenLead[c]>>32 == 0 {
			t.Fatalf("lead %#x: tokenLead rejects it", c)
		}
		for k := range 8 {
			for range 50 {
				x := r.Uint64()&^(0xff<<(8*k)) | uint64(c)<<(8*k)
				base := uint64(8 * r.IntN(8))
				if got := elementEnds(x, base) >> (8 * k) & 0xff; got != base+uint64(k)+want {
					t.Fatalf("lead %#x at byte %d (base %d): end %d, want %d", c, k, base, got, base+uint64(k)+want)
				}
			}
		}
	}
}

// TestListBinAllPaths: a bin prompt decodes the same read in place (binView), through
// the one-copy path of little-endian hosts that cannot read it in place, and through the
// per-word loop of big-endian hosts, for int32 tokens and uint64 block keys, at every
// alignment of the bin's bytes.
func TestListBinAllPaths(t *testing.T) {
	defer func(le, view bool) { hostLittleEndian, binInPlace = le, view }(hostLittleEndian, binInPlace)
	r := rand.New(rand.NewPCG(9, 10))
	raw := make([]byte, 8*33)
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	for shift := 0; shift < 8; shift++ {
		body := msgp.AppendBytes(make([]byte, shift, shift+len(raw)+8), raw)[shift:]
		var toks [3][]int32
		var keys [3][]uint64
		for k, path := range []struct{ le, view bool }{{true, true}, {true, false}, {false, false}} {
			hostLittleEndian, binInPlace = path.le, path.view
			var terr tokenErr
			var ok bool
			var tbuf []int32
			toks[k], _, terr, ok = decodeTokens(body, &tbuf, new([]int32))
			if !ok || terr.reason != "" || len(toks[k]) != 66 {
				t.Fatalf("tokens (path %+v): ok %v err %+v len %d", path, ok, terr, len(toks[k]))
			}
			var kbuf []uint64
			keys[k], _, terr, ok = decodeHashes(body, &kbuf)
			if !ok || terr.reason != "" || len(keys[k]) != 33 {
				t.Fatalf("keys (path %+v): ok %v err %+v len %d", path, ok, terr, len(keys[k]))
			}
			// A view is never kept as the buffer; a copy always is.
			inPlace := within(unsafe.Pointer(&toks[k][0]), body)
			if want := path.view && (unalignedLoads || uintptr(unsafe.Pointer(&body[len(body)-len(raw)]))%4 == 0); inPlace != want {
				t.Fatalf("tokens (path %+v, shift %d): in place %v, want %v", path, shift, inPlace, want)
			}
			if inPlace == (tbuf != nil) {
				t.Fatalf("tokens (path %+v): in place %v but buffer kept %v", path, inPlace, tbuf != nil)
			}
			if within(unsafe.Pointer(&keys[k][0]), body) == (kbuf != nil) {
				t.Fatalf("keys (path %+v): view and kept buffer disagree", path)
			}
		}
		for i := range toks[2] {
			if want := int32(binary.LittleEndian.Uint32(raw[4*i:])); toks[2][i] != want {
				t.Fatalf("token %d: %d, want %d", i, toks[2][i], want)
			}
		}
		for i := range keys[2] {
			if want := binary.LittleEndian.Uint64(raw[8*i:]); keys[2][i] != want {
				t.Fatalf("key %d: %d, want %d", i, keys[2][i], want)
			}
		}
		for k := 0; k < 2; k++ {
			if !slices.Equal(toks[k], toks[2]) || !slices.Equal(keys[k], keys[2]) {
				t.Fatalf("path %d differs from the loop (shift %d)", k, shift)
			}
		}
	}
}

// within reports whether p points into b.
func within(p unsafe.Pointer, b []byte) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return uintptr(p) >= lo && uintptr(p) < lo+uintptr(len(b))
}

// TestBinViewNeverWrittenThrough: a request decoded from a bin reads its body in place;
// the next request, an array, is decoded into the request's own buffer and must leave
// the first body as it was (a view kept as the reused buffer would be overwritten), and
// Release drops the view. Both for /query and /query_by_hash.
func TestBinViewNeverWrittenThrough(t *testing.T) {
	if !hostLittleEndian {
		t.Skip("big-endian host: bins are decoded, never viewed")
	}
	toks := make([]int32, 300)
	for i := range toks {
		toks[i] = int32(i*7 + 1)
	}
	bin := listBody("token_ids", toks, true)
	keep := slices.Clone(bin)
	var q QueryRequest
	for round := 0; round < 3; round++ {
		if rerr := DecodeQueryRequest(bin, &q); rerr != nil {
			t.Fatal(rerr)
		}
		if !slices.Equal(q.Tokens, toks) {
			t.Fatal("bin tokens differ")
		}
		view := within(unsafe.Pointer(&q.Tokens[0]), bin)
		other := make([]int32, 400)
		for i := range other {
			other[i] = int32(1000 - i)
		}
		if rerr := DecodeQueryRequest(listBody("token_ids", other, false), &q); rerr != nil {
			t.Fatal(rerr)
		}
		if !slices.Equal(q.Tokens, other) || within(unsafe.Pointer(&q.Tokens[0]), bin) {
			t.Fatal("array tokens wrong, or decoded into the last body")
		}
		if !slices.Equal(bin, keep) {
			t.Fatalf("round %d (bin viewed: %v): the array was decoded into the bin request's body", round, view)
		}
		q.Release(1 << 20)
		if q.Tokens != nil || q.Model != "" {
			t.Fatal("Release kept references into the body")
		}
	}
	hashes := make([]uint64, 50)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	hbin := listBody("block_hashes", hashes, true)
	hkeep := slices.Clone(hbin)
	var hq QueryByHashRequest
	if rerr := DecodeQueryByHashRequest(hbin, &hq); rerr != nil || !slices.Equal(hq.BlockHashes, hashes) {
		t.Fatal("bin hashes", rerr)
	}
	if rerr := DecodeQueryByHashRequest(listBody("block_hashes", hashes[:20], false), &hq); rerr != nil || !slices.Equal(hq.BlockHashes, hashes[:20]) {
		t.Fatal("array hashes", rerr)
	}
	if !slices.Equal(hbin, hkeep) {
		t.Fatal("the array was decoded into the bin request's body")
	}
	hq.Release(1 << 20)
	if hq.BlockHashes != nil {
		t.Fatal("Release kept the block keys' view")
	}
}

// listBody is a /query-shaped body (model "m", block size 16) whose prompt field key
// holds vs as a bin of little-endian words (asBin) or as an array: token_ids of a
// /query, block_hashes of a /query_by_hash.
func listBody[T int32 | uint64](key string, vs []T, asBin bool) []byte {
	b := msgp.AppendMapHeader(nil, 3)
	b = msgp.AppendString(b, "model")
	b = msgp.AppendString(b, "m")
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt64(b, 16)
	b = msgp.AppendString(b, key)
	var raw []byte
	if !asBin {
		b = msgp.AppendArrayHeader(b, uint32(len(vs)))
	}
	for _, v := range vs {
		switch x := any(v).(type) {
		case int32:
			if asBin {
				raw = binary.LittleEndian.AppendUint32(raw, uint32(x))
			} else {
				b = msgp.AppendInt32(b, x)
			}
		case uint64:
			if asBin {
				raw = binary.LittleEndian.AppendUint64(raw, x)
			} else {
				b = msgp.AppendUint64(b, x)
			}
		}
	}
	if asBin {
		b = msgp.AppendBytes(b, raw)
	}
	return b
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
	// Widths mixed element by element, long enough for several tokensMixed windows.
	b := msgp.AppendArrayHeader(nil, 200)
	for range 200 {
		b = tokenElem(b, r, []int{0, 2, 3, 4, 5}[r.IntN(5)])
	}
	f.Add(b)
	// Long enough for tokensSegmented: each style, and one with odd elements.
	for style := range 7 {
		b, _ := segArray(r, segMinElems+200*style, style, style/5)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkTokenArray(t, 0, b, new([]int32), new([]int32))
	})
}

// TestResponseKeysEncoded: each pre-encoded key is the msgpack str of its text.
func TestResponseKeysEncoded(t *testing.T) {
	for _, k := range []string{keyInstances, keyLongestMatched, keyDP, keyRankMatches, keyDevice, keyCPULocal, keyCPUShare, keyDisk} {
		if want := string(msgp.AppendString(nil, k[1:])); k != want {
			t.Errorf("key %q, want %q", k, want)
		}
	}
}

// vbmiModes are the array decode paths the reference tests check: the portable one
// always, tokenarray.DecodeVBMI's where this CPU runs it (its own tests are in
// wire/internal/tokenarray).
func vbmiModes() []bool {
	if tokenarray.HasVBMI {
		return []bool{false, true}
	}
	return []bool{false}
}
