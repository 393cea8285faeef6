package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/conductor-go/conductor/bench/idle"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// procCost is what a process holds at one instant: open descriptors and OS threads.
type procCost struct{ fds, threads int }

func readCost(pid int) (procCost, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return procCost{}, fmt.Errorf("count descriptors: %w", err)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procCost{}, fmt.Errorf("read threads: %w", err)
	}
	c := procCost{fds: len(ents)}
	for _, line := range bytes.Split(status, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("Threads:")); ok {
			c.threads, _ = strconv.Atoi(string(bytes.TrimSpace(rest)))
		}
	}
	return c, nil
}

// runServices measures what registrations cost the conductor process: descriptors and OS
// threads before, after registering n services over HTTP, and after unregistering them.
func runServices(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cf conductorFlags
	fs := newFlagSet("services", &cf, stderr)
	n := fs.Int("n", 500, "services to register")
	live := fs.Bool("live", false, "register against live publishers (one per service, in this process) instead of loopback ports nobody listens on")
	replay := fs.Bool("replay", false, "with -live, give each publisher a replay endpoint")
	settle := fs.Duration("settle", 2*time.Second, "wait before each sample")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n <= 0 {
		return errors.New("-n must be positive")
	}
	cond, err := cf.startSampled("services", stderr)
	if err != nil {
		return err
	}
	defer cond.Stop()
	cl, err := httpclient.New(cond.Addr, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer cl.Close()
	var endpoints []string
	if !*live {
		dead, err := idle.ReserveDeadEndpoints(*n)
		if err != nil {
			return err
		}
		defer dead.Close()
		endpoints = dead.Endpoints()
	} else {
		endpoints = make([]string, *n)
	}
	regs := idle.Registrations(endpoints, "svc-bench", "svc-")
	if *live {
		for i := range regs {
			cfg := zmqtest.Config{}
			if *replay {
				cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
			}
			p, err := zmqtest.NewPublisher(cfg)
			if err != nil {
				return err
			}
			defer p.Close()
			regs[i].Endpoint, regs[i].ReplayEndpoint = p.Endpoint(), p.ReplayEndpoint()
		}
	}
	sample := func(what string) (procCost, error) {
		if err := target.Sleep(ctx, *settle); err != nil {
			return procCost{}, err
		}
		c, err := readCost(cond.PID)
		if err == nil {
			fmt.Fprintf(stdout, "%-28s fds %6d  threads %5d\n", what, c.fds, c.threads)
		}
		return c, err
	}
	base, err := sample("before")
	if err != nil {
		return err
	}
	t0 := time.Now()
	for i := range regs {
		if _, err := cl.Register(&regs[i]); err != nil {
			return fmt.Errorf("register %d: %w", i, err)
		}
	}
	regTime := time.Since(t0)
	cpu0, err := target.ReadProc(cond.PID)
	if err != nil {
		return err
	}
	w0 := time.Now()
	reg, err := sample(fmt.Sprintf("%d registered", *n))
	if err != nil {
		return err
	}
	cpu1, err := target.ReadProc(cond.PID)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "idle CPU with %d services registered: %.1f%% of one core\n", *n,
		100*float64(cpu1.CPU-cpu0.CPU)/float64(time.Since(w0)))
	t0 = time.Now()
	for i := range regs {
		if _, err := cl.Unregister(&httpclient.UnregisterRequest{InstanceID: regs[i].InstanceID}); err != nil {
			return fmt.Errorf("unregister %d: %w", i, err)
		}
	}
	unregTime := time.Since(t0)
	unreg, err := sample("all unregistered")
	if err != nil {
		return err
	}
	per := func(a, b int) float64 { return float64(b-a) / float64(*n) }
	fmt.Fprintf(stdout, "per service: %.2f fds, %.2f threads; left after unregister: %d fds, %d threads\n",
		per(base.fds, reg.fds), per(base.threads, reg.threads), unreg.fds-base.fds, unreg.threads-base.threads)
	fmt.Fprintf(stdout, "register %v (%v each), unregister %v (%v each)\n", regTime, regTime/time.Duration(*n),
		unregTime, unregTime/time.Duration(*n))
	return nil
}
