// Package syncbuf holds Buffer, a bytes.Buffer safe for one goroutine writing while
// others read: where a process's or a logger's output is collected and read at once
// (tests and benchmark harnesses waiting for a log line).
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects what is written to it; Write, String and Count may run concurrently.
// The zero value is an empty buffer ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count returns how many times substr occurs in what was written so far.
func (b *Buffer) Count(substr string) int {
	return strings.Count(b.String(), substr)
}
