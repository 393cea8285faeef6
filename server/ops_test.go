package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/service"
)

// scrape fetches /metrics and parses the text exposition.
func scrape(t *testing.T, app *App) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, app, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%s", err, body)
	}
	return fams
}

// metricValue sums the samples of a family whose labels include every given pair.
// metricWant is a series, by name and label pairs, and the value it must have.
type metricWant struct {
	name   string
	labels []string
	want   float64
}

// check returns an error unless the scrape f has the series at its value.
func (w metricWant) check(f map[string]*dto.MetricFamily) error {
	if got, ok := metricValue(f, w.name, w.labels...); !ok || got != w.want {
		return errf("%s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.want)
	}
	return nil
}

// waitMetrics waits until a scrape of app has every series at its value.
func waitMetrics(t *testing.T, app *App, what string, wants ...metricWant) {
	t.Helper()
	eventually(t, what, func() error {
		f := scrape(t, app)
		for _, w := range wants {
			if err := w.check(f); err != nil {
				return err
			}
		}
		return nil
	})
}

func metricValue(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range f.GetMetric() {
		match := true
		for i := 0; i < len(labels); i += 2 {
			has := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					has = true
				}
			}
			match = match && has
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, found
}

func TestMetricsMoveWithEventsAndQueries(t *testing.T) {
	app := startApp(t, false)
	pub := newPublisher(t, false)
	mustRegister(t, app, "", registerBody(pub.Endpoint(), "engine-a", 0))
	waitSub(t, pub, 1)
	before := scrape(t, app)
	if v, _ := metricValue(before, "conductor_queries_total", "protocol", "http"); v != 0 {
		t.Fatalf("queries before any query = %v", v)
	}
	tokens := seqTokens(16*9, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	for _, batch := range [][]uint64{keys[0:1], keys[1:2], keys[2:8]} { // blocks 0-7 of 9
		mustPublish(t, pub, vllmBatch(0, stored(batch, "GPU")))
	}
	// A malformed payload: counted as a dropped envelope, nothing applied.
	mustPublish(t, pub, []byte{0xc1})
	waitMetrics(t, app, "events applied",
		metricWant{"conductor_service_events_total", []string{"service", "engine-a|default|0", "outcome", "applied"}, 3},
		metricWant{"conductor_service_rejected_total", []string{"reason", "invalid_envelope"}, 1})
	for i := 0; i < 5; i++ {
		msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	}
	msgpackPost(t, app, "/query", mp("model", "", "block_size", 16, "token_ids", []any{}))
	f := scrape(t, app)
	checks := []metricWant{
		{"conductor_queries_total", []string{"protocol", "http"}, 6},
		{"conductor_query_errors_total", []string{"protocol", "http"}, 1},
		{"conductor_query_duration_seconds", []string{"protocol", "http"}, 6},
		{"conductor_query_blocks_hashed", nil, 5},
		{"conductor_http_requests_total", []string{"route", "/query", "status", "200"}, 5},
		{"conductor_http_requests_total", []string{"route", "/register", "status", "200"}, 1},
		{"conductor_service_messages_received_total", []string{"service", "engine-a|default|0"}, 4},
		{"conductor_service_blocks_applied_total", nil, 8},
		// Every batch (the malformed one too) goes through the gate on the burst path.
		{"conductor_service_burst_batches_total", nil, 4},
		{"conductor_service_stale", nil, 0},
		{"conductor_context_blocks", []string{"model", "m"}, 8},
		{"conductor_context_slots", []string{"model", "m"}, 1},
		// Each query walks blocks 0-8. The first hashes them and remembers blocks 0-7 (a
		// run); the 4 repeats take those from the key memo and hash block 8 again.
		{"conductor_query_memo_misses_total", nil, 9 + 4},
		{"conductor_query_memo_hits_total", nil, 4 * 8},
		{"conductor_query_memo_evictions_total", nil, 0},
		{"conductor_query_memo_reasked_total", nil, 0},
		{"conductor_query_memo_capacity_entries", nil, float64(hashing.DefaultMemoStart)},
	}
	for _, c := range checks {
		if err := c.check(f); err != nil {
			t.Error(err)
		}
	}
	// The 3 valid batches were applied by 1 to 3 writer requests, however they were read.
	if v, _ := metricValue(f, "conductor_service_burst_flushes_total"); v < 1 || v > 3 {
		t.Errorf("burst flushes = %v, want 1..3", v)
	}
	// Blocks hashed (keys computed, from the memo or SHA-256): each query's walk goes
	// through all 9 blocks (the last one ends it).
	if h := f["conductor_query_blocks_hashed"].GetMetric()[0].GetHistogram(); h.GetSampleSum() != 5*9 {
		t.Errorf("blocks hashed sum = %v, want 45", h.GetSampleSum())
	}
	if _, ok := f["process_resident_memory_bytes"]; !ok {
		t.Error("process metrics missing")
	}
	if _, ok := metricValue(f, "conductor_service_last_event_age_seconds"); !ok {
		t.Error("last event age missing")
	}
}

func TestMetricsDisabled(t *testing.T) {
	app := startWith(t, AppConfig{RPCPort: -1, DisableMetrics: true})
	if code, _ := httpGet(t, app, "/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics with metrics disabled: %d, want 404", code)
	}
	if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(16, 1))); code != http.StatusOK {
		t.Errorf("query with metrics disabled: %d", code)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	app := startApp(t, false)
	get := func(path string) (int, string) { return httpGet(t, app, path) }
	if code, body := get("/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body := get("/readyz")
	var ready map[string]any
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != 200 || ready["ready"] != true {
		t.Errorf("/readyz after start = %d %q", code, body)
	}
	app.ready.Store(false) // as during start-up, before static services are subscribed
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before ready = %d, want 503", code)
	}
	app.ready.Store(true)
	app.Service.BeginStop()
	app.ready.Store(false)
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while stopping = %d, want 503", code)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while stopping = %d", code)
	}
}

