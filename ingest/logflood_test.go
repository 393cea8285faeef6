package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/wire/publisher"
)

// logLines decodes JSON log output: per message, the lines that stand for real events
// (summary lines of Flush excluded) and the sum of the "suppressed" counts reported.
func logLines(t *testing.T, out []byte) (lines, suppressed map[string]int) {
	t.Helper()
	lines, suppressed = map[string]int{}, map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m struct {
			Msg        string `json:"msg"`
			Summary    bool   `json:"summary"`
			Suppressed int    `json:"suppressed"`
			Service    string `json:"service"`
		}
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m.Service != "svc" {
			t.Fatalf("log line without its source: %s", l)
		}
		if !m.Summary {
			lines[m.Msg]++
		}
		suppressed[m.Msg] += m.Suppressed
	}
	return lines, suppressed
}

// The flood of the hardening report: 200,000 malformed batches (20,000 under the race
// detector) in 5 seconds of a stepped clock, alternating a broken envelope with a valid batch holding one
// invalid event. Unlimited, every batch writes a line; limited, each reason writes at most
// Burst lines per Interval and the rest is counted, so that lines plus suppressed counts
// add up exactly, and the handler's counters keep every batch.
func TestMalformedFloodLogIsRateLimited(t *testing.T) {
	batches := 200000
	if raceEnabled {
		batches = 20000
	}
	step := 5 * time.Second / time.Duration(batches)
	broken := []byte{0xc1}
	badEvent := vllmBadEventBatch()
	flood := func(t *testing.T, out io.Writer, limit lograte.Config) *translate.EventHandler {
		now := time.Unix(1_700_000_000, 0) // the limiter's clock, stepped by hand
		limit.Now = func() time.Time { return now }
		lim := lograte.New(slog.NewJSONHandler(out, nil), limit)
		eng := engine.New(engine.Config{})
		t.Cleanup(eng.Close)
		h := translate.NewEventHandler(translate.Source{
			Name: "svc", Kind: publisher.VLLM, Endpoint: "tcp://127.0.0.1:1",
			Context: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16},
			Slot:    engine.Slot{InstanceID: "i"}, Profile: vllmProfile(t),
		}, eng, lim.Logger())
		for i := range batches {
			p := broken
			if i%2 == 1 {
				p = badEvent
			}
			if err := h.HandleBatch(uint64(i), p); err != nil {
				t.Fatal(err)
			}
			now = now.Add(step)
		}
		lim.Flush(context.Background())
		return h
	}
	var unlimited countWriter
	flood(t, &unlimited, lograte.Config{Burst: -1})
	var out bytes.Buffer
	h := flood(t, &out, lograte.Config{Burst: 10, Interval: time.Second})
	limited := out.Bytes()
	t.Logf("log bytes for %d malformed batches: %d unlimited, %d limited", batches, unlimited.bytes, len(limited))
	st := h.Stats()
	if st.Batches != uint64(batches) || st.BatchesDropped != uint64(batches/2) || st.EventsRejected != uint64(batches/2) {
		t.Fatalf("handler stats %+v", st)
	}
	if unlimited.lines != batches {
		t.Fatalf("unlimited: %d lines", unlimited.lines)
	}
	lines, suppressed := logLines(t, limited)
	for _, msg := range []string{"kv event batch dropped", "kv event rejected"} {
		// 5 seconds of 1-second windows, 10 lines each.
		if lines[msg] != 50 || lines[msg]+suppressed[msg] != batches/2 {
			t.Errorf("%s: %d lines, %d suppressed", msg, lines[msg], suppressed[msg])
		}
	}
	if len(limited) > 32<<10 {
		t.Errorf("limited flood wrote %d bytes", len(limited))
	}
}

// vllmBadEventBatch is a valid batch whose one event breaks a field rule (block size 7
// where the registration says 16).
func vllmBadEventBatch() []byte {
	return engineBatch(nil, vStored([]uint64{1, 2}).with("block_size", 7))
}

// countWriter counts bytes and lines written.
type countWriter struct{ bytes, lines int }

func (w *countWriter) Write(p []byte) (int, error) {
	w.bytes += len(p)
	w.lines += bytes.Count(p, []byte("\n"))
	return len(p), nil
}
