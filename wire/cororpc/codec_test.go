package cororpc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// hx decodes hex with spaces allowed, failing the test on bad input.
func rpcHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	return b
}

func rpcEqualBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s:\n got %x\nwant %x", what, got, want)
	}
}

func rpcDeepEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

var (
	rpcGoldenQueryArgs       = "1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 03 01000000 02000000 03000000 00 00"
	rpcGoldenQueryArgsSalted = "1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 03 01000000 02000000 03000000 01 01 73 01 01 65"
	rpcGoldenQueryRespEmpty  = "ccd2d5ad 01 00"
	rpcGoldenQueryRespOne    = "ccd2d5ad0101016530000000000000000100000000000000002000000000000000010000" +
		"000000000000200000000000000020000000000000003000000000000000300000000000" +
		"00002000000000000000200000000000000030000000000000003000000000000000"
	rpcGoldenQueryRespInvalid = "ccd2d5ad 00 a8fdffff"
	rpcGoldenRegisterArgs     = "102aa7f2147463703a2f2f3132372e302e302e313a353535370000000000016d000764656661756c740165" +
		"1000000000000000000000000007766c6c6d5f76310b7368613235365f63626f72013000086c6f7736345f6265"
	rpcGoldenRegisterRespOK      = "a80190d8 01 01 65 01"
	rpcGoldenUnregisterArgs      = "1aca8199 01 65 07 64656661756c74 00000000"
	rpcGoldenUnregisterNotFound  = "5c3854f3 00 2ff8ffff"
	rpcGoldenUnregisterRespOK    = "5c3854f3 01 0b 657c64656661756c747c30"
	rpcGoldenGlobalViewEmpty     = "58de0b3a 00000000 00"
	rpcGoldenListServicesEmpty   = "f8427866 00"
	rpcCBORSeed0Root             = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
	rpcGoldenQuery70000Head      = "1d1a00f9100700000064656661756c74010000006d000000"
	rpcGoldenQuery70000SHA       = "cdefb9ae539f78678edf162125ad998ec6ec100b8e29a1a28a66d478aebf51c1"
	rpcGoldenQueryResp300Head    = "cdd2d5ad08012c0104006930303010000000000000000100"
	rpcGoldenQueryResp300SHA     = "5a0d1516ce3716f443efce367ab6d73b28145a02d0a90280f7c06cd5a78efadb"
	rpcGoldenGlobalView300Head   = "59de0b3a08010000000100070064656661756c7401006d00"
	rpcGoldenGlobalView300SHA    = "9f4ae0d29fec885a1f9ad338ff35d5f769b0396ba6755d56d68abacece65784d"
	rpcGoldenQueryArgsBaseCtx    = ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	rpcGoldenVLLMProfile         = HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}
	rpcGoldenRegisterArgsService = ServiceConfig{
		Endpoint: "tcp://127.0.0.1:5557", PublisherKind: publisher.VLLM, ModelName: "m",
		TenantID: "default", InstanceID: "e", BlockSize: 16, HashProfile: rpcGoldenVLLMProfile,
	}
)

func TestRPCQueryRequestGoldens(t *testing.T) {
	cases := []struct {
		name string
		hex  string
		q    QueryRequest
	}{
		{"plain", rpcGoldenQueryArgs, QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: []int32{1, 2, 3}}},
		{"salt and filter", rpcGoldenQueryArgsSalted, QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: []int32{1, 2, 3},
			CacheSalt: "s", HasCacheSalt: true, InstanceFilter: "e", HasInstanceFilter: true}},
		{"300 tokens", rpcGoldenQueryArgs300Hex, QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: rpcSeqTokens(1, 300)}},
		{"model of 300 x", rpcGoldenQueryArgsModel300Hex, QueryRequest{
			Context: ContextKey{TenantID: "default", ModelName: strings.Repeat("x", 300), BlockSize: 16}, Tokens: []int32{7}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := rpcHex(t, c.hex)
			rpcEqualBytes(t, "encode", AppendQueryRequest(nil, &c.q), want)
			var got QueryRequest
			if err := DecodeQueryRequest(want, &got); err != nil {
				t.Fatal(err)
			}
			rpcDeepEqual(t, "decode", got, c.q)
		})
	}
}

func rpcSeqTokens(from int32, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

func rpcCheckLongGolden(t *testing.T, body []byte, wantLen int, head, sum string) {
	t.Helper()
	if len(body) != wantLen {
		t.Fatalf("length %d, want %d", len(body), wantLen)
	}
	rpcEqualBytes(t, "head", body[:24], rpcHex(t, head))
	got := sha256.Sum256(body)
	if hex.EncodeToString(got[:]) != sum {
		t.Fatalf("sha256 %x, want %s", got, sum)
	}
}

func TestRPCQueryRequest70000Tokens(t *testing.T) {
	q := QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: rpcSeqTokens(-35000, 70000)}
	body := AppendQueryRequest(nil, &q)
	rpcCheckLongGolden(t, body, 280039, rpcGoldenQuery70000Head, rpcGoldenQuery70000SHA)
	var got QueryRequest
	if err := DecodeQueryRequest(body, &got); err != nil {
		t.Fatal(err)
	}
	rpcDeepEqual(t, "decode", got, q)
}

