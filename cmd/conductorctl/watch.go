package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/conductor-go/conductor/httpclient"
)

// clearScreen moves the cursor home and erases the screen (ANSI), so each refresh
// replaces the previous one on a terminal.
const clearScreen = "\x1b[H\x1b[2J"

func (c *cli) cmdWatch(g *globals, args []string) int {
	const name = "watch"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	interval := fs.Duration("interval", 2*time.Second, "time between refreshes")
	count := fs.Int("count", 0, "stop after this many refreshes (0: until interrupted)")
	var f queryFlags
	f.register(fs)
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	if *interval <= 0 {
		return c.usageError(name, fs, "--interval must be positive")
	}
	if *count < 0 {
		return c.usageError(name, fs, "--count must not be negative")
	}
	probe := f.q.Model != "" || f.q.BlockSize != 0 || f.tokens.given(fs.Args())
	if probe {
		if err := f.load(c.stdin, fs.Args()); err != nil {
			var ue *usageError
			if errors.As(err, &ue) {
				return c.usageError(name, fs, "probe: "+ue.msg)
			}
			return c.inputError(err)
		}
	}
	cl, code := c.client(g)
	if cl == nil {
		return code
	}
	defer cl.Close()

	w := watcher{c: c, g: g, cl: cl, probe: probe, q: &f.q, interval: *interval}
	ticker := time.NewTicker(*interval)
	defer ticker.Stop()
	for i := 1; ; i++ {
		code := w.refresh(i, *count)
		if *count > 0 && i >= *count {
			return code
		}
		select {
		case <-c.ctx.Done():
			return exitOK // interrupted by the operator: the normal way out
		case <-ticker.C:
		}
	}
}

// watcher holds what persists across refreshes: the previous prefix counts, for the
// CHANGE column, and the query result, reused.
type watcher struct {
	c        *cli
	g        *globals
	cl       *httpclient.Client
	probe    bool
	q        *httpclient.QueryRequest
	interval time.Duration
	prev     map[contextKey]int64
	res      httpclient.QueryResult
}

// watchFrame is one refresh in --json mode, printed as one line (NDJSON). A part whose
// call failed is null; the error went to stderr.
type watchFrame struct {
	Refresh    int                     `json:"refresh"`
	Time       string                  `json:"time"`
	GlobalView *httpclient.GlobalView  `json:"global_view"`
	Services   *httpclient.ServiceList `json:"services"`
	Probe      *httpclient.QueryResult `json:"probe,omitempty"`
}

// refresh fetches and prints one frame and returns the exit status it would warrant:
// watch goes on after a failed refresh, but a --count run ending on one reports it.
func (w *watcher) refresh(i, count int) int {
	c := w.c
	now := time.Now()
	frame := watchFrame{Refresh: i, Time: now.Format(time.RFC3339)}
	code := exitOK
	fail := func(err error) {
		fmt.Fprintf(c.stderr, "error: %v\n", err)
		code = max(code, exitCode(err))
	}

	view, err := w.cl.GlobalView()
	var connErr *httpclient.ConnError
	if err != nil {
		fail(err)
	} else {
		frame.GlobalView = &view
	}
	// An unreachable conductor would fail the other calls the same way; say it once.
	if !errors.As(err, &connErr) {
		if l, err := w.cl.Services(); err != nil {
			fail(err)
		} else {
			frame.Services = &l
		}
		if w.probe {
			if err := w.cl.Query(w.q, &w.res); err != nil {
				fail(err)
			} else {
				frame.Probe = &w.res
			}
		}
	}

	if w.g.json {
		line, err := json.Marshal(frame)
		if err != nil {
			fail(fmt.Errorf("encode JSON: %w", err))
			return code
		}
		c.stdout.Write(append(line, '\n'))
		return code
	}

	var buf bytes.Buffer
	if c.clearScreen {
		buf.WriteString(clearScreen)
	} else if i > 1 {
		buf.WriteByte('\n')
	}
	progress := fmt.Sprintf("refresh %d, every %s", i, w.interval)
	if count > 0 {
		progress = fmt.Sprintf("refresh %d/%d", i, count)
	}
	fmt.Fprintf(&buf, "conductor %s  %s  %s\n\nCONTEXTS\n", w.cl.Addr(), now.Format("2006-01-02 15:04:05"), progress)
	if frame.GlobalView != nil {
		writeView(&buf, *frame.GlobalView, true, w.prev)
		w.remember(frame.GlobalView)
	} else {
		buf.WriteString("unavailable\n")
	}
	buf.WriteString("\nSERVICES\n")
	if frame.Services != nil {
		writeServices(&buf, *frame.Services, false)
	} else {
		buf.WriteString("unavailable\n")
	}
	if w.probe {
		fmt.Fprintf(&buf, "\nPROBE model %s, block %d", w.q.Model, w.q.BlockSize)
		if w.q.InstanceID != "" {
			fmt.Fprintf(&buf, ", instance %s", w.q.InstanceID)
		}
		buf.WriteString("\n")
		if frame.Probe != nil {
			writeQuery(&buf, frame.Probe, len(w.q.TokenIDs))
		} else {
			buf.WriteString("unavailable\n")
		}
	}
	if _, err := c.stdout.Write(buf.Bytes()); err != nil {
		fail(fmt.Errorf("write output: %w", err))
	}
	return code
}

func (w *watcher) remember(v *httpclient.GlobalView) {
	m := make(map[contextKey]int64, len(v.Contexts))
	for i := range v.Contexts {
		m[keyOf(&v.Contexts[i])] = v.Contexts[i].PrefixCount
	}
	w.prev = m
}
