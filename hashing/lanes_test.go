package hashing

import (
	"hash/maphash"
	"math/big"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// laneRef is a memo lane step computed the slow way: the block hash through maphash's
// streaming Hash, the fold's 128-bit product through math/big.
func laneRef(prev uint64, seed maphash.Seed, k uint64, b []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	_, _ = h.Write(b)
	x := new(big.Int).SetUint64(prev ^ h.Sum64())
	x.Mul(x, new(big.Int).SetUint64(k))
	lo := new(big.Int).And(x, new(big.Int).SetUint64(^uint64(0))).Uint64()
	return x.Rsh(x, 64).Uint64() ^ lo
}

// checkLanes runs a memo chain's lanes over a prompt and checks every block's lanes
// against laneRef, and that the two lanes differ (independent seeds).
func checkLanes(t *testing.T, m *Memo, p *Profile, bs int, toks []int32) {
	t.Helper()
	var ch Chain
	ch.ResetMemo(m, p, bs, "", "", toks)
	la, lb := ch.mc.la, ch.mc.lb
	for i := 0; i < ch.NumBlocks(); i++ {
		blk := ch.blockTokens(i)
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 4*len(blk))
		la, lb = laneRef(la, m.hsA, m.kA, b), laneRef(lb, m.hsB, m.kB, b)
		ch.advance()
		if ch.mc.la != la || ch.mc.lb != lb {
			t.Fatalf("block %d: lanes %#x %#x, want %#x %#x", i, ch.mc.la, ch.mc.lb, la, lb)
		}
		if la == lb {
			t.Fatalf("block %d: both lanes %#x", i, la)
		}
	}
}

// TestMemoLanes: the lanes of every block of prompts of every length and block size
// are the documented chain (maphash of the block's token bytes under the lane's seed,
// folded with the previous value by the keyed multiply), in every profile.
func TestMemoLanes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m := NewMemo(64)
	for _, p := range allProfiles(t) {
		for n := 0; n < 100; n += 7 {
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(r.Uint32())
			}
			for _, bs := range []int{1, 3, 16} {
				checkLanes(t, m, &p, bs, toks)
			}
		}
	}
}

// FuzzMemoLanes: for any tokens and block size the lanes are the documented chain, and
// a change to one token changes both lanes of its block and of every block after it.
func FuzzMemoLanes(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(2), uint16(3))
	f.Add(make([]byte, 64), uint8(16), uint16(0))
	m := NewMemo(64)
	p := allProfiles(f)["sglang"]
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, at uint16) {
		toks := make([]int32, len(raw)/4)
		for i := range toks {
			toks[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		b := 1 + int(bs%32)
		checkLanes(t, m, &p, b, toks)
		if len(toks) == 0 {
			return
		}
		a1, b1 := lanesOf(m, &p, b, "", "", toks)
		j := int(at) % len(toks)
		toks[j] ^= 1 << (at % 31)
		a2, b2 := lanesOf(m, &p, b, "", "", toks)
		for i := j / b; i < len(a1); i++ {
			// A false equality has probability 2^-64 per lane: it does not happen.
			if a1[i] == a2[i] || b1[i] == b2[i] {
				t.Fatalf("token %d changed, block %d keeps a lane", j, i)
			}
		}
	})
}
