//go:build race

package arena

// raceHeap: under the race detector, Map allocates from the Go heap, which the detector
// instruments (it ignores mappings of its own making), so that tests still check that
// every concurrent access to records and tables goes through sync/atomic.
const raceHeap = true
