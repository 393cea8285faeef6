package hashing

import (
	"encoding/binary"
	"math/rand/v2"
	"unsafe"
)

// laneKeys are one memo lane's secrets (random per Memo): w mixes the eight words of
// each 64-byte group of a block, group chains the groups of one block, fold chains the
// blocks (both odd).
type laneKeys struct {
	w           [8]uint64
	group, fold uint64
}

func newLaneKeys() laneKeys {
	var k laneKeys
	for i := range k.w {
		k.w[i] = rand.Uint64()
	}
	k.group, k.fold = rand.Uint64()|1, rand.Uint64()|1
	return k
}

// blockLanes returns both lanes after block b (its token bytes) from their values pa, pb
// before it. A lane is a keyed multiply hash in the manner of wyhash: each 64-byte group
// (the last one zero-padded) is four 64x64->128 multiplies of key-masked word pairs,
// folded (hi ^ lo) and summed; the groups of a block chain by a multiply with the group
// key; the block's sum, its byte length and the previous lane value are mixed by one
// multiply with the fold key. Both lanes read the same words under independent keys, so
// one pass serves both, and nothing before the last multiply depends on the chain: the
// blocks of a prompt hash in parallel and the chain costs one multiply per block and lane.
// A block of vLLM's 16 tokens is one group: 8 multiplies and 2 chain multiplies for both
// lanes (two maphash calls, the lanes before, took more instructions and a call each).
func (m *Memo) blockLanes(pa, pb uint64, b []byte) (uint64, uint64) {
	ka, kb := &m.laneA, &m.laneB
	if len(b) == 64 { // one group, unpadded: the common block (16 tokens; see also fill)
		ha, hb := laneGroup((*[64]byte)(b), ka, kb)
		return memoMul(pa^ha^64, ka.fold), memoMul(pb^hb^64, kb.fold)
	}
	n := uint64(len(b))
	var ga, gb uint64
	for len(b) >= 64 {
		ha, hb := laneGroup((*[64]byte)(b), ka, kb)
		ga, gb = memoMul(ga, ka.group)+ha, memoMul(gb, kb.group)+hb
		b = b[64:]
	}
	if len(b) > 0 {
		var t [64]byte
		copy(t[:], b)
		ha, hb := laneGroup(&t, ka, kb)
		ga, gb = memoMul(ga, ka.group)+ha, memoMul(gb, kb.group)+hb
	}
	return memoMul(pa^ga^n, ka.fold), memoMul(pb^gb^n, kb.fold)
}

// laneGroup hashes one 64-byte group under both lanes' word keys. Each lane loads the
// words again (L1 hits) rather than keeping all eight live: the multiplies' fixed
// registers leave too few for that, and spills cost more than loads.
func laneGroup(g *[64]byte, ka, kb *laneKeys) (ha, hb uint64) {
	return laneSum(g, ka), laneSum(g, kb)
}

func laneSum(g *[64]byte, k *laneKeys) uint64 {
	le := binary.LittleEndian
	return memoMul(le.Uint64(g[0:8])^k.w[0], le.Uint64(g[8:16])^k.w[1]) +
		memoMul(le.Uint64(g[16:24])^k.w[2], le.Uint64(g[24:32])^k.w[3]) +
		memoMul(le.Uint64(g[32:40])^k.w[4], le.Uint64(g[40:48])^k.w[5]) +
		memoMul(le.Uint64(g[48:56])^k.w[6], le.Uint64(g[56:64])^k.w[7])
}

// laneRun16Go is laneRun16 in Go: blockLanes for n consecutive blocks of 16 tokens at p,
// lanes chained from la, lb, each block's stored in outA[j], outB[j]. It is the version
// for other architectures, and the amd64 assembly's reference in tests.
func laneRun16Go(ka, kb *laneKeys, p *int32, n int, la, lb uint64, outA, outB *uint64) (uint64, uint64) {
	g := unsafe.Pointer(p)
	oa, ob := unsafe.Slice(outA, n), unsafe.Slice(outB, n)
	for j := range n {
		b := (*[64]byte)(unsafe.Add(g, 64*j))
		la = memoMul(la^laneSum(b, ka)^64, ka.fold)
		lb = memoMul(lb^laneSum(b, kb)^64, kb.fold)
		oa[j], ob[j] = la, lb
	}
	return la, lb
}
