package lograte

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// stepClock is a clock the test moves by hand.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

// The limiter's window, per kind: Burst lines pass, the next line after the window
// carries the count of those suppressed, kinds (level, message) are independent, and
// Flush reports what no later line did.
func TestWindows(t *testing.T) {
	var out bytes.Buffer
	clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
	lim := New(slog.NewJSONHandler(&out, nil), Config{Burst: 2, Interval: 10 * time.Second, Now: clock.Now})
	log := lim.Logger().With("service", "svc")
	type line struct {
		Msg        string `json:"msg"`
		Level      string `json:"level"`
		Suppressed int    `json:"suppressed"`
		Summary    bool   `json:"summary"`
	}
	read := func() []line {
		var ls []line
		for _, l := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
			if len(l) == 0 {
				continue
			}
			var x line
			if err := json.Unmarshal(l, &x); err != nil {
				t.Fatal(err)
			}
			ls = append(ls, x)
		}
		out.Reset()
		return ls
	}
	for range 5 {
		log.Warn("a")
	}
	log.Error("a") // another level: another kind
	log.Warn("b")
	if ls := read(); len(ls) != 4 || ls[0].Msg != "a" || ls[1].Msg != "a" || ls[2].Level != "ERROR" || ls[3].Msg != "b" {
		t.Fatalf("first window: %+v", ls)
	}
	clock.now = clock.now.Add(9 * time.Second)
	log.Warn("a")
	if ls := read(); len(ls) != 0 {
		t.Fatalf("inside the window: %+v", ls)
	}
	clock.now = clock.now.Add(time.Second)
	log.Warn("a")
	log.Warn("a")
	log.Warn("a")
	if ls := read(); len(ls) != 2 || ls[0].Suppressed != 4 || ls[1].Suppressed != 0 {
		t.Fatalf("next window: %+v", ls)
	}
	lim.Flush(context.Background())
	if ls := read(); len(ls) != 1 || !ls[0].Summary || ls[0].Msg != "a" || ls[0].Suppressed != 1 {
		t.Fatalf("flush: %+v", ls)
	}
	lim.Flush(context.Background())
	if ls := read(); len(ls) != 0 {
		t.Fatalf("second flush: %+v", ls)
	}
}
