package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/rpcclient"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// startLimitedFDs runs the binary under prlimit with at most nofile descriptors (soft
// and hard, so the Go runtime cannot raise it).
func startLimitedFDs(t *testing.T, nofile int, config string) *conductor {
	t.Helper()
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	saved := binPath
	defer func() { binPath = saved }()
	wrapper := t.TempDir() + "/limited.sh"
	script := fmt.Sprintf("#!/bin/sh\nexec %s --nofile=%d:%d -- %s\n", prlimit, nofile, nofile, saved)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	binPath = wrapper
	return startConductor(t, config)
}

// TestListenersSurviveEMFILE: with the descriptor limit reached by idle connections,
// accept fails with "too many open files". Both listeners must back off and keep going:
// once the idle connections leave, HTTP and RPC serve again, and SIGTERM exits 0.
// (Before the fix the HTTP server and the RPC listener stopped for good.)
func TestListenersSurviveEMFILE(t *testing.T) {
	httpPort, rpcPort := freePort(t), freePort(t)
	dir := t.TempDir()
	cfg := writeJSON(t, dir, map[string]any{"http_server_port": httpPort, "rpc_server_port": rpcPort,
		"http_bind_address": "127.0.0.1", "rpc_bind_address": "127.0.0.1", "state_file": ""})
	c := startLimitedFDs(t, 64, cfg)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	rpcAddr := fmt.Sprintf("127.0.0.1:%d", rpcPort)
	c.waitHTTP(httpAddr)
	c.waitHTTP(rpcAddr) // the RPC listener opens after the HTTP one; waitHTTP only dials
	// 100 idle connections to each listener: more than the process can hold.
	var idle []net.Conn
	defer func() {
		for _, x := range idle {
			x.Close()
		}
	}()
	for i := 0; i < 100; i++ {
		for _, addr := range []string{httpAddr, rpcAddr} {
			x, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				t.Fatalf("dial %d: %v", i, err)
			}
			idle = append(idle, x)
		}
	}
	c.waitFor("EMFILE on both listeners", func() error {
		out := c.out.String()
		if !strings.Contains(out, "listener=http") || !strings.Contains(out, "listener=rpc") || !strings.Contains(out, "too many open files") {
			return errors.New("not logged yet")
		}
		return nil
	})
	for _, x := range idle {
		x.Close()
	}
	idle = nil
	// Serves again: HTTP answers, and an RPC call goes through (each attempt may meet
	// the listener still backing off: retried until it serves).
	client := &http.Client{Timeout: 2 * time.Second}
	c.waitFor("HTTP serving after the descriptors were freed", func() error {
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok\n" {
			return fmt.Errorf("%d %q", resp.StatusCode, body)
		}
		return nil
	})
	c.waitFor("RPC serving after the descriptors were freed", func() error {
		rc, err := rpcclient.Dial(rpcAddr, 2*time.Second)
		if err != nil {
			return err
		}
		defer rc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = rc.ListServices(ctx)
		return err
	})
	// Logged when a listener accepts again; it may reach c.out after the answer.
	c.waitLog("accepting again")
	c.terminate()
}

// TestShutdownBoundedWithHalfSentRequest: clients that sent half a request (HTTP, and
// RPC frames, one of them waiting for the body budget) and keep their connections open
// do not delay exit beyond shutdown_timeout_ms: the process logs that the shutdown timed
// out and closed them, and exits 0 long before any read timeout (an hour here) could
// have freed it.
func TestShutdownBoundedWithHalfSentRequest(t *testing.T) {
	httpPort, rpcPort := freePort(t), freePort(t)
	cfg := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": rpcPort,
		"http_bind_address": "127.0.0.1", "rpc_bind_address": "127.0.0.1", "state_file": "", "shutdown_timeout_ms": 1000,
		"http_read_timeout_ms": 3_600_000, "rpc_read_timeout_ms": 3_600_000, "max_inflight_body_bytes": 8 << 20})
	c := startConductor(t, cfg)
	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	c.waitHTTP(addr)
	half, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := fmt.Fprintf(half, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nContent-Length: 100000\r\n\r\n%s", make([]byte, 9000)); err != nil {
		t.Fatal(err)
	}
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	// Two RPC frames declaring 3 MiB each: the first holds 6 of the 7 MiB a big body may
	// use, the second waits for the budget.
	frame, _ := cororpc.BeginRequest(nil, 1, cororpc.FuncQuery)
	binary.LittleEndian.PutUint32(frame[12:], 3<<20)
	for i := 0; i < 2; i++ {
		r, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", rpcPort))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := r.Write(append(frame, make([]byte, 1000)...)); err != nil {
			t.Fatal(err)
		}
	}
	// Once the server holds the half HTTP body (5 x 100000) and the first frame (2 x 3 MiB)
	// reserved (the second frame then waits for the budget), stop it.
	c.waitFor("the half body and the first RPC frame reserved", func() error {
		if v, _ := metricSum(t, "http://"+addr, "conductor_http_inflight_body_bytes"); v != 6791456 {
			return fmt.Errorf("conductor_http_inflight_body_bytes is %v, not 6791456 yet", v)
		}
		return nil
	})
	// Within exitWait (a minute), where the read timeouts would hold it an hour.
	c.terminate()
	if !strings.Contains(c.out.String(), "http shutdown timed out; open connections closed") {
		t.Errorf("the shutdown did not time out and close the half-sent request's connection:\n%s", c.out.String())
	}
}

// TestBindAddressAndErrorBodiesUTF8: with http_bind_address 127.0.0.1 the server is not
// reachable on another local address; an error echoing invalid UTF-8 decodes strictly.
func TestBindAddressAndErrorBodiesUTF8(t *testing.T) {
	httpPort := freePort(t)
	cfg := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": 0,
		"http_bind_address": "127.0.0.1", "state_file": ""})
	c := startConductor(t, cfg)
	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	c.waitHTTP(addr)
	if x, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.2:%d", httpPort), time.Second); err == nil {
		x.Close()
		t.Errorf("reachable on 127.0.0.2 although bound to 127.0.0.1")
	}
	body := msgp.AppendMapHeader(nil, 1)
	body = msgp.AppendString(body, "bad\xff\xfekey")
	body = msgp.AppendInt(body, 1)
	code, resp := call(t, http.MethodPost, "http://"+addr+"/query", body)
	if code != 400 || resp["reason"] != "unknown_field" {
		t.Fatalf("unknown invalid-UTF-8 key: %d %v", code, resp)
	}
	for k, v := range resp {
		if s, ok := v.(string); ok && !utf8.ValidString(s) {
			t.Errorf("%s is not valid UTF-8: %q", k, s)
		}
	}
	if resp["field"] != `bad\xff\xfekey` {
		t.Errorf("field = %q", resp["field"])
	}
	c.terminate()
}

// TestUnknownConfigKeyRefused: a config with a key the conductor does not know (here the
// old bind_address) exits 1 with a message naming it.
func TestUnknownConfigKeyRefused(t *testing.T) {
	cfg := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": freePort(t), "bind_address": "127.0.0.1"})
	c := startConductor(t, cfg)
	if code := c.waitExit(exitWait); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if out := c.out.String(); !strings.Contains(out, `unknown key(s) "bind_address"`) {
		t.Fatalf("output does not name the key:\n%s", out)
	}
}
