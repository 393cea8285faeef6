package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/conductor-go/conductor/bench/idle"
	"github.com/conductor-go/conductor/bench/report"
)

// runIdle measures a conductor with nothing to do (bench/idle), or alternately two
// binaries.
func runIdle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("idle", stderr)
	fs := cmd.fs
	dead := fs.Int("dead-endpoints", 0, "register this many services on loopback ports nobody listens on before waiting")
	wait := fs.Duration("wait", 5*time.Second, "time between the first RSS sample (ready, services registered) and the second")
	window := fs.Duration("window", 10*time.Second, "time over which idle CPU is measured, after the wait")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dead < 0 || *wait < 0 || *window <= 0 {
		return fmt.Errorf("--dead-endpoints %d, --wait %v, --window %v: none negative, the window positive", *dead, *wait, *window)
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		cond, err := cf.startSampled("idle", stderr)
		if err != nil {
			return nil, nil, err
		}
		defer cond.Stop()
		res, err := idle.Run(ctx, idle.Config{Addr: cond.Addr, PID: cond.PID, DeadEndpoints: *dead, Wait: *wait, Window: *window, Progress: stderr})
		if err != nil {
			return nil, nil, err
		}
		t := report.Table{
			Title:  fmt.Sprintf("\nIdle %s conductor, %d services on dead endpoints", cond.Mode, res.DeadEndpoints),
			Header: []string{"figure", "value"}, LeftAlign: true,
		}
		what := processWhat(cond)
		t.Add("RSS when ready", fmt.Sprintf("%.1f MiB (%s, /readyz answered 200)", mib(res.RSSReadyBytes), what))
		if res.DeadEndpoints > 0 {
			t.Add("RSS registered", fmt.Sprintf("%.1f MiB (%d services registered in %.2f s)", mib(res.RSSRegisteredBytes), res.DeadEndpoints, res.RegisterSeconds))
		}
		t.Add("RSS after the wait", fmt.Sprintf("%.1f MiB (%.1f s later)", mib(res.RSSBytes), res.WaitSeconds))
		t.Add("idle CPU", fmt.Sprintf("%.2f%% of a core (%.3f s over %.1f s)", res.CPUPercent, res.CPUSeconds, res.WindowSeconds))
		_ = t.Fprint(stdout)
		figs := []report.Figure{
			{Name: "RSS when ready", Unit: "MiB", Value: mib(res.RSSReadyBytes)},
			{Name: "RSS after the wait", Unit: "MiB", Value: mib(res.RSSBytes)},
			{Name: "idle CPU", Unit: "% of a core", Value: res.CPUPercent},
		}
		return figs, map[string]any{"conductor_mode": string(cond.Mode), "binary": cf.bin, "config": cf.config, "result": res}, nil
	}
	return cmd.run(ctx, measure, stdout)
}
