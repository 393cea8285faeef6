package server

import (
	"sync"
	"time"
)

// logLimiter is a token bucket per reason: a burst of lines passes, then at most one per
// period, and the next line let through reports how many were suppressed, so that a
// client sending garbage in a loop cannot flood the log (the metrics keep exact counts).
type logLimiter struct {
	period time.Duration
	burst  float64
	now    func() time.Time // tests step it

	mu      sync.Mutex
	reasons map[string]*logReason
}

type logReason struct {
	tokens     float64
	last       time.Time
	suppressed uint64
}

func newLogLimiter(period time.Duration, burst int) *logLimiter {
	return &logLimiter{period: period, burst: float64(burst), now: time.Now, reasons: make(map[string]*logReason)}
}

// allow reports whether a line of this reason may be logged now and, if so, how many
// were suppressed before it.
func (l *logLimiter) allow(reason string) (ok bool, suppressed uint64) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reasons[reason]
	if r == nil {
		if len(l.reasons) >= 1024 { // reasons are a small fixed set; never grow without bound
			l.reasons = make(map[string]*logReason)
		}
		r = &logReason{tokens: l.burst, last: now}
		l.reasons[reason] = r
	}
	r.tokens = min(l.burst, r.tokens+float64(now.Sub(r.last))/float64(l.period))
	r.last = now
	if r.tokens < 1 {
		r.suppressed++
		return false, 0
	}
	r.tokens--
	suppressed, r.suppressed = r.suppressed, 0
	return true, suppressed
}
