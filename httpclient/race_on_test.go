//go:build race

package httpclient

// raceEnabled: the race detector makes sync.Pool drop items at random, so allocation
// counts through fasthttp's pools are meaningless under -race.
const raceEnabled = true
