#include "textflag.h"

// func cborTokensAsm(dst *byte, toks *int32, n int, t *cborTables) int
//
// Per 8 ids (dword lanes of Y0): u = id, or ^id for negatives (Y2), the major type
// (Y1), the width class c = [u >= 24] + [u >= 256] + [u >= 65536] (Y3), the head byte
// (Y4: major | u for class 0, major | 23+c otherwise), then the 8-byte lanes of Z6 (head,
// argument big-endian), the bytes the class keeps (K4) packed by VPCOMPRESSB and stored
// 64 bytes wide. See cbor_simd.go.
TEXT ·cborTokensAsm(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ toks+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ t+24(FP), BX
	VPBROADCASTD 0(BX), Y20  // 24
	VPBROADCASTD 4(BX), Y21  // 256
	VPBROADCASTD 8(BX), Y22  // 65536
	VPBROADCASTD 12(BX), Y23 // 1
	VPBROADCASTD 16(BX), Y24 // 23
	VPBROADCASTD 20(BX), Y25 // negative major
	VMOVDQU64 32(BX), Z26    // rep
	VMOVDQU64 96(BX), Z27    // thr
	VMOVDQU64 160(BX), Z28   // perm
	XORQ AX, AX
	XORQ DX, DX

loop:
	CMPQ DX, CX
	JGE  done
	VMOVDQU32 (SI)(DX*4), Y0
	VPSRAD    $31, Y0, Y1
	VPXORD    Y1, Y0, Y2
	VPANDD    Y25, Y1, Y1
	VPCMPUD   $5, Y20, Y2, K1
	VPCMPUD   $5, Y21, Y2, K2
	VPCMPUD   $5, Y22, Y2, K3
	VPXORD    Y3, Y3, Y3
	VPADDD    Y23, Y3, K1, Y3
	VPADDD    Y23, Y3, K2, Y3
	VPADDD    Y23, Y3, K3, Y3
	VMOVDQA32 Y2, Y4
	VPADDD    Y24, Y3, K1, Y4
	VPORD     Y1, Y4, Y4
	VPERMB    Z3, Z26, Z5
	VPCMPUB   $5, Z27, Z5, K4
	VINSERTI64X4 $1, Y4, Z2, Z6
	VPERMB    Z6, Z28, Z6
	VPCOMPRESSB.Z Z6, K4, Z7
	VMOVDQU8  Z7, (DI)(AX*1)
	KMOVQ     K4, R8
	POPCNTQ   R8, R8
	ADDQ      R8, AX
	ADDQ      $8, DX
	JMP       loop

done:
	MOVQ AX, ret+32(FP)
	VZEROUPPER
	RET
