package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// envInt is the positive integer in the environment variable k, or def.
func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestMeasureBigBodyAttack measures, against the spawned binary, process RSS and the
// latency of small /query and /healthz requests while parallel clients push huge valid
// /query bodies. It asserts nothing about speed (figures are printed), and only runs
// when CONDUCTOR_ATTACK_MEASURE=1:
//
//	CONDUCTOR_ATTACK_MEASURE=1 [CONDUCTOR_MEASURE_BIN=path] [ATTACK_BODY_MB=250] \
//	  [ATTACK_CLIENTS=8] [ATTACK_SECONDS=15] go test -run TestMeasureBigBodyAttack -v ./cmd/mooncake_conductor/
//
// CONDUCTOR_MEASURE_BIN selects another binary (e.g. an older build, for the "before").
func TestMeasureBigBodyAttack(t *testing.T) {
	if os.Getenv("CONDUCTOR_ATTACK_MEASURE") != "1" {
		t.Skip("set CONDUCTOR_ATTACK_MEASURE=1 to run the attack measurement")
	}
	bodyMB, clients, seconds := envInt("ATTACK_BODY_MB", 250), envInt("ATTACK_CLIENTS", 8), envInt("ATTACK_SECONDS", 15)
	if bin := os.Getenv("CONDUCTOR_MEASURE_BIN"); bin != "" {
		saved := binPath
		binPath = bin
		defer func() { binPath = saved }()
	}
	httpPort := freePort(t)
	cfg := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": 0, "state_file": ""})
	c := startConductor(t, cfg)
	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	c.waitHTTP(addr)
	pid := c.cmd.Process.Pid

	// A valid query whose token_ids bin makes the body bodyMB MiB.
	n := bodyMB << 20
	big := mp("model", "m", "block_size", 16)
	big[0]++ // three keys
	big = msgp.AppendString(big, "token_ids")
	big = append(big, 0xc6, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(big[len(big)-4:], uint32(n))
	big = append(big, make([]byte, n)...)
	small := mp("model", "m", "block_size", 16, "token_ids", make([]byte, 4*2048))

	rss := func() int64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				f := strings.Fields(line)
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
		return -1
	}
	baseRSS := rss()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var statuses sync.Map // status -> *atomic.Int64
	count := func(k string) {
		v, _ := statuses.LoadOrStore(k, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err != nil {
					count("dial error")
					time.Sleep(50 * time.Millisecond) // paces the redials (a measurement: no verdict)
					continue
				}
				_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
				go func() { <-stop; conn.Close() }()
				fmt.Fprintf(conn, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nContent-Length: %d\r\n\r\n", len(big))
				done := make(chan struct{})
				go func() {
					defer close(done)
					resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
					if err != nil {
						count("no response")
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count(strconv.Itoa(resp.StatusCode))
				}()
				_, _ = io.Copy(conn, bytes.NewReader(big))
				<-done
				conn.Close()
			}
		}()
	}
	// Small queries and health checks, one at a time, measured from here.
	client := &http.Client{Timeout: 30 * time.Second}
	var qlat, hlat []time.Duration
	qerr := 0
	maxRSS := baseRSS
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	for time.Now().Before(end) {
		start := time.Now()
		resp, err := client.Post("http://"+addr+"/query", "application/msgpack", bytes.NewReader(small))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil || resp.StatusCode != 200 {
			qerr++
		} else {
			qlat = append(qlat, time.Since(start))
		}
		start = time.Now()
		if resp, err := client.Get("http://" + addr + "/healthz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			hlat = append(hlat, time.Since(start))
		}
		if r := rss(); r > maxRSS {
			maxRSS = r
		}
		time.Sleep(5 * time.Millisecond) // paces the sampling
	}
	close(stop)
	wg.Wait()
	time.Sleep(5 * time.Second) // the figure is the RSS 5 s after the attack (printed, no verdict)
	after := rss()
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[min(len(d)-1, int(float64(len(d))*p))]
	}
	var st []string
	statuses.Range(func(k, v any) bool { st = append(st, fmt.Sprintf("%v=%d", k, v.(*atomic.Int64).Load())); return true })
	sort.Strings(st)
	t.Logf("attack: %d clients x %d MiB /query bodies for %d s against %s", clients, bodyMB, seconds, binPath)
	t.Logf("attack responses: %s", strings.Join(st, " "))
	t.Logf("RSS: before %d MiB, max during %d MiB, 5 s after %d MiB", baseRSS>>20, maxRSS>>20, after>>20)
	t.Logf("small /query (2048 tokens): %d ok, %d failed; p50 %v p99 %v max %v", len(qlat), qerr, pct(qlat, 0.5), pct(qlat, 0.99), pct(qlat, 1))
	t.Logf("/healthz: %d; p99 %v max %v", len(hlat), pct(hlat, 0.99), pct(hlat, 1))
	c.terminate()
}

// TestMeasureRPCHalfFrames measures process RSS while many RPC clients each declare a
// large frame, send part of it and stall (then leave). Opt-in like the test above:
//
//	CONDUCTOR_ATTACK_MEASURE=1 [CONDUCTOR_MEASURE_BIN=path] [ATTACK_CLIENTS=500] \
//	  go test -run TestMeasureRPCHalfFrames -v ./cmd/mooncake_conductor/
func TestMeasureRPCHalfFrames(t *testing.T) {
	if os.Getenv("CONDUCTOR_ATTACK_MEASURE") != "1" {
		t.Skip("set CONDUCTOR_ATTACK_MEASURE=1 to run the attack measurement")
	}
	clients := 500
	if v, err := strconv.Atoi(os.Getenv("ATTACK_CLIENTS")); err == nil && v > 0 {
		clients = v
	}
	if bin := os.Getenv("CONDUCTOR_MEASURE_BIN"); bin != "" {
		saved := binPath
		binPath = bin
		defer func() { binPath = saved }()
	}
	rpcPort := freePort(t)
	httpPort := freePort(t)
	cfg := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": rpcPort, "state_file": ""})
	c := startConductor(t, cfg)
	c.waitHTTP(fmt.Sprintf("127.0.0.1:%d", rpcPort))
	pid := c.cmd.Process.Pid
	rss := func() int64 {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				return kb << 10
			}
		}
		return -1
	}
	base := rss()
	// A Query frame header declaring an 8 MiB body; then 1 MiB of that body.
	hdr, _ := cororpc.BeginRequest(nil, 1, cororpc.FuncQuery)
	binary.LittleEndian.PutUint32(hdr[12:], 8<<20)
	part := append(hdr, make([]byte, 1<<20)...)
	var conns []net.Conn
	for i := 0; i < clients; i++ {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", rpcPort), 2*time.Second)
		if err != nil {
			t.Logf("dial %d: %v", i, err)
			break
		}
		conns = append(conns, conn)
		_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = conn.Write(part) // may block once the server stops reading: that is the point
	}
	time.Sleep(3 * time.Second) // the figure is the RSS 3 s into the stall (printed, no verdict)
	during := rss()
	for _, conn := range conns {
		conn.Close()
	}
	time.Sleep(5 * time.Second) // and 5 s after the clients left
	after := rss()
	t.Logf("RPC half frames: %d clients x (8 MiB declared, 1 MiB sent) against %s", len(conns), binPath)
	t.Logf("RSS: before %d MiB, with the clients stalled %d MiB, 5 s after they left %d MiB", base>>20, during>>20, after>>20)
	c.terminate()
}
