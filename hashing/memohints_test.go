package hashing

import "testing"

// walkHints consumes the whole prompt through KeysAhead/HintsAhead/Advance as a walk
// does, and when set stores set(block) into every hint it is given before saving them.
// It returns the hints seen (0 where HintsAhead gave none).
func walkHints(t *testing.T, ch *Chain, nblocks int, set func(i int) uint32) []uint32 {
	t.Helper()
	seen := make([]uint32, nblocks)
	for i := 0; i < nblocks; {
		ks := ch.KeysAhead()
		hs := ch.HintsAhead()
		if len(ks) == 0 {
			if _, err := ch.Next(); err != nil {
				t.Fatal(err)
			}
			i++
			continue
		}
		if hs != nil && len(hs) != len(ks) {
			t.Fatalf("block %d: %d hints for %d keys ahead", i, len(hs), len(ks))
		}
		copy(seen[i:], hs) // nil: no hints to read or save (seen stays 0)
		if set != nil && hs != nil {
			for j := range hs {
				hs[j] = set(i + j)
			}
			ch.SaveHints(len(hs))
		}
		ch.Advance(len(ks))
		i += len(ks)
	}
	ch.Done()
	return seen
}

// TestMemoHintsRoundTrip: hints saved by one walk of a prompt are what the next walk of a
// prompt sharing its runs gets, block by block; blocks the memo does not hold (hashed,
// or a prompt's partial last run) get none and save nowhere.
func TestMemoHintsRoundTrip(t *testing.T) {
	p := allProfiles(t)["cbor"]
	toks := make([]int32, 16*100+5) // 100 whole blocks: 12 runs and 4 blocks
	for i := range toks {
		toks[i] = int32(i*13 + 1)
	}
	m := NewMemo(1 << 12)
	var ch Chain
	ch.SetHintOwner(1)
	ch.ResetMemo(m, &p, 16, "", "", toks)
	if seen := walkHints(t, &ch, 100, func(i int) uint32 { return uint32(1000 + i) }); anyNonZero(seen) {
		t.Fatalf("first walk (nothing memoised) saw hints %v", seen)
	}
	for _, h := range m.hints {
		if h != 0 {
			t.Fatal("a walk of blocks it hashed saved hints")
		}
	}
	ch.ResetMemo(m, &p, 16, "", "", toks) // every whole run now from the memo
	seen := walkHints(t, &ch, 100, func(i int) uint32 { return uint32(1000 + i) })
	if anyNonZero(seen) {
		t.Fatalf("second walk saw hints before any were saved: %v", seen)
	}
	ch.ResetMemo(m, &p, 16, "", "", toks)
	seen = walkHints(t, &ch, 100, nil)
	for i, h := range seen {
		want := uint32(1000 + i)
		if i >= 96 {
			want = 0 // the partial last run is hashed each time
		}
		if h != want {
			t.Fatalf("block %d: hint %d, want %d", i, h, want)
		}
	}
	// A prompt sharing the first 5 runs and then differing: their hints, then none.
	other := append([]int32(nil), toks...)
	for i := 16*40 + 3; i < len(other); i++ {
		other[i]++
	}
	ch.ResetMemo(m, &p, 16, "", "", other)
	seen = walkHints(t, &ch, 100, nil)
	for i, h := range seen {
		want := uint32(1000 + i)
		if i >= 40 {
			want = 0
		}
		if h != want {
			t.Fatalf("other prompt, block %d: hint %d, want %d", i, h, want)
		}
	}
	// Only changed hints are written: saving what was read changes nothing.
	before := append([]uint32(nil), m.hints...)
	ch.ResetMemo(m, &p, 16, "", "", toks)
	walkHints(t, &ch, 100, func(i int) uint32 {
		if i >= 96 {
			return 7 // hashed blocks: saved nowhere
		}
		return uint32(1000 + i)
	})
	for i := range before {
		if m.hints[i] != before[i] {
			t.Fatalf("hint word %d changed from %d to %d", i, before[i], m.hints[i])
		}
	}
	var plain Chain
	plain.Reset(&p, 16, "", "", toks)
	plain.SaveHints(3) // no memo: a no-op
	if plain.HintsAhead() != nil {
		t.Fatal("hints without a memo")
	}
}

func anyNonZero(hs []uint32) bool {
	for _, h := range hs {
		if h != 0 {
			return true
		}
	}
	return false
}

// TestMemoHintsHaveOneOwner: a run's hints are the first owner's to save them; a chain of
// another owner (another index sharing the prompt) gets none and saves none, the first
// owner keeps seeing its own, a chain without an owner gets no hints at all, and a run
// the memo writes anew can be claimed again.
func TestMemoHintsHaveOneOwner(t *testing.T) {
	p := allProfiles(t)["cbor"]
	toks := make([]int32, 16*64)
	for i := range toks {
		toks[i] = int32(i*29 + 3)
	}
	m := NewMemo(1 << 12)
	var a, b, none Chain
	a.SetHintOwner(7)
	b.SetHintOwner(9)
	a.ResetMemo(m, &p, 16, "", "", toks)
	walkHints(t, &a, 64, nil) // hashes and inserts every run
	a.ResetMemo(m, &p, 16, "", "", toks)
	walkHints(t, &a, 64, func(i int) uint32 { return uint32(100 + i) })
	for round := 0; round < 2; round++ {
		b.ResetMemo(m, &p, 16, "", "", toks)
		if seen := walkHints(t, &b, 64, func(i int) uint32 { return uint32(500 + i) }); anyNonZero(seen) {
			t.Fatalf("round %d: another owner saw hints %v", round, seen)
		}
		a.ResetMemo(m, &p, 16, "", "", toks)
		seen := walkHints(t, &a, 64, nil)
		for i, h := range seen {
			if h != uint32(100+i) {
				t.Fatalf("round %d, block %d: the owner's hint is %d, want %d", round, i, h, 100+i)
			}
		}
	}
	none.ResetMemo(m, &p, 16, "", "", toks)
	if ks := none.KeysAhead(); len(ks) < 2 || none.HintsAhead() != nil {
		t.Fatalf("a chain without an owner: %d keys ahead, hints %v", len(ks), none.HintsAhead())
	}
	// Every entry written anew (as an insert replacing the run does): no owner, so the
	// other chain claims the runs.
	for w := range m.ents {
		if m.ents[w].check != 0 {
			wr := m.cur().newWriter(&m.ents[w], &memoRunVal{a: m.ents[w].a, b: m.ents[w].b, k: m.ents[w].k, d: m.ents[w].d})
			for k := 0; k < memoWriteSteps; k++ {
				wr.step(k)
			}
		}
	}
	b.ResetMemo(m, &p, 16, "", "", toks)
	walkHints(t, &b, 64, func(i int) uint32 { return uint32(500 + i) })
	b.ResetMemo(m, &p, 16, "", "", toks)
	for i, h := range walkHints(t, &b, 64, nil) {
		if h != uint32(500+i) {
			t.Fatalf("rewritten run, block %d: the new owner's hint is %d, want %d", i, h, 500+i)
		}
	}
}
