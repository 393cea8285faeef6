// Package report formats benchmark results: latency percentiles, aligned text tables for
// the terminal and JSON files under bench/results/.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100, nearest rank) of sorted, or 0
// when empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	rank = min(max(rank, 0), len(sorted)-1)
	return sorted[rank]
}

// Latency summarises a set of latencies in microseconds (JSON-friendly).
type Latency struct {
	Count  int     `json:"count"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Summarize sorts lat in place and returns its summary.
func Summarize(lat []time.Duration) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return Latency{
		Count:  len(lat),
		MeanUS: us(sum) / float64(len(lat)),
		P50US:  us(Percentile(lat, 50)),
		P99US:  us(Percentile(lat, 99)),
		P999US: us(Percentile(lat, 99.9)),
		MaxUS:  us(lat[len(lat)-1]),
	}
}

// Table is a titled text table.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	Notes  []string
	// LeftAlign left-aligns every column (key/value tables of mixed text).
	LeftAlign bool
}

// Add appends a row, formatting each cell with fmt.Sprint.
func (t *Table) Add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = fmt.Sprint(c)
	}
	t.Rows = append(t.Rows, row)
}

// Fprint writes the table with columns padded to their widest cell; the first column is
// left-aligned and the others right-aligned (numbers) unless LeftAlign is set.
func (t *Table) Fprint(w io.Writer) error {
	width := make([]int, len(t.Header))
	for i, h := range t.Header {
		width[i] = len(h)
	}
	for _, r := range t.Rows {
		for i, c := range r {
			if i < len(width) {
				width[i] = max(width[i], len(c))
			}
		}
	}
	var b strings.Builder
	if t.Title != "" {
		b.WriteString(t.Title + "\n")
	}
	line := func(cells []string) {
		var l strings.Builder
		for i := range width {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			if i > 0 {
				l.WriteString("  ")
			}
			if i == 0 || t.LeftAlign {
				fmt.Fprintf(&l, "%-*s", width[i], c)
			} else {
				fmt.Fprintf(&l, "%*s", width[i], c)
			}
		}
		// Left-aligned last columns pad with spaces nobody wants at line ends.
		b.WriteString(strings.TrimRight(l.String(), " "))
		b.WriteString("\n")
	}
	line(t.Header)
	total := 0
	for _, wd := range width {
		total += wd + 2
	}
	b.WriteString(strings.Repeat("-", max(total-2, 0)) + "\n")
	for _, r := range t.Rows {
		line(r)
	}
	for _, n := range t.Notes {
		b.WriteString(n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes v, indented, to dir/name-<UTC time>.json (creating dir) and returns
// the path.
func WriteJSON(dir, name string, v any) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("results dir: %w", err)
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode results: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.json", name, time.Now().UTC().Format("20060102T150405Z")))
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write results: %w", err)
	}
	return path, nil
}

// Figure is one named measurement of a run, for comparing runs (Medians).
type Figure struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit,omitempty"`
	Value float64 `json:"value"`
}

// Median returns the median of values (the mean of the middle two for an even count), or
// 0 when empty. values is not changed.
func Median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	s := slices.Clone(values)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Medians returns, for runs of the same figures, each figure's median over the runs, in
// the order of the first run's figures; a figure missing from a run is left out of that
// figure's median.
func Medians(runs [][]Figure) []Figure {
	if len(runs) == 0 {
		return nil
	}
	out := make([]Figure, 0, len(runs[0]))
	for _, f := range runs[0] {
		var vals []float64
		for _, r := range runs {
			for _, g := range r {
				if g.Name == f.Name {
					vals = append(vals, g.Value)
					break
				}
			}
		}
		out = append(out, Figure{Name: f.Name, Unit: f.Unit, Value: Median(vals)})
	}
	return out
}
