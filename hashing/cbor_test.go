package hashing

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
)

// canonicalCBOR is the oracle: fxamacker/cbor in canonical (RFC 7049 §3.9) mode, which for
// arrays, byte/text strings, ints and null coincides with cbor2.dumps(canonical=True).
func canonicalCBOR(t testing.TB) cbor.EncMode {
	t.Helper()
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatalf("cbor enc mode: %v", err)
	}
	return em
}

// checkCBORBlock compares every CBOR path (reference encoder, chain fast encoder, Chain
// digest) with the oracle's encoding of (parent, tokens, extras).
func checkCBORBlock(t testing.TB, em cbor.EncMode, parent [32]byte, toks []int32, lora, salt string) {
	t.Helper()
	items := make([]any, len(toks))
	for i, v := range toks {
		items[i] = int64(v)
	}
	var extras any
	if lora != "" || salt != "" {
		var ex []any
		if lora != "" {
			ex = append(ex, lora)
		}
		if salt != "" {
			ex = append(ex, salt)
		}
		extras = ex
	}
	want, err := em.Marshal([]any{parent[:], items, extras})
	if err != nil {
		t.Fatalf("oracle marshal: %v", err)
	}
	if got := appendCBORVLLMBlock(nil, parent[:], toks, blockExtras{lora: lora, salt: salt}, nil); !bytes.Equal(got, want) {
		t.Fatalf("reference encoder differs (%d tokens)\n got %x\nwant %x", len(toks), head(got), head(want))
	}
	extra := appendCBORExtras(nil, blockExtras{lora: lora, salt: salt})
	// Exactly the room the encoding may take (the scalar path), then with the slack
	// the vector path needs (taken where the CPU has it).
	for _, slack := range []int{0, cborSlack} {
		buf := make([]byte, 44+5*len(toks)+len(extra)+slack)
		if got := encodeCBORBlock(buf, parent[:], toks, extra, nil); !bytes.Equal(got, want) {
			t.Fatalf("fast encoder differs (%d tokens, slack %d)\n got %x\nwant %x", len(toks), slack, head(got), head(want))
		}
	}
	if len(toks) == 0 {
		return
	}
	// Through the public API: a chain whose root is parent hashes one block of all tokens.
	p := Profile{Strategy: StrategyVLLMV1, Algorithm: AlgoSHA256CBOR, Projection: ProjLow64BE, Seed: "0", Root: parent}
	var ch Chain
	ch.Reset(&p, len(toks), lora, salt, toks)
	key, err := ch.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	d := sum256(want)
	if ch.Digest() != d || key != binary.BigEndian.Uint64(d[24:]) {
		t.Fatalf("chain digest differs from SHA-256 of the oracle encoding")
	}
}

func TestCBORMatchesFxamacker(t *testing.T) {
	em := canonicalCBOR(t)
	r := rand.New(rand.NewPCG(3, 4))
	strs := []string{"", "", "a", "lora-a", exactUTF8(23), exactUTF8(24), exactUTF8(255), exactUTF8(256), exactUTF8(65536), randString(r, 30)}
	for i := range 500 {
		var parent [32]byte
		for j := range parent {
			parent[j] = byte(r.Uint32())
		}
		n := r.IntN(40)
		switch i % 50 {
		case 0:
			n = 23 + r.IntN(3) // array head 1 byte vs 0x98
		case 1:
			n = 255 + r.IntN(3)
		case 2:
			n = 65535 + r.IntN(3) // array head 0x99 vs 0x9a
		}
		checkCBORBlock(t, em, parent, randTokens(r, n), strs[r.IntN(len(strs))], strs[r.IntN(len(strs))])
	}
	// Every head-length boundary for both signs.
	edges := []int32{0, 23, 24, 255, 256, 65535, 65536, 1<<31 - 1, -1, -24, -25, -256, -257, -65536, -65537, -1 << 31}
	checkCBORBlock(t, em, [32]byte{1}, edges, "", "s")
}

// FuzzCBORDifferential checks the hand-written canonical CBOR encoder against
// fxamacker/cbor for arbitrary parents, tokens (int32 LE in tokenBytes) and strings.
func FuzzCBORDifferential(f *testing.F) {
	f.Add([]byte{0x4e, 0x11}, []byte{1, 0, 0, 0, 2, 0, 0, 0}, "", "")
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0x18, 0, 0, 0}, "lora-a", "s1")
	f.Add([]byte("parent"), bytes.Repeat([]byte{0, 1, 0, 0}, 30), "adapter-A", "")
	f.Fuzz(func(t *testing.T, parentBytes, tokenBytes []byte, lora, salt string) {
		var parent [32]byte
		copy(parent[:], parentBytes)
		toks := make([]int32, len(tokenBytes)/4)
		for i := range toks {
			toks[i] = int32(binary.LittleEndian.Uint32(tokenBytes[4*i:]))
		}
		checkCBORBlock(t, canonicalCBOR(t), parent, toks, lora, salt)
	})
}

// BenchmarkCBORBlock encodes 4096 distinct blocks of 16 token ids per op, so that no
// branch predictor learns the widths from repetition: ids drawn from a 151,936-id
// vocabulary (3- and 5-byte arguments at random, as in real prompts of large-vocabulary
// models) and from a 32,000-id one (all 3 bytes but the smallest: predictable widths).
func BenchmarkCBORBlock(b *testing.B) {
	for _, vocab := range []int{151936, 32000} {
		b.Run(fmt.Sprintf("vocab%d", vocab), func(b *testing.B) {
			r := rand.New(rand.NewPCG(21, 22))
			const blocks = 4096
			toks := make([]int32, 16*blocks)
			for i := range toks {
				toks[i] = int32(r.IntN(vocab))
			}
			var parent [32]byte
			buf := make([]byte, 44+5*16+cborSlack)
			benchBlocks(b, blocks, func() {
				for j := range blocks {
					parent[0] += encodeCBORBlock(buf, parent[:], toks[16*j:16*j+16], nil, nil)[40]
				}
			})
		})
	}
}

