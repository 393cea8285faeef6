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

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/ingest/zmqtest"
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
	cl, err := httpclient.New(cond.Addr, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer cl.Close()
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		return err
	}
	defer pub.Close()
	hash := sim.VLLMHash("sha256", "0")
	if _, err := cl.Register(&httpclient.RegisterRequest{
		Endpoint: pub.Endpoint(), Type: "vLLM", ModelName: "flood", InstanceID: "flood", BlockSize: 16,
		HashProfile: httpclient.HashProfile{Strategy: hash.Strategy, Algorithm: hash.Algorithm,
			PythonHashSeed: hash.PythonHashSeed, IndexProjection: hash.IndexProjection},
	}); err != nil {
		return err
	}
	if err := pub.WaitSubscribers(1, 10*time.Second); err != nil {
		return err
	}
	broken := []byte{0xc1}
	// [ts, [{BlockStored, block_size 7}], nil]
	bad := msgp.AppendArrayHeader(nil, 3)
	bad = msgp.AppendFloat64(bad, 1757500000.25)
	bad = msgp.AppendArrayHeader(bad, 1)
	bad = msgp.AppendMapHeader(bad, 6)
	bad = msgp.AppendString(bad, "type")
	bad = msgp.AppendString(bad, "BlockStored")
	bad = msgp.AppendString(bad, "block_hashes")
	bad = msgp.AppendArrayHeader(bad, 1)
	bad = msgp.AppendUint64(bad, 12345)
	bad = msgp.AppendString(bad, "parent_block_hash")
	bad = msgp.AppendNil(bad)
	bad = msgp.AppendString(bad, "token_ids")
	bad = msgp.AppendNil(bad)
	bad = msgp.AppendString(bad, "block_size")
	bad = msgp.AppendInt(bad, 7)
	bad = msgp.AppendString(bad, "medium")
	bad = msgp.AppendString(bad, "GPU")
	bad = msgp.AppendNil(bad)
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
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(*settle):
	}
	b, l := logs.counts()
	fmt.Fprintf(stdout, "%d malformed batches in %v: conductor log %d bytes, %d lines\n", *n, elapsed.Round(time.Millisecond), b-before, l)
	return nil
}
