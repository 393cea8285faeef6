//go:build !race

package server

// raceEnabled reports whether the tests run under -race (see race_on_test.go).
const raceEnabled = false