func startWithState(t *testing.T, path string) *App {
	t.Helper()
	app, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(), StateFile: path})
	if err != nil {
		t.Fatal(err)
	}
	return app
}

func TestStateFileRestoresRegistrations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", service.StateFileName)
	pub := newPublisher(t, false)
	app := startWithState(t, path)
	mustRegister(t, app, "", registerBody(pub.Endpoint(), "engine-a", 0, "lora_name", "l1"))
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"instance_id":"engine-a"`) {
		t.Fatalf("state file after register: %v %s", err, data)
	}
	// Simulate a crash: the process goes away without unregistering anything.
	app.Stop()

	app2 := startWithState(t, path)
	defer app2.Stop()
	svcs := app2.Service.Services()
	if len(svcs) != 1 || svcs[0].InstanceID != "engine-a" || svcs[0].LoraName != "l1" || svcs[0].Endpoint != pub.Endpoint() {
		t.Fatalf("restored services = %+v", svcs)
	}
	// Re-subscribed: events published now reach the new process's index.
	waitSub(t, pub, 1)
	tokens := seqTokens(32, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "l1", "", tokens)
	ev := mp("type", "BlockStored", "block_hashes", []any{keys[0], keys[1]}, "parent_block_hash", nil, "token_ids", nil,
		"block_size", 16, "lora_id", 1, "medium", "GPU", "lora_name", "l1")
	eventually(t, "hits after restart", func() error {
		if _, err := pub.Publish(vllmBatch(0, ev)); err != nil {
			return err
		}
		_, r := msgpackPost(t, app2, "/query", queryBody("m", 16, tokens, "lora_name", "l1"))
		if got := tierOf(t, hits(t, r), "engine-a", "device"); got != 32 {
			return errf("device = %d", got)
		}
		return nil
	})
	if code, _ := msgpackPost(t, app2, "/unregister", mp("instance_id", "engine-a", "dp_rank", 0)); code != 200 {
		t.Fatal("unregister failed")
	}
	if st, err := (&service.StateFile{Path: path}).Load(); err != nil || len(st.Services) != 0 {
		data, _ = os.ReadFile(path)
		t.Errorf("state file still lists the unregistered service: %v %s", err, data)
	}
}

func TestCorruptStateFileIsSetAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, service.StateFileName)
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := startWithState(t, path)
	defer app.Stop()
	if n := len(app.Service.Services()); n != 0 {
		t.Errorf("services from a corrupt state file: %d", n)
	}
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 1 {
		t.Fatalf("corrupt file not set aside: %v", matches)
	}
	if b, _ := os.ReadFile(matches[0]); string(b) != "{not json" {
		t.Errorf("set-aside content changed: %q", b)
	}
	// The conductor keeps working and writes a fresh state file.
	pub := newPublisher(t, false)
	if code, _ := msgpackPost(t, app, "/register", registerBody(pub.Endpoint(), "engine-b", 0)); code != 200 {
		t.Fatal("register after corrupt state failed")
	}
	if st, err := (&service.StateFile{Path: path}).Load(); err != nil || len(st.Services) != 1 {
		b, _ := os.ReadFile(path)
		t.Errorf("new state file = %s (%v)", b, err)
	}
}

func TestStateFileInvalidEntrySkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), service.StateFileName)
	pub := newPublisher(t, false)
	doc := `{"version":1,"services":[
	 {"endpoint":"` + pub.Endpoint() + `","type":"vLLM","modelname":"m","instance_id":"ok","block_size":16,"dp_rank":0,
	  "hash_profile":{"strategy":"vllm_v1","algorithm":"sha256","python_hash_seed":"0","index_projection":"low64_be"}},
	 {"endpoint":"tcp://127.0.0.1:1","type":"vLLM","modelname":"m","instance_id":"bad","block_size":16,"dp_rank":0,
	  "hash_profile":{"strategy":"vllm_v1","algorithm":"md5","python_hash_seed":"0","index_projection":"low64_be"}}]}`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	app := startWithState(t, path)
	defer app.Stop()
	svcs := app.Service.Services()
	if len(svcs) != 1 || svcs[0].InstanceID != "ok" || svcs[0].Profile.AlgorithmName() != "sha256" {
		t.Fatalf("services = %+v", svcs)
	}
}

// TestRestartCatchesUpFromReplay: events a replay-capable publisher sent while the
// conductor was down are fetched from its replay buffer when the persisted registration is
// restored, without waiting for new traffic.
func TestRestartCatchesUpFromReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), service.StateFileName)
	pub := newPublisher(t, true)
	app := startWithState(t, path)
	body := registerBody(pub.Endpoint(), "engine-r", 0, "replay_endpoint", pub.ReplayEndpoint())
	mustRegister(t, app, "", body)
	app.Stop()

	tokens := seqTokens(48, 7)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	for i := range keys {
		mustPublish(t, pub, vllmBatch(0, stored(keys[i:i+1], "GPU")))
	}
	app2 := startWithState(t, path)
	defer app2.Stop()
	eventually(t, "caught up from the replay buffer", func() error {
		_, r := msgpackPost(t, app2, "/query", queryBody("m", 16, tokens))
		if got := tierOf(t, hits(t, r), "engine-r", "device"); got != 48 {
			return errf("device = %d, want 48", got)
		}
		// The replayed batches are applied as they arrive; the catch-up is counted when
		// the publisher's end marker follows them, which a query can beat.
		if st := app2.Service.Stats(); len(st) == 1 && st[0].Stats.CatchUps == 0 {
			return errf("catch-up not counted yet")
		}
		return nil
	})
	if st := app2.Service.Stats(); len(st) != 1 || st[0].Stats.CatchUps != 1 || st[0].Stats.Stale {
		t.Errorf("subscriber stats after catch-up: %+v", st)
	}
}
