//go:build race

package ingest_test

// raceEnabled scales down tests whose size only serves a measurement.
const raceEnabled = true
