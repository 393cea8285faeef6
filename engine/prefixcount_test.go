package engine

import "testing"

// TestPrefixCountCoversVisibleBlocks: at the moment a new block's record enters the table
// (where a query can find it), PrefixCount already counts it and every block stored
// before it, also when one request stores many ops (a burst). A drain that waits for a
// marker block and then reads /global_view relies on it; the count used to be stored only
// at the end of the writer step, so a reader could see the marker of a burst with the
// burst's other blocks not yet counted.
func TestPrefixCountCoversVisibleBlocks(t *testing.T) {
	e := newTestEngine(t, Config{})
	a := Slot{"a", 0}
	mustRegister(t, e, ctxA, vllmProfile(t), a)
	created := 0
	e.hooks = &testHooks{created: func(key uint64) {
		created++
		for _, cv := range e.GlobalView() {
			if cv.Key == ctxA && cv.PrefixCount < uint64(created) {
				t.Errorf("block %d (key %#x) is in the table while PrefixCount is %d", created, key, cv.PrefixCount)
			}
		}
	}}
	var ops []Op
	for i := 0; i < 8; i++ {
		keys := make([]uint64, 16)
		for j := range keys {
			keys[j] = benchKey(i*16 + j)
		}
		ops = append(ops, store(a, TierDevice, keys...))
	}
	mustApply(t, e, ctxA, ops...)
	if created != 8*16 {
		t.Fatalf("created %d records, want %d", created, 8*16)
	}
}
