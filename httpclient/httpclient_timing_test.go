package httpclient

import (
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

func benchTokens(n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(i*7919) & 0x3ffff // vocabulary-sized ids: 3-byte msgpack ints
	}
	return toks
}

func BenchmarkAppendQueryRequest(b *testing.B) {
	for _, bin := range []bool{false, true} {
		b.Run(fmt.Sprintf("tokens=8192/binary=%v", bin), func(b *testing.B) {
			q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: benchTokens(8192), BinaryTokens: bin}
			buf := AppendQueryRequest(nil, &q)
			b.SetBytes(int64(4 * len(q.TokenIDs)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendQueryRequest(buf[:0], &q)
			}
		})
	}
}

// benchQueryBody is a result for 16 instances of 4 DP ranks each, the size of a
// mid-sized deployment.
func benchQueryBody(b *testing.B) []byte {
	var body []byte
	body = msgp.AppendMapHeader(body, 1)
	body = msgp.AppendString(body, "instances")
	body = msgp.AppendMapHeader(body, 16)
	for i := range 16 {
		body = msgp.AppendString(body, fmt.Sprintf("vllm-decode-node%02d", i))
		body = msgp.AppendMapHeader(body, 7)
		body = msgp.AppendString(body, "longest_matched")
		body = msgp.AppendInt64(body, 4096)
		body = msgp.AppendString(body, "dp")
		body = msgp.AppendMapHeader(body, 4)
		for r := range 4 {
			body = msgp.AppendString(body, fmt.Sprint(r))
			body = msgp.AppendInt64(body, int64(1024*r))
		}
		body = msgp.AppendString(body, "rank_matches")
		body = msgp.AppendMapHeader(body, 4)
		for r := range 4 {
			body = msgp.AppendString(body, fmt.Sprint(r))
			body = msgp.AppendMapHeader(body, 4)
			for _, k := range []string{"device", "cpu_local", "cpu_share", "disk"} {
				body = msgp.AppendString(body, k)
				body = msgp.AppendInt64(body, int64(1024*r))
			}
		}
		for _, k := range []string{"device", "cpu_local", "cpu_share", "disk"} {
			body = msgp.AppendString(body, k)
			body = msgp.AppendInt64(body, 3072)
		}
	}
	return body
}

func BenchmarkDecodeQueryResult(b *testing.B) {
	body := benchQueryBody(b)
	var res QueryResult
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeQueryResult(&res, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientQuery measures the full round trip over loopback TCP against a fasthttp
// server answering with a prepared 16-instance body.
func BenchmarkClientQuery(b *testing.B) {
	c := cannedClient(b, benchQueryBody(b))
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: benchTokens(2048)}
	var res QueryResult
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Query(&q, &res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSessionQuery measures the same round trip through a Session: encoding each
// time, sending a pre-encoded body (the load generator's loop), and taking the raw
// answer without decoding it.
func BenchmarkSessionQuery(b *testing.B) {
	c := cannedClient(b, benchQueryBody(b))
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: benchTokens(2048)}
	body := AppendQueryRequest(nil, &q)
	var res QueryResult
	for _, form := range []string{"encode", "encoded", "raw"} {
		b.Run(form, func(b *testing.B) {
			s := c.NewSession()
			defer s.Close()
			b.ReportAllocs()
			for b.Loop() {
				var err error
				switch form {
				case "encode":
					err = s.Query(&q, &res)
				case "encoded":
					err = s.QueryEncoded(body, &res)
				default:
					_, err = s.QueryRaw(body)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