// rpcInstances300 is the long-golden query result: i000..i299, each lm16 dp{0:16}
// rm{0:16,16,16,16} and tiers 16.
func rpcInstances300() QueryResult {
	var res QueryResult
	for i := range 300 {
		res.Instances = append(res.Instances, InstanceHit{
			InstanceID: fmt.Sprintf("i%03d", i),
			Hit: CacheHitResult{LongestMatchTokens: 16, DP: []RankValue{{0, 16}},
				RankMatches: []RankTiers{{0, 16, 16, 16, 16}}, Device: 16, CPULocal: 16, CPUShare: 16, Disk: 16},
		})
	}
	return res
}

func TestRPCQueryResponseGoldens(t *testing.T) {
	one := QueryResult{Instances: []InstanceHit{{InstanceID: "e", Hit: CacheHitResult{
		LongestMatchTokens: 48, DP: []RankValue{{0, 32}}, RankMatches: []RankTiers{{0, 32, 32, 48, 48}},
		Device: 32, CPULocal: 32, CPUShare: 48, Disk: 48}}}}
	for _, c := range []struct {
		name string
		hex  string
		res  QueryResult
	}{{"empty", rpcGoldenQueryRespEmpty, QueryResult{}}, {"one instance", rpcGoldenQueryRespOne, one}} {
		t.Run(c.name, func(t *testing.T) {
			want := rpcHex(t, c.hex)
			got, err := AppendQueryResult(nil, &c.res)
			if err != nil {
				t.Fatal(err)
			}
			rpcEqualBytes(t, "encode", got, want)
			var dec QueryResult
			ec, err := DecodeQueryResponse(want, &dec)
			if err != nil || ec != CodeOK {
				t.Fatalf("decode: %v %v", ec, err)
			}
			if len(c.res.Instances) == 0 {
				c.res.Instances = dec.Instances[:0] // nil vs empty is not a wire difference
			}
			rpcDeepEqual(t, "decode", dec, c.res)
		})
	}
	t.Run("INVALID_PARAMS", func(t *testing.T) {
		want := rpcHex(t, rpcGoldenQueryRespInvalid)
		rpcEqualBytes(t, "encode", AppendQueryError(nil, CodeInvalidParams), want)
		dec := rpcInstances300() // must be emptied
		ec, err := DecodeQueryResponse(want, &dec)
		if err != nil || ec != CodeInvalidParams || len(dec.Instances) != 0 {
			t.Fatalf("decode: %v %v %d", ec, err, len(dec.Instances))
		}
	})
	t.Run("300 instances", func(t *testing.T) {
		res := rpcInstances300()
		body, err := AppendQueryResult(nil, &res)
		if err != nil {
			t.Fatal(err)
		}
		rpcCheckLongGolden(t, body, 31808, rpcGoldenQueryResp300Head, rpcGoldenQueryResp300SHA)
		var dec QueryResult
		if ec, err := DecodeQueryResponse(body, &dec); err != nil || ec != CodeOK {
			t.Fatalf("decode: %v %v", ec, err)
		}
		rpcDeepEqual(t, "decode", dec, res)
	})
}

func TestRPCRegisterGoldens(t *testing.T) {
	want := rpcHex(t, rpcGoldenRegisterArgs)
	rpcEqualBytes(t, "encode args", AppendServiceConfig(nil, &rpcGoldenRegisterArgsService), want)
	var cfg ServiceConfig
	if err := DecodeServiceConfig(want, &cfg); err != nil {
		t.Fatal(err)
	}
	rpcDeepEqual(t, "decode args", cfg, rpcGoldenRegisterArgsService)

	resp := rpcHex(t, rpcGoldenRegisterRespOK)
	rpcEqualBytes(t, "encode resp", AppendRegisterResult(nil, RegisterResult{"e", true}), resp)
	res, ec, err := DecodeRegisterResponse(resp)
	if err != nil || ec != CodeOK || res != (RegisterResult{"e", true}) {
		t.Fatalf("decode resp: %+v %v %v", res, ec, err)
	}

	errBody := AppendRegisterError(nil, CodeInvalidParams)
	rpcEqualBytes(t, "encode error", errBody, rpcHex(t, "a80190d8 00 a8fdffff"))
	res, ec, err = DecodeRegisterResponse(errBody)
	if err != nil || ec != CodeInvalidParams || res != (RegisterResult{}) {
		t.Fatalf("decode error: %+v %v %v", res, ec, err)
	}
}