// randomCBORIDs draws up to 200 ids: the encodings' edges, any int32, and vocabulary ids
// of every width.
func randomCBORIDs(r *rand.Rand) []int32 {
	edges := []int32{0, 23, 24, 255, 256, 65535, 65536, 1<<31 - 1, -1, -24, -25, -256, -257, -65536, -65537, -1 << 31}
	toks := make([]int32, r.IntN(200))
	for i := range toks {
		switch r.IntN(4) {
		case 0:
			toks[i] = edges[r.IntN(len(edges))]
		case 1:
			toks[i] = int32(r.Uint32())
		default:
			toks[i] = int32(r.IntN(151936)) >> r.IntN(18)
		}
	}
	return toks
}

// appendCBORInts appends the reference encoding of ids: appendCBORInt of each.
func appendCBORInts(b []byte, ids []int32) []byte {
	for _, v := range ids {
		b = appendCBORInt(b, v)
	}
	return b
}

// checkCBOREncoder runs encode (it writes the CBOR encodings of ids at the start of b and
// returns their length) on a buffer of marker bytes, and fails unless it wrote exactly
// appendCBORInts' bytes and nothing more than 7 bytes past them. It returns the length.
func checkCBOREncoder(t *testing.T, iter int, ids []int32, encode func(b []byte) int) int {
	t.Helper()
	want := appendCBORInts(nil, ids)
	b := bytes.Repeat([]byte{0xa5}, 5*len(ids)+cborSlack)
	w := encode(b)
	if !bytes.Equal(b[:w], want) {
		t.Fatalf("iter %d: %d ids, %d bytes\n got %x\nwant %x", iter, len(ids), w, b[:w], want)
	}
	if tail := b[w+7:]; bytes.Count(tail, []byte{0xa5}) != len(tail) {
		t.Fatalf("iter %d: wrote more than 7 bytes past the encoding: %x", iter, b[w:])
	}
	return w
}

// eachRandomIDs calls check with 3000 draws of randomCBORIDs from the generator seeded
// with seed1, seed2.
func eachRandomIDs(seed1, seed2 uint64, check func(iter int, toks []int32)) {
	r := rand.New(rand.NewPCG(seed1, seed2))
	for iter := range 3000 {
		check(iter, randomCBORIDs(r))
	}
}

// TestCBORTokensWord: the word-at-a-time encoder writes exactly what appendCBORInt does
// for every id, and nothing more than 7 bytes past it.
func TestCBORTokensWord(t *testing.T) {
	eachRandomIDs(7, 8, func(iter int, toks []int32) {
		checkCBOREncoder(t, iter, toks, func(b []byte) int { return cborTokensWord(b, toks) })
	})
}

// TestCBORTokensEveryID: where the CPU has no AVX-512 VBMI2, cborTokens encodes every id
// (8 at a time with AVX2 where it can, the rest word by word) exactly as appendCBORInt
// does, and only with the room its wide stores need.
func TestCBORTokensEveryID(t *testing.T) {
	if hasCBORVector {
		t.Skip("this CPU takes the AVX-512 encoder (TestCBORTokensVector)")
	}
	eachRandomIDs(9, 10, func(iter int, toks []int32) {
		checkCBOREncoder(t, iter, toks, func(b []byte) int {
			n, w := cborTokens(b, toks)
			if n != len(toks) {
				t.Fatalf("iter %d: cborTokens took %d of %d ids", iter, n, len(toks))
			}
			return w
		})
		b := make([]byte, 5*len(toks)+cborSlack-1)
		if n, _ := cborTokens(b, toks); n != 0 && len(toks) > 0 {
			t.Fatalf("iter %d: encoded without the slack", iter)
		}
	})
}

// TestCBORTokensVector: cborTokens encodes the leading multiple of 8 of any ids (every
// width class and sign, their boundaries, mixed at random) exactly as appendCBORInt
// does, where the CPU has it; it declines without the room its wide stores need.
func TestCBORTokensVector(t *testing.T) {
	if !hasCBORVector {
		t.Skip("no AVX-512 VBMI2 on this CPU")
	}
	eachRandomIDs(5, 6, func(iter int, toks []int32) {
		want := appendCBORInts(nil, toks[:len(toks)&^7])
		b := make([]byte, 5*len(toks)+cborSlack)
		n, w := cborTokens(b, toks)
		if n != len(toks)&^7 || !bytes.Equal(b[:w], want) {
			t.Fatalf("iter %d: %d ids, %d bytes; want %d ids\n got %x\nwant %x", iter, n, w, len(toks)&^7, b[:w], want)
		}
		if len(toks) >= 8 {
			if n, _ := cborTokens(b[:5*(len(toks)&^7)+cborSlack-1], toks); n != 0 {
				t.Fatalf("iter %d: encoded without the slack", iter)
			}
		}
	})
}

// TestCBORTablesLayout: the assembly reads cborTables by these offsets.
func TestCBORTablesLayout(t *testing.T) {
	var c cborTables
	got := []uintptr{unsafe.Offsetof(c.lim), unsafe.Offsetof(c.one), unsafe.Offsetof(c.base), unsafe.Offsetof(c.neg),
		unsafe.Offsetof(c.rep), unsafe.Offsetof(c.thr), unsafe.Offsetof(c.perm)}
	want := []uintptr{0, 12, 16, 20, 32, 96, 160}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets %v, the assembly reads %v", got, want)
	}
}
