package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// runBigMessage measures the conductor's RSS around one outsized ZMQ message: a
// registered publisher sends a few ordinary batches, then one message of -mb MiB, then
// ordinary batches again; RSS is sampled before, after the big message, and after idling.
func runBigMessage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cf conductorFlags
	fs := newFlagSet("bigmsg", &cf, stderr)
	mb := fs.Int("mb", 200, "size of the big message in MiB")
	settle := fs.Duration("settle", 3*time.Second, "wait before each sample")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cond, err := cf.startSampled("bigmsg", stderr)
	if err != nil {
		return err
	}
	defer cond.Stop()
	pub, err := zmqtest.NewPublisher(zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		return err
	}
	defer pub.Close()
	cl, err := subscribeTo(cond, pub, "bigmsg", "big")
	if err != nil {
		return err
	}
	defer cl.Close()
	small := []byte{0x93, 0xcb, 0x41, 0xda, 0x2f, 0x9f, 0x3a, 0x00, 0x00, 0x00, 0x90, 0xc0} // [ts, [], nil]
	sample := func(what string) error {
		if err := wait(ctx, *settle); err != nil {
			return err
		}
		s, err := target.ReadProc(cond.PID)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-36s RSS %7.1f MiB\n", what, float64(s.RSSBytes)/(1<<20))
		return nil
	}
	for range 10 {
		if _, err := pub.Publish(small); err != nil {
			return err
		}
	}
	if err := sample("before"); err != nil {
		return err
	}
	big := make([]byte, *mb<<20)
	copy(big, small)
	if _, err := pub.Publish(big); err != nil {
		return err
	}
	big = nil
	if err := sample(fmt.Sprintf("after one %d MiB message", *mb)); err != nil {
		return err
	}
	for range 10 {
		if _, err := pub.Publish(small); err != nil {
			return err
		}
	}
	if err := sample("after 10 more small batches"); err != nil {
		return err
	}
	return sample("idle")
}

// subscribeTo registers pub with the conductor as a vLLM engine (sha256, seed "0",
// block size 16) serving model as instance, and returns the client it registered with
// once the conductor has subscribed.
func subscribeTo(cond *target.Conductor, pub *zmqtest.Publisher, model, instance string) (*httpclient.Client, error) {
	cl, err := httpclient.New(cond.Addr, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	hash := sim.VLLMHash("sha256", "0")
	if _, err := cl.Register(&httpclient.RegisterRequest{
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Type: "vLLM", ModelName: model,
		InstanceID: instance, BlockSize: 16,
		HashProfile: httpclient.HashProfile{Strategy: hash.Strategy, Algorithm: hash.Algorithm,
			PythonHashSeed: hash.PythonHashSeed, IndexProjection: hash.IndexProjection},
	}); err != nil {
		cl.Close()
		return nil, err
	}
	if err := pub.WaitSubscribers(1, 10*time.Second); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}