func TestRPCUnregisterGoldens(t *testing.T) {
	want := rpcHex(t, rpcGoldenUnregisterArgs)
	rpcEqualBytes(t, "encode args", AppendUnregisterArgs(nil, "e", "default", 0), want)
	id, tenant, rank, err := DecodeUnregisterArgs(want)
	if err != nil || id != "e" || tenant != "default" || rank != 0 {
		t.Fatalf("decode args: %q %q %d %v", id, tenant, rank, err)
	}

	nf := rpcHex(t, rpcGoldenUnregisterNotFound)
	rpcEqualBytes(t, "encode not found", AppendUnregisterError(nil, CodeServiceNotFound), nf)
	res, ec, err := DecodeUnregisterResponse(nf)
	if err != nil || ec != CodeServiceNotFound || res.RemovedKey != "" {
		t.Fatalf("decode not found: %+v %v %v", res, ec, err)
	}

	ok := rpcHex(t, rpcGoldenUnregisterRespOK)
	rpcEqualBytes(t, "encode ok", AppendUnregisterResult(nil, UnregisterResult{"e|default|0"}), ok)
	res, ec, err = DecodeUnregisterResponse(ok)
	if err != nil || ec != CodeOK || res.RemovedKey != "e|default|0" {
		t.Fatalf("decode ok: %+v %v %v", res, ec, err)
	}
}

func rpcGlobalView300() GlobalView {
	prof := rpcGoldenVLLMProfile
	prof.RootDigest = rpcCBORSeed0Root
	cv := ContextView{Context: rpcGoldenQueryArgsBaseCtx, Profile: prof, PrefixCount: 42}
	for i := range 300 {
		cv.InstanceRanks = append(cv.InstanceRanks, InstanceRanks{InstanceID: fmt.Sprintf("i%03d", i), Ranks: []int64{0}})
	}
	return GlobalView{ContextCount: 1, Contexts: []ContextView{cv}}
}

func TestRPCGlobalViewGoldens(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		want := rpcHex(t, rpcGoldenGlobalViewEmpty)
		got, err := AppendGlobalView(nil, &GlobalView{})
		if err != nil {
			t.Fatal(err)
		}
		rpcEqualBytes(t, "encode", got, want)
		v, err := DecodeGlobalView(want)
		if err != nil || v.ContextCount != 0 || len(v.Contexts) != 0 {
			t.Fatalf("decode: %+v %v", v, err)
		}
	})
	t.Run("one context", func(t *testing.T) {
		prof := rpcGoldenVLLMProfile
		prof.RootDigest = rpcCBORSeed0Root
		gv := GlobalView{ContextCount: 1, Contexts: []ContextView{{Context: rpcGoldenQueryArgsBaseCtx, Profile: prof,
			InstanceRanks: []InstanceRanks{{"e", []int64{0, 1}}}, PrefixCount: 42}}}
		want := rpcHex(t, rpcGoldenGlobalView152Hex)
		got, err := AppendGlobalView(nil, &gv)
		if err != nil {
			t.Fatal(err)
		}
		rpcEqualBytes(t, "encode", got, want)
		v, err := DecodeGlobalView(want)
		if err != nil {
			t.Fatal(err)
		}
		rpcDeepEqual(t, "decode", v, gv)
	})
	t.Run("300 instances", func(t *testing.T) {
		gv := rpcGlobalView300()
		body, err := AppendGlobalView(nil, &gv)
		if err != nil {
			t.Fatal(err)
		}
		rpcCheckLongGolden(t, body, 4944, rpcGoldenGlobalView300Head, rpcGoldenGlobalView300SHA)
		v, err := DecodeGlobalView(body)
		if err != nil {
			t.Fatal(err)
		}
		rpcDeepEqual(t, "decode", v, gv)
	})
}

func TestRPCServiceListGoldens(t *testing.T) {
	want := rpcHex(t, rpcGoldenListServicesEmpty)
	rpcEqualBytes(t, "encode empty", AppendServiceList(nil, nil), want)
	list, err := DecodeServiceList(want)
	if err != nil || len(list) != 0 {
		t.Fatalf("decode empty: %v %v", list, err)
	}

	sg := []ServiceConfig{{
		Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", PublisherKind: publisher.SGLang,
		ModelName: "m", TenantID: "default", InstanceID: "e", BlockSize: 16, DPRank: 1, CacheGroup: 0, HasCacheGroup: true,
		HashProfile: HashProfile{Strategy: "sglang", Algorithm: "sha256_raw", PythonHashSeed: "0",
			RootDigest: strings.Repeat("0", 64), IndexProjection: "first64_be"},
	}}
	want = rpcHex(t, rpcGoldenListServicesSGLangHex)
	rpcEqualBytes(t, "encode sglang", AppendServiceList(nil, sg), want)
	list, err = DecodeServiceList(want)
	if err != nil {
		t.Fatal(err)
	}
	rpcDeepEqual(t, "decode sglang", list, sg)
}

// rpcGoldenBody pairs a golden body with its decoder, for the malformed-input tests.
type rpcGoldenBody struct {
	name   string
	body   []byte
	decode func([]byte) error
}

