package hashing

import "github.com/klauspost/cpuid/v2"

// hasSHANI tells whether this CPU runs sha256BlocksNI: the SHA extensions, SSSE3 (byte
// shuffles) and SSE4.1 (word blends). Read-only after package initialisation.
var hasSHANI = cpuid.CPU.Supports(cpuid.SHA, cpuid.SSSE3, cpuid.SSE4)

// sha256BlocksNI runs the SHA-256 compression over blocks 64-byte blocks at p, updating
// the state h (sha256ni_amd64.s).
//
//go:noescape
func sha256BlocksNI(h *[8]uint32, p *byte, blocks int, t *sha256Tables)
