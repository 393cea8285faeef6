#include "textflag.h"

// GROUP decodes elements 16g..16g+15 of the window (pat = group g's pattern, patE =
// its patE, off = 64g bytes of output) into dst[i+16g:], and ORs their range failures
// into DX at bit 16g (sh = 16g).
//   Z14: the element's end E (the next one's start) in each byte, minus 1..4: the value
//        bytes' positions (an element's last start, at most 63, is the end of the last
//        one in the window: positions past the window map to themselves)
//   Z14: those bytes (the 4 big-endian bytes ending at E), masked to the form's width
//   Z15: the form in each byte; Z16: the form's mask, then its bits that must be clear
#define GROUP(pat, patE, off, sh) \
	VPERMB   Z10, patE, Z14; \
	VPSUBB   Z21, Z14, Z14; \
	VPERMB   Z0, Z14, Z14; \
	VPERMB   Z13, pat, Z15; \
	VPERMD   Z20, Z15, Z16; \
	VPANDD   Z16, Z14, Z14; \
	VPERMD   Z19, Z15, Z16; \
	VPTESTMD Z16, Z14, K7; \
	KMOVW    K7, AX; \
	SHLQ     $sh, AX; \
	ORQ      AX, DX; \
	VMOVDQU32 Z14, off(DI)(R10*4)

// func decodeVBMIAsm(b *byte, nb int, dst *int32, nd int, t *vbmiTables) (n, pos int)
//
// Registers: SI b, R8 nb, DI dst, R9 nd, R10 elements decoded, R11 window start.
// Z9: the window's first element start (0..4), in every byte. Per window: Z0 its 64
// bytes; Z2 next (next¹); Z3..Z8 next², next⁴, ... next⁶⁴; Z10 the start of element k
// in byte k; Z12 its lead byte; Z13 its form. Z11, Z1: patE[0], patE[1]; BX: the
// tables. See vbmi.go.
TEXT ·decodeVBMIAsm(SB), NOSPLIT, $64-56
	MOVQ b+0(FP), SI
	MOVQ nb+8(FP), R8
	MOVQ dst+16(FP), DI
	MOVQ nd+24(FP), R9
	MOVQ t+32(FP), BX
	VMOVDQU64 0(BX), Z31   // iota
	VMOVDQU64 64(BX), Z30  // win
	VMOVDQU64 128(BX), Z29 // ones
	VMOVDQU64 192(BX), Z28 // lenT
	VMOVDQU64 256(BX), Z27 // clsLo
	VMOVDQU64 320(BX), Z26 // clsHi
	VMOVDQU64 384(BX), Z25 // pat[0]
	VMOVDQU64 448(BX), Z24 // pat[1]
	VMOVDQU64 512(BX), Z23 // pat[2]
	VMOVDQU64 576(BX), Z22 // pat[3]
	VMOVDQU64 640(BX), Z21 // sub
	VMOVDQU64 704(BX), Z20 // maskT
	VMOVDQU64 768(BX), Z19 // signT
	VMOVDQU64 832(BX), Z18 // all59
	VMOVDQU64 896(BX), Z17 // inval
	KMOVQ 960(BX), K1
	KMOVQ 968(BX), K2
	KMOVQ 976(BX), K3
	KMOVQ 984(BX), K4
	KMOVQ 992(BX), K5
	KMOVQ 1000(BX), K6
	VMOVDQU64 1008(BX), Z11 // patE[0]
	VMOVDQU64 1072(BX), Z1  // patE[1]
	XORQ R10, R10
	XORQ R11, R11
	VPXORQ Z9, Z9, Z9

loop:
	MOVQ R9, AX
	SUBQ R10, AX
	CMPQ AX, $64
	JLT  done
	MOVQ R8, AX
	SUBQ R11, AX
	CMPQ AX, $64
	JLT  done
	VMOVDQU64 0(SI)(R11*1), Z0

	// next: each window byte's position plus the length of an element it would lead;
	// the 5 bytes after the window map to themselves.
	VPMOVB2M  Z0, K7
	VMOVDQA64 Z29, Z2
	VPERMB    Z28, Z0, K7, Z2
	VPANDQ    Z30, Z2, Z2
	VPADDB    Z31, Z2, Z2

	// next², next⁴, ... next⁶⁴.
	VPERMB Z2, Z2, Z3
	VPERMB Z3, Z3, Z4
	VPERMB Z4, Z4, Z5
	VPERMB Z5, Z5, Z6
	VPERMB Z6, Z6, Z7
	VPERMB Z7, Z7, Z8

	// Element k starts at next^k(s): lane k applies next^(2^j) for each bit j of k.
	VMOVDQA64 Z9, Z10
	VPERMB    Z2, Z10, K1, Z10
	VPERMB    Z3, Z10, K2, Z10
	VPERMB    Z4, Z10, K3, Z10
	VPERMB    Z5, Z10, K4, Z10
	VPERMB    Z6, Z10, K5, Z10
	VPERMB    Z7, Z10, K6, Z10

	// The next window's first start: next⁶⁴(s) - vbmiWindow.
	VPERMB Z8, Z9, Z9
	VPSUBB Z18, Z9, Z9

	// Per element: lead byte, form (fixints: leads below 0x80, form 0).
	VPERMB    Z0, Z10, Z12
	VMOVDQA64 Z12, Z13
	VPERMI2B  Z26, Z27, Z13
	VPMOVB2M  Z12, K7
	VMOVDQU8.Z Z13, K7, Z13

	// DX: elements of a form not taken; CX: elements starting in the window.
	VPCMPEQB Z17, Z13, K7
	KMOVQ    K7, DX
	VPCMPUB  $1, Z18, Z10, K7
	KMOVQ    K7, AX
	POPCNTQ  AX, CX

	GROUP(Z25, Z11, 0, 0)
	CMPQ CX, $16
	JLE  checked
	GROUP(Z24, Z1, 64, 16)
	CMPQ CX, $32
	JLE  checked
	VMOVDQU64 1136(BX), Z12 // patE[2] (the lead bytes are not needed any more)
	GROUP(Z23, Z12, 128, 32)
	CMPQ CX, $48
	JLE  checked
	VMOVDQU64 1200(BX), Z12 // patE[3]
	GROUP(Z22, Z12, 192, 48)

checked:
	// The first element not taken (64 if none) ends the decode when it is in the window.
	TZCNTQ DX, AX
	CMPQ   AX, CX
	JLT    stop
	ADDQ   CX, R10
	ADDQ   $59, R11
	JMP    loop

stop:
	// AX elements of this window are taken; the next one starts at byte AX of Z10.
	VMOVDQU64 Z10, buf-64(SP)
	LEAQ      buf-64(SP), BX
	MOVBQZX   (BX)(AX*1), BX
	ADDQ      R11, BX
	ADDQ      AX, R10
	MOVQ      R10, n+40(FP)
	MOVQ      BX, pos+48(FP)
	VZEROUPPER
	RET

done:
	VMOVQ  X9, AX
	ANDQ   $0xff, AX
	ADDQ   R11, AX
	MOVQ   R10, n+40(FP)
	MOVQ   AX, pos+48(FP)
	VZEROUPPER
	RET
