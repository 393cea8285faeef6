//go:build race

package server

// raceEnabled: the race detector makes sync.Pool drop items at random, so allocation
// counts through pooled scratch are meaningless under -race.
const raceEnabled = true
