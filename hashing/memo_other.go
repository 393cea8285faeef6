//go:build !linux

package hashing

// adviseHuge is a no-op where transparent huge pages cannot be requested.
func adviseHuge([]memoEntry) {}
