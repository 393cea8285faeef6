package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// stagedFixture is an engine with one context (slots a and b, 40 blocks on a's device
// tier, a binding of source s1) and the chunks of its snapshot.
func stagedFixture(t *testing.T) (src *Engine, key ContextKey, p hashing.Profile, chunks []*SnapshotChunk) {
	t.Helper()
	a, b := Slot{InstanceID: "a"}, Slot{InstanceID: "b"}
	src, key, p = setup(t, Config{}, a, b), ctxA, vllmProfile(t)
	hs := seqKeys(1, 40)
	ops := []Op{{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: hs},
		{Kind: OpStore, Slot: b, Tier: TierCPULocal, Hashes: hs[:5]},
		{Kind: OpSharedStore, Source: "s1", Backend: "x", ObjectKey: "o1", SharedTier: SharedCPU, Hash: hs[0]}}
	if err := src.Apply(key, ops); err != nil {
		t.Fatal(err)
	}
	err := src.SnapshotContext(key, 16, func(ch *SnapshotChunk) error {
		c := *ch
		c.Slots = append([]Slot(nil), ch.Slots...)
		c.Entries = append([]SnapshotEntry(nil), ch.Entries...)
		c.Bindings = append([]SnapshotBinding(nil), ch.Bindings...)
		c.Journal = append([]SnapshotOp(nil), ch.Journal...)
		chunks = append(chunks, &c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return src, key, p, chunks
}

func all(Slot) bool      { return true }
func allSrc(string) bool { return true }

// TestStageAllOrNothing: a load whose second context conflicts with the index applies
// nothing: the first context's blocks, staged, are discarded with their charges, and the
// published index is as before (before, the first context's blocks stayed).
func TestStageAllOrNothing(t *testing.T) {
	src, key, p, chunks := stagedFixture(t)
	dst := New(Config{})
	defer dst.Close()
	other := ContextKey{TenantID: "default", ModelName: "n", BlockSize: 16}
	if _, err := dst.RegisterSlot(other, p, Slot{InstanceID: "z"}); err != nil {
		t.Fatal(err)
	}
	st := dst.NewStage()
	for _, ch := range chunks {
		if _, _, err := st.LoadSnapshotChunk(key, p, ch, all, allSrc); err != nil {
			t.Fatal(err)
		}
	}
	conflicting, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "9", "low64_be")
	if _, _, err := st.LoadSnapshotChunk(other, conflicting, chunks[0], all, allSrc); !errors.Is(err, ErrProfileConflict) {
		t.Fatalf("second context: %v, want a profile conflict", err)
	}
	if dst.TotalBlocks() == 0 {
		t.Fatal("the staged blocks are not charged")
	}
	st.Discard()
	if _, ok := dst.ContextProfile(key); ok {
		t.Fatal("a discarded stage's context is published")
	}
	if n := dst.TotalBlocks(); n != 0 {
		t.Fatalf("%d blocks charged after the discard", n)
	}
	_ = src
}

// TestStageCommitSwapsWhole: a committed stage replaces the published contexts at once:
// before Commit queries see nothing of it, after it everything; without replace a
// context that holds data refuses (ErrIndexNotEmpty) and nothing changes; with replace
// the old context's charges are given back; slots follow the registrations of now.
func TestStageCommitSwapsWhole(t *testing.T) {
	src, key, p, chunks := stagedFixture(t)
	want, _ := snapshotSet(t, src, key, 0)
	dst := New(Config{})
	defer dst.Close()
	// The loading node registers a and c (not b): b is left out of the load, c is
	// registered in the staged context at commit.
	a, c := Slot{InstanceID: "a"}, Slot{InstanceID: "c"}
	for _, s := range []Slot{a, c} {
		if _, err := dst.RegisterSlot(key, p, s); err != nil {
			t.Fatal(err)
		}
	}
	load := func() *Stage {
		st := dst.NewStage()
		for _, ch := range chunks {
			if _, _, err := st.LoadSnapshotChunk(key, p, ch, func(s Slot) bool { return s != Slot{InstanceID: "b"} }, allSrc); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	st := load()
	if got, _ := snapshotSet(t, dst, key, 0); len(got) != 0 {
		t.Fatalf("staged data visible before commit: %v", got)
	}
	if err := st.Commit(false, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, _ := snapshotSet(t, dst, key, 0)
	if len(got) != len(want)-5 { // b's five entries left out
		t.Fatalf("after commit %d lines, want %d: %v", len(got), len(want)-5, got)
	}
	if v := fmt.Sprint(dst.GlobalView()[0].Instances); v != "[{a [0]} {c [0]}]" {
		t.Fatalf("committed context's instances %s, want a and c (the registrations of now)", v)
	}
	charged := dst.TotalBlocks()

	// Again without replace: refused, nothing swapped, the stage still discardable.
	st2 := load()
	if err := st2.Commit(false, nil, nil); !errors.Is(err, ErrIndexNotEmpty) {
		t.Fatalf("second load without replace: %v", err)
	}
	st2.Discard()
	if dst.TotalBlocks() != charged {
		t.Fatalf("charges %d after a refused commit, want %d", dst.TotalBlocks(), charged)
	}
	// With replace, keeping only slot a and dropping source s1: the old context's charges
	// are given back, the new one holds a's blocks only.
	st3 := load()
	err := st3.Commit(true, func(_ ContextKey, s Slot) bool { return s == a }, func(ContextKey, string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	got, _ = snapshotSet(t, dst, key, 0)
	if len(got) != 40 {
		t.Fatalf("after replace: %d lines, want a's 40: %v", len(got), got)
	}
	if n := dst.TotalBlocks(); n != 40 {
		t.Fatalf("%d blocks charged after replace, want 40", n)
	}
	// An Apply after the swap reaches the new context: it removes the fixture's block 0.
	if err := dst.Apply(key, []Op{{Kind: OpRemove, Slot: a, Tier: TierDevice, Hashes: seqKeys(1, 1)}}); err != nil {
		t.Fatal(err)
	}
	if got, _ = snapshotSet(t, dst, key, 0); len(got) != 39 {
		t.Fatalf("apply after replace: %d lines", len(got))
	}
}

// TestConcurrentSnapshotsOwnJournals: two snapshots of one context copied at once, with
// changes between their steps, each get every change in their own journal and rebuild
// the context; before, the second replaced the first's journal and the first failed
// with ErrSnapshotJournalFull.
func TestConcurrentSnapshotsOwnJournals(t *testing.T) {
	a := Slot{InstanceID: "a"}
	src, key, p := setup(t, Config{}, a), ctxA, vllmProfile(t)
	hs := seqKeys(1, 64)
	if err := src.Apply(key, []Op{{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: hs}}); err != nil {
		t.Fatal(err)
	}
	// Snapshot 1 runs in this goroutine; at its first chunk, snapshot 2 runs whole, and
	// between each of snapshot 2's steps a change is applied (a block removed, one
	// added). Snapshot 1 then goes on: every change must reach it too.
	dst1, dst2 := New(Config{}), New(Config{})
	defer dst1.Close()
	defer dst2.Close()
	step := 0
	extra := uint64(1000)
	err := src.SnapshotContext(key, 16, func(ch *SnapshotChunk) error {
		if _, _, err := dst1.LoadSnapshotChunk(key, p, ch, all, allSrc); err != nil {
			return err
		}
		step++
		if step != 1 {
			return nil
		}
		return src.SnapshotContext(key, 16, func(ch2 *SnapshotChunk) error {
			if _, _, err := dst2.LoadSnapshotChunk(key, p, ch2, all, allSrc); err != nil {
				return err
			}
			extra++
			return src.Apply(key, []Op{{Kind: OpRemove, Slot: a, Tier: TierDevice, Hashes: []uint64{hs[extra%64]}},
				{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: []uint64{extra * 7}}})
		})
	})
	if err != nil {
		t.Fatalf("snapshot 1: %v", err)
	}
	want, _ := snapshotSet(t, src, key, 0)
	got1, _ := snapshotSet(t, dst1, key, 0)
	if fmt.Sprint(got1) != fmt.Sprint(want) {
		t.Fatalf("snapshot 1 rebuilt\n%v\nwant\n%v", got1, want)
	}
	// Snapshot 2 ended at its last step, before the last change: it has all but that.
	got2, _ := snapshotSet(t, dst2, key, 0)
	if len(got2) != len(want) {
		t.Fatalf("snapshot 2 rebuilt %d lines, want %d", len(got2), len(want))
	}
}
