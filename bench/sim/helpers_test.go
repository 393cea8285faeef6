package sim

import "testing"

// startTestPublisher starts a hub serving one publisher of cfg; the hub closes when tb
// ends.
func startTestPublisher(tb testing.TB, cfg PublisherConfig) *Publisher {
	tb.Helper()
	hub, err := NewHub()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(hub.Close)
	pub, err := hub.NewPublisher(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	hub.Start()
	return pub
}

// hashKeys is the keys a Hasher of spec (block size bs, no LoRA, salt) gives tokens.
func hashKeys(t *testing.T, spec HashSpec, bs int, salt string, tokens []int32) []uint64 {
	t.Helper()
	h, err := NewHasher(spec, bs, "", salt)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := h.AppendKeys(nil, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}
