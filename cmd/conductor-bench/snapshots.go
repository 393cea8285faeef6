package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/snapshots"
	"github.com/conductor-go/conductor/bench/target"
)

// snapshotToken is the admin_token the snapshot commands give a spawned conductor (its
// snapshot routes need one) unless --config-set sets another.
const snapshotToken = "conductor-bench"

// startWithToken starts the conductor cf selects and returns the admin token it holds:
// the one set with --config-set, else (spawned) snapshotToken, which it sets, else
// (external) flagToken, else (in process, which has none) "".
func startWithToken(cf *conductorFlags, flagToken string, stderr io.Writer) (*target.Conductor, string, error) {
	token := ""
	switch {
	case cf.bin != "":
		if t, ok := cf.config["admin_token"].(string); ok {
			token = t
			break
		}
		if cf.config == nil {
			cf.config = configSet{}
		}
		cf.config["admin_token"] = snapshotToken
		token = snapshotToken
	case cf.url != "":
		token = flagToken
	}
	cond, err := cf.start(stderr)
	return cond, token, err
}

// runSnapshotUpload measures a conductor's RSS while it receives K large snapshot POSTs
// (bench/snapshots.Upload).
func runSnapshotUpload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("snapshot-upload", stderr)
	fs := cmd.fs
	token := fs.String("token", "", "admin_token of the --conductor (a spawned one gets "+snapshotToken+", or --config-set admin_token=...)")
	size := fs.Int64("bytes", 1<<30, "size of the posted snapshot")
	posts := fs.Int("posts", 3, "POSTs of it, one after the other")
	unsigned := fs.Bool("unsigned", false, "sign it with a random key (refused once read) instead of the token's (valid, but for an instance nobody registers)")
	settle := fs.Duration("settle", 60*time.Second, "wait after the last POST before the settled RSS")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cmd.cf.bin == "" && cmd.alt.bins == "" && (cmd.cf.url == "" || cmd.cf.pid <= 0) {
		return errors.New("snapshot-upload measures the conductor's own RSS: --conductor-bin, or --conductor with --pid")
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		cond, tok, err := startWithToken(cf, *token, stderr)
		if err != nil {
			return nil, nil, err
		}
		defer cond.Stop()
		res, err := snapshots.Upload(ctx, snapshots.UploadConfig{Addr: cond.Addr, PID: cond.PID, Token: tok, Bytes: *size,
			Posts: *posts, Unsigned: *unsigned, Settle: *settle, Progress: stderr})
		if res == nil {
			return nil, nil, err
		}
		what := map[bool]string{true: "signed, for an instance nobody registers", false: "unsigned"}[res.Signed]
		t := report.Table{
			Title:  fmt.Sprintf("\nSnapshot upload (%s conductor): %d POSTs of a %.1f MiB snapshot (%s)", cond.Mode, len(res.Posts), mib(uint64(res.SnapshotBytes)), what),
			Header: []string{"figure", "value"}, LeftAlign: true,
		}
		for i, p := range res.Posts {
			answer := p.Answer
			if p.Error != "" {
				answer = strings.TrimSpace(answer + " " + p.Error)
			}
			t.Add(fmt.Sprintf("POST %d", i+1), fmt.Sprintf("%d %s (%.1f s; RSS after %.1f MiB)", p.Status, clip(answer, 100), p.Seconds, mib(p.RSSAfterBytes)))
		}
		t.Add("RSS before", fmt.Sprintf("%.1f MiB", mib(res.RSSStartBytes)))
		t.Add("RSS peak during the POSTs", fmt.Sprintf("%.1f MiB", mib(res.RSSPeakBytes)))
		t.Add("RSS after the last POST", fmt.Sprintf("%.1f MiB", mib(res.RSSAfterBytes)))
		t.Add("RSS settled", fmt.Sprintf("%.1f MiB, %.1f s later", mib(res.RSSSettledBytes), res.SettleSeconds))
		_ = t.Fprint(stdout)
		figs := []report.Figure{
			{Name: "RSS before", Unit: "MiB", Value: mib(res.RSSStartBytes)},
			{Name: "RSS peak", Unit: "MiB", Value: mib(res.RSSPeakBytes)},
			{Name: "RSS settled", Unit: "MiB", Value: mib(res.RSSSettledBytes)},
		}
		return figs, map[string]any{"conductor_mode": string(cond.Mode), "binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// runSnapshotDownloads starts K snapshot downloads at once while an engine keeps
// changing the index, and checks each (bench/snapshots.Downloads). It fails when a
// download ended cleanly but does not verify.
func runSnapshotDownloads(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("snapshot-downloads", stderr)
	fs := cmd.fs
	token := fs.String("token", "", "admin_token of the --conductor (a spawned one gets "+snapshotToken+", or --config-set admin_token=...)")
	gets := fs.Int("gets", 16, "downloads started at once")
	blocks := fs.Int("blocks", 60000, "blocks the engine holds (its device cache) while it churns")
	interval := fs.Duration("churn-interval", 5*time.Millisecond, "pause between the engine's prompts of 64 blocks, each evicting as many (0: flat out)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		cond, tok, err := startWithToken(cf, *token, stderr)
		if err != nil {
			return nil, nil, err
		}
		defer cond.Stop()
		res, err := snapshots.Downloads(ctx, snapshots.DownloadsConfig{Addr: cond.Addr, Token: tok, Gets: *gets, Blocks: *blocks,
			ChurnInterval: *interval, Progress: stderr})
		if res == nil {
			return nil, nil, err
		}
		t := report.Table{
			Title: fmt.Sprintf("\nSnapshot downloads (%s conductor): %d at once from an index of %d blocks, %d blocks changed meanwhile (%.1f s)",
				cond.Mode, res.Gets, res.IndexedBlocks, res.ChurnedBlocks, res.Seconds),
			Header: []string{"GET", "outcome", "status", "bytes", "entries", "s", "detail"},
		}
		for i, r := range res.Results {
			t.Add(i+1, r.Outcome, r.Status, r.Bytes, r.Entries, fmt.Sprintf("%.2f", r.Seconds), clip(r.Detail, 60))
		}
		t.Notes = append(t.Notes, "outcomes: "+strings.Join(res.SortedOutcomes(), ", "))
		_ = t.Fprint(stdout)
		figs := []report.Figure{
			{Name: "complete and verified", Unit: "GETs", Value: float64(res.Outcomes[snapshots.OutcomeVerified])},
			{Name: "refused", Unit: "GETs", Value: float64(res.Outcomes[snapshots.OutcomeRefused])},
			{Name: "aborted (visible)", Unit: "GETs", Value: float64(res.Outcomes[snapshots.OutcomeAborted])},
			{Name: "complete, not verifying", Unit: "GETs", Value: float64(res.Silent())},
		}
		if err == nil && res.Silent() > 0 {
			err = fmt.Errorf("%d of %d downloads ended cleanly with a snapshot that does not verify", res.Silent(), res.Gets)
		}
		return figs, map[string]any{"conductor_mode": string(cond.Mode), "binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// clip shortens s to n bytes for a table cell.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
