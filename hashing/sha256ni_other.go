//go:build !amd64

package hashing

// hasSHANI is false: sha256BlocksNI is amd64 assembly.
const hasSHANI = false

// sha256BlocksNI is never called off amd64 (hasSHANI is false).
func sha256BlocksNI(h *[8]uint32, p *byte, blocks int, t *sha256Tables) {
	panic("sha256BlocksNI without SHA-NI")
}
