package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/internal/syncbuf"
	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/rpcclient"
	"github.com/conductor-go/conductor/wire/cororpc"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Golden struct_pack bodies of reference-notes.md §2.3 and rpc-golden-long.txt, copied
// verbatim (release mode, yalantinglibs 6a0e067). Spaces are only for reading.
const (
	rgQueryArgs           = "1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 03 01000000 02000000 03000000 00 00"
	rgQueryArgsSaltFilter = "1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 03 01000000 02000000 03000000 01 01 73 01 01 65"
	rgQueryRespEmpty      = "ccd2d5ad 01 00"
	rgQueryRespInvalid    = "ccd2d5ad 00 a8fdffff"
	rgRegisterArgs        = "102aa7f2147463703a2f2f3132372e302e302e313a353535370000000000016d000764656661756c740165" +
		"1000000000000000000000000007766c6c6d5f76310b7368613235365f63626f72013000086c6f7736345f6265"
	rgRegisterRespOK     = "a80190d8 01 01 65 01"
	rgUnregisterArgs     = "1aca8199 01 65 07 64656661756c74 00000000"
	rgUnregisterNotFound = "5c3854f3 00 2ff8ffff"
	rgUnregisterOK       = "5c3854f3 01 0b 657c64656661756c747c30"
	rgGlobalViewEmpty    = "58de0b3a 00000000 00"
	rgListServicesEmpty  = "f8427866 00"
	// GetGlobalView, 1 context, instances {e:[0,1]}, prefix_count 42 (152 bytes).
	rgGlobalView152 = "58de0b3a01000000010764656661756c74016d00100000000000000007766c6c6d5f76310b7368613235365f63626f72" +
		"013040346531313935646630323064653539653064363561333361343237396631313833653761653465356439383065" +
		"33303966386235356164666632653631633365086c6f7736345f62650101650200000000000000000100000000000000" +
		"2a00000000000000"
	// ListServices, one SGLang service with replay, dp 1, cache_group 0 (181 bytes), with the
	// endpoints tcp://127.0.0.1:5557 and :5558.
	rgListServicesSGLang = "f842786601147463703a2f2f3132372e302e302e313a35353537147463703a2f2f3132372e302e302e313a3535353802" +
		"000000016d000764656661756c7401651000000000000000010000000100000000000000000673676c616e670a736861" +
		"3235365f7261770130403030303030303030303030303030303030303030303030303030303030303030303030303030" +
		"30303030303030303030303030303030303030303030303030300a666972737436345f6265"
	rgGoldenEndpoint       = "tcp://127.0.0.1:5557"
	rgGoldenReplayEndpoint = "tcp://127.0.0.1:5558"
)

func rgHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad golden hex %q: %v", s, err)
	}
	return b
}

// rgSplice replaces every struct_pack string holding old (one-byte length prefix, as in
// the short goldens) by the same string holding repl.
func rgSplice(t testing.TB, body []byte, old, repl string) []byte {
	t.Helper()
	if len(old) > 255 || len(repl) > 255 {
		t.Fatal("rgSplice handles one-byte lengths only")
	}
	from := append([]byte{byte(len(old))}, old...)
	to := append([]byte{byte(len(repl))}, repl...)
	if !bytes.Contains(body, from) {
		t.Fatalf("golden body has no string %q", old)
	}
	return bytes.ReplaceAll(body, from, to)
}

// dialRPC connects an RPC client to the app, closed at cleanup, and returns it with a
// context that expires after timeout.
func dialRPC(t testing.TB, app *App, timeout time.Duration) (*rpcclient.Client, context.Context) {
	t.Helper()
	cl, err := rpcclient.Dial(app.RPCAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return cl, ctx
}

// startRPCTestApp starts an in-process conductor with RPC on free loopback ports whose
// warnings are captured.
func startRPCTestApp(t testing.TB) (*App, *syncbuf.Buffer) {
	t.Helper()
	return startCapturing(t, AppConfig{})
}

// startCapturing starts an in-process conductor with cfg, RPC included, on free loopback
// ports, and captures its warnings.
func startCapturing(t testing.TB, cfg AppConfig) (*App, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return startWith(t, cfg), logs
}

// rawRPC is a bare TCP connection to the RPC port: the tests write exact bytes and read
// exact response frames, with no client library in between.
type rawRPC struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func dialRawRPC(t testing.TB, addr string) *rawRPC {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial rpc: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &rawRPC{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawRPC) write(b []byte) {
	rc.t.Helper()
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

func (rc *rawRPC) send(seq, fn uint32, body []byte) {
	rc.t.Helper()
	rc.write(cororpc.AppendRequest(nil, seq, fn, body))
}

// read reads one response frame, checking the header fields that never vary: magic 21,
// version 0, msg_type 0, no attachment.
func (rc *rawRPC) read() (errCode uint8, seq uint32, body []byte) {
	rc.t.Helper()
	var h [cororpc.ResponseHeaderSize]byte
	if _, err := io.ReadFull(rc.r, h[:]); err != nil {
		rc.t.Fatalf("read response header: %v", err)
	}
	if h[0] != 21 || h[1] != 0 || h[3] != 0 {
		rc.t.Fatalf("response header %x: want magic 21, version 0, msg_type 0", h)
	}
	if attach := binary.LittleEndian.Uint32(h[12:]); attach != 0 {
		rc.t.Fatalf("response header %x: attach_length %d", h, attach)
	}
	body = make([]byte, binary.LittleEndian.Uint32(h[8:]))
	if _, err := io.ReadFull(rc.r, body); err != nil {
		rc.t.Fatalf("read response body: %v", err)
	}
	return h[2], binary.LittleEndian.Uint32(h[4:]), body
}

// readOK reads a success frame answering seq and returns its body.
func (rc *rawRPC) readOK(seq uint32) []byte {
	rc.t.Helper()
	code, got, body := rc.read()
	if code != 0 || got != seq {
		rc.t.Fatalf("response err_code %d seq %d (body %x), want 0 and seq %d", code, got, body, seq)
	}
	return body
}

func (rc *rawRPC) call(seq, fn uint32, body []byte) []byte {
	rc.t.Helper()
	rc.send(seq, fn, body)
	return rc.readOK(seq)
}

// wantClosed asserts the server has closed the connection (EOF or reset), not merely
// stopped answering.
func (rc *rawRPC) wantClosed(what string) {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := rc.r.ReadByte()
	if err == nil {
		rc.t.Fatalf("%s: connection still delivers data (%#x), want it closed", what, b)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatalf("%s: connection still open after a minute, want it closed", what)
	}
}

func wantBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n got %x\nwant %x", what, got, want)
	}
}

var rgVLLMProfile = cororpc.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}

