// Package idle measures what a conductor costs while nothing happens: its RSS once ready
// and after a wait, and the CPU it uses over a window, optionally with services
// registered whose ZMQ endpoints nobody listens on (each a subscription that keeps
// reconnecting).
package idle

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
)

// Config configures an idle measurement.
type Config struct {
	// Addr is the conductor's HTTP address and PID its process (required).
	Addr string
	PID  int
	// DeadEndpoints services are registered before the wait, each on its own loopback
	// TCP port that nobody listens on (ReserveDeadEndpoints).
	DeadEndpoints int
	// Wait is the time between the first RSS sample (ready, and the services registered)
	// and the second; Window the time over which CPU is measured after it (0 = 10 s).
	Wait, Window time.Duration
	// Progress gets a line per phase (nil = silent).
	Progress io.Writer
}

// Result is an idle measurement. Sizes are bytes, times seconds.
type Result struct {
	// RSSReadyBytes is the RSS right after /readyz first answered 200.
	RSSReadyBytes uint64 `json:"rss_ready_bytes"`
	// DeadEndpoints services were registered in RegisterSeconds; RSSRegisteredBytes is
	// the RSS right after (0 without them).
	DeadEndpoints      int     `json:"dead_endpoints"`
	RegisterSeconds    float64 `json:"register_seconds,omitempty"`
	RSSRegisteredBytes uint64  `json:"rss_registered_bytes,omitempty"`
	// RSSBytes is the RSS after WaitSeconds more.
	WaitSeconds float64 `json:"wait_seconds"`
	RSSBytes    uint64  `json:"rss_bytes"`
	// CPUSeconds is the CPU time used over WindowSeconds (right after the wait), and
	// CPUPercent that as a percentage of one core.
	WindowSeconds float64 `json:"window_seconds"`
	CPUSeconds    float64 `json:"cpu_seconds"`
	CPUPercent    float64 `json:"cpu_percent_of_core"`
}

// Run waits for the conductor to be ready, registers the dead services, waits and
// measures; the services are unregistered at the end.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.PID <= 0 {
		return nil, fmt.Errorf("idle: the conductor's pid is needed to read its RSS and CPU")
	}
	if cfg.DeadEndpoints < 0 {
		return nil, fmt.Errorf("idle: %d dead endpoints: must not be negative", cfg.DeadEndpoints)
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if err := target.WaitReady(ctx, cfg.Addr, 30*time.Second); err != nil {
		return nil, fmt.Errorf("idle: %w", err)
	}
	s, err := target.ReadProc(cfg.PID)
	if err != nil {
		return nil, err
	}
	res := &Result{RSSReadyBytes: s.RSSBytes, DeadEndpoints: cfg.DeadEndpoints}
	progress(cfg.Progress, "ready: RSS %.1f MiB", mib(s.RSSBytes))
	if cfg.DeadEndpoints > 0 {
		dead, err := ReserveDeadEndpoints(cfg.DeadEndpoints)
		if err != nil {
			return nil, err
		}
		defer dead.Close()
		cl, err := httpclient.New(cfg.Addr, httpclient.Options{Timeout: 30 * time.Second})
		if err != nil {
			return nil, fmt.Errorf("idle: %w", err)
		}
		defer cl.Close()
		regs := Registrations(dead.Endpoints(), "idle", "dead-")
		t0 := time.Now()
		defer func() {
			for i := range regs {
				_, _ = cl.Unregister(&httpclient.UnregisterRequest{InstanceID: regs[i].InstanceID})
			}
		}()
		for i := range regs {
			if _, err := cl.Register(&regs[i]); err != nil {
				return nil, fmt.Errorf("idle: register dead endpoint %d of %d: %w", i+1, len(regs), err)
			}
		}
		res.RegisterSeconds = time.Since(t0).Seconds()
		if s, err = target.ReadProc(cfg.PID); err != nil {
			return nil, err
		}
		res.RSSRegisteredBytes = s.RSSBytes
		progress(cfg.Progress, "registered %d services on dead endpoints in %.1fs: RSS %.1f MiB",
			len(regs), res.RegisterSeconds, mib(s.RSSBytes))
	}
	t0 := time.Now()
	if err := target.Sleep(ctx, cfg.Wait); err != nil {
		return nil, err
	}
	res.WaitSeconds = time.Since(t0).Seconds()
	s0, err := target.ReadProc(cfg.PID)
	if err != nil {
		return nil, err
	}
	res.RSSBytes = s0.RSSBytes
	w0 := time.Now()
	if err := target.Sleep(ctx, cfg.Window); err != nil {
		return nil, err
	}
	s1, err := target.ReadProc(cfg.PID)
	if err != nil {
		return nil, err
	}
	res.WindowSeconds = time.Since(w0).Seconds()
	res.CPUSeconds = (s1.CPU - s0.CPU).Seconds()
	res.CPUPercent = 100 * res.CPUSeconds / res.WindowSeconds
	progress(cfg.Progress, "after %.1fs: RSS %.1f MiB; %.2f%% of a core over %.1fs", res.WaitSeconds, mib(res.RSSBytes),
		res.CPUPercent, res.WindowSeconds)
	return res, nil
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// Registrations returns one vLLM registration per endpoint, all of model with instance
// ids prefix0, prefix1, ... and vLLM's default hash profile.
func Registrations(endpoints []string, model, prefix string) []httpclient.RegisterRequest {
	hash := sim.VLLMHash("sha256", "0")
	regs := make([]httpclient.RegisterRequest, len(endpoints))
	for i, ep := range endpoints {
		regs[i] = httpclient.RegisterRequest{
			Endpoint: ep, Type: "vLLM", ModelName: model, InstanceID: prefix + strconv.Itoa(i), BlockSize: 16,
			HashProfile: httpclient.HashProfile{Strategy: hash.Strategy, Algorithm: hash.Algorithm,
				PythonHashSeed: hash.PythonHashSeed, IndexProjection: hash.IndexProjection},
		}
	}
	return regs
}
