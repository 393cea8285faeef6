package hashing

import "testing"

// walkHints consumes the whole prompt through KeysAhead/HintsAhead/Advance as a walk
// does, calls see with each batch's hints (block index of the batch's first block), and
// when set stores set(block) into every hint before saving them. It returns the hints seen.
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
		if len(hs) != len(ks) {
			t.Fatalf("block %d: %d hints for %d keys ahead", i, len(hs), len(ks))
		}
		copy(seen[i:], hs)
		if set != nil {
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
