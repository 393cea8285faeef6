package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

type collect struct{ out []string }

func (c *collect) Context(x *Header) error {
	c.out = append(c.out, fmt.Sprintf("C %+v %s %s %s %s %s %q %d %s %+v", x.Key, x.Profile.StrategyName(),
		x.Profile.AlgorithmName(), x.Profile.Seed, x.Profile.ProjectionName(), x.Profile.ExtraKeysName(),
		x.Profile.LoraPath, x.Profile.Lookahead, x.Profile.RootHex(), x.Sources))
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
	// The hash profile fields of current engines travel too (tagged extra keys with the
	// adapter's path, lookahead, seed unset).
	p3, err3 := hashing.ResolveSpec(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset",
		IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/adapters/a", LookaheadTokens: 3})
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf, testKey)
	want := &collect{}
	ctxs := []*Header{
		{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p1, Sources: []Source{
			{Endpoint: "tcp://e:1", Slot: engine.Slot{InstanceID: "a"}, Seq: 99, HasSeq: true},
			{Endpoint: "tcp://e:2", Slot: engine.Slot{InstanceID: "b", DPRank: 3}},
			{Endpoint: "tcp://s:1", Shared: true, Seq: 7, HasSeq: true}}},
		{Key: engine.ContextKey{TenantID: "t", ModelName: "n", LoraName: "l", BlockSize: 64}, Profile: p2},
		{Key: engine.ContextKey{TenantID: "default", ModelName: "m", LoraName: "a", BlockSize: 4}, Profile: p3, Sources: []Source{
			{Endpoint: "tcp://e:1", Slot: engine.Slot{InstanceID: "a"}, Seq: 5, HasSeq: true}}},
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

var testKey = KeyFromToken("s3cret")

// readAll receives data and reads it back into v.
func readAll(data []byte, opts ReceiveOptions, v Visitor) (Stats, error) {
	if opts.MaxBytes == 0 {
		opts.MaxBytes = 1 << 20
	}
	if opts.Key == nil {
		opts.Key = testKey
	}
	sp, err := Receive(bytes.NewReader(data), opts)
	if err != nil {
		return Stats{}, err
	}
	defer sp.Close()
	return sp.Read(v)
}

func TestSnapshotStreamRoundTrip(t *testing.T) {
	data, want := sampleSnapshot(t)
	got := &collect{}
	st, err := readAll(data, ReceiveOptions{}, got)
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
	if st2, err := Verify(bytes.NewReader(data), 1<<20, ""); err != nil || st2 != st {
		t.Fatalf("Verify: %+v %v", st2, err)
	}
}

// TestSnapshotStreamCorruption: every single-byte change, every truncation and a
// too-small limit are refused before anything is decoded (a change to the payload
// fails the checksum, one to the checksum fails it too, one to the signature fails the
// signature).
func TestSnapshotStreamCorruption(t *testing.T) {
	data, _ := sampleSnapshot(t)
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x40
		sp, err := Receive(bytes.NewReader(bad), ReceiveOptions{MaxBytes: 1 << 20, Key: testKey})
		if err == nil {
			sp.Close()
			t.Fatalf("byte %d flipped: accepted", i)
		}
		if !errors.Is(err, ErrCorrupt) && !(i >= len(data)-32 && errors.Is(err, ErrUnauthenticated)) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for n := 0; n < len(data); n++ {
		if sp, err := Receive(bytes.NewReader(data[:n]), ReceiveOptions{MaxBytes: 1 << 20, Key: testKey}); err == nil {
			sp.Close()
			t.Fatalf("truncated to %d: accepted", n)
		}
	}
	if _, err := readAll(data, ReceiveOptions{MaxBytes: int64(len(data) - 1)}, &collect{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := readAll([]byte("not a snapshot at all, not even close"), ReceiveOptions{}, &collect{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage: %v", err)
	}
}

// TestSnapshotSignature: a stream signed with another key (another cluster, another
// token) is refused as unauthenticated, checksum and structure notwithstanding; a tool
// that cannot know the key may still check the rest (Verify).
func TestSnapshotSignature(t *testing.T) {
	data, _ := sampleSnapshot(t)
	if _, err := readAll(data, ReceiveOptions{Key: KeyFromToken("other")}, &collect{}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("another key: %v", err)
	}
	if _, err := readAll(data, ReceiveOptions{Key: []byte{}}, &collect{}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := Verify(bytes.NewReader(data), 1<<20, ""); err != nil {
		t.Fatalf("Verify without the key: %v", err)
	}
}

// countingReader yields an endless stream of one byte and counts what was read.
type countingReader struct {
	b byte
	n int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r.b
	}
	r.n += int64(len(p))
	return len(p), nil
}

// TestReceiveStopsEarly: an endless stream that is not a snapshot is refused after its
// first buffer (the header is checked as it arrives); an endless one with a valid header
// after MaxBytes, never held in memory.
func TestReceiveStopsEarly(t *testing.T) {
	junk := &countingReader{b: 'x'}
	if _, err := Receive(junk, ReceiveOptions{MaxBytes: 1 << 30, Key: testKey}); !errors.Is(err, ErrCorrupt) || junk.n > 1<<20 {
		t.Fatalf("endless junk: %v after %d bytes", err, junk.n)
	}
	head := append([]byte(snapshotMagic), Version, 0)
	endless := io.MultiReader(bytes.NewReader(head), &countingReader{b: 0})
	if _, err := Receive(endless, ReceiveOptions{MaxBytes: 8 << 20, Key: testKey}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("endless stream: %v", err)
	}
}
