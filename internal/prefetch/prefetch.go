// Package prefetch asks the CPU to bring cache lines in ahead of their use, without
// waiting for them: a walk that knows the addresses it will read a few microseconds from
// now (the table entries of blocks it has just hashed) starts their cache misses while it
// goes on computing, where a load would hold the core's reorder window until the line
// arrived. A prefetch never faults and never changes memory, so an address that is stale
// by the time it is used costs nothing but the wasted line.
package prefetch

// Lines prefetches the cache line of each address in addrs (into every cache level),
// returning at once. On architectures without an implementation it does nothing.
func Lines(addrs []uintptr) {
	if len(addrs) > 0 {
		lines(&addrs[0], len(addrs))
	}
}