const rgRootVLLMCBOR0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"

// TestRPCGoldenEmptyIndex sends the golden request bodies over a raw connection to an
// empty conductor and compares the exact response bodies, and the seq echo, against the
// goldens.
func TestRPCGoldenEmptyIndex(t *testing.T) {
	app, _ := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)

	// Variants of the golden Query body with one field edited by hand; each is also
	// checked against the encoder so a typo here cannot pass as a server answer.
	ctx := cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	edited := func(hexBody string, q cororpc.QueryRequest) string {
		if enc := cororpc.AppendQueryRequest(nil, &q); !bytes.Equal(enc, rgHex(t, hexBody)) {
			t.Fatalf("hand-edited body %s differs from encoder %x", hexBody, enc)
		}
		return hexBody
	}
	noModel, bs0, bsNeg, noTokens := ctx, ctx, ctx, ctx
	noModel.ModelName, bs0.BlockSize, bsNeg.BlockSize = "", 0, -16
	cases := []struct {
		name      string
		fn        uint32
		req, resp string
	}{
		{"Query", cororpc.FuncQuery, rgQueryArgs, rgQueryRespEmpty},
		{"Query salt+filter", cororpc.FuncQuery, rgQueryArgsSaltFilter, rgQueryRespEmpty},
		{"Query no tokens", cororpc.FuncQuery, edited("1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 00 00 00",
			cororpc.QueryRequest{Context: noTokens}), rgQueryRespEmpty},
		{"Query empty model", cororpc.FuncQuery, edited("1c1a00f9 07 64656661756c74 00 00 1000000000000000 03 01000000 02000000 03000000 00 00",
			cororpc.QueryRequest{Context: noModel, Tokens: []int32{1, 2, 3}}), rgQueryRespInvalid},
		{"Query block_size 0", cororpc.FuncQuery, edited("1c1a00f9 07 64656661756c74 01 6d 00 0000000000000000 03 01000000 02000000 03000000 00 00",
			cororpc.QueryRequest{Context: bs0, Tokens: []int32{1, 2, 3}}), rgQueryRespInvalid},
		{"Query block_size -16", cororpc.FuncQuery, edited("1c1a00f9 07 64656661756c74 01 6d 00 f0ffffffffffffff 03 01000000 02000000 03000000 00 00",
			cororpc.QueryRequest{Context: bsNeg, Tokens: []int32{1, 2, 3}}), rgQueryRespInvalid},
		{"GetGlobalView", cororpc.FuncGetGlobalView, "", rgGlobalViewEmpty},
		{"ListServices", cororpc.FuncListServices, "", rgListServicesEmpty},
		{"Unregister", cororpc.FuncUnregister, rgUnregisterArgs, rgUnregisterNotFound},
	}
	for i, c := range cases {
		seq := uint32(0x5eed0000 + i) // distinct per request: the echo is checked, not assumed
		got := rc.call(seq, c.fn, rgHex(t, c.req))
		wantBytes(t, c.name, got, rgHex(t, c.resp))
	}
	// seq_num is echoed verbatim, including 0 and the largest value.
	for _, seq := range []uint32{0, 1, 0xffffffff} {
		wantBytes(t, fmt.Sprintf("ListServices seq %d", seq), rc.call(seq, cororpc.FuncListServices, nil), rgHex(t, rgListServicesEmpty))
	}
}

// TestRPCGoldenRegisterLifecycle registers a real publisher with the golden Register body
// (its endpoint substituted), then checks Register, ListServices and Unregister answers
// byte for byte.
func TestRPCGoldenRegisterLifecycle(t *testing.T) {
	app, _ := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)
	pub := newPublisher(t, false)

	req := rgSplice(t, rgHex(t, rgRegisterArgs), rgGoldenEndpoint, pub.Endpoint())
	cfg := cororpc.ServiceConfig{Endpoint: pub.Endpoint(), ModelName: "m", TenantID: "default", InstanceID: "e",
		BlockSize: 16, HashProfile: rgVLLMProfile}
	wantBytes(t, "spliced Register body vs encoder", req, cororpc.AppendServiceConfig(nil, &cfg))

	wantBytes(t, "Register", rc.call(11, cororpc.FuncRegister, req), rgHex(t, rgRegisterRespOK))
	// An identical duplicate succeeds with is_new false.
	wantBytes(t, "Register again", rc.call(12, cororpc.FuncRegister, req), rgHex(t, "a80190d8 01 01 65 00"))
	// The same key with another block size conflicts: INVALID_PARAMS inside the expected.
	other := cfg
	other.BlockSize = 32
	wantBytes(t, "Register conflicting", rc.call(13, cororpc.FuncRegister, cororpc.AppendServiceConfig(nil, &other)),
		rgHex(t, "a80190d8 00 a8fdffff"))

	listed := cfg
	listed.HashProfile.RootDigest = rgRootVLLMCBOR0
	wantBytes(t, "ListServices", rc.call(14, cororpc.FuncListServices, nil),
		cororpc.AppendServiceList(nil, []cororpc.ServiceConfig{listed}))

	wantBytes(t, "Unregister", rc.call(15, cororpc.FuncUnregister, rgHex(t, rgUnregisterArgs)), rgHex(t, rgUnregisterOK))
	wantBytes(t, "Unregister again", rc.call(16, cororpc.FuncUnregister, rgHex(t, rgUnregisterArgs)), rgHex(t, rgUnregisterNotFound))
	wantBytes(t, "ListServices after", rc.call(17, cororpc.FuncListServices, nil), rgHex(t, rgListServicesEmpty))
}

