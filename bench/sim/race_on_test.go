//go:build race

package sim

// raceEnabled: the race detector allocates on its own (and disables sync.Pool reuse at
// random), so allocation counts are only asserted without it.
const raceEnabled = true
