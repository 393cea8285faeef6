package main

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// BenchmarkQuery measures one client's full-hit Query round trip against an in-process
// conductor whose 8 instances hold 2K- and 8K-token prompts, over RPC and HTTP.
//
//	go test ./cmd/rpc-latency -run x -bench Query -benchtime 2000x
func BenchmarkQuery(b *testing.B) {
	bench, err := Setup(Config{Instances: 8, BlockSize: 16, Prompts: []int{2048, 8192}, Model: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer bench.Close()
	for _, size := range []int{2048, 8192} {
		name := map[int]string{2048: "2K", 8192: "8K"}[size]
		b.Run("RPC/"+name, func(b *testing.B) {
			var res cororpc.QueryResult
			q := bench.rpcReq[size]
			b.ReportAllocs()
			for b.Loop() {
				code, err := bench.rpc.Query(context.Background(), q, &res)
				if err != nil || code != cororpc.CodeOK || len(res.Instances) != 8 {
					b.Fatal(code, err)
				}
			}
		})
		b.Run("HTTP/"+name, func(b *testing.B) {
			req, resp := bench.queryRequest(size)
			defer releaseQuery(req, resp)
			b.ReportAllocs()
			for b.Loop() {
				if err := bench.http.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
					b.Fatal(resp.StatusCode(), err)
				}
			}
		})
	}
}
