package replicas

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/conductor-go/conductor/bench/idle"
	"github.com/conductor-go/conductor/bench/target"
)

// ResetConfig configures the etcd-reset scene.
type ResetConfig struct {
	// Bin is the conductor binary each of Replicas runs (at least 2).
	Bin      string
	Replicas int
	// Wait bounds each wait of the scene: for the replicas to agree before the reset,
	// to heal the registry after it, and to agree on the registrations that follow.
	Wait time.Duration
	// Config adds configuration keys to every replica's.
	Config map[string]any
	// Progress gets a line per phase (nil = silent).
	Progress io.Writer
}

// ReplicaAfterReset is what one replica shows once the scene is over.
type ReplicaAfterReset struct {
	// Resets and Republished are conductor_registry_resets_total and
	// conductor_registry_republished_total (-1 when the binary has no such metric).
	Resets      float64 `json:"resets"`
	Republished float64 `json:"republished"`
	// ResetLogLines counts its log lines about the reset.
	ResetLogLines int `json:"reset_log_lines"`
	// Services is what it lists at the end; Ready whether /readyz answered 200.
	Services []string `json:"services"`
	Ready    bool     `json:"ready"`
}

// ResetResult is the etcd-reset scene.
type ResetResult struct {
	// Before are the services registered before the reset (one through each replica).
	Before []string `json:"before"`
	// RegistryAfterReset is what etcd held once the replicas had Wait to heal it (or
	// as soon as it held every service of Before again).
	RegistryAfterReset []string `json:"registry_after_reset"`
	// Restored: etcd held every service of Before again.
	Restored        bool    `json:"restored"`
	RestoredSeconds float64 `json:"restored_seconds,omitempty"`
	// Counted: every replica counted the reset (conductor_registry_resets_total) and
	// logged it, within Wait of etcd coming back.
	Counted        bool    `json:"counted"`
	CountedSeconds float64 `json:"counted_seconds,omitempty"`
	// After are the services registered after the reset, through the last replica;
	// AfterAcknowledged how many of them were acknowledged.
	After             []string `json:"after"`
	AfterAcknowledged int      `json:"after_acknowledged"`
	// Registry is what etcd holds at the end; Converged: every replica lists exactly
	// that within Wait of the last registration.
	Registry  []string            `json:"registry"`
	Converged bool                `json:"converged"`
	Replicas  []ReplicaAfterReset `json:"replicas"`
}

// Healed reports the outcome an operator needs: every replica noticed the reset, the
// registry holds what was registered before the reset and after it, and every replica
// serves exactly that.
func (r *ResetResult) Healed() bool {
	want := slices.Concat(r.Before, r.After)
	slices.Sort(want)
	return r.Restored && r.Counted && r.Converged && r.AfterAcknowledged == len(r.After) && slices.Equal(r.Registry, want)
}

// resetLog is the text of the replicas' log line about a registry reset.
const resetLog = "registry was reset"

// EtcdReset runs the scene: replicas agree on a few services; etcd is killed and started
// again on the same ports with an empty data directory; the scene waits for the
// registry to hold those services again, registers more through the last replica, and
// reads what etcd and each replica hold.
func EtcdReset(ctx context.Context, cfg ResetConfig) (*ResetResult, error) {
	if cfg.Replicas < 2 || cfg.Wait <= 0 {
		return nil, fmt.Errorf("etcd reset: %d replicas, wait %v: want 2 or more replicas and a positive wait", cfg.Replicas, cfg.Wait)
	}
	s, err := startReplicaSet(ctx, cfg.Bin, cfg.Replicas, cfg.Config, cfg.Progress)
	if err != nil {
		return nil, err
	}
	defer s.close()
	dead, err := idle.ReserveDeadEndpoints(2 * cfg.Replicas)
	if err != nil {
		return nil, err
	}
	defer dead.Close()
	before := idle.Registrations(dead.Endpoints()[:cfg.Replicas], "reset", "before-")
	after := idle.Registrations(dead.Endpoints()[cfg.Replicas:], "reset", "after-")
	res := &ResetResult{}
	for i := range before {
		if _, err := s.replicas[i].cl.Register(&before[i]); err != nil {
			return nil, fmt.Errorf("register %s through %s: %w", before[i].InstanceID, s.replicas[i].name, err)
		}
		res.Before = append(res.Before, before[i].InstanceID)
	}
	slices.Sort(res.Before)
	agreed, err := poll(ctx, cfg.Wait, func() (bool, error) {
		same, _, err := s.everyReplicaLists(res.Before)
		return same, err
	})
	if err != nil || !agreed {
		return nil, fmt.Errorf("the replicas do not list %v before the reset (%v)", res.Before, err)
	}

	progressf(cfg.Progress, "etcd killed; started again on the same ports with an empty data directory")
	s.etcd.Stop()
	if err := s.etcd.RelaunchEmpty(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	res.Restored, err = poll(ctx, cfg.Wait, func() (bool, error) {
		reg, err := s.registryIDs(ctx)
		res.RegistryAfterReset = reg
		return err == nil && slices.Equal(reg, res.Before), nil
	})
	if err != nil {
		return nil, err
	}
	if res.Restored {
		res.RestoredSeconds = time.Since(t0).Seconds()
	}
	// Each replica finds the reset on its own (a watch response, or its periodic check
	// of the cluster key): wait until each has counted and logged it.
	res.Counted, err = poll(ctx, cfg.Wait, func() (bool, error) {
		for _, r := range s.replicas {
			ar, err := r.afterReset(ctx)
			if err != nil || ar.Resets < 1 || ar.ResetLogLines < 1 {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if res.Counted {
		res.CountedSeconds = time.Since(t0).Seconds()
	}
	progressf(cfg.Progress, "registry after the reset: %v (every earlier service back: %v); every replica counted the reset: %v",
		res.RegistryAfterReset, res.Restored, res.Counted)

	last := s.replicas[len(s.replicas)-1]
	for i := range after {
		res.After = append(res.After, after[i].InstanceID)
		if _, err := last.cl.Register(&after[i]); err == nil {
			res.AfterAcknowledged++
		} else {
			progressf(cfg.Progress, "register %s through %s after the reset: %v", after[i].InstanceID, last.name, err)
		}
	}
	res.Converged, err = poll(ctx, cfg.Wait, func() (bool, error) {
		reg, err := s.registryIDs(ctx)
		if err != nil {
			return false, nil // etcd may still be electing: ask again
		}
		res.Registry = reg
		same, _, err := s.everyReplicaLists(reg)
		return same, err
	})
	if err != nil {
		return nil, err
	}
	for _, r := range s.replicas {
		ar, err := r.afterReset(ctx)
		if err != nil {
			return nil, err
		}
		if ar.Services, err = r.serviceIDs(); err != nil {
			return nil, err
		}
		ar.Ready = target.Ready(ctx, r.c.Addr)
		res.Replicas = append(res.Replicas, ar)
	}
	return res, nil
}

// afterReset reads r's reset counters and counts its log lines about the reset.
func (r *replica) afterReset(ctx context.Context) (ReplicaAfterReset, error) {
	m, err := target.ReadMetrics(ctx, r.c.Addr)
	if err != nil {
		return ReplicaAfterReset{}, fmt.Errorf("%s: %w", r.name, err)
	}
	ar := ReplicaAfterReset{Resets: -1, Republished: -1, ResetLogLines: linesWith(r.log, resetLog)}
	if v, ok := m.Sum("conductor_registry_resets_total"); ok {
		ar.Resets = v
	}
	if v, ok := m.Sum("conductor_registry_republished_total"); ok {
		ar.Republished = v
	}
	return ar, nil
}
