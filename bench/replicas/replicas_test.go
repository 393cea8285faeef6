package replicas

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestScenesRefuseBadConfig: a scene that cannot measure anything says so before it
// starts etcd or a conductor.
func TestScenesRefuseBadConfig(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"one replica", func() error {
			_, err := Race(ctx, RaceConfig{Bin: "x", Replicas: 1, Limit: 1, Runs: 1, Converge: time.Second})
			return err
		}, "2 or more replicas"},
		{"no runs", func() error {
			_, err := Race(ctx, RaceConfig{Bin: "x", Replicas: 2, Limit: 1, Runs: 0, Converge: time.Second})
			return err
		}, "positive limit, runs"},
		{"no binary", func() error {
			_, err := Race(ctx, RaceConfig{Replicas: 2, Limit: 1, Runs: 1, Converge: time.Second})
			return err
		}, "a binary is needed"},
		{"no wait", func() error {
			_, err := EtcdReset(ctx, ResetConfig{Bin: "x", Replicas: 2})
			return err
		}, "positive wait"},
	} {
		if err := c.run(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", c.name, err, c.want)
		}
	}
}

// TestHealed: the reset scene's verdict needs every part of the outcome.
func TestHealed(t *testing.T) {
	ok := ResetResult{Before: []string{"b0"}, After: []string{"a0"}, AfterAcknowledged: 1, Registry: []string{"a0", "b0"},
		Restored: true, Counted: true, Converged: true}
	if !ok.Healed() {
		t.Fatal("a healed scene is not")
	}
	for name, broken := range map[string]func(r *ResetResult){
		"not restored":   func(r *ResetResult) { r.Restored = false },
		"not counted":    func(r *ResetResult) { r.Counted = false },
		"not converged":  func(r *ResetResult) { r.Converged = false },
		"refused after":  func(r *ResetResult) { r.AfterAcknowledged = 0 },
		"registry lacks": func(r *ResetResult) { r.Registry = []string{"a0"} },
		"registry extra": func(r *ResetResult) { r.Registry = []string{"a0", "b0", "x"} },
	} {
		r := ok
		broken(&r)
		if r.Healed() {
			t.Errorf("%s: healed", name)
		}
	}
}
