package report

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestSummarize: nearest-rank percentiles over a known distribution.
func TestSummarize(t *testing.T) {
	var lat []time.Duration
	for i := 1000; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	s := Summarize(lat)
	if s.Count != 1000 || s.P50US != 500 || s.P99US != 990 || s.P999US != 999 || s.MaxUS != 1000 || s.MeanUS != 500.5 {
		t.Fatalf("summary %+v", s)
	}
	if (Summarize(nil) != Latency{}) {
		t.Fatal("empty summary not zero")
	}
	if Percentile([]time.Duration{7}, 99.9) != 7 {
		t.Fatal("single-element percentile")
	}
}

// TestTableAndJSON: columns align and results land in a timestamped JSON file.
func TestTableAndJSON(t *testing.T) {
	tb := Table{Title: "T", Header: []string{"policy", "hit"}, Notes: []string{"note"}}
	tb.Add("conductor", "51.2%")
	tb.Add("rr", 3)
	var b strings.Builder
	if err := tb.Fprint(&b); err != nil {
		t.Fatal(err)
	}
	want := "T\npolicy       hit\n----------------\nconductor  51.2%\nrr             3\nnote\n"
	if b.String() != want {
		t.Fatalf("table:\n%q\nwant\n%q", b.String(), want)
	}
	dir := t.TempDir()
	path, err := WriteJSON(dir+"/sub", "replay", map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	if err := json.Unmarshal(data, &got); err != nil || got["a"] != 1 || !strings.Contains(path, "/sub/replay-") {
		t.Fatalf("json %s: %v %v", path, got, err)
	}
}

// TestMedians: the median of odd and even counts, and per figure over runs that lack some.
func TestMedians(t *testing.T) {
	in := []float64{5, 1, 3}
	if m := Median(in); m != 3 || in[0] != 5 {
		t.Fatalf("Median %v, input %v", m, in)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatalf("even median %v", m)
	}
	if Median(nil) != 0 || Medians(nil) != nil {
		t.Fatal("empty")
	}
	runs := [][]Figure{
		{{Name: "a", Unit: "s", Value: 1}, {Name: "b", Value: 10}},
		{{Name: "b", Value: 30}, {Name: "a", Unit: "s", Value: 9}},
		{{Name: "a", Unit: "s", Value: 2}},
	}
	got := Medians(runs)
	want := []Figure{{Name: "a", Unit: "s", Value: 2}, {Name: "b", Value: 20}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Medians %+v, want %+v", got, want)
	}
}
