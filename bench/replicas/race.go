package replicas

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/conductor-go/conductor/bench/idle"
	"github.com/conductor-go/conductor/httpclient"
)

// RaceConfig configures the max_services race.
type RaceConfig struct {
	// Bin is the conductor binary each replica runs.
	Bin string
	// Replicas share one etcd, each with max_services Limit. Every run sends Limit
	// registrations to each replica at once (Replicas x Limit in all, on loopback
	// ports nobody listens on), for Runs runs.
	Replicas, Limit, Runs int
	// Converge bounds the wait for every replica to list what was acknowledged (and,
	// after a run, nothing).
	Converge time.Duration
	// Config adds configuration keys to every replica's.
	Config map[string]any
	// Progress gets a line per phase and per broken run (nil = silent).
	Progress io.Writer
}

// RaceRun is one run of the race.
type RaceRun struct {
	// Acknowledged registrations (200), and the services etcd holds afterwards.
	Acknowledged int `json:"acknowledged"`
	InRegistry   int `json:"in_registry"`
	// Converged: every replica listed exactly the acknowledged services within
	// Converge; ReplicaCounts is what each listed last.
	Converged     bool  `json:"converged"`
	ReplicaCounts []int `json:"replica_counts"`
}

// RaceResult is the race over every run.
type RaceResult struct {
	Replicas int       `json:"replicas"`
	Limit    int       `json:"limit"`
	Runs     []RaceRun `json:"runs"`
	// AckMin, AckMedian and AckMax summarise the acknowledged registrations per run.
	AckMin    int `json:"acknowledged_min"`
	AckMedian int `json:"acknowledged_median"`
	AckMax    int `json:"acknowledged_max"`
	// OverLimit counts the runs that acknowledged more than Limit, RegistryDiffers
	// those whose registry did not hold exactly the acknowledged services, Diverged
	// those in which some replica never listed exactly them.
	OverLimit       int `json:"runs_over_limit"`
	RegistryDiffers int `json:"runs_registry_differs"`
	Diverged        int `json:"runs_replicas_differ"`
}

// Broken counts the runs with any of the three faults.
func (r *RaceResult) Broken() int {
	n := 0
	for _, run := range r.Runs {
		if run.Acknowledged > r.Limit || run.InRegistry != run.Acknowledged || !run.Converged {
			n++
		}
	}
	return n
}

// Race runs the max_services race cfg.Runs times on a fresh replica cluster.
func Race(ctx context.Context, cfg RaceConfig) (*RaceResult, error) {
	if cfg.Replicas < 2 || cfg.Limit < 1 || cfg.Runs < 1 || cfg.Converge <= 0 {
		return nil, fmt.Errorf("replicas race: %d replicas, limit %d, %d runs, converge %v: want 2 or more replicas, positive limit, runs and converge", cfg.Replicas, cfg.Limit, cfg.Runs, cfg.Converge)
	}
	config := map[string]any{"max_services": cfg.Limit}
	for k, v := range cfg.Config {
		config[k] = v
	}
	s, err := startReplicaSet(ctx, cfg.Bin, cfg.Replicas, config, cfg.Progress)
	if err != nil {
		return nil, err
	}
	defer s.close()
	dead, err := idle.ReserveDeadEndpoints(cfg.Replicas * cfg.Limit)
	if err != nil {
		return nil, err
	}
	defer dead.Close()
	res := &RaceResult{Replicas: cfg.Replicas, Limit: cfg.Limit}
	var runErr error
	for run := 0; run < cfg.Runs; run++ {
		r, err := s.raceOnce(ctx, idle.Registrations(dead.Endpoints(), "race", fmt.Sprintf("race%d-", run)), cfg.Converge)
		if err != nil {
			runErr = fmt.Errorf("run %d: %w", run+1, err) // the runs before it are reported
			break
		}
		res.Runs = append(res.Runs, r)
		if r.Acknowledged > cfg.Limit || r.InRegistry != r.Acknowledged || !r.Converged {
			progressf(cfg.Progress, "run %d: %d acknowledged (limit %d), registry holds %d, replicas list %v (converged: %v)",
				run+1, r.Acknowledged, cfg.Limit, r.InRegistry, r.ReplicaCounts, r.Converged)
		}
	}
	acks := make([]int, len(res.Runs))
	for i, r := range res.Runs {
		acks[i] = r.Acknowledged
		if r.Acknowledged > cfg.Limit {
			res.OverLimit++
		}
		if r.InRegistry != r.Acknowledged {
			res.RegistryDiffers++
		}
		if !r.Converged {
			res.Diverged++
		}
	}
	if len(acks) > 0 {
		sort.Ints(acks)
		res.AckMin, res.AckMedian, res.AckMax = acks[0], acks[len(acks)/2], acks[len(acks)-1]
	}
	return res, runErr
}

// raceOnce sends regs to the replicas in turn, all at once, reads the outcome, and
// unregisters everything again.
func (s *replicaSet) raceOnce(ctx context.Context, regs []httpclient.RegisterRequest, converge time.Duration) (RaceRun, error) {
	var run RaceRun
	var mu sync.Mutex
	var acked []string
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range regs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-gate
			if _, err := s.replicas[i%len(s.replicas)].cl.Register(&regs[i]); err == nil {
				mu.Lock()
				acked = append(acked, regs[i].InstanceID)
				mu.Unlock()
			}
		}(i)
	}
	close(gate)
	wg.Wait()
	sort.Strings(acked)
	run.Acknowledged = len(acked)
	reg, err := s.registryIDs(ctx)
	if err != nil {
		return run, err
	}
	run.InRegistry = len(reg)
	var lists [][]string
	run.Converged, err = poll(ctx, converge, func() (bool, error) {
		var same bool
		var err error
		same, lists, err = s.everyReplicaLists(acked)
		return same, err
	})
	if err != nil {
		return run, err
	}
	for _, l := range lists {
		run.ReplicaCounts = append(run.ReplicaCounts, len(l))
	}
	return run, s.unregisterAll(ctx, converge)
}

// unregisterAll unregisters, through the first replica, every service any replica or
// the registry holds, then through each replica what it alone still holds (a replica
// that diverged may keep services the registry no longer has), and waits until none is
// left anywhere.
func (s *replicaSet) unregisterAll(ctx context.Context, limit time.Duration) error {
	empty := func() (bool, error) {
		same, _, err := s.everyReplicaLists(nil)
		if err != nil || !same {
			return false, err
		}
		reg, err := s.registryIDs(ctx)
		return len(reg) == 0, err
	}
	for _, through := range s.replicas {
		ids, err := s.registryIDs(ctx)
		if err != nil {
			return err
		}
		for _, r := range s.replicas {
			have, err := r.serviceIDs()
			if err != nil {
				return err
			}
			ids = append(ids, have...)
		}
		slices.Sort(ids)
		for _, id := range slices.Compact(ids) {
			_, _ = through.cl.Unregister(&httpclient.UnregisterRequest{InstanceID: id})
		}
		ok, err := poll(ctx, limit, empty)
		if ok || err != nil {
			return err
		}
	}
	_, lists, err := s.everyReplicaLists(nil)
	if err != nil {
		return err
	}
	return fmt.Errorf("services left after unregistering everything through every replica: %v", lists)
}
