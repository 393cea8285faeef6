package hashing

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// laneRef is a memo lane step computed the slow way from its definition (blockLanes):
// the block's bytes in 64-byte groups, the last zero-padded, each group's words read byte
// by byte, every 64x64->128 product through math/big.
func laneRef(prev uint64, k *laneKeys, b []byte) uint64 {
	mul := func(x, y uint64) uint64 {
		p := new(big.Int).Mul(new(big.Int).SetUint64(x), new(big.Int).SetUint64(y))
		lo := new(big.Int).And(p, new(big.Int).SetUint64(^uint64(0))).Uint64()
		return p.Rsh(p, 64).Uint64() ^ lo
	}
	word := func(g []byte, i int) uint64 {
		var w uint64
		for j := 7; j >= 0; j-- {
			w = w<<8 | uint64(g[8*i+j])
		}
		return w
	}
	var sum uint64
	for off := 0; off < len(b); off += 64 {
		g := make([]byte, 64)
		copy(g, b[off:])
		var h uint64
		for i := 0; i < 8; i += 2 {
			h += mul(word(g, i)^k.w[i], word(g, i+1)^k.w[i+1])
		}
		sum = mul(sum, k.group) + h
	}
	return mul(prev^sum^uint64(len(b)), k.fold)
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
		la, lb = laneRef(la, &m.laneA, b), laneRef(lb, &m.laneB, b)
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
// are the documented chain (blockLanes, computed from its definition by laneRef), in
// every profile, with blocks of one group, several groups and a padded last group.
func TestMemoLanes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m := NewMemo(64)
	for _, p := range allProfiles(t) {
		for n := 0; n < 100; n += 7 {
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(r.Uint32())
			}
			for _, bs := range []int{1, 3, 16, 17, 40} {
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

// TestMemoFillLanes: the lanes fill computes for a batch (a loop of its own for vLLM
// blocks of 16 tokens, advance otherwise) are those advance computes block by block, in
// batches of every size, for block sizes on and off the fast path.
func TestMemoFillLanes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	m := NewMemo(64)
	toks := make([]int32, 16*300+5)
	for i := range toks {
		toks[i] = int32(r.Uint32())
	}
	for name, p := range allProfiles(t) {
		for _, bs := range []int{16, 15, 1} {
			wantA, wantB := lanesOf(m, &p, bs, "", "", toks)
			var ch Chain
			ch.ResetMemo(m, &p, bs, "", "", toks)
			for ch.next < ch.NumBlocks() {
				ch.mc.batch = 1 + r.IntN(aheadRuns)
				ch.fill()
				for j := 0; j < ch.mc.aheadLen; j++ {
					if i := ch.next + j; ch.mc.aheadA[j] != wantA[i] || ch.mc.aheadB[j] != wantB[i] {
						t.Fatalf("%s bs %d block %d: fill lanes %#x %#x, advance %#x %#x", name, bs, i,
							ch.mc.aheadA[j], ch.mc.aheadB[j], wantA[i], wantB[i])
					}
				}
				ch.next += ch.mc.aheadLen // stand in for the walk consuming the batch
				ch.mc.aheadLen, ch.mc.aheadPos = 0, 0
			}
		}
	}
}

// TestLaneRun16: laneRun16 (amd64 assembly where it exists) and laneRun16Go both give
// the lanes' documented chain (laneRef, from the definition) for runs of 0 to 70 blocks of 16 tokens, under random keys and start
// values, with tokens of all widths (the extremes too), and write nothing past n.
func TestLaneRun16(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for round := range 200 {
		m := NewMemo(64)
		n := round % 71
		toks := make([]int32, 16*n)
		for i := range toks {
			switch r.IntN(4) {
			case 0:
				toks[i] = int32(r.Uint32())
			case 1:
				toks[i] = int32(r.IntN(152000))
			case 2:
				toks[i] = []int32{0, -1, math.MaxInt32, math.MinInt32}[r.IntN(4)]
			default:
				toks[i] = int32(r.IntN(256))
			}
		}
		la0, lb0 := r.Uint64(), r.Uint64()
		wantA, wantB := make([]uint64, n), make([]uint64, n)
		a, b := la0, lb0
		for j := range n {
			blk := toks[16*j : 16*j+16]
			bytes := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 64)
			a, b = laneRef(a, &m.laneA, bytes), laneRef(b, &m.laneB, bytes)
			wantA[j], wantB[j] = a, b
		}
		for name, run := range map[string]func(ka, kb *laneKeys, p *int32, n int, la, lb uint64, outA, outB *uint64) (uint64, uint64){
			"laneRun16": laneRun16, "laneRun16Go": laneRun16Go,
		} {
			outA, outB := make([]uint64, n+1), make([]uint64, n+1)
			outA[n], outB[n] = 0xdead, 0xbeef
			ga, gb := la0, lb0
			if n > 0 {
				ga, gb = run(&m.laneA, &m.laneB, &toks[0], n, la0, lb0, &outA[0], &outB[0])
			}
			if ga != a || gb != b {
				t.Fatalf("%s n %d: returned %#x %#x, want %#x %#x", name, n, ga, gb, a, b)
			}
			for j := range n {
				if outA[j] != wantA[j] || outB[j] != wantB[j] {
					t.Fatalf("%s n %d block %d: %#x %#x, want %#x %#x", name, n, j, outA[j], outB[j], wantA[j], wantB[j])
				}
			}
			if outA[n] != 0xdead || outB[n] != 0xbeef {
				t.Fatalf("%s n %d: wrote past the run", name, n)
			}
		}
	}
}
