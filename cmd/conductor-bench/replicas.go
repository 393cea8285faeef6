package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/conductor-go/conductor/bench/replicas"
	"github.com/conductor-go/conductor/bench/report"
)

// parseReplicaScene parses the flags of a replica command and checks that it has a
// binary to spawn.
func (m *measuredCommand) parseReplicaScene(args []string) error {
	if err := m.fs.Parse(args); err != nil {
		return err
	}
	if m.cf.url != "" {
		return errors.New("replica scenes spawn their own conductors: --conductor-bin (or --alternate), not --conductor")
	}
	if m.cf.bin == "" && m.alt.bins == "" {
		return errors.New("replica scenes spawn their own conductors: --conductor-bin BIN (or --alternate A,B)")
	}
	return nil
}

// runReplicasRace races registrations for the last max_services slots across replicas
// on a real etcd, R times (bench/replicas.Race). It fails when a run broke the limit or
// left the registry and the replicas disagreeing.
func runReplicasRace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("replicas-race", stderr)
	fs := cmd.fs
	n := fs.Int("replicas", 2, "replicas on the etcd")
	limit := fs.Int("limit", 20, "max_services of every replica; each run sends this many registrations to each replica at once")
	runs := fs.Int("runs", 100, "runs of the race")
	converge := fs.Duration("converge", 15*time.Second, "wait for every replica to list what was acknowledged")
	if err := cmd.parseReplicaScene(args); err != nil {
		return err
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		res, err := replicas.Race(ctx, replicas.RaceConfig{Bin: cf.bin, Replicas: *n, Limit: *limit, Runs: *runs,
			Converge: *converge, Config: cf.config, Progress: stderr})
		if res == nil || len(res.Runs) == 0 {
			return nil, nil, err
		}
		t := report.Table{
			Title:  fmt.Sprintf("\nmax_services race: %d replicas on one etcd, max_services %d, %d registrations at once per run, %d runs", res.Replicas, res.Limit, res.Replicas*res.Limit, len(res.Runs)),
			Header: []string{"figure", "value"}, LeftAlign: true,
		}
		t.Add("acknowledged per run", fmt.Sprintf("min %d, median %d, max %d (limit %d)", res.AckMin, res.AckMedian, res.AckMax, res.Limit))
		t.Add("runs over the limit", res.OverLimit)
		t.Add("runs whose registry differs from the acknowledged", res.RegistryDiffers)
		t.Add("runs with a replica not listing exactly the acknowledged", fmt.Sprintf("%d (within %v)", res.Diverged, *converge))
		_ = t.Fprint(stdout)
		figs := []report.Figure{
			{Name: "acknowledged per run (median)", Unit: "services", Value: float64(res.AckMedian)},
			{Name: "acknowledged per run (max)", Unit: "services", Value: float64(res.AckMax)},
			{Name: "broken runs", Unit: "runs", Value: float64(res.Broken())},
		}
		if err == nil && res.Broken() > 0 {
			err = fmt.Errorf("%d of %d runs broke max_services or left the registry and the replicas disagreeing", res.Broken(), len(res.Runs))
		}
		return figs, map[string]any{"binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// runEtcdReset restores etcd empty under running replicas and reports what they do
// (bench/replicas.EtcdReset). It fails when the registry and the replicas do not end
// holding everything registered before and after the reset.
func runEtcdReset(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("etcd-reset", stderr)
	fs := cmd.fs
	n := fs.Int("replicas", 3, "replicas on the etcd")
	wait := fs.Duration("wait", 15*time.Second, "bound of each wait: the registry healed after the reset, the replicas agreeing after the new registrations")
	if err := cmd.parseReplicaScene(args); err != nil {
		return err
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		res, err := replicas.EtcdReset(ctx, replicas.ResetConfig{Bin: cf.bin, Replicas: *n, Wait: *wait, Config: cf.config, Progress: stderr})
		if res == nil {
			return nil, nil, err
		}
		t := report.Table{
			Title:  fmt.Sprintf("\netcd restored empty under %d replicas", len(res.Replicas)),
			Header: []string{"figure", "value"}, LeftAlign: true,
		}
		restored := "no, not within the wait"
		if res.Restored {
			restored = fmt.Sprintf("yes, %.1f s after etcd came back", res.RestoredSeconds)
		}
		t.Add("registered before (one per replica)", strings.Join(res.Before, " "))
		t.Add("registry after the reset", fmt.Sprintf("%v; every earlier service back: %s", res.RegistryAfterReset, restored))
		counted := "no, not within the wait"
		if res.Counted {
			counted = fmt.Sprintf("yes, %.1f s after etcd came back", res.CountedSeconds)
		}
		t.Add("every replica counted and logged the reset", counted)
		t.Add("registered after, through the last replica", fmt.Sprintf("%s (%d acknowledged)", strings.Join(res.After, " "), res.AfterAcknowledged))
		t.Add("registry at the end", fmt.Sprint(res.Registry))
		for i, r := range res.Replicas {
			t.Add(fmt.Sprintf("replica %d", i+1), fmt.Sprintf("lists %v; resets %s, republished %s, reset log lines %d, ready %v",
				r.Services, metricValue(r.Resets), metricValue(r.Republished), r.ResetLogLines, r.Ready))
		}
		t.Add("every replica lists the registry", res.Converged)
		t.Add("healed (registry and replicas hold before + after)", res.Healed())
		_ = t.Fprint(stdout)
		healed := 0.0
		if res.Healed() {
			healed = 1
		}
		figs := []report.Figure{{Name: "healed", Unit: "0/1", Value: healed}}
		if err == nil && !res.Healed() {
			err = errors.New("after the reset the registry and the replicas do not all hold what was registered before and after it")
		}
		return figs, map[string]any{"binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// metricValue prints a counter read from /metrics, or "absent" (-1).
func metricValue(v float64) string {
	if v < 0 {
		return "absent"
	}
	return fmt.Sprintf("%.0f", v)
}
