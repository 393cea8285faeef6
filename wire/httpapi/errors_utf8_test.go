package httpapi_test

import (
	"testing"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/wire/httpapi"
)

// TestErrorBodiesAreValidUTF8 checks that error bodies echoing invalid UTF-8 (an unknown
// key, an id) stay decodable by strict clients: every str in the body is valid UTF-8 and
// the bad bytes are shown as \xNN.
func TestErrorBodiesAreValidUTF8(t *testing.T) {
	bad := "k\xff\xfe\xc3(é"
	cases := []struct {
		name string
		body []byte
		want string
	}{
		{"request error", httpapi.AppendRequestError(nil, &httpapi.RequestError{Msg: "unsupported request field: " + bad, Reason: httpapi.ReasonUnknownField, Field: bad, Index: -1}),
			`unsupported request field: k\xff\xfe\xc3(é`},
		{"message", httpapi.AppendErrorMessage(nil, "service not found: "+bad), `service not found: k\xff\xfe\xc3(é`},
		{"long", httpapi.AppendErrorMessage(nil, string(make([]byte, 40))+"\x80"), string(make([]byte, 40)) + `\x80`},
	}
	for _, c := range cases {
		m, rest, err := msgp.ReadMapHeaderBytes(c.body)
		if err != nil || m == 0 {
			t.Fatalf("%s: not a map: %v", c.name, err)
		}
		var got string
		for i := uint32(0); i < m; i++ {
			var k, v []byte
			if k, rest, err = msgp.ReadStringZC(rest); err != nil {
				t.Fatalf("%s: key: %v", c.name, err)
			}
			if string(k) == "index" {
				_, rest, _ = msgp.ReadInt64Bytes(rest)
				continue
			}
			if v, rest, err = msgp.ReadStringZC(rest); err != nil {
				t.Fatalf("%s: value of %s: %v", c.name, k, err)
			}
			if !utf8.Valid(v) {
				t.Errorf("%s: %s is not valid UTF-8: %q", c.name, k, v)
			}
			if string(k) == "error" {
				got = string(v)
			}
		}
		if len(rest) != 0 {
			t.Errorf("%s: %d trailing bytes", c.name, len(rest))
		}
		if got != c.want {
			t.Errorf("%s: error = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestAppendSafeStringValidIsVerbatim guards the common path: valid text is unchanged
// and costs no allocation.
func TestAppendSafeStringValidIsVerbatim(t *testing.T) {
	buf := make([]byte, 0, 128)
	s := "service not found: e0|default|0 é"
	if got, want := string(httpapi.AppendSafeString(buf, s)), string(msgp.AppendString(nil, s)); got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { _ = httpapi.AppendSafeString(buf[:0], s) }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}
