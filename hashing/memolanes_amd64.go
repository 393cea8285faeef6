package hashing

// laneRun16 computes blockLanes for n consecutive blocks of 16 tokens (one unpadded
// 64-byte group each) at p: it chains both lanes from la, lb through the blocks, stores
// each block's lanes in outA[0:n] and outB[0:n], and returns the last. Written in
// assembly (memolanes_amd64.s): the compiled Go loop (laneRun16Go) spends about half
// its instructions moving values in and out of the two registers a 64x64->128 multiply
// uses and spilling around them. The caller guarantees p holds 16*n tokens and outA,
// outB n words each.
//
//go:noescape
func laneRun16(ka, kb *laneKeys, p *int32, n int, la, lb uint64, outA, outB *uint64) (uint64, uint64)
