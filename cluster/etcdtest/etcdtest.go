// Package etcdtest runs a real etcd server (the etcd binary, Debian package etcd-server,
// installed by `make deps-etcd`) for tests and benchmarks: one member on free 127.0.0.1
// ports in a directory of the caller's, stopped when the test ends (Start) or when the
// caller stops it (Launch).
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Server is one running (or stopped) etcd member. It keeps its data directory and
// ports across Stop and Restart, so a restarted member has the same contents.
type Server struct {
	t       testing.TB // nil for a member started by Launch
	bin     string
	dir     string
	client  int
	peer    int
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
}

// Binary returns the etcd binary's path, or an error telling how to install it.
func Binary() (string, error) {
	if p := os.Getenv("ETCD_BIN"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", fmt.Errorf("etcd binary not found (run `make deps-etcd`, which installs Debian's etcd-server, or set ETCD_BIN): %w", err)
	}
	return p, nil
}

// Start starts an etcd member on free loopback ports; it is stopped at the end of t.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	t.Cleanup(s.Stop)
	return s
}

// Launch starts an etcd member on free loopback ports with its data and log under dir,
// outside a test (a benchmark); the caller stops it with Stop.
func Launch(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, logPath: filepath.Join(dir, "etcd.log")}
	// A free port can be taken by another process between our probe and etcd's bind:
	// then try other ports.
	for attempt := 0; ; attempt++ {
		if s.client, err = freePort(); err != nil {
			return nil, err
		}
		if s.peer, err = freePort(); err != nil {
			return nil, err
		}
		err := s.start()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 4 {
			return nil, err
		}
		_ = os.RemoveAll(filepath.Join(s.dir, "data"))
	}
}

var errPortTaken = errors.New("etcdtest: port taken")

// Endpoint is the client URL.
func (s *Server) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.client) }

// Endpoints is the client URL list for clientv3.Config.
func (s *Server) Endpoints() []string { return []string{s.Endpoint()} }

func (s *Server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	peerURL := "http://127.0.0.1:" + strconv.Itoa(s.peer)
	cmd := exec.Command(s.bin,
		"--name", "etcdtest",
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.Endpoint(),
		"--advertise-client-urls", s.Endpoint(),
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcdtest="+peerURL,
		"--logger", "zap", "--log-outputs", "stderr",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start etcd: %w", err)
	}
	s.cmd = cmd
	s.done = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(s.done)
	}()
	if err := s.waitReady(20 * time.Second); err != nil {
		s.Stop()
		log, _ := os.ReadFile(s.logPath)
		if bytes.Contains(log, []byte("address already in use")) {
			return fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return fmt.Errorf("etcd not ready: %v\n%s", err, tail(log, 4000))
	}
	return nil
}

// waitReady polls the member until a linearizable read succeeds.
func (s *Server) waitReady(limit time.Duration) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(ctx, "etcdtest-ready")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("etcd exited: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the member (SIGKILL: nothing it had not acknowledged survives) and waits for
// it to exit. It is idempotent.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts a stopped member again with the same data and ports; a failure fails
// the test.
func (s *Server) Restart() {
	s.t.Helper()
	s.must(s.Relaunch())
}

// must fails the test on err.
func (s *Server) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

// stopped refuses a restart of a running member.
func (s *Server) stopped() error {
	if s.cmd != nil {
		return errors.New("etcdtest: restart of a running member")
	}
	return nil
}

// Relaunch is Restart returning its error (for a member started by Launch).
func (s *Server) Relaunch() error {
	if err := s.stopped(); err != nil {
		return err
	}
	// Same ports (clients know them): wait while something else holds one.
	for attempt := 0; ; attempt++ {
		err := s.start()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 50 {
			return err
		}
		time.Sleep(100 * time.Millisecond) // paces the retries of the bind
	}
}

// RestartEmpty starts a stopped member again on the same ports with an empty data
// directory, as an operator who restores etcd from nothing would: same name and peer
// URL, hence the same cluster id, and revisions counting from 1 again.
func (s *Server) RestartEmpty() {
	s.t.Helper()
	s.must(s.RelaunchEmpty())
}

// RelaunchEmpty is RestartEmpty returning its error (for a member started by Launch).
func (s *Server) RelaunchEmpty() error {
	if err := s.stopped(); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(s.dir, "data")); err != nil {
		return fmt.Errorf("etcdtest: empty the data directory: %w", err)
	}
	return s.Relaunch()
}

// Client returns a client of the member, closed at the end of the test.
func (s *Server) Client() *clientv3.Client {
	s.t.Helper()
	cli, err := s.NewClient()
	s.must(err)
	s.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewClient returns a client of the member; the caller closes it.
func (s *Server) NewClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client: %w", err)
	}
	return cli, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("etcdtest: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
