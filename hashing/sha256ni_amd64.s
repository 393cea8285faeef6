#include "textflag.h"

// SHA-256 compression with the x86 SHA extensions (SHA-NI), for sum256Room.
//
// The state lives in two registers in the order SHA256RNDS2 wants: X1 = (A,B,E,F) and
// X2 = (C,D,G,H), listed from the high dword down. Each group of four rounds adds four
// round constants to four message words in X0 and runs SHA256RNDS2 twice (two rounds
// each; PSHUFD brings the upper two sums down for the second). The message words of
// groups 4..15 are scheduled from the four groups before them (SHA256MSG1, the words 7
// back via PALIGNR, SHA256MSG2), rotating through X3..X6.

// ROUNDS4 runs four rounds on the message words in m with the constants at k(AX).
#define ROUNDS4(m, k) \
	MOVOU       k(AX), X0; \
	PADDD       m, X0; \
	SHA256RNDS2 X0, X1, X2; \
	PSHUFD      $0x0e, X0, X0; \
	SHA256RNDS2 X0, X2, X1

// SCHEDULE replaces w16 (words t-16..t-13) with words t..t+3, given w12 (t-12..t-9),
// w8 (t-8..t-5) and w4 (t-4..t-1).
#define SCHEDULE(w16, w12, w8, w4) \
	SHA256MSG1 w12, w16; \
	MOVO       w4, X7; \
	PALIGNR    $4, w8, X7; \
	PADDD      X7, w16; \
	SHA256MSG2 w4, w16

// func sha256BlocksNI(h *[8]uint32, p *byte, blocks int, t *sha256Tables)
TEXT ·sha256BlocksNI(SB), NOSPLIT, $0-32
	MOVQ h+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ blocks+16(FP), DX
	MOVQ t+24(FP), AX
	MOVOU 256(AX), X8 // the byte order mask: big-endian words

	// h[0..3] = (D,C,B,A) and h[4..7] = (H,G,F,E) from the high dword down: to ABEF, CDGH.
	MOVOU   (DI), X1
	MOVOU   16(DI), X2
	PSHUFD  $0xb1, X1, X1 // C,D,A,B
	PSHUFD  $0x1b, X2, X2 // E,F,G,H
	MOVO    X1, X7
	PALIGNR $8, X2, X1    // A,B,E,F
	PBLENDW $0xf0, X7, X2 // C,D,G,H

	TESTQ DX, DX
	JZ    done

loop:
	MOVO X1, X9
	MOVO X2, X10

	MOVOU  0(SI), X3
	PSHUFB X8, X3
	MOVOU  16(SI), X4
	PSHUFB X8, X4
	MOVOU  32(SI), X5
	PSHUFB X8, X5
	MOVOU  48(SI), X6
	PSHUFB X8, X6

	ROUNDS4(X3, 0)
	ROUNDS4(X4, 16)
	ROUNDS4(X5, 32)
	ROUNDS4(X6, 48)

	SCHEDULE(X3, X4, X5, X6)
	ROUNDS4(X3, 64)
	SCHEDULE(X4, X5, X6, X3)
	ROUNDS4(X4, 80)
	SCHEDULE(X5, X6, X3, X4)
	ROUNDS4(X5, 96)
	SCHEDULE(X6, X3, X4, X5)
	ROUNDS4(X6, 112)

	SCHEDULE(X3, X4, X5, X6)
	ROUNDS4(X3, 128)
	SCHEDULE(X4, X5, X6, X3)
	ROUNDS4(X4, 144)
	SCHEDULE(X5, X6, X3, X4)
	ROUNDS4(X5, 160)
	SCHEDULE(X6, X3, X4, X5)
	ROUNDS4(X6, 176)

	SCHEDULE(X3, X4, X5, X6)
	ROUNDS4(X3, 192)
	SCHEDULE(X4, X5, X6, X3)
	ROUNDS4(X4, 208)
	SCHEDULE(X5, X6, X3, X4)
	ROUNDS4(X5, 224)
	SCHEDULE(X6, X3, X4, X5)
	ROUNDS4(X6, 240)

	PADDD X9, X1
	PADDD X10, X2
	ADDQ  $64, SI
	DECQ  DX
	JNZ   loop

done:
	// Back to (D,C,B,A) and (H,G,F,E).
	PSHUFD  $0x1b, X1, X1 // F,E,B,A
	PSHUFD  $0xb1, X2, X2 // D,C,H,G
	MOVO    X1, X7
	PBLENDW $0xf0, X2, X1 // D,C,B,A
	PALIGNR $8, X7, X2    // H,G,F,E
	MOVOU   X1, (DI)
	MOVOU   X2, 16(DI)
	RET
