package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// metricSum sums the samples of the metric name in base's /metrics whose labels hold
// every one of labels (as exposed, `service="e|default|0"`); found is false when there is
// none.
func metricSum(t *testing.T, base, name string, labels ...string) (sum float64, found bool) {
	t.Helper()
	m, err := target.ReadMetrics(t.Context(), strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatalf("%s: %v", base, err)
	}
	sum, found = m.Sum(name, labels...)
	return sum, found
}

// startWithPublisher starts a ZMQ publisher and the binary with one vLLM service on it
// (HTTP on a free port, no RPC, no state file, env added to its environment), and returns
// them and the HTTP base URL once the conductor is ready and subscribed.
func startWithPublisher(t *testing.T, env ...string) (*zmqtest.Publisher, *conductor, string) {
	t.Helper()
	return startWithPublisherConfig(t, nil, env...)
}

// startWithPublisherConfig is startWithPublisher with the configuration keys of extra
// added to its own.
func startWithPublisherConfig(t *testing.T, extra map[string]any, env ...string) (*zmqtest.Publisher, *conductor, string) {
	t.Helper()
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	httpPort := freePort(t)
	keys := map[string]any{
		"http_server_port": httpPort, "rpc_server_port": 0, "state_file": "",
		"kvevent_instance": map[string]any{"vllm-a-r0": vllmEntry(pub.Endpoint())},
	}
	for k, v := range extra {
		keys[k] = v
	}
	config := writeJSON(t, t.TempDir(), keys)
	c := startConductor(t, config, env...)
	base := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	c.waitReady(base)
	if err := pub.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return pub, c, base
}

// TestBinaryBurstIngest: the binary's subscriptions take the burst path (every batch
// handed over deferred, applied by the flush at the end of the burst): a burst of batches
// from a real ZMQ publisher is counted in conductor_service_burst_batches_total, whole,
// and applied by at most as many writer requests (conductor_service_burst_flushes_total)
// as there were batches. A subscription whose handler chain does not implement
// ingest.BurstHandler (as the bootstrap gate once did not) leaves the burst counters at 0.
func TestBinaryBurstIngest(t *testing.T) {
	pub, c, base := startWithPublisher(t)
	const batches = 2000
	for i := range batches {
		if _, err := pub.Publish(vllmBatch([]uint64{uint64(2*i + 1), uint64(2*i + 2)})); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor("every batch applied", func() error {
		if v, _ := metricSum(t, base, "conductor_service_messages_applied_total"); v != batches {
			return fmt.Errorf("%v batches applied", v)
		}
		return nil
	})
	deferred, _ := metricSum(t, base, "conductor_service_burst_batches_total")
	flushes, _ := metricSum(t, base, "conductor_service_burst_flushes_total")
	blocks, _ := metricSum(t, base, "conductor_service_blocks_applied_total")
	if deferred != batches {
		t.Errorf("conductor_service_burst_batches_total = %v, want %d: the burst path did not run", deferred, batches)
	}
	if flushes < 1 || flushes > batches {
		t.Errorf("conductor_service_burst_flushes_total = %v, want 1..%d", flushes, batches)
	}
	if blocks != 2*batches {
		t.Errorf("conductor_service_blocks_applied_total = %v, want %d", blocks, 2*batches)
	}
	t.Logf("%d batches applied by %v writer requests (mean burst %.1f batches)", batches, flushes, deferred/max(flushes, 1))
	c.terminate()
}
