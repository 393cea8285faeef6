package httpapi

import "golang.org/x/sys/cpu"

// hasVBMI tells whether this CPU (and OS) runs tokensVBMI's AVX-512 VBMI code.
// Read-only after package initialisation.
var hasVBMI = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI &&
	cpu.X86.HasBMI1 && cpu.X86.HasPOPCNT

// tokensVBMIAsm is tokensVBMI's loop (tokens_vbmi_amd64.s): windows of vbmiWindow bytes at b
// while nd-n >= 64 elements of room are left and 64 bytes from the window's start.
//
//go:noescape
func tokensVBMIAsm(b *byte, nb int, dst *int32, nd int, t *vbmiTables) (n, pos int)

// tokensVBMI decodes leading elements of the token array body b (its first element at
// b[0]) into dst while they are fixints or 8/16/32-bit integers in 0..MaxInt32, and
// returns how many it decoded and the bytes they took. It stops at any other element, and
// where fewer than 64 elements of dst or 64 bytes of b are left; it decodes nothing
// unless hasVBMI. The caller keeps dst no longer than the array.
func tokensVBMI(b []byte, dst []int32) (int, int) {
	if !hasVBMI || len(b) < 64 || len(dst) < vbmiMinElems {
		return 0, 0
	}
	return tokensVBMIAsm(&b[0], len(b), &dst[0], len(dst), &vbmiTabs)
}
