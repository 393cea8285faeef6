// Command rpc-latency measures one client's Query round trip over the coro_rpc channel and
// over HTTP, on the same index: full-hit prompts held by several vLLM instances.
//
//	go run ./cmd/rpc-latency -n 2000 -python .venv/bin/python
//
// By default it starts an in-process conductor on loopback; -rpc and -http point it at a
// running one instead (its index must not already hold the model). Instances are fed by
// real ZMQ publishers with the hashes the engine would publish, and the tool checks that
// every instance reports a full hit before measuring. It prints p50/p99/mean per prompt
// and protocol: Go rpcclient, Go HTTP (fasthttp, the body read but not decoded), and, with
// -python, the pure-Python mooncake.conductor client run as a subprocess.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/rpcclient"
	"github.com/conductor-go/conductor/server"
	"github.com/conductor-go/conductor/wire/cororpc"
	"github.com/conductor-go/conductor/wire/publisher"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rpc-latency:", err)
		os.Exit(1)
	}
}

// Config is one measurement run.
type Config struct {
	// RPCAddr and HTTPAddr name a running conductor; both empty starts one in-process.
	RPCAddr, HTTPAddr string
	Instances         int
	BlockSize         int
	Prompts           []int // prompt lengths in tokens, each a multiple of BlockSize
	N, Warmup         int   // measured and discarded queries per prompt and protocol
	Python            string
	Model             string
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rpc-latency", flag.ContinueOnError)
	cfg := Config{}
	var prompts string
	fs.StringVar(&cfg.RPCAddr, "rpc", "", "RPC address of a running conductor (default: start one in-process)")
	fs.StringVar(&cfg.HTTPAddr, "http", "", "HTTP address of a running conductor (with -rpc)")
	fs.IntVar(&cfg.Instances, "instances", 8, "vLLM instances holding every prompt")
	fs.IntVar(&cfg.BlockSize, "block-size", 16, "tokens per block")
	fs.StringVar(&prompts, "prompts", "2048,8192", "prompt lengths in tokens")
	fs.IntVar(&cfg.N, "n", 2000, "measured queries per prompt and protocol")
	fs.IntVar(&cfg.Warmup, "warmup", 200, "discarded queries before measuring")
	fs.StringVar(&cfg.Python, "python", "", "python interpreter with mooncake.conductor importable (empty: skip Python)")
	fs.StringVar(&cfg.Model, "model", "latency-bench", "model name of the benchmark context")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, p := range strings.Split(prompts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 || n%cfg.BlockSize != 0 {
			return fmt.Errorf("-prompts: %q is not a positive multiple of the block size", p)
		}
		cfg.Prompts = append(cfg.Prompts, n)
	}
	if (cfg.RPCAddr == "") != (cfg.HTTPAddr == "") {
		return errors.New("-rpc and -http go together")
	}
	b, err := Setup(cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(out, "conductor rpc=%s http=%s; %d instances, block size %d, full hit; %d queries after %d warm-up, one client\n",
		b.RPCAddr, b.HTTPAddr, cfg.Instances, cfg.BlockSize, cfg.N, cfg.Warmup)
	fmt.Fprintf(out, "%-8s %-22s %10s %10s %10s\n", "prompt", "client", "p50", "p99", "mean")
	for _, size := range cfg.Prompts {
		rows := []struct {
			name    string
			measure func(int, int, int) (Stats, error)
		}{{"Go rpcclient (RPC)", b.MeasureRPC}, {"Go fasthttp (HTTP)", b.MeasureHTTP}}
		for _, r := range rows {
			st, err := r.measure(size, cfg.N, cfg.Warmup)
			if err != nil {
				return fmt.Errorf("%s, %d tokens: %w", r.name, size, err)
			}
			fmt.Fprintf(out, "%-8d %-22s %10s %10s %10s\n", size, r.name, fmtDur(st.P50), fmtDur(st.P99), fmtDur(st.Mean))
		}
		if cfg.Python != "" {
			st, err := b.MeasurePython(cfg.Python, size, cfg.N, cfg.Warmup)
			if err != nil {
				return fmt.Errorf("python, %d tokens: %w", size, err)
			}
			fmt.Fprintf(out, "%-8d %-22s %10s %10s %10s\n", size, "Python client (RPC)", fmtDur(st.P50), fmtDur(st.P99), fmtDur(st.Mean))
		}
	}
	return nil
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1e3) }

