//go:build race

package client

// raceEnabled: the race detector allocates on its own (and disables sync.Pool reuse at
// random), so allocation counts are only asserted without it.
const raceEnabled = true
