package engine

import (
	"sync/atomic"
	"testing"

	"github.com/conductor-go/conductor/arena"
)

// TestInsertFromPlacesEntryOnItsProbePath: a look-up that misses reports the first free
// position of the key's probe path (a tombstone before the empty entry that ends it), and
// insertFrom puts the entry there, or, when an insert (a migration step's) took that
// position meanwhile, at the next free one: every key stays findable and the counts of
// live entries and tombstones stay exact.
func TestInsertFromPlacesEntryOnItsProbePath(t *testing.T) {
	ar := arena.New(arena.Config{RecordWords: recordWords(0)})
	var pub atomic.Pointer[view]
	tab := newTable(64, ar, 0, &pub)
	home := func(k uint64) uint64 { return mix(k) >> tab.shift }
	put := func(k uint64) {
		idx := ar.Alloc()
		ar.Record(idx)[recKey] = k
		tab.insertNew(k, idx)
	}
	target := benchKey(0)
	h := home(target)
	var same []uint64 // keys whose probe path starts where target's does
	for i := 1; len(same) < 4; i++ {
		if k := benchKey(i); home(k) == h {
			same = append(same, k)
		}
	}
	at := func(k uint64) uint64 {
		t.Helper()
		pos, _, _, ok := tab.slotOf(k)
		if !ok {
			t.Fatalf("key %x not found", k)
		}
		return pos
	}
	// An empty path: the miss stops at target's home.
	if pos, _, _, _, ok := tab.locate(target); ok || pos != h {
		t.Fatalf("miss on an empty path at %d (found %v), want %d", pos, ok, h)
	}
	for _, k := range same[:3] {
		put(k)
	}
	tab.remove(same[1]) // a tombstone at h+1
	pos, _, _, _, ok := tab.locate(target)
	if ok || pos != (h+1)&tab.mask {
		t.Fatalf("miss at %d (found %v), want the tombstone at %d", pos, ok, (h+1)&tab.mask)
	}
	put(same[3]) // takes the tombstone meanwhile
	if p := at(same[3]); p != (h+1)&tab.mask {
		t.Fatalf("insert reused %d, want the tombstone at %d", p, (h+1)&tab.mask)
	}
	idx := ar.Alloc()
	ar.Record(idx)[recKey] = target
	tab.insertFrom(target, pos, idx)
	if p := at(target); p != (h+3)&tab.mask {
		t.Fatalf("inserted at %d, want the next free position %d", p, (h+3)&tab.mask)
	}
	for _, k := range []uint64{same[0], same[2], same[3], target} {
		if rec, ok := tab.find1(k); !ok || rec[recKey] != k {
			t.Fatalf("key %x not found after insertFrom", k)
		}
	}
	if tab.live != 4 || tab.tombs != 0 {
		t.Fatalf("live %d, tombs %d; want 4, 0", tab.live, tab.tombs)
	}
}
