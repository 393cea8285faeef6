package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

type collect struct{ out []string }

func (c *collect) Context(x *Header) error {
	c.out = append(c.out, fmt.Sprintf("C %+v %s %s %s %s %s %q %d %s %v", x.Key, x.Profile.StrategyName(), x.Profile.AlgorithmName(),
		x.Profile.Seed, x.Profile.ProjectionName(), x.Profile.ExtraKeysName(), x.Profile.LoraPath, x.Profile.Lookahead,
		x.Profile.RootHex(), x.Sequences))
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
	// A profile with every field of issue 25 (a vLLM >= 0.33 LoRA context).
	p3, err3 := hashing.ResolveSpec(hashing.Spec{Strategy: "vllm_v1", Algorithm: "xxhash", PythonHashSeed: "7",
		IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/adapters/a", LookaheadTokens: 3})
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	want := &collect{}
	ctxs := []*Header{
		{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p1, Sequences: map[string]uint64{"tcp://e:1": 99}},
		{Key: engine.ContextKey{TenantID: "t", ModelName: "n", LoraName: "l", BlockSize: 64}, Profile: p2, Sequences: map[string]uint64{}},
		{Key: engine.ContextKey{TenantID: "default", ModelName: "m", LoraName: "a", BlockSize: 4}, Profile: p3, Sequences: map[string]uint64{"tcp://e:2": 5}},
	}
	chunks := [][]*engine.SnapshotChunk{
		{{Slots: []engine.Slot{{InstanceID: "a"}, {InstanceID: "b", DPRank: 3}}, Entries: []engine.SnapshotEntry{{Key: 1, Slot: 0, Tiers: 1}, {Key: 2, Slot: 1, Tiers: 5}}},
			{Journal: []engine.SnapshotOp{{Op: engine.Op{Kind: engine.OpRemove, Slot: engine.Slot{InstanceID: "a", DPRank: 1}, Tier: engine.TierDisk, Hashes: []uint64{5, 6}}},
				{Op: engine.Op{Kind: engine.OpSharedStore, Source: "tcp://s:1", Backend: "b", ObjectKey: "o", Component: "_1_v", SharedTier: engine.SharedCPU, Hash: 8}},
				{Op: engine.Op{Source: "tcp://s:2", Backend: "z"}, Retract: true, ClearShared: true}},
				Slots: []engine.Slot{{InstanceID: "a"}}, Bindings: []engine.SnapshotBinding{{Source: "tcp://s:1", Backend: "b", ObjectKey: "o", Tier: engine.SharedDisk, Hash: 9, Components: []string{"_0_k"}}}}},
		{{Slots: []engine.Slot{}, Entries: []engine.SnapshotEntry{}}},
		{{Slots: []engine.Slot{{InstanceID: "a"}}, Entries: []engine.SnapshotEntry{{Key: 3, Slot: 0, Tiers: 1}}}},
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
	if st.Contexts != 3 || st.Entries != 3 || st.Bindings != 1 || st.Bytes != int64(len(data)) {
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

// asVersion1 rewrites a stream whose profiles use none of the fields of issue 25 as
// version 1 wrote it: each context frame without extra keys, lora path and lookahead.
func asVersion1(t *testing.T, data []byte) []byte {
	t.Helper()
	out := append([]byte(snapshotMagic), 1, 0)
	b := data[len(snapshotMagic)+2 : len(data)-4]
	for len(b) > 0 {
		typ, n := b[0], binary.LittleEndian.Uint32(b[1:5])
		payload := b[5 : 5+n]
		b = b[5+n:]
		if typ == frameContext {
			d := &dec{b: payload}
			for range 3 {
				d.str()
			}
			d.u64()
			for range 4 {
				d.str()
			}
			cut := len(payload) - len(d.b)
			if ek := d.str(); ek != "untagged" || d.str() != "" || d.u64() != 0 {
				t.Fatalf("not a version-1 profile")
			}
			payload = append(bytes.Clone(payload[:cut]), d.b...)
		}
		out = append(out, typ)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	return binary.LittleEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// TestSnapshotVersion1Loads: a stream of an earlier release (version 1, whose profiles
// end at the projection) still loads, with the default values of the new fields.
func TestSnapshotVersion1Loads(t *testing.T) {
	p, _ := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	var buf bytes.Buffer
	w := NewWriter(&buf)
	hdr := &Header{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p, Sequences: map[string]uint64{"tcp://e:1": 3}}
	ch := &engine.SnapshotChunk{Slots: []engine.Slot{{InstanceID: "a"}}, Entries: []engine.SnapshotEntry{{Key: 7, Slot: 0, Tiers: 1}}}
	if w.Context(hdr) != nil || w.Chunk(ch) != nil {
		t.Fatal("write")
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	v2 := &collect{}
	if _, err := Read(bytes.NewReader(buf.Bytes()), 1<<20, v2); err != nil {
		t.Fatal(err)
	}
	v1data := asVersion1(t, buf.Bytes())
	if bytes.Equal(v1data, buf.Bytes()) || binary.LittleEndian.Uint16(v1data[len(snapshotMagic):]) != 1 {
		t.Fatal("the rewrite changed nothing")
	}
	v1 := &collect{}
	if _, err := Read(bytes.NewReader(v1data), 1<<20, v1); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(v1.out) != fmt.Sprint(v2.out) {
		t.Fatalf("version 1 read as\n%v\nversion 2 as\n%v", v1.out, v2.out)
	}
	// Version 1 frames carry no new field: the frame of version 2 read as version 1 has
	// trailing bytes, and the reverse is short.
	bad := bytes.Clone(buf.Bytes())
	binary.LittleEndian.PutUint16(bad[len(snapshotMagic):], 1)
	binary.LittleEndian.PutUint32(bad[len(bad)-4:], crc32.Checksum(bad[:len(bad)-4], castagnoli))
	if _, err := Read(bytes.NewReader(bad), 1<<20, &collect{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a version-2 body labelled 1: %v", err)
	}
	binary.LittleEndian.PutUint16(bad[len(snapshotMagic):], 3)
	binary.LittleEndian.PutUint32(bad[len(bad)-4:], crc32.Checksum(bad[:len(bad)-4], castagnoli))
	if _, err := Read(bytes.NewReader(bad), 1<<20, &collect{}); err == nil || !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("version 3: %v", err)
	}
}
