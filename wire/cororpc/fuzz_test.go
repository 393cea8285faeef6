package cororpc

import (
	"bytes"
	"testing"
)

// FuzzRPCDecoders feeds arbitrary bytes to every RPC body decoder. None may panic, and
// whatever decodes must re-encode to a body that decodes to the same value (the width may
// differ, since struct_pack accepts wider lengths than the encoder picks).
func FuzzRPCDecoders(f *testing.F) {
	for _, g := range rpcGoldenBodies(&testing.T{}) {
		f.Add(g.body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var q QueryRequest
		if DecodeQueryRequest(body, &q) == nil {
			var q2 QueryRequest
			re := AppendQueryRequest(nil, &q)
			if err := DecodeQueryRequest(re, &q2); err != nil || !bytes.Equal(AppendQueryRequest(nil, &q2), re) {
				t.Fatalf("query request re-encode: %v", err)
			}
		}
		var res QueryResult
		if ec, err := DecodeQueryResponse(body, &res); err == nil && ec == CodeOK {
			re, err := AppendQueryResult(nil, &res)
			if err != nil {
				t.Fatalf("decoded result does not encode: %v", err)
			}
			var res2 QueryResult
			if _, err := DecodeQueryResponse(re, &res2); err != nil || len(res2.Instances) != len(res.Instances) {
				t.Fatalf("query result re-decode: %v", err)
			}
		}
		var c ServiceConfig
		if DecodeServiceConfig(body, &c) == nil {
			var c2 ServiceConfig
			if err := DecodeServiceConfig(AppendServiceConfig(nil, &c), &c2); err != nil || c2 != c {
				t.Fatalf("service config re-decode: %v", err)
			}
		}
		if gv, err := DecodeGlobalView(body); err == nil {
			if _, err := AppendGlobalView(nil, &gv); err != nil {
				t.Fatalf("decoded view does not encode: %v", err)
			}
		}
		_, _ = DecodeServiceList(body)
		_, _, _ = DecodeRegisterResponse(body)
		_, _, _ = DecodeUnregisterResponse(body)
		_, _, _, _ = DecodeUnregisterArgs(body)
		_, _ = DecodeFrameworkError(255, body)
		_, _ = DecodeFrameworkError(4, body)
		if _, _, err := ReadRequest(bufReader(body), nil, 1<<20); err == nil && len(body) < RequestHeaderSize {
			t.Fatal("short request frame accepted")
		}
	})
}
