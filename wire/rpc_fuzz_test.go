package wire

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
		var q RPCQueryRequest
		if DecodeRPCQueryRequest(body, &q) == nil {
			var q2 RPCQueryRequest
			re := AppendRPCQueryRequest(nil, &q)
			if err := DecodeRPCQueryRequest(re, &q2); err != nil || !bytes.Equal(AppendRPCQueryRequest(nil, &q2), re) {
				t.Fatalf("query request re-encode: %v", err)
			}
		}
		var res RPCQueryResult
		if ec, err := DecodeRPCQueryResponse(body, &res); err == nil && ec == RPCCodeOK {
			re, err := AppendRPCQueryResult(nil, &res)
			if err != nil {
				t.Fatalf("decoded result does not encode: %v", err)
			}
			var res2 RPCQueryResult
			if _, err := DecodeRPCQueryResponse(re, &res2); err != nil || len(res2.Instances) != len(res.Instances) {
				t.Fatalf("query result re-decode: %v", err)
			}
		}
		var c RPCServiceConfig
		if DecodeRPCServiceConfig(body, &c) == nil {
			var c2 RPCServiceConfig
			if err := DecodeRPCServiceConfig(AppendRPCServiceConfig(nil, &c), &c2); err != nil || c2 != c {
				t.Fatalf("service config re-decode: %v", err)
			}
		}
		if gv, err := DecodeRPCGlobalView(body); err == nil {
			if _, err := AppendRPCGlobalView(nil, &gv); err != nil {
				t.Fatalf("decoded view does not encode: %v", err)
			}
		}
		_, _ = DecodeRPCServiceList(body)
		_, _, _ = DecodeRPCRegisterResponse(body)
		_, _, _ = DecodeRPCUnregisterResponse(body)
		_, _, _, _ = DecodeRPCUnregisterArgs(body)
		_, _ = DecodeRPCFrameworkError(255, body)
		_, _ = DecodeRPCFrameworkError(4, body)
		if _, _, err := ReadRPCRequest(rpcReader(body), nil, 1<<20); err == nil && len(body) < RPCRequestHeaderSize {
			t.Fatal("short request frame accepted")
		}
	})
}
