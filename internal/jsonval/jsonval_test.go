package jsonval

import (
	"encoding/json"
	"testing"
)

func TestInt(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want int64
		ok   bool
	}{
		{`16`, 16, true}, {`-1`, -1, true}, {`9223372036854775807`, 1<<63 - 1, true},
		{`"16"`, 0, false}, {`1.5`, 0, false}, {`1e3`, 0, false}, {`null`, 0, false}, {`true`, 0, false},
		{`9223372036854775808`, 0, false}, {``, 0, false}, {`[]`, 0, false},
	} {
		v, err := Int(json.RawMessage(c.raw))
		if (err == nil) != c.ok || v != c.want {
			t.Errorf("Int(%s) = %d, %v; want %d, ok %v", c.raw, v, err, c.want, c.ok)
		}
	}
}

func TestString(t *testing.T) {
	for _, c := range []struct {
		raw, want string
		ok        bool
	}{
		{`"a"`, "a", true}, {`""`, "", true}, {`"\u00e9\n"`, "é\n", true},
		{`null`, "", false}, {`1`, "", false}, {``, "", false}, {`"unterminated`, "", false},
	} {
		v, ok := String(json.RawMessage(c.raw))
		if ok != c.ok || v != c.want {
			t.Errorf("String(%s) = %q, %v; want %q, %v", c.raw, v, ok, c.want, c.ok)
		}
	}
}

// TestCheckDuplicateKeys: a key repeated in one object is named with its path, at any
// depth and however it is escaped; the same key in two objects is not a duplicate.
func TestCheckDuplicateKeys(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"a": 1, "b": 2}`, ""},
		{`{"a": {"x": 1}, "b": {"x": 2}}`, ""},
		{`[{"a": 1}, {"a": 2}]`, ""},
		{`{"a": 1, "a": 2}`, `duplicate key "a" in the root object`},
		{`{"a": 1, "\u0061": 2}`, `duplicate key "a" in the root object`},
		{`{"cluster": {"key_prefix": "/x/", "key_prefix": "/y/"}}`, `duplicate key "key_prefix" in "cluster"`},
		{`{"kvevent_instance": {"e": {"hash_profile": {"strategy": "a", "strategy": "b"}}}}`,
			`duplicate key "strategy" in "kvevent_instance.e.hash_profile"`},
		{`{"l": [1, {"k": 1, "k": 1}]}`, `duplicate key "k" in "l[1]"`},
		{`{"a": 1,`, ""}, // does not parse: the caller's decoder says so
	} {
		err := CheckDuplicateKeys([]byte(c.doc))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.doc, got, c.want)
		}
	}
}
