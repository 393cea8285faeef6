package httpapi_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/wire/httpapi"
)

var htReasons = map[string]bool{
	httpapi.ReasonInvalidMsgpack: true, httpapi.ReasonUnknownField: true, httpapi.ReasonMissing: true,
	httpapi.ReasonInvalidType: true, httpapi.ReasonInvalidValue: true, httpapi.ReasonOutOfRange: true,
}

// FuzzDecodeQueryRequest checks the strict decoder against msgp's generic reader: whatever
// it accepts must be one well-formed map whose fields hold exactly the decoded values, and
// whatever it rejects must carry a well-formed error. Reusing q across inputs also checks
// that nothing from an earlier request leaks into a later one.
func FuzzDecodeQueryRequest(f *testing.F) {
	for _, m := range []htMap{
		htQueryBase(),
		htQueryBase().with("token_ids", htLE(1, -1, math.MaxInt32)).with("cache_salt", nil),
		htQueryBase().with("tenant_id", "t").with("lora_name", "l").with("instance_id", "i").with("cache_salt", "s"),
		htQueryBase().with("token_ids", []any{htWidth(0xd3, -5), htWidth(0xcf, 9), htWidth(0xcd, 300)}),
		htQueryBase().plus("token_ids", []any{}).plus(1, 2),
		htQueryBase().with("block_size", uint64(math.MaxUint64)),
		// Long enough to be decoded in segments, as Python and Go send them, with
		// token_ids last and not last.
		htQueryBase().with("token_ids", htPrompt(700)),
		htQueryBase().with("token_ids", htSigned(htPrompt(700))).with("cache_salt", "s").with("tenant_id", "t"),
	} {
		f.Add(htEnc(m))
	}
	var q httpapi.QueryRequest
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := slices.Clone(body)
		e := httpapi.DecodeQueryRequest(body, &q)
		if !bytes.Equal(body, orig) {
			t.Fatal("decoder modified the body")
		}
		if e != nil {
			if !htReasons[e.Reason] || e.Msg == "" {
				t.Fatalf("bad error %+v", e)
			}
			if e.Index >= 0 && e.Field != "token_ids" || e.Index < -1 {
				t.Fatalf("index on the wrong field: %+v", e)
			}
			return
		}
		v, rest, err := msgp.ReadIntfBytes(body)
		if err != nil || len(rest) != 0 {
			t.Fatalf("accepted a body the generic reader rejects: %v, %d trailing", err, len(rest))
		}
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("accepted a %T root", v)
		}
		htFuzzField(t, m, "model", q.Model, "")
		htFuzzField(t, m, "tenant_id", q.TenantID, "default")
		htFuzzField(t, m, "lora_name", q.LoraName, "")
		htFuzzField(t, m, "instance_id", q.InstanceID, "")
		if _, has := m["instance_id"]; has != q.HasInstanceID {
			t.Fatalf("HasInstanceID %v, present %v", q.HasInstanceID, has)
		}
		if s, _ := m["cache_salt"].(string); s != q.CacheSalt {
			t.Fatalf("cache_salt %q, want %q", q.CacheSalt, s)
		}
		if q.Model == "" || q.TenantID == "" || q.BlockSize <= 0 {
			t.Fatalf("accepted invalid values %+v", q)
		}
		switch bs := m["block_size"].(type) {
		case int64:
			if bs != q.BlockSize {
				t.Fatalf("block_size %d, want %d", q.BlockSize, bs)
			}
		case uint64:
			if bs > math.MaxInt64 || int64(bs) != q.BlockSize {
				t.Fatalf("block_size %d, want %d", q.BlockSize, bs)
			}
		default:
			t.Fatalf("accepted block_size %T", bs)
		}
		var want []int32
		switch toks := m["token_ids"].(type) {
		case []byte:
			for i := 0; i+4 <= len(toks); i += 4 {
				want = append(want, int32(binary.LittleEndian.Uint32(toks[i:])))
			}
		case []any:
			for _, x := range toks {
				switch n := x.(type) {
				case int64:
					want = append(want, int32(n))
				case uint64:
					want = append(want, int32(n))
				default:
					t.Fatalf("accepted token %T", x)
				}
			}
		default:
			t.Fatalf("accepted token_ids %T", toks)
		}
		if !slices.Equal(want, q.Tokens) && !(len(want) == 0 && len(q.Tokens) == 0) {
			t.Fatalf("tokens %v, want %v", q.Tokens, want)
		}
	})
}

func htFuzzField(t *testing.T, m map[string]any, key, got, def string) {
	t.Helper()
	want, _ := m[key].(string)
	if want == "" {
		want = def
	}
	if got != want {
		t.Fatalf("%s %q, want %q", key, got, want)
	}
}