func rpcDecodeQueryReq(b []byte) error { var q QueryRequest; return DecodeQueryRequest(b, &q) }
func rpcDecodeQueryResp(b []byte) error {
	var r QueryResult
	_, err := DecodeQueryResponse(b, &r)
	return err
}
func rpcDecodeServiceConfig(b []byte) error {
	var c ServiceConfig
	return DecodeServiceConfig(b, &c)
}
func rpcDecodeRegisterResp(b []byte) error { _, _, err := DecodeRegisterResponse(b); return err }
func rpcDecodeUnregArgs(b []byte) error    { _, _, _, err := DecodeUnregisterArgs(b); return err }
func rpcDecodeUnregResp(b []byte) error    { _, _, err := DecodeUnregisterResponse(b); return err }
func rpcDecodeGlobalView(b []byte) error   { _, err := DecodeGlobalView(b); return err }
func rpcDecodeServiceList(b []byte) error  { _, err := DecodeServiceList(b); return err }

func rpcGoldenBodies(t *testing.T) []rpcGoldenBody {
	res300 := rpcInstances300()
	resp300, _ := AppendQueryResult(nil, &res300)
	gv300 := rpcGlobalView300()
	gvBody, _ := AppendGlobalView(nil, &gv300)
	return []rpcGoldenBody{
		{"query args", rpcHex(t, rpcGoldenQueryArgs), rpcDecodeQueryReq},
		{"query args salted", rpcHex(t, rpcGoldenQueryArgsSalted), rpcDecodeQueryReq},
		{"query args 300", rpcHex(t, rpcGoldenQueryArgs300Hex), rpcDecodeQueryReq},
		{"query args model 300", rpcHex(t, rpcGoldenQueryArgsModel300Hex), rpcDecodeQueryReq},
		{"query resp empty", rpcHex(t, rpcGoldenQueryRespEmpty), rpcDecodeQueryResp},
		{"query resp one", rpcHex(t, rpcGoldenQueryRespOne), rpcDecodeQueryResp},
		{"query resp invalid", rpcHex(t, rpcGoldenQueryRespInvalid), rpcDecodeQueryResp},
		{"query resp 300", resp300, rpcDecodeQueryResp},
		{"register args", rpcHex(t, rpcGoldenRegisterArgs), rpcDecodeServiceConfig},
		{"register resp", rpcHex(t, rpcGoldenRegisterRespOK), rpcDecodeRegisterResp},
		{"unregister args", rpcHex(t, rpcGoldenUnregisterArgs), rpcDecodeUnregArgs},
		{"unregister not found", rpcHex(t, rpcGoldenUnregisterNotFound), rpcDecodeUnregResp},
		{"unregister ok", rpcHex(t, rpcGoldenUnregisterRespOK), rpcDecodeUnregResp},
		{"global view empty", rpcHex(t, rpcGoldenGlobalViewEmpty), rpcDecodeGlobalView},
		{"global view 152", rpcHex(t, rpcGoldenGlobalView152Hex), rpcDecodeGlobalView},
		{"global view 300", gvBody, rpcDecodeGlobalView},
		{"services empty", rpcHex(t, rpcGoldenListServicesEmpty), rpcDecodeServiceList},
		{"services sglang", rpcHex(t, rpcGoldenListServicesSGLangHex), rpcDecodeServiceList},
	}
}

func TestRPCDecodeTruncated(t *testing.T) {
	for _, g := range rpcGoldenBodies(t) {
		if err := g.decode(g.body); err != nil {
			t.Fatalf("%s: golden does not decode: %v", g.name, err)
		}
		for n := range len(g.body) {
			if len(g.body) > 400 && n > 64 && n < len(g.body)-64 && n%97 != 0 {
				continue // sample the middle of long bodies
			}
			err := g.decode(g.body[:n])
			if err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes decoded", g.name, n, len(g.body))
			}
			if !errors.Is(err, ErrStructPackTruncated) && !errors.Is(err, ErrStructPackLength) {
				t.Fatalf("%s: prefix %d: unexpected error %v", g.name, n, err)
			}
		}
	}
}

func TestRPCDecodeTrailingAndTypeCode(t *testing.T) {
	bodies := rpcGoldenBodies(t)
	for _, g := range bodies {
		err := g.decode(append(bytes.Clone(g.body), 0))
		if !errors.Is(err, ErrStructPackTrailing) {
			t.Fatalf("%s + 1 byte: got %v, want trailing", g.name, err)
		}
		bad := bytes.Clone(g.body)
		bad[1] ^= 0x40
		if err := g.decode(bad); !errors.Is(err, ErrStructPackTypeCode) {
			t.Fatalf("%s with altered type code: got %v", g.name, err)
		}
	}
	// Every decoder rejects every other message's body by its type code.
	for _, a := range bodies {
		for _, b := range bodies {
			if reflect.ValueOf(a.decode).Pointer() == reflect.ValueOf(b.decode).Pointer() {
				continue
			}
			if err := a.decode(b.body); !errors.Is(err, ErrStructPackTypeCode) {
				t.Fatalf("decoder of %s accepted %s: %v", a.name, b.name, err)
			}
		}
	}
}

