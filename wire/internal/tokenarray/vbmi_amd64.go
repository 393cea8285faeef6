package tokenarray

import "golang.org/x/sys/cpu"

// HasVBMI tells whether this CPU (and OS) runs DecodeVBMI's AVX-512 VBMI code.
// Read-only after package initialisation.
var HasVBMI = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI &&
	cpu.X86.HasBMI1 && cpu.X86.HasPOPCNT

// decodeVBMIAsm is DecodeVBMI's loop (vbmi_amd64.s): windows of vbmiWindow bytes at b
// while nd-n >= 64 elements of room are left and 64 bytes from the window's start.
//
//go:noescape
func decodeVBMIAsm(b *byte, nb int, dst *int32, nd int, t *vbmiTables) (n, pos int)

// DecodeVBMI decodes leading elements of a token array body b (its first element at
// b[0]; the bytes after the array may follow) into dst while they are fixints or
// 8/16/32-bit integers in 0..MaxInt32, and returns how many it decoded and the bytes they
// took. It stops at any other element, and where fewer than MinElems elements of dst or
// 64 bytes of b are left; it decodes nothing unless HasVBMI. The caller keeps dst no
// longer than the elements left in the array: DecodeVBMI does not know where it ends.
func DecodeVBMI(b []byte, dst []int32) (n, pos int) {
	if !HasVBMI || len(b) < 64 || len(dst) < MinElems {
		return 0, 0
	}
	return decodeVBMIAsm(&b[0], len(b), &dst[0], len(dst), &vbmiTabs)
}
