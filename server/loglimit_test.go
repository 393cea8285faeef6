package server

import (
	"testing"
	"time"
)

// TestLogLimiter: a burst per reason passes, then one line per period; the next line
// let through carries the number suppressed; reasons are independent.
func TestLogLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLogLimiter(time.Second, 2)
	l.now = func() time.Time { return now }
	steps := []struct {
		advance    time.Duration
		reason     string
		ok         bool
		suppressed uint64
	}{
		{0, "bad frame", true, 0},
		{0, "bad frame", true, 0},
		{100 * time.Millisecond, "bad frame", false, 0},
		{100 * time.Millisecond, "bad frame", false, 0},
		{0, "bad body", true, 0},
		{800 * time.Millisecond, "bad frame", true, 2},
		{0, "bad frame", false, 0},
		{10 * time.Second, "bad frame", true, 1}, // refilled to the burst, not beyond
		{0, "bad frame", true, 0},
		{0, "bad frame", false, 0},
		{0, "bad body", true, 0},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		ok, n := l.allow(s.reason)
		if ok != s.ok || n != s.suppressed {
			t.Fatalf("step %d (%s): allow = %v,%d want %v,%d", i, s.reason, ok, n, s.ok, s.suppressed)
		}
	}
}
