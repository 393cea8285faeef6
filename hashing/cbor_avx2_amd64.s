#include "textflag.h"

// CBOR integers for 8 ids at a time with AVX2 (see cborTokensAVX2 in cbor_amd64.go).
//
// Per id, in dword lanes: u = id, or ^id for a negative one; its class (0: u < 24,
// 1: < 256, 2: < 65536, 3: larger) from three compares; the head byte (major type | u
// for class 0, major | 23+class otherwise); the argument as big-endian bytes, shifted so
// that only the width's bytes remain (a shift by 32 or more leaves none). Head and
// argument are interleaved into one qword per id (head, then the argument's bytes), the
// 8 qwords and 8 widths are put on the stack, and each qword is stored at the output
// position, which then advances by its width.

// STORE writes the id's qword at q(SP) at the output position and advances the position
// by its width at w(SP).
#define STORE(q, w) \
	MOVQ q(SP), R8; \
	MOVQ R8, (DI)(BX*1); \
	MOVL w(SP), R9; \
	ADDQ R9, BX

// func cborTokensAVX2(dst *byte, toks *int32, n int, t *cborAVX2Tables) int
TEXT ·cborTokensAVX2(SB), NOSPLIT, $96-40
	MOVQ dst+0(FP), DI
	MOVQ toks+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ t+24(FP), AX
	XORQ BX, BX

	VPBROADCASTD 0(AX), Y10  // 23
	VPBROADCASTD 4(AX), Y11  // 255
	VPBROADCASTD 8(AX), Y12  // 65535
	VPBROADCASTD 12(AX), Y13 // the negative major type
	VPBROADCASTD 16(AX), Y14 // 4
	VPBROADCASTD 20(AX), Y9  // 1
	VMOVDQU      32(AX), Y15 // byte order mask: each dword big-endian

	TESTQ CX, CX
	JZ    done

loop:
	VMOVDQU   (SI), Y0
	VPSRAD    $31, Y0, Y1      // all ones for a negative id
	VPXOR     Y1, Y0, Y2       // u
	VPAND     Y13, Y1, Y1      // major type
	VPCMPGTD  Y10, Y2, Y3      // c1: u > 23
	VPCMPGTD  Y11, Y2, Y4      // c2: u > 255
	VPCMPGTD  Y12, Y2, Y5      // c3: u > 65535
	VPADDD    Y4, Y3, Y6
	VPADDD    Y5, Y6, Y6       // -class
	VPSUBD    Y6, Y10, Y7      // 23 + class
	VPBLENDVB Y3, Y7, Y2, Y7   // c1 ? 23+class : u
	VPOR      Y1, Y7, Y7       // head
	VPADDD    Y5, Y6, Y8       // 1 - width
	VPADDD    Y14, Y8, Y4      // 5 - width: argument bytes to drop
	VPSLLD    $3, Y4, Y4
	VPSHUFB   Y15, Y2, Y5      // u big-endian
	VPSRLVD   Y4, Y5, Y5       // the width's argument bytes, first at byte 0
	VPSLLD    $8, Y5, Y6
	VPOR      Y6, Y7, Y6       // head, argument bytes 0..2
	VPSRLD    $24, Y5, Y5      // argument byte 3
	VPUNPCKLDQ Y5, Y6, Y3      // ids 0, 1 | 4, 5
	VPUNPCKHDQ Y5, Y6, Y4      // ids 2, 3 | 6, 7
	VPSUBD    Y8, Y9, Y8       // width
	VMOVDQU   Y3, 0(SP)
	VMOVDQU   Y4, 32(SP)
	VMOVDQU   Y8, 64(SP)

	// In id order: the qwords lie as ids 0, 1, 4, 5, 2, 3, 6, 7.
	STORE(0, 64)
	STORE(8, 68)
	STORE(32, 72)
	STORE(40, 76)
	STORE(16, 80)
	STORE(24, 84)
	STORE(48, 88)
	STORE(56, 92)

	ADDQ $32, SI
	SUBQ $8, CX
	JNZ  loop

done:
	VZEROUPPER
	MOVQ BX, ret+32(FP)
	RET
