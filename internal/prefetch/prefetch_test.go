package prefetch

import (
	"testing"
	"unsafe"
)

// TestLinesLeavesMemoryAlone prefetches valid, stale and nil addresses: a prefetch must
// neither fault nor change what it touches.
func TestLinesLeavesMemoryAlone(t *testing.T) {
	buf := make([]uint64, 4096)
	for i := range buf {
		buf[i] = uint64(i) * 3
	}
	addrs := []uintptr{0, 1, ^uintptr(0) - 63}
	for i := 0; i < len(buf); i += 8 {
		addrs = append(addrs, uintptr(unsafe.Pointer(&buf[i])))
	}
	Lines(addrs)
	Lines(nil)
	for i := range buf {
		if buf[i] != uint64(i)*3 {
			t.Fatalf("word %d changed to %d", i, buf[i])
		}
	}
}

// TestLinesAllocatesNothing: the walk calls Lines once per hashed window.
func TestLinesAllocatesNothing(t *testing.T) {
	buf := make([]uint64, 64)
	addrs := []uintptr{uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[32]))}
	if n := testing.AllocsPerRun(100, func() { Lines(addrs) }); n != 0 {
		t.Fatalf("Lines allocates %v times a call", n)
	}
}
