#include "textflag.h"

// func lines(p *uintptr, n int)
TEXT ·lines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JLE  done

loop:
	MOVQ       (SI), AX
	PREFETCHT0 (AX)
	ADDQ       $8, SI
	DECQ       CX
	JNZ        loop

done:
	RET
