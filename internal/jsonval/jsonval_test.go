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