// TestRPCGoldenViewsWithEvents reproduces two long goldens from a live index: the
// 152-byte global view (instance e on ranks 0 and 1, 42 prefixes) built from real vLLM
// events, and the 181-byte SGLang ListServices answer (endpoints substituted). It also
// checks a Query answer with hits against the encoder.
func TestRPCGoldenViewsWithEvents(t *testing.T) {
	t.Run("global view", func(t *testing.T) {
		app, _ := startRPCTestApp(t)
		rc := dialRawRPC(t, app.RPCAddr)
		pubs := []*rgPub{{dp: 0}, {dp: 1}}
		for i, p := range pubs {
			p.pub = newPublisher(t, false)
			cfg := cororpc.ServiceConfig{Endpoint: p.pub.Endpoint(), ModelName: "m", TenantID: "default", InstanceID: "e",
				BlockSize: 16, DPRank: int32(p.dp), HashProfile: rgVLLMProfile}
			resp := rc.call(uint32(100+i), cororpc.FuncRegister, cororpc.AppendServiceConfig(nil, &cfg))
			wantBytes(t, "Register", resp, rgHex(t, rgRegisterRespOK))
			waitSub(t, p.pub, 1)
		}
		tokens := seqTokens(42*16, 1)
		keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
		mustPublish(t, pubs[0].pub, vllmBatch(0, stored(keys, "GPU")))
		// Rank 1 holds the first two blocks: the prefix count stays 42 (distinct keys).
		mustPublish(t, pubs[1].pub, vllmBatch(1, stored(keys[:2], "GPU")))
		want := rgHex(t, rgGlobalView152)
		var got []byte
		eventually(t, "global view golden", func() error {
			got = rc.call(200, cororpc.FuncGetGlobalView, nil)
			if !bytes.Equal(got, want) {
				return fmt.Errorf("got %x", got)
			}
			return nil
		})
		// Query: 3 blocks on rank 0, 2 on rank 1; the answer lists both ranks.
		eventually(t, "rank 1 events", func() error {
			q := cororpc.QueryRequest{Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: tokens[:48]}
			got := rc.call(201, cororpc.FuncQuery, cororpc.AppendQueryRequest(nil, &q))
			want, err := cororpc.AppendQueryResult(nil, &cororpc.QueryResult{Instances: []cororpc.InstanceHit{{InstanceID: "e",
				Hit: cororpc.CacheHitResult{LongestMatchTokens: 48,
					DP:          []cororpc.RankValue{{Rank: 0, Value: 48}, {Rank: 1, Value: 32}},
					RankMatches: []cororpc.RankTiers{{Rank: 0, Device: 48, CPULocal: 48, CPUShare: 48, Disk: 48}, {Rank: 1, Device: 32, CPULocal: 32, CPUShare: 32, Disk: 32}},
					Device:      48, CPULocal: 48, CPUShare: 48, Disk: 48}}}})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				return fmt.Errorf("query body %x, want %x", got, want)
			}
			return nil
		})
	})

	t.Run("SGLang services", func(t *testing.T) {
		app, _ := startRPCTestApp(t)
		rc := dialRawRPC(t, app.RPCAddr)
		pub := newPublisher(t, true)
		cfg := cororpc.ServiceConfig{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(),
			PublisherKind: publisher.SGLang, ModelName: "m", TenantID: "", InstanceID: "e", BlockSize: 16,
			DPRank: 1, HasCacheGroup: true, CacheGroup: 0,
			HashProfile: cororpc.HashProfile{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"}}
		wantBytes(t, "Register", rc.call(1, cororpc.FuncRegister, cororpc.AppendServiceConfig(nil, &cfg)), rgHex(t, rgRegisterRespOK))
		want := rgSplice(t, rgHex(t, rgListServicesSGLang), rgGoldenEndpoint, pub.Endpoint())
		want = rgSplice(t, want, rgGoldenReplayEndpoint, pub.ReplayEndpoint())
		wantBytes(t, "ListServices", rc.call(2, cororpc.FuncListServices, nil), want)
		wantBytes(t, "Unregister dp 1", rc.call(3, cororpc.FuncUnregister, cororpc.AppendUnregisterArgs(nil, "e", "", 1)),
			rgHex(t, "5c3854f3 01 0b 657c64656661756c747c31"))
	})
}

type rgPub struct {
	pub *zmqtest.Publisher
	dp  int
}

// TestRPCPipelinedInOrder writes many requests in one go, mixing methods, business
// errors and an unknown function, and reads the answers in request order with their
// sequence numbers.
func TestRPCPipelinedInOrder(t *testing.T) {
	app, _ := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)

	type exp struct {
		seq   uint32
		frame bool // framework error expected
		body  string
	}
	var batch []byte
	var want []exp
	add := func(seq, fn uint32, req, resp string) {
		batch = cororpc.AppendRequest(batch, seq, fn, rgHex(t, req))
		want = append(want, exp{seq: seq, body: resp})
	}
	add(1, cororpc.FuncQuery, rgQueryArgs, rgQueryRespEmpty)
	add(0xffffffff, cororpc.FuncListServices, "", rgListServicesEmpty)
	batch = cororpc.AppendRequest(batch, 3, 0x12345678, rgHex(t, rgQueryArgs))
	want = append(want, exp{seq: 3, frame: true})
	add(0, cororpc.FuncGetGlobalView, "", rgGlobalViewEmpty)
	add(42, cororpc.FuncQuery, "1c1a00f9 07 64656661756c74 00 00 1000000000000000 03 01000000 02000000 03000000 00 00", rgQueryRespInvalid)
	add(7, cororpc.FuncUnregister, rgUnregisterArgs, rgUnregisterNotFound)
	add(7, cororpc.FuncQuery, rgQueryArgsSaltFilter, rgQueryRespEmpty) // a repeated seq is echoed as is
	// Enough queries that the batch spans several reads of the server's 64 KiB buffer,
	// so frames are split across reads.
	big := cororpc.AppendQueryRequest(nil, &cororpc.QueryRequest{
		Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: seqTokens(1000, 1)})
	for i := range 300 {
		batch = cororpc.AppendRequest(batch, uint32(1000+i), cororpc.FuncQuery, big)
		want = append(want, exp{seq: uint32(1000 + i), body: rgQueryRespEmpty})
	}
	done := make(chan error, 1)
	go func() { _, err := rc.c.Write(batch); done <- err }() // the server writes while we write
	for i, w := range want {
		code, seq, body := rc.read()
		if seq != w.seq {
			t.Fatalf("response %d has seq %d, want %d", i, seq, w.seq)
		}
		if w.frame {
			if code == 0 {
				t.Fatalf("response %d: unknown function answered with err_code 0", i)
			}
			continue
		}
		if code != 0 {
			t.Fatalf("response %d: err_code %d", i, code)
		}
		wantBytes(t, fmt.Sprintf("response %d", i), body, rgHex(t, w.body))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRPCFrameworkErrorsKeepConnection: an unknown function id and an unsupported
// serialize_type are answered with a framework error (non-zero err_code, struct_pack
// string body) and the same connection keeps working.
func TestRPCFrameworkErrorsKeepConnection(t *testing.T) {
	app, logs := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)

	rc.send(77, 0xdeadbeef, rgHex(t, rgQueryArgs))
	code, seq, body := rc.read()
	if code != uint8(cororpc.ErrcFunctionNotRegistered) || seq != 77 {
		t.Fatalf("unknown function: err_code %d seq %d, want %d and 77", code, seq, cororpc.ErrcFunctionNotRegistered)
	}
	fe, err := cororpc.DecodeFrameworkError(code, body)
	if err != nil || fe.Msg == "" {
		t.Fatalf("framework error body %x: %v %v", body, fe, err)
	}
	wantBytes(t, "query after unknown function", rc.call(78, cororpc.FuncQuery, rgHex(t, rgQueryArgs)), rgHex(t, rgQueryRespEmpty))

	// serialize_type 1 (not struct_pack): the frame is consumed and refused.
	frame := cororpc.AppendRequest(nil, 79, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
	frame[2] = 1
	rc.write(frame)
	if code, seq, body = rc.read(); code == 0 || seq != 79 {
		t.Fatalf("serialize_type 1: err_code %d seq %d", code, seq)
	}
	if _, err := cororpc.DecodeFrameworkError(code, body); err != nil {
		t.Fatalf("framework error body %x: %v", body, err)
	}
	wantBytes(t, "query after serialize_type error", rc.call(80, cororpc.FuncQuery, rgHex(t, rgQueryArgs)), rgHex(t, rgQueryRespEmpty))
	if n := logs.Count("rpc connection closed"); n != 0 {
		t.Errorf("no connection should have been dropped:\n%s", logs)
	}
}

// TestRPCMalformedFramesCloseOnlyThatConnection: each malformed frame closes its own
// connection with a log line, while another connection keeps being served.
func TestRPCMalformedFramesCloseOnlyThatConnection(t *testing.T) {
	app, logs := startRPCTestApp(t)
	healthy := dialRawRPC(t, app.RPCAddr)
	wantBytes(t, "healthy", healthy.call(1, cororpc.FuncQuery, rgHex(t, rgQueryArgs)), rgHex(t, rgQueryRespEmpty))

	good := func(seq uint32) []byte {
		return cororpc.AppendRequest(nil, seq, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
	}
	badCode := rgHex(t, rgQueryArgs)
	badCode[0] ^= 0x02 // QueryRequest type code 0xf9001a1c -> 0xf9001a1e
	cases := []struct {
		name string
		send func(rc *rawRPC)
		// frameworkError: the server answers the request with a framework error first.
		frameworkError bool
	}{
		{"bad magic", func(rc *rawRPC) { f := good(5); f[0] = 0x16; rc.write(f) }, false},
		{"version 1", func(rc *rawRPC) { f := good(5); f[1] = 1; rc.write(f) }, false},
		{"oversized length", func(rc *rawRPC) {
			f := good(5)
			binary.LittleEndian.PutUint32(f[12:], 0xfffffff0)
			rc.write(f[:cororpc.RequestHeaderSize])
		}, false},
		{"oversized attachment", func(rc *rawRPC) {
			f := good(5)
			binary.LittleEndian.PutUint32(f[16:], cororpc.DefaultMaxBody)
			rc.write(f)
		}, false},
		{"truncated body", func(rc *rawRPC) {
			f := good(5)
			rc.write(f[:len(f)-3])
			if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
				rc.t.Fatal(err)
			}
		}, false},
		{"truncated header", func(rc *rawRPC) {
			rc.write(good(5)[:11])
			if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
				rc.t.Fatal(err)
			}
		}, false},
		{"wrong type code in Query body", func(rc *rawRPC) { rc.send(5, cororpc.FuncQuery, badCode) }, true},
		{"trailing byte in Query body", func(rc *rawRPC) { rc.send(5, cororpc.FuncQuery, append(rgHex(t, rgQueryArgs), 0)) }, true},
		{"body for GetGlobalView", func(rc *rawRPC) { rc.send(5, cororpc.FuncGetGlobalView, []byte{0}) }, true},
	}
	for _, c := range cases {
		before := logs.Count("rpc connection closed")
		rc := dialRawRPC(t, app.RPCAddr)
		// The connection works before the bad frame.
		wantBytes(t, c.name+": first query", rc.call(4, cororpc.FuncQuery, rgHex(t, rgQueryArgs)), rgHex(t, rgQueryRespEmpty))
		c.send(rc)
		if c.frameworkError {
			code, seq, body := rc.read()
			if code == 0 || seq != 5 {
				t.Fatalf("%s: err_code %d seq %d, want a framework error for seq 5", c.name, code, seq)
			}
			if _, err := cororpc.DecodeFrameworkError(code, body); err != nil {
				t.Fatalf("%s: framework error body %x: %v", c.name, body, err)
			}
		}
		rc.wantClosed(c.name)
		if after := logs.Count("rpc connection closed"); after != before+1 {
			t.Errorf("%s: %d new log lines about a closed connection, want 1:\n%s", c.name, after-before, logs)
		}
		wantBytes(t, c.name+": other connection", healthy.call(uint32(len(c.name)), cororpc.FuncQuery, rgHex(t, rgQueryArgs)),
			rgHex(t, rgQueryRespEmpty))
	}
	// A peer that simply hangs up between frames is not a malformed frame: no log line.
	before := logs.Count("rpc connection closed")
	rc := dialRawRPC(t, app.RPCAddr)
	rc.call(1, cororpc.FuncListServices, nil)
	rc.c.Close()
	healthy.call(2, cororpc.FuncListServices, nil)
	if after := logs.Count("rpc connection closed"); after != before {
		t.Errorf("a clean hang-up was logged as a bad frame:\n%s", logs)
	}
}

// TestRPCAnswersBeforeClosing: answers to the good requests that precede a bad frame in
// the same write are delivered before the connection is closed, not dropped with the
// connection's unflushed output.
func TestRPCAnswersBeforeClosing(t *testing.T) {
	app, _ := startRPCTestApp(t)
	for _, c := range []struct {
		name string
		tail func([]byte) []byte
		// frameworkError: the bad frame itself is answered before the close.
		frameworkError bool
	}{
		{"bad magic", func(b []byte) []byte {
			f := cororpc.AppendRequest(nil, 9, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
			f[0] = 0x16
			return append(b, f...)
		}, false},
		{"bad body", func(b []byte) []byte { return cororpc.AppendRequest(b, 9, cororpc.FuncQuery, []byte{1, 2, 3, 4}) }, true},
	} {
		rc := dialRawRPC(t, app.RPCAddr)
		var batch []byte
		for seq := uint32(1); seq <= 3; seq++ {
			batch = cororpc.AppendRequest(batch, seq, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
		}
		rc.write(c.tail(batch))
		for seq := uint32(1); seq <= 3; seq++ {
			wantBytes(t, c.name, rc.readOK(seq), rgHex(t, rgQueryRespEmpty))
		}
		if c.frameworkError {
			if code, seq, _ := rc.read(); code == 0 || seq != 9 {
				t.Fatalf("%s: err_code %d seq %d, want a framework error for seq 9", c.name, code, seq)
			}
		}
		rc.wantClosed(c.name)
	}
}

// TestRPCAnswersWhileNextFrameIsPartial: a response is not held back because part of
// the next request is already buffered; a client may wait for an answer before it
// finishes sending the next frame.
func TestRPCAnswersWhileNextFrameIsPartial(t *testing.T) {
	app, _ := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)
	next := cororpc.AppendRequest(nil, 2, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
	for _, cut := range []int{5, cororpc.RequestHeaderSize, cororpc.RequestHeaderSize + 7} {
		first := cororpc.AppendRequest(nil, 1, cororpc.FuncQuery, rgHex(t, rgQueryArgs))
		rc.write(append(first, next[:cut]...))
		_ = rc.c.SetReadDeadline(time.Now().Add(time.Minute))
		wantBytes(t, fmt.Sprintf("cut %d: first", cut), rc.readOK(1), rgHex(t, rgQueryRespEmpty))
		rc.write(next[cut:])
		wantBytes(t, fmt.Sprintf("cut %d: second", cut), rc.readOK(2), rgHex(t, rgQueryRespEmpty))
	}
}

// ---- RPC and HTTP agree ----

// xHit is one instance's answer in a protocol-neutral form.
type xHit struct {
	Tiers [5]int64 // longest_matched, device, cpu_local, cpu_share, disk
	DP    map[string]int64
	RM    map[string][4]int64
}

func hitsOfRPC(res *cororpc.QueryResult) map[string]xHit {
	out := map[string]xHit{}
	for _, in := range res.Instances {
		h := in.Hit
		x := xHit{Tiers: [5]int64{h.LongestMatchTokens, h.Device, h.CPULocal, h.CPUShare, h.Disk},
			DP: map[string]int64{}, RM: map[string][4]int64{}}
		for _, d := range h.DP {
			x.DP[strconv.FormatInt(d.Rank, 10)] = d.Value
		}
		for _, r := range h.RankMatches {
			x.RM[strconv.FormatInt(r.Rank, 10)] = [4]int64{r.Device, r.CPULocal, r.CPUShare, r.Disk}
		}
		out[in.InstanceID] = x
	}
	return out
}

func hitsOfHTTP(t testing.TB, resp map[string]any) map[string]xHit {
	t.Helper()
	out := map[string]xHit{}
	for id, v := range hits(t, resp) {
		m := v.(map[string]any)
		if len(m) != 7 {
			t.Fatalf("instance %s has %d fields: %v", id, len(m), m)
		}
		x := xHit{DP: map[string]int64{}, RM: map[string][4]int64{}}
		for i, k := range []string{"longest_matched", "device", "cpu_local", "cpu_share", "disk"} {
			x.Tiers[i] = asInt(t, m[k])
		}
		for r, c := range m["dp"].(map[string]any) {
			x.DP[r] = asInt(t, c)
		}
		for r, c := range m["rank_matches"].(map[string]any) {
			rm := c.(map[string]any)
			if len(rm) != 4 {
				t.Fatalf("rank_matches %s: %v", r, rm)
			}
			x.RM[r] = [4]int64{asInt(t, rm["device"]), asInt(t, rm["cpu_local"]), asInt(t, rm["cpu_share"]), asInt(t, rm["disk"])}
		}
		out[id] = x
	}
	return out
}

// xCtx is one context of the global view in a protocol-neutral form.
type xCtx struct {
	Tenant, Model, Lora string
	BlockSize           int64
	Profile             [5]string
	PrefixCount         uint64
	Instances           map[string][]int64
}

func viewOfRPC(v *cororpc.GlobalView) []xCtx {
	out := []xCtx{}
	for _, c := range v.Contexts {
		x := xCtx{Tenant: c.Context.TenantID, Model: c.Context.ModelName, Lora: c.Context.LoraName, BlockSize: c.Context.BlockSize,
			Profile: rgProfileOfRPC(c.Profile), PrefixCount: c.PrefixCount, Instances: map[string][]int64{}}
		for _, ir := range c.InstanceRanks {
			x.Instances[ir.InstanceID] = ir.Ranks
		}
		out = append(out, x)
	}
	return out
}

// rgProfileOfRPC lists a profile's strategy, algorithm, seed, root digest and projection.
func rgProfileOfRPC(p cororpc.HashProfile) [5]string {
	return [5]string{p.Strategy, p.Algorithm, p.PythonHashSeed, p.RootDigest, p.IndexProjection}
}

// rgProfileOfHTTP is rgProfileOfRPC for a hash_profile map of an HTTP response.
func rgProfileOfHTTP(t testing.TB, v any) [5]string {
	t.Helper()
	m := v.(map[string]any)
	if len(m) != 5 {
		t.Fatalf("hash profile %v", m)
	}
	var p [5]string
	for i, k := range []string{"strategy", "algorithm", "python_hash_seed", "root_digest", "index_projection"} {
		p[i] = m[k].(string)
	}
	return p
}

// httpItems returns the maps listed under key in an HTTP response, checking that
// countKey counts them.
func httpItems(t testing.TB, resp map[string]any, key, countKey string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, v := range resp[key].([]any) {
		out = append(out, v.(map[string]any))
	}
	if n := asInt(t, resp[countKey]); n != int64(len(out)) {
		t.Fatalf("%s %d for %d %s", countKey, n, len(out), key)
	}
	return out
}

func viewOfHTTP(t testing.TB, resp map[string]any) []xCtx {
	t.Helper()
	out := []xCtx{}
	for _, m := range httpItems(t, resp, "contexts", "context_count") {
		x := xCtx{Tenant: m["tenant_id"].(string), Model: m["model_name"].(string), Lora: m["lora_name"].(string),
			BlockSize: asInt(t, m["block_size"]), Profile: rgProfileOfHTTP(t, m["hash_profile"]),
			PrefixCount: uint64(asInt(t, m["prefix_count"])), Instances: map[string][]int64{}}
		for id, rs := range m["instances"].(map[string]any) {
			ranks := []int64{}
			for _, r := range rs.([]any) {
				ranks = append(ranks, asInt(t, r))
			}
			x.Instances[id] = ranks
		}
		out = append(out, x)
	}
	return out
}

// xSvc is one registered service in a protocol-neutral form.
type xSvc struct {
	Endpoint, Replay, Type, Model, Lora, Tenant, Instance string
	BlockSize, DPRank                                     int64
	CacheGroup                                            string // "nil" or the number
	Profile                                               [5]string
}

func servicesOfRPC(list []cororpc.ServiceConfig) []xSvc {
	out := []xSvc{}
	for _, c := range list {
		cg := "nil"
		if c.HasCacheGroup {
			cg = strconv.FormatInt(c.CacheGroup, 10)
		}
		out = append(out, xSvc{c.Endpoint, c.ReplayEndpoint, c.PublisherKind.String(), c.ModelName, c.LoraName, c.TenantID,
			c.InstanceID, c.BlockSize, int64(c.DPRank), cg, rgProfileOfRPC(c.HashProfile)})
	}
	return out
}

func servicesOfHTTP(t testing.TB, resp map[string]any) []xSvc {
	t.Helper()
	out := []xSvc{}
	for _, m := range httpItems(t, resp, "services", "count") {
		// The 11 keys of the contract (the RPC type's fields), and this conductor's
		// IndexMedia and HashCheck, which the upstream RPC type has no room for.
		if len(m) != 13 {
			t.Fatalf("service has %d keys: %v", len(m), m)
		}
		if _, ok := m["IndexMedia"].([]any); !ok {
			t.Fatalf("IndexMedia %v", m["IndexMedia"])
		}
		if hc, _ := m["HashCheck"].(string); hc != "unverified" && hc != "ok" && !strings.HasPrefix(hc, "mismatch (") {
			t.Fatalf("HashCheck %q", m["HashCheck"])
		}
		cg := "nil"
		if m["CacheGroup"] != nil {
			cg = strconv.FormatInt(asInt(t, m["CacheGroup"]), 10)
		}
		out = append(out, xSvc{m["Endpoint"].(string), m["ReplayEndpoint"].(string), m["Type"].(string), m["ModelName"].(string),
			m["LoraName"].(string), m["TenantID"].(string), m["InstanceID"].(string), asInt(t, m["BlockSize"]), asInt(t, m["DPRank"]),
			cg, rgProfileOfHTTP(t, m["HashProfile"])})
	}
	return out
}

// sglStored is an SGLang BlockStored map event for one page (signed int64 hash).
func sglStored(key uint64, medium string) []byte {
	return mp("type", "BlockStored", "block_hashes", []any{int64(key)}, "parent_block_hash", nil,
		"token_ids", nil, "block_size", 16, "lora_id", nil, "medium", medium)
}

// mcStored is a Mooncake master "stored" event for one block of context (default, m, 16),
// identified by its connector hash.
func mcStored(key uint64, tsMillis int64, medium, objectKey string) []byte {
	return mp("event_id", uint64(1), "timestamp", tsMillis, "event_type", "stored", "model_name", "m", "block_size", 16,
		"additional_salt", nil, "lora_name", nil, "tenant_id", "default", "backend_id", "pool-a", "medium", medium,
		"dp_rank", 0, "group_id", nil, "seq_hashes", []any{}, "base_block_idx", nil, "object_key", objectKey,
		"connector_block_hash", fmt.Sprintf("%016x", key), "parent_hash", nil, "token_ids", nil)
}

func mcBatch(tsMillis int64, events ...[]byte) []byte {
	var b []byte
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendInt64(b, tsMillis)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, e := range events {
		b = append(b, e...)
	}
	return msgp.AppendInt(b, 0)
}

// TestRPCAndHTTPAgree registers publishers of every kind through both protocols, feeds
// real events, and checks that RPC (rpcclient) and HTTP give the same answers for many
// queries, the global view and the service list, besides the expected figures.
func TestRPCAndHTTPAgree(t *testing.T) {
	app, logs := startRPCTestApp(t)
	defer func() {
		if t.Failed() {
			t.Logf("conductor log:\n%s", logs)
		}
	}()
	cl, ctx := dialRPC(t, app, 60*time.Second)

	pa0, pa1, pb0, pc, pm := newPublisher(t, false), newPublisher(t, true), newPublisher(t, false), newPublisher(t, false), newPublisher(t, false)
	viaRPC := func(cfg cororpc.ServiceConfig) {
		t.Helper()
		res, code, err := cl.Register(ctx, &cfg)
		if err != nil || code != cororpc.CodeOK || res.InstanceID != cfg.InstanceID || !res.IsNew {
			t.Fatalf("rpc register %s: %+v %v %v", cfg.InstanceID, res, code, err)
		}
	}
	viaHTTP := func(body []byte) {
		t.Helper()
		mustRegister(t, app, "", body)
	}
	viaRPC(cororpc.ServiceConfig{Endpoint: pa0.Endpoint(), ModelName: "m", TenantID: "default", InstanceID: "a", BlockSize: 16, HashProfile: rgVLLMProfile})
	viaHTTP(registerBody(pa1.Endpoint(), "a", 1, "replay_endpoint", pa1.ReplayEndpoint()))
	viaRPC(cororpc.ServiceConfig{Endpoint: pb0.Endpoint(), ModelName: "m", TenantID: "", InstanceID: "b", BlockSize: 16,
		HasCacheGroup: true, HashProfile: rgVLLMProfile})
	viaHTTP(registerBody(pc.Endpoint(), "c", 0, "type", "SGLang", "modelname", "s",
		"hash_profile", profileMap("sglang", "sha256_raw", "", "first64_be")))
	viaRPC(cororpc.ServiceConfig{Endpoint: pm.Endpoint(), PublisherKind: publisher.Mooncake, ModelName: "m", TenantID: "default",
		InstanceID: "pool", BlockSize: 16, HashProfile: rgVLLMProfile})
	for _, p := range []*zmqtest.Publisher{pa0, pa1, pb0, pc, pm} {
		waitSub(t, p, 1)
	}

	prompt := seqTokens(64, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", prompt)
	salted := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "s1", prompt)
	sgPrompt := seqTokens(48, 100)
	sgKeys := blockKeys(t, "sglang", "sha256_raw", "", "first64_be", 16, "", "", sgPrompt)
	publish := func(p *zmqtest.Publisher, payload []byte) {
		t.Helper()
		mustPublish(t, p, payload)
	}
	publish(pa0, vllmBatch(0, stored(keys, "GPU")))
	publish(pa1, vllmBatch(1, stored(keys[:2], "GPU")))
	publish(pb0, vllmBatch(0, stored(keys[:3], "GPU"), stored(salted[:1], "GPU")))
	publish(pc, vllmBatch(0, sglStored(sgKeys[0], "GPU"), sglStored(sgKeys[0], "CPU_PINNED"), sglStored(sgKeys[1], "CPU_PINNED"),
		sglStored(sgKeys[0], "DISK"), sglStored(sgKeys[1], "DISK"), sglStored(sgKeys[2], "DISK")))
	const ts = int64(1757500000250)
	publish(pm, mcBatch(ts, mcStored(keys[0], ts, "cpu", "obj-0"), mcStored(keys[1], ts, "cpu", "obj-1"),
		mcStored(keys[2], ts, "cpu", "obj-2"), mcStored(keys[3], ts, "disk", "obj-3")))

	type query struct {
		name                        string
		model, lora, tenant         string
		tokens                      []int32
		salt, filter                string
		want                        map[string]xHit // nil: only compare the protocols
		bs                          int64
		httpStatus                  int
		rpcCode                     cororpc.ErrorCode
		hasSalt, hasFilter, emptyOK bool
	}
	zero := func(ranks ...string) xHit {
		x := xHit{DP: map[string]int64{}, RM: map[string][4]int64{}}
		for _, r := range ranks {
			x.DP[r], x.RM[r] = 0, [4]int64{}
		}
		return x
	}
	full := map[string]xHit{
		"a": {Tiers: [5]int64{64, 64, 64, 64, 64}, DP: map[string]int64{"0": 64, "1": 32},
			RM: map[string][4]int64{"0": {64, 64, 64, 64}, "1": {32, 32, 48, 64}}},
		"b": {Tiers: [5]int64{64, 48, 48, 48, 64}, DP: map[string]int64{"0": 48}, RM: map[string][4]int64{"0": {48, 48, 48, 64}}},
	}
	queries := []query{
		{name: "full hit", model: "m", tokens: prompt, want: full},
		{name: "partial (40 tokens: 2 blocks + tail)", model: "m", tokens: prompt[:40], want: map[string]xHit{
			"a": {Tiers: [5]int64{32, 32, 32, 32, 32}, DP: map[string]int64{"0": 32, "1": 32}, RM: map[string][4]int64{"0": {32, 32, 32, 32}, "1": {32, 32, 32, 32}}},
			"b": {Tiers: [5]int64{32, 32, 32, 32, 32}, DP: map[string]int64{"0": 32}, RM: map[string][4]int64{"0": {32, 32, 32, 32}}},
		}},
		{name: "miss", model: "m", tokens: seqTokens(64, 5000), want: map[string]xHit{"a": zero("0", "1"), "b": zero("0")}},
		{name: "filter a", model: "m", tokens: prompt, filter: "a", want: map[string]xHit{"a": full["a"]}},
		{name: "filter unknown", model: "m", tokens: prompt, filter: "zzz", want: map[string]xHit{}},
		{name: "filter Mooncake registration", model: "m", tokens: prompt, filter: "pool", want: map[string]xHit{}},
		{name: "salt s1", model: "m", tokens: prompt, salt: "s1", want: map[string]xHit{
			"a": zero("0", "1"),
			"b": {Tiers: [5]int64{16, 16, 16, 16, 16}, DP: map[string]int64{"0": 16}, RM: map[string][4]int64{"0": {16, 16, 16, 16}}},
		}},
		{name: "salt and filter", model: "m", tokens: prompt, salt: "s1", filter: "b"},
		{name: "no tokens", model: "m", tokens: []int32{}, want: map[string]xHit{"a": zero("0", "1"), "b": zero("0")}},
		{name: "SGLang tiers", model: "s", tokens: sgPrompt, want: map[string]xHit{
			"c": {Tiers: [5]int64{48, 16, 32, 32, 48}, DP: map[string]int64{"0": 16}, RM: map[string][4]int64{"0": {16, 32, 32, 48}}},
		}},
		{name: "SGLang partial page", model: "s", tokens: sgPrompt[:40]},
		{name: "unknown model", model: "x", tokens: prompt, want: map[string]xHit{}},
		{name: "other tenant", model: "m", tenant: "t2", tokens: prompt, want: map[string]xHit{}},
		{name: "explicit default tenant", model: "m", tenant: "default", tokens: prompt, want: full},
		{name: "lora context absent", model: "m", lora: "lora-a", tokens: prompt, want: map[string]xHit{}},
		{name: "block size 32 context absent", model: "m", bs: 32, tokens: prompt, want: map[string]xHit{}},
		{name: "empty model", model: "", tokens: prompt, httpStatus: 400, rpcCode: cororpc.CodeInvalidParams},
		{name: "block size 0", model: "m", bs: -1, tokens: prompt, httpStatus: 400, rpcCode: cororpc.CodeInvalidParams},
		{name: "negative token under SGLang", model: "s", tokens: []int32{1, -2, 3}, httpStatus: 400, rpcCode: cororpc.CodeInvalidParams},
		{name: "negative tokens under vLLM hash", model: "m", tokens: seqTokens(32, -40)},
	}
	var res cororpc.QueryResult
	for _, q := range queries {
		bs := int64(16)
		switch {
		case q.bs == -1:
			bs = 0
		case q.bs != 0:
			bs = q.bs
		}
		rq := cororpc.QueryRequest{Context: cororpc.ContextKey{TenantID: q.tenant, ModelName: q.model, LoraName: q.lora, BlockSize: bs},
			Tokens: q.tokens, CacheSalt: q.salt, HasCacheSalt: q.salt != "", InstanceFilter: q.filter, HasInstanceFilter: q.filter != ""}
		extra := []any{}
		if q.lora != "" {
			extra = append(extra, "lora_name", q.lora)
		}
		if q.tenant != "" {
			extra = append(extra, "tenant_id", q.tenant)
		}
		if q.salt != "" {
			extra = append(extra, "cache_salt", q.salt)
		}
		if q.filter != "" {
			extra = append(extra, "instance_id", q.filter)
		}
		httpBody := queryBody(q.model, int(bs), q.tokens, extra...)
		if q.httpStatus != 0 {
			code, err := cl.Query(ctx, &rq, &res)
			if err != nil || code != q.rpcCode {
				t.Errorf("%s: rpc code %v err %v, want %v", q.name, code, err, q.rpcCode)
			}
			if status, resp := msgpackPost(t, app, "/query", httpBody); status != q.httpStatus {
				t.Errorf("%s: http %d %v, want %d", q.name, status, resp, q.httpStatus)
			}
			continue
		}
		var viaRPC, viaHTTP map[string]xHit
		// Events travel asynchronously: wait for the expected figures, then compare.
		eventually(t, q.name, func() error {
			code, err := cl.Query(ctx, &rq, &res)
			if err != nil || code != cororpc.CodeOK {
				return fmt.Errorf("rpc query: %v %v", code, err)
			}
			viaRPC = hitsOfRPC(&res)
			status, resp := msgpackPost(t, app, "/query", httpBody)
			if status != http.StatusOK {
				return fmt.Errorf("http query: %d %v", status, resp)
			}
			viaHTTP = hitsOfHTTP(t, resp)
			if q.want != nil && !reflect.DeepEqual(viaRPC, q.want) {
				return fmt.Errorf("rpc answer %+v, want %+v", viaRPC, q.want)
			}
			if !reflect.DeepEqual(viaRPC, viaHTTP) {
				return fmt.Errorf("rpc %+v != http %+v", viaRPC, viaHTTP)
			}
			return nil
		})
	}

	gv, err := cl.GetGlobalView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int(gv.ContextCount) != len(gv.Contexts) {
		t.Errorf("context_count %d for %d contexts", gv.ContextCount, len(gv.Contexts))
	}
	_, httpView := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	rv, hv := viewOfRPC(&gv), viewOfHTTP(t, httpView)
	if !reflect.DeepEqual(rv, hv) {
		t.Errorf("global view differs:\n rpc %+v\nhttp %+v", rv, hv)
	}
	if len(rv) != 2 || rv[0].Model != "m" || rv[1].Model != "s" || rv[0].PrefixCount != 5 || rv[1].PrefixCount != 3 ||
		!reflect.DeepEqual(rv[0].Instances, map[string][]int64{"a": {0, 1}, "b": {0}}) || rv[0].Profile[3] != rgRootVLLMCBOR0 {
		t.Errorf("global view %+v", rv)
	}

	list, err := cl.ListServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, httpSvcs := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	rs, hs := servicesOfRPC(list), servicesOfHTTP(t, httpSvcs)
	if !reflect.DeepEqual(rs, hs) {
		t.Errorf("services differ:\n rpc %+v\nhttp %+v", rs, hs)
	}
	keysOf := make([]string, len(rs))
	for i, s := range rs {
		keysOf[i] = s.Instance + "|" + s.Tenant + "|" + strconv.FormatInt(s.DPRank, 10)
	}
	if !sort.StringsAreSorted(keysOf) || strings.Join(keysOf, ",") != "a|default|0,a|default|1,b|default|0,c|default|0,pool|default|0" {
		t.Errorf("service keys %v", keysOf)
	}
	if rs[1].Replay != pa1.ReplayEndpoint() || rs[2].CacheGroup != "0" || rs[3].Type != "SGLang" || rs[4].Type != "Mooncake" {
		t.Errorf("services %+v", rs)
	}

	// Unregistering through one protocol is seen by the other.
	if _, code, err := cl.Unregister(ctx, "a", "", 1); err != nil || code != cororpc.CodeOK {
		t.Fatalf("rpc unregister: %v %v", code, err)
	}
	if code, resp := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "dp_rank", 1)); code != http.StatusNotFound {
		t.Errorf("http unregister of an rpc-unregistered service: %d %v", code, resp)
	}
	if code, _ := msgpackPost(t, app, "/unregister", mp("instance_id", "b", "dp_rank", 0)); code != http.StatusOK {
		t.Errorf("http unregister b: %d", code)
	}
	if _, code, err := cl.Unregister(ctx, "b", "default", 0); err != nil || code != cororpc.CodeServiceNotFound {
		t.Errorf("rpc unregister of an http-unregistered service: %v %v", code, err)
	}
	rq := cororpc.QueryRequest{Context: cororpc.ContextKey{ModelName: "m", BlockSize: 16}, Tokens: prompt}
	if code, err := cl.Query(ctx, &rq, &res); err != nil || code != cororpc.CodeOK {
		t.Fatal(code, err)
	}
	_, resp := msgpackPost(t, app, "/query", queryBody("m", 16, prompt))
	if rh, hh := hitsOfRPC(&res), hitsOfHTTP(t, resp); !reflect.DeepEqual(rh, hh) || len(rh) != 1 ||
		!reflect.DeepEqual(rh["a"].DP, map[string]int64{"0": 64}) {
		t.Errorf("after unregister: rpc %+v http %+v", rh, hh)
	}
}

// TestRPCQueryDispatchAllocs: once a connection's buffers are warm, answering a Query
// with hits on several ranks allocates nothing, and produces the bytes a client receives.
func TestRPCQueryDispatchAllocs(t *testing.T) {
	app, _ := startRPCTestApp(t)
	rc := dialRawRPC(t, app.RPCAddr)
	var pubs []*zmqtest.Publisher
	for dp := range 2 {
		p := newPublisher(t, false)
		cfg := cororpc.ServiceConfig{Endpoint: p.Endpoint(), ModelName: "m", TenantID: "default", InstanceID: "e",
			BlockSize: 16, DPRank: int32(dp), HashProfile: rgVLLMProfile}
		rc.call(1, cororpc.FuncRegister, cororpc.AppendServiceConfig(nil, &cfg))
		waitSub(t, p, 1)
		pubs = append(pubs, p)
	}
	tokens := seqTokens(2048, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	for dp, p := range pubs {
		mustPublish(t, p, vllmBatch(dp, stored(keys[:len(keys)-dp], "GPU")))
	}
	body := cororpc.AppendQueryRequest(nil, &cororpc.QueryRequest{
		Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: tokens})
	var overNet []byte
	eventually(t, "both ranks indexed", func() error {
		overNet = rc.call(2, cororpc.FuncQuery, body)
		var res cororpc.QueryResult
		if code, err := cororpc.DecodeQueryResponse(overNet, &res); err != nil || code != cororpc.CodeOK ||
			len(res.Instances) != 1 || len(res.Instances[0].Hit.DP) != 2 || res.Instances[0].Hit.DP[1].Value != 2048-16 ||
			res.Instances[0].Hit.DP[0].Value != 2048 {
			return fmt.Errorf("answer %+v %v %v", res, code, err)
		}
		return nil
	})

	conn := app.RPC.Dispatcher()
	hdr := cororpc.RequestHeader{SeqNum: 2, FunctionID: cororpc.FuncQuery, Length: uint32(len(body))}
	var out []byte
	dispatch := func() {
		var err error
		if out, err = conn.Dispatch(hdr, body); err != nil {
			t.Fatal(err)
		}
	}
	dispatch()
	wantBytes(t, "dispatched frame vs network answer", out, cororpc.AppendResponse(nil, 2, 0, overNet))
	if n := testing.AllocsPerRun(50, dispatch); n != 0 {
		t.Errorf("Query dispatch allocates %.1f times per call, want 0", n)
	}
}
