package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/conductor-go/conductor/bench/report"
)

// alternateFlags run a measurement against two conductor binaries in turn.
type alternateFlags struct {
	bins   string
	rounds int
}

func (a *alternateFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.bins, "alternate", "", "BIN_A,BIN_B: measure two conductor binaries in turn (A B, B A, A B, ...), each run a freshly spawned process, and print every figure's median per binary")
	fs.IntVar(&a.rounds, "rounds", 3, "with --alternate: runs of each binary")
}

// pair returns the two binaries, or nil when not alternating.
func (a *alternateFlags) pair(cf *conductorFlags) ([]string, error) {
	if a.bins == "" {
		return nil, nil
	}
	bins := splitList(a.bins)
	switch {
	case len(bins) != 2:
		return nil, fmt.Errorf("--alternate %q: want two binaries, BIN_A,BIN_B", a.bins)
	case cf.url != "" || cf.bin != "":
		return nil, errors.New("--alternate spawns its binaries: it excludes --conductor and --conductor-bin")
	case a.rounds < 1:
		return nil, fmt.Errorf("--rounds %d: want at least 1", a.rounds)
	}
	return bins, nil
}

// measuredCommand is a command that measures once, or alternately against two binaries
// (runMeasured): its flag set with the conductor's and the alternation's flags and
// --results registered; the command adds its own flags before Parse.
type measuredCommand struct {
	name    string
	fs      *flag.FlagSet
	cf      conductorFlags
	alt     alternateFlags
	results *string
}

func newMeasuredCommand(name string, stderr io.Writer) *measuredCommand {
	m := &measuredCommand{name: name}
	m.fs = newFlagSet(name, &m.cf, stderr)
	m.alt.register(m.fs)
	m.results = m.fs.String("results", "bench/results", "directory for the JSON result")
	return m
}

// run measures as the flags say and writes the JSON result.
func (m *measuredCommand) run(ctx context.Context, measure measureFunc, stdout io.Writer) error {
	return runMeasured(ctx, m.name, *m.results, &m.cf, &m.alt, measure, stdout)
}

// measureFunc measures once against the conductor cf selects, prints its own table, and
// returns its figures (for medians) and its JSON document; both may come with an error.
type measureFunc func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error)

// alternatedRun is one run of an alternation.
type alternatedRun struct {
	Binary  string          `json:"binary"`
	Round   int             `json:"round"`
	Figures []report.Figure `json:"figures"`
	Result  any             `json:"result"`
}

// runMeasured measures once, or alternately against two binaries (alt), and writes the
// JSON result named mode under dir.
func runMeasured(ctx context.Context, mode, dir string, cf *conductorFlags, alt *alternateFlags, measure measureFunc, stdout io.Writer) error {
	bins, err := alt.pair(cf)
	if err != nil {
		return err
	}
	if bins == nil {
		_, doc, err := measure(ctx, cf)
		if doc != nil {
			path, werr := report.WriteJSON(dir, mode, doc)
			if werr != nil {
				return errors.Join(err, werr)
			}
			fmt.Fprintf(stdout, "results: %s\n", path)
		}
		return err
	}
	var runs []alternatedRun
	byBin := [2][][]report.Figure{}
	for r := 0; r < alt.rounds && err == nil; r++ {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0} // A B, B A, ...: drift over the session falls on both alike
		}
		for _, b := range order {
			fmt.Fprintf(stdout, "\n== round %d of %d: %s %s\n", r+1, alt.rounds, "AB"[b:b+1], bins[b])
			c := *cf
			c.bin = bins[b]
			figs, doc, merr := measure(ctx, &c)
			runs = append(runs, alternatedRun{Binary: bins[b], Round: r + 1, Figures: figs, Result: doc})
			if merr != nil {
				err = fmt.Errorf("round %d, %s: %w", r+1, bins[b], merr)
				break
			}
			byBin[b] = append(byBin[b], figs)
		}
	}
	medA, medB := report.Medians(byBin[0]), report.Medians(byBin[1])
	if len(medA) > 0 && len(medA) == len(medB) {
		printMedians(stdout, mode, bins, byBin, medA, medB)
	}
	path, werr := report.WriteJSON(dir, mode, map[string]any{"alternate": bins, "rounds": alt.rounds, "runs": runs,
		"medians": map[string][]report.Figure{"a": medA, "b": medB}})
	if werr != nil {
		return errors.Join(err, werr)
	}
	fmt.Fprintf(stdout, "results: %s\n", path)
	return err
}

func printMedians(w io.Writer, mode string, bins []string, byBin [2][][]report.Figure, medA, medB []report.Figure) {
	t := report.Table{
		Title:  fmt.Sprintf("\n%s: medians of %d alternated runs per binary", mode, len(byBin[0])),
		Header: []string{"figure", "unit", "A", "B", "B/A", "A runs", "B runs"},
	}
	runsOf := func(b int, name string) string {
		var vals []string
		for _, figs := range byBin[b] {
			for _, f := range figs {
				if f.Name == name {
					vals = append(vals, formatFigure(f.Value))
				}
			}
		}
		return strings.Join(vals, " ")
	}
	for i, a := range medA {
		b := medB[i]
		ratio := "-"
		if a.Value != 0 {
			ratio = fmt.Sprintf("%.3f", b.Value/a.Value)
		}
		t.Add(a.Name, a.Unit, formatFigure(a.Value), formatFigure(b.Value), ratio, runsOf(0, a.Name), runsOf(1, a.Name))
	}
	t.Notes = append(t.Notes, "A = "+bins[0], "B = "+bins[1])
	_ = t.Fprint(w)
}

// formatFigure prints a figure with about four significant digits.
func formatFigure(v float64) string {
	switch a := max(v, -v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
