package main

import (
	"strings"
	"testing"
)

// runOK runs the command and fails the test unless it exits 0.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut strings.Builder
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("%s exit %d\nstdout:\n%s\nstderr:\n%s", args[0], code, out.String(), errOut.String())
	}
	return out.String()
}

// TestSnapshotUploadCommand: a spawned conductor answers every POST of a signed but
// useless snapshot (200, nothing applied) and of an unsigned one (403), and the RSS
// figures are read around them.
func TestSnapshotUploadCommand(t *testing.T) {
	bin := conductorBinary(t)
	for _, c := range []struct {
		flags  []string
		status int
		answer string
	}{
		{nil, 200, `"applied":0`},
		{[]string{"--unsigned"}, 403, "not signed"},
	} {
		dir := t.TempDir()
		args := append([]string{"snapshot-upload", "--conductor-bin", bin, "--bytes", "2000000", "--posts", "2", "--settle", "10ms",
			"--results", dir}, c.flags...)
		runOK(t, args...)
		var doc struct {
			Mode   string `json:"conductor_mode"`
			Result struct {
				Bytes int64 `json:"snapshot_bytes"`
				Posts []struct {
					Status int    `json:"status"`
					Answer string `json:"answer"`
				} `json:"posts"`
				Start   uint64 `json:"rss_start_bytes"`
				Peak    uint64 `json:"rss_peak_bytes"`
				Settled uint64 `json:"rss_settled_bytes"`
			} `json:"result"`
		}
		readResult(t, dir, "snapshot-upload", &doc)
		r := &doc.Result
		if doc.Mode != "spawned" || r.Bytes < 2000000 || len(r.Posts) != 2 || r.Start == 0 || r.Peak < r.Start || r.Settled == 0 {
			t.Fatalf("%v: %+v", c.flags, doc)
		}
		for i, p := range r.Posts {
			if p.Status != c.status || !strings.Contains(p.Answer, c.answer) {
				t.Errorf("%v: POST %d answered %d %s, want %d %s", c.flags, i+1, p.Status, p.Answer, c.status, c.answer)
			}
		}
	}
}

// TestSnapshotDownloadsCommand: downloads started at once while the engine churns, two
// at a time allowed: every one is accounted for, none ends cleanly without verifying,
// and the refused ones are 503s.
func TestSnapshotDownloadsCommand(t *testing.T) {
	dir := t.TempDir()
	runOK(t, "snapshot-downloads", "--conductor-bin", conductorBinary(t), "--config-set", "max_snapshot_downloads=2",
		"--gets", "6", "--blocks", "640", "--results", dir)
	var doc struct {
		Result struct {
			Gets     int            `json:"gets"`
			Indexed  uint64         `json:"indexed_blocks"`
			Outcomes map[string]int `json:"outcomes"`
			Results  []struct {
				Outcome string `json:"outcome"`
				Status  int    `json:"status"`
				Entries int64  `json:"entries"`
			} `json:"results"`
		} `json:"result"`
	}
	readResult(t, dir, "snapshot-downloads", &doc)
	r := &doc.Result
	sum := 0
	for _, n := range r.Outcomes {
		sum += n
	}
	if r.Gets != 6 || len(r.Results) != 6 || sum != 6 || r.Indexed != 640 {
		t.Fatalf("%+v", r)
	}
	served := 0
	for _, g := range r.Results {
		switch g.Outcome {
		case "complete, verified":
			served++
			if g.Status != 200 || g.Entries == 0 {
				t.Errorf("verified download %+v", g)
			}
		case "200, body aborted":
			served++
		case "refused":
			if g.Status != 503 {
				t.Errorf("refused download %+v", g)
			}
		default:
			t.Errorf("download %+v", g)
		}
	}
	if served == 0 {
		t.Fatalf("no download was served: %+v", r)
	}
}

// TestReplicasRaceCommand: on the current binary every run acknowledges exactly
// max_services of the registrations sent to two replicas at once, the registry holds
// exactly those, and both replicas list them.
func TestReplicasRaceCommand(t *testing.T) {
	dir := t.TempDir()
	runOK(t, "replicas-race", "--conductor-bin", conductorBinary(t), "--limit", "3", "--runs", "2", "--results", dir)
	var doc struct {
		Result struct {
			Limit int `json:"limit"`
			Runs  []struct {
				Acknowledged  int   `json:"acknowledged"`
				InRegistry    int   `json:"in_registry"`
				Converged     bool  `json:"converged"`
				ReplicaCounts []int `json:"replica_counts"`
			} `json:"runs"`
		} `json:"result"`
	}
	readResult(t, dir, "replicas-race", &doc)
	if doc.Result.Limit != 3 || len(doc.Result.Runs) != 2 {
		t.Fatalf("%+v", doc.Result)
	}
	for i, r := range doc.Result.Runs {
		if r.Acknowledged != 3 || r.InRegistry != 3 || !r.Converged || len(r.ReplicaCounts) != 2 || r.ReplicaCounts[0] != 3 || r.ReplicaCounts[1] != 3 {
			t.Errorf("run %d: %+v", i+1, r)
		}
	}
}

// TestEtcdResetCommand: after etcd comes back empty, every replica counts and logs the
// reset, the registry gets the earlier services back, and every replica ends listing
// the registry with the registrations made after the reset.
func TestEtcdResetCommand(t *testing.T) {
	dir := t.TempDir()
	out := runOK(t, "etcd-reset", "--conductor-bin", conductorBinary(t), "--replicas", "2", "--results", dir)
	var doc struct {
		Result struct {
			Before    []string `json:"before"`
			After     []string `json:"after"`
			Registry  []string `json:"registry"`
			Restored  bool     `json:"restored"`
			Counted   bool     `json:"counted"`
			Converged bool     `json:"converged"`
			Replicas  []struct {
				Resets   float64  `json:"resets"`
				LogLines int      `json:"reset_log_lines"`
				Services []string `json:"services"`
			} `json:"replicas"`
		} `json:"result"`
	}
	readResult(t, dir, "etcd-reset", &doc)
	r := &doc.Result
	if len(r.Before) != 2 || len(r.After) != 2 || len(r.Registry) != 4 || !r.Restored || !r.Counted || !r.Converged || len(r.Replicas) != 2 {
		t.Fatalf("%+v\n%s", r, out)
	}
	for i, rep := range r.Replicas {
		if rep.Resets < 1 || rep.LogLines < 1 || strings.Join(rep.Services, ",") != strings.Join(r.Registry, ",") {
			t.Errorf("replica %d: %+v (registry %v)", i+1, rep, r.Registry)
		}
	}
	if !strings.Contains(out, "healed (registry and replicas hold before + after)  true") {
		t.Errorf("output:\n%s", out)
	}
}

// TestSceneUsageErrors: the scenes that need a process of their own refuse to run
// without one.
func TestSceneUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"snapshot-upload"}, "--conductor-bin"},
		{[]string{"replicas-race"}, "--conductor-bin"},
		{[]string{"etcd-reset", "--conductor", "http://127.0.0.1:1"}, "not --conductor"},
	} {
		var out, errOut strings.Builder
		if code := run(c.args, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, errOut.String())
		}
	}
}
