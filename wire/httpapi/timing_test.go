package httpapi_test

import (
	"testing"

	"github.com/conductor-go/conductor/wire/httpapi"
)

// htPrompt returns n token ids spread over a 152K vocabulary (Qwen/DeepSeek size), so an
// array mixes 16- and 32-bit encodings at random, as real prompts do. The plain array
// benchmark encodes them as Python's msgpack does (unsigned), the Signed one as Go's msgp.
func htPrompt(n int) []int32 {
	tokens := make([]int32, n)
	for i, k := range htKeys(n) {
		tokens[i] = int32(k % 152000)
	}
	return tokens
}

func benchmarkDecodeQuery(b *testing.B, tokens any) {
	body := htEnc(htQueryBase().with("token_ids", tokens).with("tenant_id", "default").with("cache_salt", nil))
	var q httpapi.QueryRequest
	benchmarkDecodeBody(b, body, func(body []byte) *httpapi.RequestError { return httpapi.DecodeQueryRequest(body, &q) })
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(q.Tokens)), "ns/token")
}

// benchmarkDecodeBody times decode of body (which must succeed: it is checked once
// first, untimed) with its bytes per second and allocations.
func benchmarkDecodeBody(b *testing.B, body []byte, decode func([]byte) *httpapi.RequestError) {
	if e := decode(body); e != nil {
		b.Fatal(e)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if e := decode(body); e != nil {
			b.Fatal(e)
		}
	}
}

// The arrays real routers send: htPrompt's ids of a 152K vocabulary at random, as
// Python's msgpack writes them (unsigned: about 57% uint32, 43% uint16, a few uint8 and
// fixint; 8KArray, 32KArray) and as Go's msgp does (int32, int16: 8KArraySigned).
func BenchmarkDecodeQueryRequest32KArray(b *testing.B) { benchmarkDecodeQuery(b, htPrompt(32768)) }

func BenchmarkDecodeQueryRequest8KArray(b *testing.B) { benchmarkDecodeQuery(b, htPrompt(8192)) }

func BenchmarkDecodeQueryRequest8KArraySigned(b *testing.B) {
	benchmarkDecodeQuery(b, htSigned(htPrompt(8192)))
}

func BenchmarkDecodeQueryRequest8KBin(b *testing.B) { benchmarkDecodeQuery(b, htLE(htPrompt(8192)...)) }

func BenchmarkDecodeRegisterRequest(b *testing.B) {
	body := htEnc(htRegisterBase())
	b.ReportAllocs()
	for range b.N {
		if _, e := httpapi.DecodeRegisterRequest(body); e != nil {
			b.Fatal(e)
		}
	}
}

func BenchmarkAppendQueryResponse8x2(b *testing.B) {
	ids := []string{"vllm-node-0", "vllm-node-1", "vllm-node-2", "vllm-node-3", "vllm-node-4", "vllm-node-5", "vllm-node-6", "vllm-node-7"}
	ranks := []httpapi.RankTiers{{Rank: 0, Device: 4096, CPULocal: 6144, CPUShare: 8192, Disk: 8192}, {Rank: 1, Device: 2048, CPULocal: 2048, CPUShare: 8192, Disk: 8192}}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for range b.N {
		out := httpapi.AppendQueryResponseHeader(buf[:0], len(ids))
		for _, id := range ids {
			out = httpapi.AppendInstanceHit(out, id, 8192, 4096, 6144, 8192, 8192, ranks)
		}
		buf = out
	}
	b.SetBytes(int64(len(buf)))
}

// htSmallVocab is n ids of a 32K-vocabulary model: nearly all encode as uint16.
func htSmallVocab(n int) []int32 {
	t := htPrompt(n)
	for i := range t {
		t[i] = 256 + t[i]%32000
	}
	return t
}

func BenchmarkDecodeQueryRequest8KArrayVocab32K(b *testing.B) {
	benchmarkDecodeQuery(b, htSmallVocab(8192))
}

// A 32K-vocabulary prompt as text makes it: one token in 16 a newline or other byte
// token (ids under 128, positive fixint), the rest uint16.
func BenchmarkDecodeQueryRequest8KArrayVocab32KText(b *testing.B) {
	t := htSmallVocab(8192)
	for i := range t {
		if t[i]%16 == 0 {
			t[i] = 13
		}
	}
	benchmarkDecodeQuery(b, t)
}

// htMixedWidths is n ids whose encodings mix all three widths element by element, as a
// real prompt's do: about a fifth under 128 (positive fixint), half under 65536 (uint16)
// and the rest above (uint32).
func htMixedWidths(n int) []int32 {
	t := htPrompt(n)
	for i, v := range t {
		switch v % 10 {
		case 0, 1:
			t[i] = v % 128
		case 2, 3, 4, 5, 6:
			t[i] = 128 + v%65000
		default:
			t[i] = 65536 + v%86000
		}
	}
	return t
}

func BenchmarkDecodeQueryRequest8KArrayMixedWidths(b *testing.B) {
	benchmarkDecodeQuery(b, htMixedWidths(8192))
}

// htKeys is n block keys spread over the whole uint64 range, as projected hashes are.
func htKeys(n int) []uint64 {
	keys := make([]uint64, n)
	x := uint64(88172645463325252)
	for i := range keys {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		keys[i] = x
	}
	return keys
}

func benchmarkDecodeQueryByHash(b *testing.B, keys any) {
	body := htEnc(hhBase().with("block_hashes", keys))
	var q httpapi.QueryByHashRequest
	benchmarkDecodeBody(b, body, func(body []byte) *httpapi.RequestError { return httpapi.DecodeQueryByHashRequest(body, &q) })
}

// The block keys of an 8K-token prompt (512 blocks of 16), as a bin and as an array.
func BenchmarkDecodeQueryByHashRequest8KBin(b *testing.B) {
	benchmarkDecodeQueryByHash(b, hhLE(htKeys(512)...))
}

func BenchmarkDecodeQueryByHashRequest8KArray(b *testing.B) {
	benchmarkDecodeQueryByHash(b, hhAny(htKeys(512)))
}
