package server

import (
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/internal/lograte"
)

// The ingest limits of the config file reach the App configuration, and values out of
// range are refused naming the key.
func TestConfigIngestKeys(t *testing.T) {
	cfg, err := LoadConfigFile(writeConfig(t, `{"zmq_max_message_size": 1048576, "zmq_io_threads": 2,
		"ingest_log_burst": 3, "ingest_log_interval_seconds": 60, "zmq_join_check_delay_ms": 250,
		"zmq_source_buffer_bytes": 8388608}`))
	if err != nil {
		t.Fatal(err)
	}
	app := cfg.AppConfig()
	if app.ZMQMaxMessageSize != 1<<20 || app.ZMQIOThreads != 2 || app.IngestLogBurst != 3 || app.IngestLogInterval != time.Minute ||
		app.ZMQJoinCheckDelay != 250*time.Millisecond || app.ZMQSourceBufferBytes != 8<<20 {
		t.Fatalf("AppConfig = %+v", app)
	}
	def, err := LoadConfigFile(writeConfig(t, `{}`))
	if err != nil {
		t.Fatal(err)
	}
	// The documented defaults (the settings table's), set explicitly.
	if a := def.AppConfig(); a.ZMQMaxMessageSize != ingest.DefaultMaxMessageSize || a.ZMQIOThreads != 1 ||
		a.IngestLogBurst != lograte.DefaultBurst || a.IngestLogInterval != lograte.DefaultInterval ||
		a.ZMQJoinCheckDelay != ingest.DefaultJoinCheckDelay || a.ZMQSourceBufferBytes != ingest.DefaultBufferBytes {
		t.Fatalf("defaults = %+v", a)
	}
	off, err := LoadConfigFile(writeConfig(t, `{"zmq_join_check_delay_ms": -1}`))
	if err != nil || off.AppConfig().ZMQJoinCheckDelay >= 0 {
		t.Fatalf("zmq_join_check_delay_ms -1: %+v %v", off, err)
	}
	for _, text := range []string{
		`{"zmq_max_message_size": -2}`, `{"zmq_max_message_size": "64MiB"}`, `{"zmq_io_threads": 65}`,
		`{"ingest_log_burst": -2}`, `{"ingest_log_interval_seconds": 1.5}`,
		`{"zmq_source_buffer_bytes": 0}`, `{"zmq_source_buffer_bytes": "1MiB"}`,
		`{"zmq_join_check_delay_ms": -2}`, `{"zmq_join_check_delay_ms": "1s"}`, `{"zmq_join_check_delay_ms": 3600001}`,
	} {
		_, err := LoadConfigFile(writeConfig(t, text))
		key := strings.Split(text, `"`)[1]
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: err = %v", text, err)
		}
	}
}

// The join check delay reaches every subscriber the App starts: the default, a set
// value, and off; so does the byte budget of libzmq's queue.
func TestJoinCheckDelayReachesSubscribers(t *testing.T) {
	for _, tc := range []struct {
		set, want time.Duration
	}{{0, ingest.DefaultJoinCheckDelay}, {30 * time.Millisecond, 30 * time.Millisecond}, {-time.Millisecond, -time.Millisecond}} {
		app, err := Start(AppConfig{HTTPPort: 0, RPCPort: -1, Logger: testLogger(), BindAddress: "127.0.0.1",
			ZMQJoinCheckDelay: tc.set, ZMQSourceBufferBytes: 3 << 20})
		if err != nil {
			t.Fatal(err)
		}
		pub := newPublisher(t, true)
		body := registerBody(pub.Endpoint(), "engine-j", 0, "replay_endpoint", pub.ReplayEndpoint())
		mustRegister(t, app, "", body)
		var got []time.Duration
		for _, c := range app.Service.Services() {
			sub, _ := app.Service.Subscription(c.ID())
			if z, ok := sub.(interface {
				SubscriberConfig() ingest.SubscriberConfig
			}); ok {
				got = append(got, z.SubscriberConfig().JoinCheckDelay)
				if b := z.SubscriberConfig().BufferBytes; b != 3<<20 {
					t.Errorf("subscriber's BufferBytes %d, want %d", b, 3<<20)
				}
			}
		}
		app.Stop()
		if len(got) != 1 || got[0] != tc.want {
			t.Fatalf("set %v: subscribers' join check delay %v, want %v", tc.set, got, tc.want)
		}
	}
}