func TestRPCDecodeOversizeLengths(t *testing.T) {
	// Token count 255 with 12 token bytes left.
	b := rpcHex(t, rpcGoldenQueryArgs)
	b[4+1+7+1+1+1+8] = 0xff
	if err := rpcDecodeQueryReq(b); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("token count 255: %v", err)
	}
	// 4-byte widths: a count of 2^32-1 must fail before any allocation.
	q := QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: rpcSeqTokens(0, 70000)}
	body := AppendQueryRequest(nil, &q)
	off := 4 + 1 + (4 + 7) + (4 + 1) + 4 + 8
	copy(body[off:], []byte{0xff, 0xff, 0xff, 0xff})
	if err := DecodeQueryRequest(body, &QueryRequest{}); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("token count 2^32-1: %v", err)
	}
	// Averaged over many decodes: TotalAlloc is process-wide, and a few KiB allocated
	// elsewhere meanwhile (the runtime, the test framework) once failed a single decode.
	const runs = 100
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		_ = DecodeQueryRequest(body, &QueryRequest{})
	}
	runtime.ReadMemStats(&after)
	if n := (after.TotalAlloc - before.TotalAlloc) / runs; n > 4096 { // only the error message
		t.Fatalf("hostile length allocated %d bytes per decode", n)
	}
	// A string length beyond the body.
	s := rpcHex(t, rpcGoldenUnregisterArgs)
	s[4+1+1] = 0xf0 // tenant length 240
	if err := rpcDecodeUnregArgs(s); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("string length: %v", err)
	}
	// Instance count far beyond what 31808 bytes can hold.
	res := rpcInstances300()
	resp, _ := AppendQueryResult(nil, &res)
	resp[6], resp[7] = 0xff, 0xff
	if err := rpcDecodeQueryResp(resp); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("instance count: %v", err)
	}
	// A 300-entry service list claimed in a tiny body.
	sl := rpcHex(t, rpcGoldenListServicesEmpty)
	sl[4] = 200
	if err := rpcDecodeServiceList(sl); !errors.Is(err, ErrStructPackLength) {
		t.Fatalf("service count: %v", err)
	}
}

func TestRPCDecodeBadFlagsAndOrder(t *testing.T) {
	b := rpcHex(t, rpcGoldenQueryArgs)
	b[len(b)-1] = 2 // instance_filter presence byte
	if err := rpcDecodeQueryReq(b); !errors.Is(err, ErrStructPackValue) {
		t.Fatalf("optional flag 2: %v", err)
	}
	r := rpcHex(t, rpcGoldenRegisterRespOK)
	r[len(r)-1] = 7 // is_new
	if err := rpcDecodeRegisterResp(r); !errors.Is(err, ErrStructPackValue) {
		t.Fatalf("bool 7: %v", err)
	}
	e := rpcHex(t, rpcGoldenUnregisterNotFound)
	e[4] = 3 // expected flag
	if err := rpcDecodeUnregResp(e); !errors.Is(err, ErrStructPackValue) {
		t.Fatalf("expected flag 3: %v", err)
	}

	// Instances out of order: encoder refuses, decoder rejects swapped bytes.
	two := QueryResult{Instances: []InstanceHit{{InstanceID: "a"}, {InstanceID: "b"}}}
	body, err := AppendQueryResult(nil, &two)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.IndexByte(body, 'a'), bytes.IndexByte(body, 'b')
	body[i], body[j] = 'b', 'a'
	if err := rpcDecodeQueryResp(body); !errors.Is(err, ErrStructPackValue) {
		t.Fatalf("unsorted instances: %v", err)
	}
	two.Instances[0].InstanceID, two.Instances[1].InstanceID = "b", "a"
	if _, err := AppendQueryResult(nil, &two); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("encode unsorted instances: %v", err)
	}
	dup := QueryResult{Instances: []InstanceHit{{InstanceID: "a", Hit: CacheHitResult{DP: []RankValue{{1, 0}, {1, 0}}}}}}
	if _, err := AppendQueryResult(nil, &dup); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("encode duplicate dp ranks: %v", err)
	}
	dupRM := QueryResult{Instances: []InstanceHit{{InstanceID: "a", Hit: CacheHitResult{RankMatches: []RankTiers{{Rank: 2}, {Rank: -1}}}}}}
	if _, err := AppendQueryResult(nil, &dupRM); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("encode unsorted rank_matches: %v", err)
	}
	// Ranks within a set out of order.
	gv := GlobalView{Contexts: []ContextView{{InstanceRanks: []InstanceRanks{{"e", []int64{0, 1}}}}}}
	gb, err := AppendGlobalView(nil, &gv)
	if err != nil {
		t.Fatal(err)
	}
	k := len(gb) - 8 - 16 // the two ranks precede prefix_count
	copy(gb[k:], rpcHex(t, "0100000000000000 0000000000000000"))
	if err := rpcDecodeGlobalView(gb); !errors.Is(err, ErrStructPackValue) {
		t.Fatalf("unsorted set: %v", err)
	}
	gv.Contexts[0].InstanceRanks[0].Ranks = []int64{1, 0}
	if _, err := AppendGlobalView(nil, &gv); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("encode unsorted set: %v", err)
	}
	gv.Contexts[0].InstanceRanks = []InstanceRanks{{"f", nil}, {"e", nil}}
	if _, err := AppendGlobalView(nil, &gv); !errors.Is(err, ErrUnsorted) {
		t.Fatalf("encode unsorted instance map: %v", err)
	}
}

