//go:build !amd64

package httpapi

// hasVBMI is false: tokensVBMI is amd64 assembly.
const hasVBMI = false

// tokensVBMI decodes nothing off amd64 (see tokens_vbmi_amd64.go).
func tokensVBMI(b []byte, dst []int32) (int, int) { return 0, 0 }
