package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

type collect struct{ out []string }

func (c *collect) Context(x *Header) error {
	c.out = append(c.out, fmt.Sprintf("C %+v %s %s %s %s %v", x.Key, x.Profile.StrategyName(), x.Profile.AlgorithmName(),
		x.Profile.Seed, x.Profile.ProjectionName(), x.Sequences))
	return nil
}

func (c *collect) Chunk(_ *Header, ch *engine.SnapshotChunk) error {
	c.out = append(c.out, fmt.Sprintf("K %+v %v %v %v", ch.Journal, ch.Slots, ch.Entries, ch.Bindings))
	return nil
}

func sampleSnapshot(t *testing.T) ([]byte, []string) {
	t.Helper()
	p1, err1 := hashing.Resolve("vllm_v1", "sha256_cbor", "42", "low64_be")
	p2, err2 := hashing.Resolve("sglang", "sha256_raw", "0", "first64_be")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	want := &collect{}
	ctxs := []*Header{
		{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p1, Sequences: map[string]uint64{"tcp://e:1": 99}},
		{Key: engine.ContextKey{TenantID: "t", ModelName: "n", LoraName: "l", BlockSize: 64}, Profile: p2, Sequences: map[string]uint64{}},
	}
	chunks := [][]*engine.SnapshotChunk{
		{{Slots: []engine.Slot{{InstanceID: "a"}, {InstanceID: "b", DPRank: 3}}, Entries: []engine.SnapshotEntry{{Key: 1, Slot: 0, Tiers: 1}, {Key: 2, Slot: 1, Tiers: 5}}},
			{Journal: []engine.SnapshotOp{{Op: engine.Op{Kind: engine.OpRemove, Slot: engine.Slot{InstanceID: "a", DPRank: 1}, Tier: engine.TierDisk, Hashes: []uint64{5, 6}}},
				{Op: engine.Op{Kind: engine.OpSharedStore, Source: "tcp://s:1", Backend: "b", ObjectKey: "o", Component: "_1_v", SharedTier: engine.SharedCPU, Hash: 8}},
				{Op: engine.Op{Source: "tcp://s:2", Backend: "z"}, Retract: true, ClearShared: true}},
				Slots: []engine.Slot{{InstanceID: "a"}}, Bindings: []engine.SnapshotBinding{{Source: "tcp://s:1", Backend: "b", ObjectKey: "o", Tier: engine.SharedDisk, Hash: 9, Components: []string{"_0_k"}}}}},
		{{Slots: []engine.Slot{}, Entries: []engine.SnapshotEntry{}}},
	}
	for i, c := range ctxs {
		if err := w.Context(c); err != nil {
			t.Fatal(err)
		}
		_ = want.Context(c)
		for _, ch := range chunks[i] {
			if err := w.Chunk(ch); err != nil {
				t.Fatal(err)
			}
			norm := *ch
			if norm.Entries == nil {
				norm.Entries = []engine.SnapshotEntry{}
			}
			_ = want.Chunk(c, &norm)
		}
	}
	n, err := w.Close()
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("close: %d %v (buffer %d)", n, err, buf.Len())
	}
	return buf.Bytes(), want.out
}

func TestSnapshotStreamRoundTrip(t *testing.T) {
	data, want := sampleSnapshot(t)
	got := &collect{}
	st, err := Read(bytes.NewReader(data), 1<<20, got)
	if err != nil {
		t.Fatal(err)
	}
	if st.Contexts != 2 || st.Entries != 2 || st.Bindings != 1 || st.Bytes != int64(len(data)) {
		t.Fatalf("stats %+v", st)
	}
	// Empty and nil slices print alike except for Slots/Entries/Bindings nil vs empty.
	norm := func(s []string) string { return fmt.Sprint(s) }
	if norm(got.out) != norm(want) {
		t.Fatalf("read back:\n%v\nwant\n%v", got.out, want)
	}
}

// TestSnapshotStreamCorruption: every single-byte change, every truncation and a
// too-small limit are refused before the visitor sees anything.
func TestSnapshotStreamCorruption(t *testing.T) {
	data, _ := sampleSnapshot(t)
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x40
		v := &collect{}
		if _, err := Read(bytes.NewReader(bad), 1<<20, v); err == nil || len(v.out) != 0 {
			t.Fatalf("byte %d flipped: err %v, visited %d", i, err, len(v.out))
		}
	}
	for n := 0; n < len(data); n++ {
		v := &collect{}
		if _, err := Read(bytes.NewReader(data[:n]), 1<<20, v); err == nil || len(v.out) != 0 {
			t.Fatalf("truncated to %d: err %v", n, err)
		}
	}
	if _, err := Read(bytes.NewReader(data), int64(len(data)-1), &collect{}); err == nil {
		t.Fatal("over the limit accepted")
	}
	if _, err := Read(bytes.NewReader([]byte("not a snapshot at all")), 1<<20, &collect{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage: %v", err)
	}
}
