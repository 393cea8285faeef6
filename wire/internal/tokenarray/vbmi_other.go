//go:build !amd64

package tokenarray

// HasVBMI is false: DecodeVBMI is amd64 assembly.
const HasVBMI = false

// DecodeVBMI decodes nothing off amd64 (see vbmi_amd64.go).
func DecodeVBMI(b []byte, dst []int32) (n, pos int) { return 0, 0 }
