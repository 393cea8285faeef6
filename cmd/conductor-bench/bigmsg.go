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
	pub, cl, err := startPublisher(cond, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"}, "bigmsg", "big")
	if err != nil {
		return err
	}
	defer pub.Close()
	defer cl.Close()
	small := []byte{0x93, 0xcb, 0x41, 0xda, 0x2f, 0x9f, 0x3a, 0x00, 0x00, 0x00, 0x90, 0xc0} // [ts, [], nil]
	sample := func(what string) error {
		if err := target.Sleep(ctx, *settle); err != nil {
			return err
		}
		s, err := target.ReadProc(cond.PID)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-36s RSS %7.1f MiB\n", what, float64(s.RSSBytes)/(1<<20))
		return nil
	}
	publishSmall := func() error {
		for range 10 {
			if _, err := pub.Publish(small); err != nil {
				return err
			}
		}
		return nil
	}
	if err := publishSmall(); err != nil {
		return err
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
	if err := publishSmall(); err != nil {
		return err
	}
	if err := sample("after 10 more small batches"); err != nil {
		return err
	}
	return sample("idle")
}

// startPublisher starts a publisher (cfg) and registers it with the conductor as a
// vLLM engine (sha256, seed "0", block size 16) serving model as instance; it returns
// the publisher and the client it registered with once the conductor has subscribed.
func startPublisher(cond *target.Conductor, cfg zmqtest.Config, model, instance string) (*zmqtest.Publisher, *httpclient.Client, error) {
	pub, err := zmqtest.NewPublisher(cfg)
	if err != nil {
		return nil, nil, err
	}
	cl, err := httpclient.New(cond.Addr, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		pub.Close()
		return nil, nil, err
	}
	hash := sim.VLLMHash("sha256", "0")
	_, err = cl.Register(&httpclient.RegisterRequest{
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Type: "vLLM", ModelName: model,
		InstanceID: instance, BlockSize: 16,
		HashProfile: httpclient.HashProfile{Strategy: hash.Strategy, Algorithm: hash.Algorithm,
			PythonHashSeed: hash.PythonHashSeed, IndexProjection: hash.IndexProjection},
	})
	if err == nil {
		err = pub.WaitSubscribers(1, 10*time.Second)
	}
	if err != nil {
		cl.Close()
		pub.Close()
		return nil, nil, err
	}
	return pub, cl, nil
}
