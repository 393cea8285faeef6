package server

import (
	"strings"
	"testing"
	"time"
)

// The ingest limits of the config file reach the App configuration, and values out of
// range are refused naming the key.
func TestConfigIngestKeys(t *testing.T) {
	cfg, err := LoadConfigFile(writeConfig(t, `{"zmq_max_message_size": 1048576, "zmq_io_threads": 2,
		"ingest_log_burst": 3, "ingest_log_interval_seconds": 60}`))
	if err != nil {
		t.Fatal(err)
	}
	app := cfg.AppConfig()
	if app.ZMQMaxMessageSize != 1<<20 || app.ZMQIOThreads != 2 || app.IngestLogBurst != 3 || app.IngestLogInterval != time.Minute {
		t.Fatalf("AppConfig = %+v", app)
	}
	def, err := LoadConfigFile(writeConfig(t, `{}`))
	if err != nil {
		t.Fatal(err)
	}
	if a := def.AppConfig(); a.ZMQMaxMessageSize != 0 || a.ZMQIOThreads != 0 || a.IngestLogBurst != 0 || a.IngestLogInterval != 0 {
		t.Fatalf("defaults = %+v", a)
	}
	for _, text := range []string{
		`{"zmq_max_message_size": -2}`, `{"zmq_max_message_size": "64MiB"}`, `{"zmq_io_threads": 65}`,
		`{"ingest_log_burst": -2}`, `{"ingest_log_interval_seconds": 1.5}`,
	} {
		_, err := LoadConfigFile(writeConfig(t, text))
		key := strings.Split(text, `"`)[1]
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: err = %v", text, err)
		}
	}
}
