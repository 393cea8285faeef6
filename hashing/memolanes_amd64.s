#include "textflag.h"

// func laneRun16(ka, kb *laneKeys, p *int32, n int, la, lb uint64, outA, outB *uint64) (uint64, uint64)
//
// blockLanes for n consecutive 64-byte blocks at p (see laneRun16 in memolanes_amd64.go).
// laneKeys: w[8] at 0..56, group at 64, fold at 72. Per block and lane: four 64x64->128
// multiplies of key-masked word pairs, each folded hi^lo and summed; then the chain value
// ^ sum ^ 64 is multiplied by the fold key and folded the same way.
TEXT ·laneRun16(SB), NOSPLIT, $0-80
	MOVQ ka+0(FP), R8
	MOVQ kb+8(FP), R9
	MOVQ p+16(FP), SI
	MOVQ n+24(FP), CX
	MOVQ la+32(FP), R10
	MOVQ lb+40(FP), R11
	MOVQ outA+48(FP), DI
	MOVQ outB+56(FP), R12
	TESTQ CX, CX
	JEQ done

loop:
	// Lane A: sum into R13, then la = fold(la ^ sum ^ 64).
	MOVQ 0(SI), AX
	XORQ 0(R8), AX
	MOVQ 8(SI), BX
	XORQ 8(R8), BX
	MULQ BX
	XORQ DX, AX
	MOVQ AX, R13
	MOVQ 16(SI), AX
	XORQ 16(R8), AX
	MOVQ 24(SI), BX
	XORQ 24(R8), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	MOVQ 32(SI), AX
	XORQ 32(R8), AX
	MOVQ 40(SI), BX
	XORQ 40(R8), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	MOVQ 48(SI), AX
	XORQ 48(R8), AX
	MOVQ 56(SI), BX
	XORQ 56(R8), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	XORQ R13, R10
	XORQ $64, R10
	MOVQ R10, AX
	MULQ 72(R8)
	XORQ DX, AX
	MOVQ AX, R10
	MOVQ R10, (DI)

	// Lane B, the same under kb.
	MOVQ 0(SI), AX
	XORQ 0(R9), AX
	MOVQ 8(SI), BX
	XORQ 8(R9), BX
	MULQ BX
	XORQ DX, AX
	MOVQ AX, R13
	MOVQ 16(SI), AX
	XORQ 16(R9), AX
	MOVQ 24(SI), BX
	XORQ 24(R9), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	MOVQ 32(SI), AX
	XORQ 32(R9), AX
	MOVQ 40(SI), BX
	XORQ 40(R9), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	MOVQ 48(SI), AX
	XORQ 48(R9), AX
	MOVQ 56(SI), BX
	XORQ 56(R9), BX
	MULQ BX
	XORQ DX, AX
	ADDQ AX, R13
	XORQ R13, R11
	XORQ $64, R11
	MOVQ R11, AX
	MULQ 72(R9)
	XORQ DX, AX
	MOVQ AX, R11
	MOVQ R11, (R12)

	ADDQ $64, SI
	ADDQ $8, DI
	ADDQ $8, R12
	DECQ CX
	JNZ loop

done:
	MOVQ R10, ret+64(FP)
	MOVQ R11, ret1+72(FP)
	RET
