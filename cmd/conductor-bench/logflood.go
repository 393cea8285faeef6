package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/wire/publisher"
)

// countingWriter counts what a spawned conductor writes to its log (stderr).
type countingWriter struct {
	mu           sync.Mutex
	bytes, lines int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.bytes += len(p)
	w.lines += bytes.Count(p, []byte("\n"))
	w.mu.Unlock()
	return len(p), nil
}

func (w *countingWriter) counts() (int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bytes, w.lines
}

// runLogFlood measures how much log a spawned conductor writes for a flood of malformed
// batches from one registered publisher: alternately a broken envelope and a valid batch
// whose one event breaks a field rule (block size 7 where 16 is registered).
func runLogFlood(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("logflood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("conductor-bin", "", "spawn this mooncake_conductor binary (required: its log is what is measured)")
	n := fs.Int("n", 200000, "malformed batches to publish")
	settle := fs.Duration("settle", 3*time.Second, "wait after the flood before counting")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" {
		return errors.New("--conductor-bin is required")
	}
	logs := &countingWriter{}
	cf := conductorFlags{bin: *bin}
	cond, err := cf.start(logs)
	if err != nil {
		return err
	}
	defer cond.Stop()
	pub, cl, err := startPublisher(cond, zmqtest.Config{}, "flood", "flood")
	if err != nil {
		return err
	}
	defer pub.Close()
	defer cl.Close()
	broken := []byte{0xc1}
	// A valid batch whose one BlockStored has block size 7 where 16 is registered.
	enc := sim.NewBatchEncoder(publisher.VLLM, sim.StyleMinimal, 7, "")
	enc.Stored([]uint64{12345}, 0, false, nil, sim.TierDevice)
	bad := enc.Finish(1757500000.25, 0)
	before, _ := logs.counts()
	t0 := time.Now()
	for i := range *n {
		p := broken
		if i%2 == 1 {
			p = bad
		}
		if _, err := pub.Publish(p); err != nil {
			return err
		}
		if i%500 == 499 {
			time.Sleep(time.Millisecond) // stay under the PUB socket's high-water mark
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	elapsed := time.Since(t0)
	if err := target.Sleep(ctx, *settle); err != nil {
		return err
	}
	b, l := logs.counts()
	fmt.Fprintf(stdout, "%d malformed batches in %v: conductor log %d bytes, %d lines\n", *n, elapsed.Round(time.Millisecond), b-before, l)
	return nil
}
