//go:build !race

package arena

// raceHeap is false outside race builds: Map maps memory outside the Go heap.
const raceHeap = false