func TestRPCMetainfo(t *testing.T) {
	// Hand-built Unregister args with 8-byte lengths (metainfo 0x18) decode.
	b := []byte{0x1b, 0xca, 0x81, 0x99, 0x18}
	b = appendString(b, 8, "e")
	b = appendString(b, 8, "default")
	b = appendI32(b, 5)
	id, tenant, rank, err := DecodeUnregisterArgs(b)
	if err != nil || id != "e" || tenant != "default" || rank != 5 {
		t.Fatalf("width 8: %q %q %d %v", id, tenant, rank, err)
	}
	// A wider width than needed is still valid struct_pack.
	b = []byte{0x1b, 0xca, 0x81, 0x99, 0x10}
	b = appendString(b, 4, "e")
	b = appendString(b, 4, "t")
	b = appendI32(b, 1)
	if id, tenant, rank, err = DecodeUnregisterArgs(b); err != nil || id != "e" || tenant != "t" || rank != 1 {
		t.Fatalf("width 4: %q %q %d %v", id, tenant, rank, err)
	}
	for _, meta := range []byte{0x01, 0x04, 0x09, 0x20, 0x80} {
		bad := append([]byte{0x1b, 0xca, 0x81, 0x99, meta}, 1, 'e', 1, 't', 0, 0, 0, 0)
		if _, _, _, err := DecodeUnregisterArgs(bad); !errors.Is(err, ErrStructPackMetainfo) {
			t.Fatalf("metainfo %#x: %v", meta, err)
		}
	}
	if _, _, _, err := DecodeUnregisterArgs([]byte{0x1b, 0xca, 0x81, 0x99}); !errors.Is(err, ErrStructPackTruncated) {
		t.Fatalf("missing metainfo byte: %v", err)
	}
}

// rpcMetaOf returns the metainfo byte of an encoded body, or -1 when there is none.
func rpcMetaOf(body []byte) int {
	if body[0]&1 == 0 {
		return -1
	}
	return int(body[4])
}

func TestRPCWidthSwitches(t *testing.T) {
	for _, c := range []struct {
		n    int
		meta int
	}{{0, -1}, {255, -1}, {256, 0x08}, {65535, 0x08}, {65536, 0x10}} {
		s := strings.Repeat("z", c.n)
		// As a string inside each message type.
		q := QueryRequest{Context: ContextKey{TenantID: s, ModelName: "m", BlockSize: 1}, Tokens: []int32{1},
			CacheSalt: "x", HasCacheSalt: true}
		qb := AppendQueryRequest(nil, &q)
		if rpcMetaOf(qb) != c.meta {
			t.Fatalf("tenant of %d bytes: metainfo %d, want %d", c.n, rpcMetaOf(qb), c.meta)
		}
		var qd QueryRequest
		if err := DecodeQueryRequest(qb, &qd); err != nil || !reflect.DeepEqual(qd, q) {
			t.Fatalf("tenant of %d bytes: round trip %v", c.n, err)
		}
		// As a present optional string; absent optionals do not count.
		q2 := QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, InstanceFilter: s, HasInstanceFilter: true}
		if rpcMetaOf(AppendQueryRequest(nil, &q2)) != c.meta {
			t.Fatalf("filter of %d bytes: wrong metainfo", c.n)
		}
		q2.HasInstanceFilter = false
		if rpcMetaOf(AppendQueryRequest(nil, &q2)) != -1 {
			t.Fatalf("absent filter of %d bytes counted", c.n)
		}
		// As a token count.
		q3 := QueryRequest{Context: rpcGoldenQueryArgsBaseCtx, Tokens: make([]int32, c.n)}
		if rpcMetaOf(AppendQueryRequest(nil, &q3)) != c.meta {
			t.Fatalf("%d tokens: wrong metainfo", c.n)
		}
		// As a removed key, a service endpoint and an instance id.
		ub := AppendUnregisterResult(nil, UnregisterResult{s})
		if rpcMetaOf(ub) != c.meta {
			t.Fatalf("removed_key of %d bytes: wrong metainfo", c.n)
		}
		if res, _, err := DecodeUnregisterResponse(ub); err != nil || res.RemovedKey != s {
			t.Fatalf("removed_key of %d bytes: %v", c.n, err)
		}
		cfg := rpcGoldenRegisterArgsService
		cfg.HashProfile.RootDigest = s
		cb := AppendServiceConfig(nil, &cfg)
		if rpcMetaOf(cb) != c.meta {
			t.Fatalf("root_digest of %d bytes: wrong metainfo", c.n)
		}
		var cd ServiceConfig
		if err := DecodeServiceConfig(cb, &cd); err != nil || cd != cfg {
			t.Fatalf("root_digest of %d bytes: %v", c.n, err)
		}
		res := QueryResult{Instances: []InstanceHit{{InstanceID: s}}}
		rb, _ := AppendQueryResult(nil, &res)
		if rpcMetaOf(rb) != c.meta {
			t.Fatalf("instance id of %d bytes: wrong metainfo", c.n)
		}
	}
	// The error alternative has no containers: never metainfo.
	if rpcMetaOf(AppendQueryError(nil, CodeInternalError)) != -1 {
		t.Fatal("error body has metainfo")
	}
}

