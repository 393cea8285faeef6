package accesslog

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// gateWriter blocks every Write until released, and reports when a Write has begun.
type gateWriter struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	<-g.release
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

// TestAccessLogBoundedWhileWriterBlocks: while the writer is stuck, requests keep
// appending into the other buffer up to its bound, then lines are dropped and counted;
// nothing is torn and what was accepted is written once the writer moves again.
func TestAccessLogBoundedWhileWriterBlocks(t *testing.T) {
	g := &gateWriter{entered: make(chan struct{}), release: make(chan struct{})}
	l := New(g, nil, Config{BufferBytes: 4096, FlushInterval: time.Hour})
	line := []byte(`{"route":"/query","n":"` + strings.Repeat("x", 80) + "\"}\n") // 105 bytes
	l.commit(line)
	flushed := make(chan struct{})
	go func() { l.Flush(); close(flushed) }()
	<-g.entered // the flusher holds the first line and is blocked in Write
	accepted := 0
	for i := 0; i < 100; i++ {
		before := l.Dropped()
		l.commit(line)
		if l.Dropped() == before {
			accepted++
		}
	}
	if want := 4096 / len(line); accepted != want || l.Dropped() != uint64(100-want) {
		t.Fatalf("accepted %d, dropped %d; want %d accepted", accepted, l.Dropped(), want)
	}
	g.release <- struct{}{}
	<-flushed
	go func() { <-g.entered; g.release <- struct{}{} }()
	l.Flush()
	go func() {
		for range g.entered {
			g.release <- struct{}{}
		}
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	close(g.entered)
	g.mu.Lock()
	got := g.buf.String()
	g.mu.Unlock()
	if want := strings.Repeat(string(line), 1+accepted); got != want {
		t.Fatalf("written %d bytes, want %d (1 + %d whole lines)", len(got), len(want), accepted)
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, `"plain"`},
		{"q\"b\\s\n\t\x00\x1f", 100, `"q\"b\\s\u000a\u0009\u0000\u001f"`},
		{"bad\xffutf8", 100, `"bad\ufffdutf8"`},
		{"ééé", 3, `"éé"`}, // cut after whole characters
		{"", 10, `""`},
	} {
		got := string(appendJSONString(nil, c.in, c.max))
		if got != c.want {
			t.Errorf("%q: %s, want %s", c.in, got, c.want)
		}
		var s string
		if err := json.Unmarshal([]byte(got), &s); err != nil {
			t.Errorf("%q: %s is not a JSON string: %v", c.in, got, err)
		}
	}
}
