package wire

import "testing"

func BenchmarkRPCEncodeQueryRequest8K(b *testing.B) {
	q, _ := rpcBench8K()
	buf := AppendRPCQueryRequest(nil, &q)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendRPCQueryRequest(buf[:0], &q)
	}
}

func BenchmarkRPCDecodeQueryRequest8K(b *testing.B) {
	q, _ := rpcBench8K()
	body := AppendRPCQueryRequest(nil, &q)
	var dq RPCQueryRequest
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeRPCQueryRequest(body, &dq); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRPCEncodeQueryResult8Instances(b *testing.B) {
	_, res := rpcBench8K()
	buf, _ := AppendRPCQueryResult(nil, &res)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendRPCQueryResult(buf[:0], &res); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRPCDecodeQueryResult8Instances(b *testing.B) {
	_, res := rpcBench8K()
	body, _ := AppendRPCQueryResult(nil, &res)
	var dr RPCQueryResult
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRPCQueryResponse(body, &dr); err != nil {
			b.Fatal(err)
		}
	}
}
