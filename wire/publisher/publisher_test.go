package publisher

import "testing"

func TestKindNamesRoundTripAndWireValues(t *testing.T) {
	for _, c := range []struct {
		k      Kind
		name   string
		wire   int32
		engine bool
	}{
		{VLLM, "vLLM", 0, true},
		{Mooncake, "Mooncake", 1, false},
		{SGLang, "SGLang", 2, true},
	} {
		if int32(c.k) != c.wire {
			t.Errorf("%s = %d on the wire, upstream says %d", c.name, int32(c.k), c.wire)
		}
		if got := c.k.String(); got != c.name {
			t.Errorf("String(%d) = %q, want %q", c.wire, got, c.name)
		}
		if k, ok := Parse(c.name); !ok || k != c.k {
			t.Errorf("Parse(%q) = %v, %v", c.name, k, ok)
		}
		if !c.k.Valid() || c.k.IsEngine() != c.engine {
			t.Errorf("%s: Valid=%v IsEngine=%v", c.name, c.k.Valid(), c.k.IsEngine())
		}
	}
	for _, s := range []string{"vllm", "VLLM", "sglang", "mooncake", "", "vLLM "} {
		if k, ok := Parse(s); ok {
			t.Errorf("Parse(%q) = %v, want refusal (names are case-sensitive)", s, k)
		}
	}
	for _, k := range []Kind{-1, 3, 1 << 20} {
		if k.Valid() || k.IsEngine() {
			t.Errorf("Kind(%d) reported valid", int32(k))
		}
		if got, want := k.String(), "PublisherKind("; len(got) < len(want) || got[:len(want)] != want {
			t.Errorf("Kind(%d).String() = %q", int32(k), got)
		}
	}
}
