// Package target starts or attaches to the conductor a benchmark measures: an external
// process given by URL (and optionally its pid), a binary the harness spawns on free
// ports, or a conductor running inside the harness process.
package target

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/server"
)

// Mode says how the conductor runs relative to the harness.
type Mode string

// Modes.
const (
	ModeExternal  Mode = "external"
	ModeSpawned   Mode = "spawned"
	ModeInProcess Mode = "in-process"
)

// Conductor is a conductor under test.
type Conductor struct {
	// Addr is host:port of its HTTP API.
	Addr string
	Mode Mode
	// PID is the process to sample for RSS and CPU (0 = unknown). For ModeInProcess it
	// is the harness itself, so samples include the simulator.
	PID  int
	stop func()
}

// errNoPID is returned where a figure needs the conductor's process.
var errNoPID = errors.New("conductor pid unknown (pass --pid)")

// Sample reads the conductor process's RSS and CPU time.
func (c *Conductor) Sample() (Sample, error) {
	if c.PID <= 0 {
		return Sample{}, errNoPID
	}
	return ReadProc(c.PID)
}

// Stop stops a spawned or in-process conductor; an external one is left running.
func (c *Conductor) Stop() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
}

// External attaches to a running conductor at url (any address httpclient.New accepts);
// pid may be 0.
func External(url string, pid int) (*Conductor, error) {
	cl, err := httpclient.New(url, httpclient.Options{})
	if err != nil {
		return nil, fmt.Errorf("conductor address: %w", err)
	}
	return &Conductor{Addr: cl.Host(), Mode: ModeExternal, PID: pid}, nil
}

// InProcess starts a conductor inside this process on a free 127.0.0.1 port with RPC
// disabled.
func InProcess(log *slog.Logger) (*Conductor, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	app, err := server.Start(server.AppConfig{
		HTTPPort:    0,
		RPCPort:     -1,
		BindAddress: "127.0.0.1",
		Logger:      log,
	})
	if err != nil {
		return nil, fmt.Errorf("start in-process conductor: %w", err)
	}
	return &Conductor{Addr: app.HTTPAddr, Mode: ModeInProcess, PID: os.Getpid(), stop: app.Stop}, nil
}

// StartInProcess starts an in-process conductor (InProcess, its log discarded) for a
// test or benchmark, which it fails if the conductor does not start; the conductor
// stops when tb ends.
func StartInProcess(tb testing.TB) *Conductor {
	tb.Helper()
	c, err := InProcess(nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// FreePort asks the kernel for a TCP port on 127.0.0.1 that was unused a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Spawn runs the conductor binary at bin with a temporary configuration (free HTTP port,
// RPC off, no state file) and waits until it answers: SpawnWith without overrides.
func Spawn(bin string, logw io.Writer) (*Conductor, error) {
	return SpawnWith(bin, logw, SpawnOptions{})
}

// SpawnOptions adjust a spawned conductor.
type SpawnOptions struct {
	// Config sets configuration keys on top of the harness's own (a JSON value per key,
	// as the configuration file holds it). The keys the harness decides (spawnOwnedKeys)
	// cannot be set.
	Config map[string]any
}

// spawnOwnedKeys are the configuration keys Spawn sets itself: the ports it picked and
// the state it must not leave behind.
var spawnOwnedKeys = []string{"http_server_port", "rpc_server_port", "state_file", "kvevent_instance"}

// ParseConfigSet turns "key=value" into a configuration key and its JSON value: value is
// read as JSON when it is JSON (false, 100, "x", {...}) and as a string otherwise.
func ParseConfigSet(kv string) (string, any, error) {
	key, val, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return "", nil, fmt.Errorf("config override %q: want key=value", kv)
	}
	var v any
	if err := json.Unmarshal([]byte(val), &v); err != nil {
		v = val
	}
	return key, v, nil
}

// SpawnWith runs the conductor binary at bin with a temporary configuration (free HTTP
// port, RPC off, no state file, then opts.Config) and waits until it answers. Its stderr
// goes to logw. It gets SIGTERM if the harness dies without stopping it (startTied). The
// configuration's directory is removed as soon as the conductor answers (it reads its
// configuration once, at start), so a harness killed later leaves nothing behind.
func SpawnWith(bin string, logw io.Writer, opts SpawnOptions) (*Conductor, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	conf := map[string]any{
		"http_server_port": port, "rpc_server_port": 0, "state_file": "", "kvevent_instance": map[string]any{},
	}
	for k, v := range opts.Config {
		if slices.Contains(spawnOwnedKeys, k) {
			return nil, fmt.Errorf("spawn: configuration key %q is set by the harness", k)
		}
		conf[k] = v
	}
	cfg, err := json.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("spawn: encode config: %w", err)
	}
	dir, err := os.MkdirTemp("", "conductor-bench-")
	if err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	path := filepath.Join(dir, "conductor.json")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("spawn: write config: %w", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "CONDUCTOR_CONFIG_PATH="+path, "CONDUCTOR_LOG_LEVEL=warn")
	cmd.Stdout, cmd.Stderr = logw, logw
	exited, err := startTied(cmd, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("spawn %s: %w", bin, err)
	}
	stop := func() {
		terminate(cmd, exited)
		os.RemoveAll(dir)
	}
	c := &Conductor{Addr: "127.0.0.1:" + strconv.Itoa(port), Mode: ModeSpawned, PID: cmd.Process.Pid, stop: stop}
	cl, err := httpclient.New(c.Addr, httpclient.Options{Timeout: time.Second})
	if err != nil {
		stop()
		return nil, fmt.Errorf("spawn %s: %w", bin, err)
	}
	defer cl.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := cl.GlobalView()
		var he *httpclient.Error
		if err == nil || errors.As(err, &he) {
			// It answered, so it has read its configuration.
			if err := os.RemoveAll(dir); err != nil {
				stop()
				return nil, fmt.Errorf("spawn %s: remove its configuration: %w", bin, err)
			}
			return c, nil
		}
		select {
		case werr := <-exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("spawn %s: exited before answering: %v", bin, werr)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("spawn %s: no answer on %s: %w", bin, c.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Sleep waits d, or until ctx ends first, then returning ctx's error: the pause of a
// measurement that a signal must be able to cut short.
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