// Random values for round trips.

func rpcRandString(r *rand.Rand, max int) string {
	n := r.IntN(max + 1)
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return string(b)
}

func rpcRandQueryRequest(r *rand.Rand) QueryRequest {
	q := QueryRequest{
		Context: ContextKey{TenantID: rpcRandString(r, 20), ModelName: rpcRandString(r, 300), LoraName: rpcRandString(r, 10), BlockSize: r.Int64()},
		Tokens:  make([]int32, r.IntN(2000)),
	}
	for i := range q.Tokens {
		q.Tokens[i] = r.Int32() - r.Int32()
	}
	if r.IntN(2) == 0 {
		q.CacheSalt, q.HasCacheSalt = rpcRandString(r, 30), true
	}
	if r.IntN(2) == 0 {
		q.InstanceFilter, q.HasInstanceFilter = rpcRandString(r, 30), true
	}
	return q
}

func rpcRandQueryResult(r *rand.Rand, n int) QueryResult {
	var res QueryResult
	for i := range n {
		h := CacheHitResult{LongestMatchTokens: r.Int64(), Device: r.Int64(), CPULocal: -r.Int64(), CPUShare: r.Int64(), Disk: r.Int64()}
		rank := int64(-3)
		for range r.IntN(5) {
			rank += 1 + r.Int64N(1000)
			h.DP = append(h.DP, RankValue{rank, r.Int64()})
			h.RankMatches = append(h.RankMatches, RankTiers{rank, r.Int64(), r.Int64(), r.Int64(), r.Int64()})
		}
		res.Instances = append(res.Instances, InstanceHit{InstanceID: fmt.Sprintf("inst-%06d-%s", i, rpcRandString(r, 3)), Hit: h})
	}
	return res
}

func rpcRandServiceConfig(r *rand.Rand) ServiceConfig {
	c := ServiceConfig{
		Endpoint: rpcRandString(r, 40), ReplayEndpoint: rpcRandString(r, 40), PublisherKind: publisher.Kind(r.Int32N(5) - 1),
		ModelName: rpcRandString(r, 300), LoraName: rpcRandString(r, 5), TenantID: rpcRandString(r, 5), InstanceID: rpcRandString(r, 12),
		BlockSize: r.Int64(), DPRank: r.Int32(),
		HashProfile: HashProfile{rpcRandString(r, 8), rpcRandString(r, 8), rpcRandString(r, 8), rpcRandString(r, 64), rpcRandString(r, 8)},
	}
	if r.IntN(2) == 0 {
		c.CacheGroup, c.HasCacheGroup = r.Int64(), true
	}
	return c
}

func TestRPCRandomRoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var qd QueryRequest
	var rd QueryResult
	for it := range 200 {
		q := rpcRandQueryRequest(r)
		if !q.HasCacheSalt {
			q.CacheSalt = ""
		}
		if err := DecodeQueryRequest(AppendQueryRequest(nil, &q), &qd); err != nil {
			t.Fatal(err)
		}
		if len(q.Tokens) == 0 {
			q.Tokens = qd.Tokens[:0]
		}
		rpcDeepEqual(t, fmt.Sprintf("query request %d", it), qd, q)

		n := r.IntN(20)
		if it%50 == 0 {
			n = 300 // map of 300 entries: 2-byte counts
		}
		res := rpcRandQueryResult(r, n)
		b, err := AppendQueryResult(nil, &res)
		if err != nil {
			t.Fatal(err)
		}
		if ec, err := DecodeQueryResponse(b, &rd); err != nil || ec != CodeOK {
			t.Fatalf("query result %d: %v %v", it, ec, err)
		}
		if n == 300 && rpcMetaOf(b) != 0x08 {
			t.Fatalf("300 instances: metainfo %d", rpcMetaOf(b))
		}
		if len(rd.Instances) != len(res.Instances) {
			t.Fatalf("query result %d: %d instances, want %d", it, len(rd.Instances), len(res.Instances))
		}
		for i := range res.Instances {
			got, want := rd.Instances[i], res.Instances[i]
			if got.InstanceID != want.InstanceID || got.Hit.LongestMatchTokens != want.Hit.LongestMatchTokens ||
				got.Hit.Device != want.Hit.Device || got.Hit.CPULocal != want.Hit.CPULocal ||
				got.Hit.CPUShare != want.Hit.CPUShare || got.Hit.Disk != want.Hit.Disk ||
				!slices.Equal(got.Hit.DP, want.Hit.DP) || !slices.Equal(got.Hit.RankMatches, want.Hit.RankMatches) {
				t.Fatalf("query result %d instance %d:\n got %+v\nwant %+v", it, i, got, want)
			}
		}

		list := make([]ServiceConfig, r.IntN(4))
		for i := range list {
			list[i] = rpcRandServiceConfig(r)
		}
		gotList, err := DecodeServiceList(AppendServiceList(nil, list))
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			list = gotList
		}
		rpcDeepEqual(t, "service list", gotList, list)
		if len(list) > 0 {
			var one ServiceConfig
			if err := DecodeServiceConfig(AppendServiceConfig(nil, &list[0]), &one); err != nil || one != list[0] {
				t.Fatalf("service config: %v", err)
			}
		}

		var gv GlobalView
		for c := range r.IntN(3) {
			cv := ContextView{Context: ContextKey{rpcRandString(r, 5), rpcRandString(r, 5), rpcRandString(r, 5), r.Int64()},
				Profile:     HashProfile{rpcRandString(r, 5), rpcRandString(r, 5), rpcRandString(r, 5), rpcRandString(r, 64), rpcRandString(r, 5)},
				PrefixCount: r.Uint64()}
			for i := range r.IntN(30) {
				ir := InstanceRanks{InstanceID: fmt.Sprintf("%d-%04d", c, i)}
				rk := int64(-10)
				for range r.IntN(4) {
					rk += 1 + r.Int64N(5)
					ir.Ranks = append(ir.Ranks, rk)
				}
				cv.InstanceRanks = append(cv.InstanceRanks, ir)
			}
			gv.Contexts = append(gv.Contexts, cv)
		}
		gv.ContextCount = int32(len(gv.Contexts))
		gb, err := AppendGlobalView(nil, &gv)
		if err != nil {
			t.Fatal(err)
		}
		gd, err := DecodeGlobalView(gb)
		if err != nil {
			t.Fatal(err)
		}
		reb, _ := AppendGlobalView(nil, &gd)
		rpcEqualBytes(t, "global view re-encode", reb, gb)

		id, tenant, rank := rpcRandString(r, 300), rpcRandString(r, 10), r.Int32()
		gi, gt, gr, err := DecodeUnregisterArgs(AppendUnregisterArgs(nil, id, tenant, rank))
		if err != nil || gi != id || gt != tenant || gr != rank {
			t.Fatalf("unregister args: %v", err)
		}
		rr := RegisterResult{rpcRandString(r, 300), r.IntN(2) == 0}
		if got, ec, err := DecodeRegisterResponse(AppendRegisterResult(nil, rr)); err != nil || ec != 0 || got != rr {
			t.Fatalf("register result: %v", err)
		}
		ec := ErrorCode(r.Int32())
		if _, got, err := DecodeRegisterResponse(AppendRegisterError(nil, ec)); err != nil || got != ec {
			t.Fatalf("register error: %v", err)
		}
	}
}

// rpcBench8K is the hot-path fixture: an 8K-token query and an 8-instance, 2-rank answer.
func rpcBench8K() (QueryRequest, QueryResult) {
	q := QueryRequest{Context: ContextKey{TenantID: "default", ModelName: "Qwen/Qwen3-8B", BlockSize: 16},
		Tokens: rpcSeqTokens(1000, 8192), InstanceFilter: "", HasInstanceFilter: false}
	var res QueryResult
	for i := range 8 {
		res.Instances = append(res.Instances, InstanceHit{InstanceID: fmt.Sprintf("engine-%d", i), Hit: CacheHitResult{
			LongestMatchTokens: 4096, DP: []RankValue{{0, 2048}, {1, 4096}},
			RankMatches: []RankTiers{{0, 2048, 2048, 4096, 4096}, {1, 4096, 4096, 4096, 4096}},
			Device:      4096, CPULocal: 4096, CPUShare: 4096, Disk: 4096}})
	}
	return q, res
}

func TestRPCHotPathsDoNotAllocate(t *testing.T) {
	q, res := rpcBench8K()
	qb := AppendQueryRequest(nil, &q)
	rb, _ := AppendQueryResult(nil, &res)
	buf := make([]byte, 0, 64<<10)
	var qd QueryRequest
	var rd QueryResult
	_ = DecodeQueryRequest(qb, &qd)
	_, _ = DecodeQueryResponse(rb, &rd)
	for name, f := range map[string]func(){
		"AppendQueryRequest": func() { buf = AppendQueryRequest(buf[:0], &q) },
		"DecodeQueryRequest": func() {
			if err := DecodeQueryRequest(qb, &qd); err != nil {
				t.Fatal(err)
			}
		},
		"AppendQueryResult": func() {
			var err error
			if buf, err = AppendQueryResult(buf[:0], &res); err != nil {
				t.Fatal(err)
			}
		},
		"AppendQueryError": func() { buf = AppendQueryError(buf[:0], CodeInvalidParams) },
		"DecodeQueryResponse": func() {
			if _, err := DecodeQueryResponse(rb, &rd); err != nil {
				t.Fatal(err)
			}
		},
	} {
		if a := testing.AllocsPerRun(50, f); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
	rpcDeepEqual(t, "decoded request", qd, q)
}