// Bench is a conductor whose index holds every prompt on every instance, with one client
// of each kind connected.
type Bench struct {
	RPCAddr, HTTPAddr string

	cfg  Config
	app  *server.App
	pubs []*zmqtest.Publisher
	ids  []string // registered instance ids
	rpc  *rpcclient.Client
	http *fasthttp.HostClient
	// per prompt length: the RPC request, the HTTP body, the first token
	rpcReq   map[int]*cororpc.QueryRequest
	httpBody map[int][]byte
	start    map[int]int32
}

// Setup starts (or connects to) a conductor, registers cfg.Instances vLLM publishers,
// publishes every prompt's blocks from each and waits until every instance reports a
// full hit over both protocols.
func Setup(cfg Config) (*Bench, error) {
	b := &Bench{cfg: cfg, rpcReq: map[int]*cororpc.QueryRequest{}, httpBody: map[int][]byte{}, start: map[int]int32{}}
	if cfg.RPCAddr == "" {
		app, err := server.Start(server.AppConfig{HTTPPort: 0, RPCPort: 0, BindAddress: "127.0.0.1",
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			return nil, fmt.Errorf("start conductor: %w", err)
		}
		b.app, cfg.RPCAddr, cfg.HTTPAddr = app, app.RPCAddr, app.HTTPAddr
	}
	b.RPCAddr, b.HTTPAddr = cfg.RPCAddr, cfg.HTTPAddr
	if err := b.setup(); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Bench) setup() error {
	cfg := b.cfg
	var err error
	if b.rpc, err = rpcclient.Dial(b.RPCAddr, 0); err != nil {
		return err
	}
	b.http = &fasthttp.HostClient{Addr: b.HTTPAddr, MaxConns: 1}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	profile := cororpc.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}
	for i := range cfg.Instances {
		p, err := zmqtest.NewPublisher(zmqtest.Config{})
		if err != nil {
			return err
		}
		b.pubs = append(b.pubs, p)
		sc := cororpc.ServiceConfig{Endpoint: p.Endpoint(), ModelName: cfg.Model, TenantID: "default",
			InstanceID: fmt.Sprintf("%s-%02d", cfg.Model, i), BlockSize: int64(cfg.BlockSize), HashProfile: profile}
		if _, code, err := b.rpc.Register(ctx, &sc); err != nil || code != cororpc.CodeOK {
			return fmt.Errorf("register %s: %v %v", sc.InstanceID, code, err)
		}
		b.ids = append(b.ids, sc.InstanceID)
		if err := p.WaitSubscribers(1, 10*time.Second); err != nil {
			return err
		}
	}
	prof, err := hashing.Resolve(profile.Strategy, profile.Algorithm, profile.PythonHashSeed, profile.IndexProjection)
	if err != nil {
		return err
	}
	next := int32(1)
	for _, size := range cfg.Prompts {
		// Distinct tokens per prompt, so each prompt is its own chain.
		tokens := make([]int32, size)
		for i := range tokens {
			tokens[i] = next + int32(i)
		}
		b.start[size] = next
		next += int32(size) + 1000
		var ch hashing.Chain
		ch.Reset(&prof, cfg.BlockSize, "", "", tokens)
		keys := make([]uint64, 0, ch.NumBlocks())
		for range ch.NumBlocks() {
			k, err := ch.Next()
			if err != nil {
				return err
			}
			keys = append(keys, k)
		}
		payload := storedBatch(keys, cfg.BlockSize)
		for _, p := range b.pubs {
			if _, err := p.Publish(payload); err != nil {
				return err
			}
		}
		b.rpcReq[size] = &cororpc.QueryRequest{Context: cororpc.ContextKey{TenantID: "default", ModelName: cfg.Model,
			BlockSize: int64(cfg.BlockSize)}, Tokens: tokens}
		b.httpBody[size] = queryBody(cfg.Model, cfg.BlockSize, tokens)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, size := range cfg.Prompts {
		for {
			err := b.CheckFullHit(size)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("index never reached a full hit: %w", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// storedBatch is one vLLM KVEventBatch [ts, [BlockStored], 0] with every key on the GPU.
func storedBatch(keys []uint64, blockSize int) []byte {
	enc := sim.NewBatchEncoder(publisher.VLLM, sim.StyleMinimal, blockSize, "")
	enc.Stored(keys, 0, false, nil, sim.TierDevice)
	return enc.Finish(float64(time.Now().UnixNano())/1e9, 0)
}

// queryBody is a /query request with token_ids as little-endian int32 bytes.
func queryBody(model string, blockSize int, tokens []int32) []byte {
	var b []byte
	b = msgp.AppendMapHeader(b, 3)
	b = msgp.AppendString(b, "model")
	b = msgp.AppendString(b, model)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, blockSize)
	b = msgp.AppendString(b, "token_ids")
	raw := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
	}
	return msgp.AppendBytes(b, raw)
}

// CheckFullHit verifies that RPC and HTTP both report every instance holding the whole
// prompt of size tokens.
func (b *Bench) CheckFullHit(size int) error {
	var res cororpc.QueryResult
	code, err := b.rpc.Query(context.Background(), b.rpcReq[size], &res)
	if err != nil || code != cororpc.CodeOK {
		return fmt.Errorf("rpc query: %v %v", code, err)
	}
	if len(res.Instances) != b.cfg.Instances {
		return fmt.Errorf("rpc: %d instances, want %d", len(res.Instances), b.cfg.Instances)
	}
	for _, in := range res.Instances {
		if in.Hit.Device != int64(size) {
			return fmt.Errorf("rpc: %s device %d, want %d", in.InstanceID, in.Hit.Device, size)
		}
	}
	body, err := b.postQuery(size, nil)
	if err != nil {
		return err
	}
	v, _, err := msgp.ReadIntfBytes(body)
	if err != nil {
		return fmt.Errorf("http body: %w", err)
	}
	top, _ := v.(map[string]any)
	insts, _ := top["instances"].(map[string]any)
	if len(insts) != b.cfg.Instances {
		return fmt.Errorf("http: %d instances, want %d", len(insts), b.cfg.Instances)
	}
	for id, in := range insts {
		m, _ := in.(map[string]any)
		if dev, ok := m["device"].(int64); !ok || dev != int64(size) {
			return fmt.Errorf("http: %s device %v, want %d", id, m["device"], size)
		}
	}
	return nil
}

// queryRequest is the POST /query of the prompt of size tokens and a response to read
// its answer into, both from fasthttp's pools: releaseQuery returns them.
func (b *Bench) queryRequest(size int) (*fasthttp.Request, *fasthttp.Response) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.SetRequestURI("http://" + b.HTTPAddr + "/query")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/msgpack")
	req.SetBodyRaw(b.httpBody[size])
	return req, resp
}

// releaseQuery returns a queryRequest's request and response to fasthttp's pools.
func releaseQuery(req *fasthttp.Request, resp *fasthttp.Response) {
	fasthttp.ReleaseRequest(req)
	fasthttp.ReleaseResponse(resp)
}

// postQuery sends the prompt's /query and returns the response body, appended to dst.
func (b *Bench) postQuery(size int, dst []byte) ([]byte, error) {
	req, resp := b.queryRequest(size)
	defer releaseQuery(req, resp)
	if err := b.http.DoTimeout(req, resp, 10*time.Second); err != nil {
		return dst, fmt.Errorf("http query: %w", err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return dst, fmt.Errorf("http query: status %d", resp.StatusCode())
	}
	return append(dst, resp.Body()...), nil
}

// Stats summarises one series of round trips.
type Stats struct {
	N              int
	P50, P99, Mean time.Duration
}

func summarise(d []time.Duration) Stats {
	slices.Sort(d)
	var sum time.Duration
	for _, v := range d {
		sum += v
	}
	return Stats{N: len(d), P50: d[len(d)/2], P99: d[min(len(d)-1, len(d)*99/100)], Mean: sum / time.Duration(len(d))}
}

// MeasureRPC times n Query calls through rpcclient, after warmup discarded ones.
func (b *Bench) MeasureRPC(size, n, warmup int) (Stats, error) {
	var res cororpc.QueryResult
	q := b.rpcReq[size]
	d := make([]time.Duration, 0, n)
	for i := range warmup + n {
		t0 := time.Now()
		code, err := b.rpc.Query(context.Background(), q, &res)
		el := time.Since(t0)
		if err != nil || code != cororpc.CodeOK || len(res.Instances) != b.cfg.Instances {
			return Stats{}, fmt.Errorf("query: %v %v (%d instances)", code, err, len(res.Instances))
		}
		if i >= warmup {
			d = append(d, el)
		}
	}
	return summarise(d), nil
}

// MeasureHTTP times n POST /query calls over one keep-alive connection; the body is read
// whole but not decoded.
func (b *Bench) MeasureHTTP(size, n, warmup int) (Stats, error) {
	req, resp := b.queryRequest(size)
	defer releaseQuery(req, resp)
	d := make([]time.Duration, 0, n)
	for i := range warmup + n {
		t0 := time.Now()
		err := b.http.DoTimeout(req, resp, 10*time.Second)
		el := time.Since(t0)
		if err != nil || resp.StatusCode() != fasthttp.StatusOK || len(resp.Body()) == 0 {
			return Stats{}, fmt.Errorf("query: status %d: %v", resp.StatusCode(), err)
		}
		if i >= warmup {
			d = append(d, el)
		}
	}
	return summarise(d), nil
}

// pythonScript times the pure-Python client; argv: rpc address, first token, prompt
// length, instances, n, warmup. It prints one JSON line of durations in nanoseconds.
const pythonScript = `
import json, sys, time
from mooncake.conductor import ConductorClient, OK
addr, first, size, instances, n, warmup, model = sys.argv[1], *map(int, sys.argv[2:7]), sys.argv[7]
tokens = list(range(first, first + size))
c = ConductorClient()
assert c.setup(addr) == OK
out = []
for i in range(warmup + n):
    t0 = time.perf_counter_ns()
    r = c.query(model, block_size=16, token_ids=tokens)
    el = time.perf_counter_ns() - t0
    assert r["ret"] == OK and len(r["hits"]) == instances and all(h["device"] == size for h in r["hits"].values()), r
    if i >= warmup:
        out.append(el)
c.close()
print(json.dumps(out))
`

// MeasurePython runs pythonScript with the given interpreter against the RPC port.
func (b *Bench) MeasurePython(python string, size, n, warmup int) (Stats, error) {
	if b.cfg.BlockSize != 16 {
		return Stats{}, errors.New("the Python measurement assumes block size 16")
	}
	cmd := exec.Command(python, "-c", pythonScript, b.RPCAddr, strconv.Itoa(int(b.start[size])), strconv.Itoa(size),
		strconv.Itoa(b.cfg.Instances), strconv.Itoa(n), strconv.Itoa(warmup), b.cfg.Model)
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		return Stats{}, fmt.Errorf("%s: %w", python, err)
	}
	var ns []int64
	if err := json.Unmarshal(raw, &ns); err != nil || len(ns) != n {
		return Stats{}, fmt.Errorf("python output %q: %v", raw, err)
	}
	d := make([]time.Duration, n)
	for i, v := range ns {
		d[i] = time.Duration(v)
	}
	return summarise(d), nil
}

// Close releases the clients and publishers and stops an in-process conductor; a
// running conductor's registrations are removed.
func (b *Bench) Close() {
	if b.rpc != nil {
		if b.app == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for _, id := range b.ids {
				_, _, _ = b.rpc.Unregister(ctx, id, "default", 0)
			}
			cancel()
		}
		_ = b.rpc.Close()
	}
	if b.http != nil {
		b.http.CloseIdleConnections()
	}
	if b.app != nil {
		b.app.Stop()
	}
	for _, p := range b.pubs {
		_ = p.Close()
	}
}
