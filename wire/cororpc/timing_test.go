package cororpc

import "testing"

func BenchmarkRPCEncodeQueryRequest8K(b *testing.B) {
	q, _ := rpcBench8K()
	buf := AppendQueryRequest(nil, &q)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendQueryRequest(buf[:0], &q)
	}
}

func BenchmarkRPCDecodeQueryRequest8K(b *testing.B) {
	q, _ := rpcBench8K()
	body := AppendQueryRequest(nil, &q)
	var dq QueryRequest
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeQueryRequest(body, &dq); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRPCEncodeQueryResult8Instances(b *testing.B) {
	_, res := rpcBench8K()
	buf, _ := AppendQueryResult(nil, &res)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendQueryResult(buf[:0], &res); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRPCDecodeQueryResult8Instances(b *testing.B) {
	_, res := rpcBench8K()
	body, _ := AppendQueryResult(nil, &res)
	var dr QueryResult
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeQueryResponse(body, &dr); err != nil {
			b.Fatal(err)
		}
	}
}
