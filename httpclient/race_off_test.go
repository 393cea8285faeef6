//go:build !race

package httpclient

// raceEnabled reports whether the tests run under -race (see race_on_test.go).
const raceEnabled = false
