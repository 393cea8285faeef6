package engine

import (
	"fmt"
	"runtime"
	"testing"
)

// settled waits until ctxA's table has no migration running: a batch probes the current
// table alone, so a key still only in the previous one ends it (the walk's own lookup
// finds it), which the exact probe counts below do not expect.
func settled(e *Engine) {
	for c := e.lookup(ctxA); c.state.Load().tab.prev.Load() != nil; {
		runtime.Gosched()
	}
}

// TestProbeStopsNearWalkEnd: the overlapped probes look up keys ahead of the walk, but
// never more than one block past the block where the walk stops (walk1: a missing key, or
// no queried slot able to continue), nor a batch past it (walkN: a missing key ends the
// batch; other stops are bounded by the batch size). A walk to the end probes every block.
func TestProbeStopsNearWalkEnd(t *testing.T) {
	const blocks, stop = 512, 10
	keys := make([]uint64, blocks)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	cases := []struct {
		name       string
		slots      int // registered slots ("a" 0, then pads): 1 and 30 walk1, 65 walkN
		ops        func(a, b Slot) []Op
		filter     string
		want       Tiers // of a
		maxProbed  int
		wantProbed int // exact when > 0
	}{
		{"miss/walk1", 1, func(a, _ Slot) []Op { return []Op{store(a, TierDisk, keys[:stop]...)} },
			"", Tiers{0, 0, 0, 16 * stop}, stop + 1, 0},
		{"miss/walk1wide", 30, func(a, _ Slot) []Op { return []Op{store(a, TierDisk, keys[:stop]...)} },
			"", Tiers{0, 0, 0, 16 * stop}, stop + 1, 0},
		{"miss/walkN", 65, func(a, _ Slot) []Op { return []Op{store(a, TierDisk, keys[:stop]...)} },
			"", Tiers{0, 0, 0, 16 * stop}, stop + 1, 0},
		{"noslot/walk1", 1, func(a, b Slot) []Op {
			return []Op{store(a, TierDisk, keys[:stop]...), store(b, TierDisk, keys...)}
		}, "a", Tiers{0, 0, 0, 16 * stop}, stop + 1, 0},
		{"noslot/walk1wide", 30, func(a, b Slot) []Op {
			return []Op{store(a, TierDisk, keys[:stop]...), store(b, TierDisk, keys...)}
		}, "a", Tiers{0, 0, 0, 16 * stop}, stop + 1, 0},
		{"noslot/walkN", 65, func(a, b Slot) []Op {
			return []Op{store(a, TierDisk, keys[:stop]...), store(b, TierDisk, keys...)}
		}, "a", Tiers{0, 0, 0, 16 * stop}, stop + probeMax, 0},
		{"full/walk1", 1, func(a, _ Slot) []Op {
			return []Op{store(a, TierDisk, keys...), store(a, TierDevice, keys[:stop]...)}
		}, "", Tiers{16 * stop, 16 * stop, 16 * stop, 16 * blocks}, blocks, blocks},
		{"full/walkN", 65, func(a, _ Slot) []Op {
			return []Op{store(a, TierDisk, keys...), store(a, TierDevice, keys[:stop]...)}
		}, "", Tiers{16 * stop, 16 * stop, 16 * stop, 16 * blocks}, blocks, blocks},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, Config{})
			a, b := Slot{"a", 0}, Slot{"b", 0}
			mustRegister(t, e, ctxA, vllmProfile(t), a)
			mustRegister(t, e, ctxA, vllmProfile(t), b)
			padSlots(t, e, 2, tc.slots)
			mustApply(t, e, ctxA, tc.ops(a, b)...)
			settled(e)
			var res Result
			if err := e.queryKeysWith(ctxA, keys, nil, blocks*16, tc.filter, &res, walkProbed); err != nil {
				t.Fatal(err)
			}
			if got := rankTiers(t, res.Instances, "a", 0); got != tc.want {
				t.Fatalf("a = %+v, want %+v", got, tc.want)
			}
			if p := res.w.pb.probed + res.w.pb.ran; p > tc.maxProbed || (tc.wantProbed > 0 && p != tc.wantProbed) {
				t.Fatalf("probed %d blocks ahead (max %d, want %d)", p, tc.maxProbed, tc.wantProbed)
			}
			// sameRun's batches grow only once walked whole: the entries it loaded past
			// the stop are at most probeFirst plus the blocks walked.
			if res.w.pb.loaded > 2*res.w.walked+probeFirst {
				t.Fatalf("loaded %d table entries ahead for a walk of %d blocks", res.w.pb.loaded, res.w.walked)
			}
			// The same answer without the probes.
			var plain Result
			if err := e.queryKeysWith(ctxA, keys, nil, blocks*16, tc.filter, &plain, walkLean); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(plain.Instances) != fmt.Sprint(res.Instances) {
				t.Fatalf("with probes %+v, without %+v", res.Instances, plain.Instances)
			}
		})
	}
}

// TestProbesUseMemoKeys: a query whose keys all come from the key memo probes every block
// ahead; the first query of the prompt (every block hashed) every block after the first
// hashAfter, in windows it hashes ahead.
func TestProbesUseMemoKeys(t *testing.T) {
	p := vllmProfile(t)
	e := newTestEngine(t, Config{MemoEntries: 1 << 12})
	s := Slot{"a", 0}
	mustRegister(t, e, ctxA, p, s)
	tokens := seqTokens(16 * 64)
	keys := chainKeys(t, p, 16, "", "", tokens)
	mustApply(t, e, ctxA, store(s, TierDisk, keys...))
	settled(e)
	for round, want := range []int{64 - hashAfter, 64} {
		var res Result
		if err := e.queryWith(&Query{Key: ctxA, Tokens: tokens}, &res, walkProbed); err != nil {
			t.Fatal(err)
		}
		if got := res.Instances[0].Disk; got != 16*64 {
			t.Fatalf("round %d: disk = %d", round, got)
		}
		if res.w.pb.probed+res.w.pb.ran != want || res.fromMemo != 64*round || res.hashed != 64 || res.w.walked != 64 {
			t.Fatalf("round %d: probed %d and ran %d (want %d), %d blocks hashed, %d from the memo, %d walked",
				round, res.w.pb.probed, res.w.pb.ran, want, res.hashed, res.fromMemo, res.w.walked)
		}
	}
}

// TestProbedRecordReusedBeforeRead: the batch finds the records of blocks 0-2; before the
// walk reads block 0, block 1 is removed and its record reused for another key (on
// cpu_local). The record the batch found for block 1 now holds that key: the walk must
// look block 1 up again (gone) and stop there, not credit the reused record.
func TestProbedRecordReusedBeforeRead(t *testing.T) {
	eachWidth(t, func(t *testing.T, nslots int, e *Engine, hooks *testHooks, s Slot) {
		keys := []uint64{0xA0, 0xA1, 0xA2}
		const kx = uint64(0xB1)
		mustApply(t, e, ctxA, store(s, TierDisk, keys...))
		var res Result
		fired := false
		hooks.walkLoad = func(i, w int) {
			if fired || i != 0 || w != recMeta {
				return
			}
			fired = true
			if res.w.pb.base != 0 || res.w.pb.n != 3 {
				t.Errorf("batch base %d n %d when block 0 is read: want 0, 3", res.w.pb.base, res.w.pb.n)
			}
			mustApply(t, e, ctxA, remove(s, TierDisk, keys[1]), store(s, TierCPULocal, kx))
		}
		err := e.queryKeysWith(ctxA, keys, nil, 3*16, "a", &res, walkProbed)
		hooks.walkLoad = nil
		if err != nil {
			t.Fatal(err)
		}
		if !fired {
			t.Fatal("interleaving did not happen")
		}
		if got := rankTiers(t, res.Instances, "a", 0); got != (Tiers{0, 0, 0, 16}) {
			t.Fatalf("a = %+v, want disk 16 only", got)
		}
		// The record was reused in place: kx holds block 1's old record.
		c := e.lookup(ctxA)
		tab := c.state.Load().tab
		if rec, ok := tab.find(kx); !ok || &rec[0] != &res.w.pb.recs[1][0] {
			t.Fatal("kx did not reuse block 1's record")
		}
	})
}

// TestHashAheadBound: without the memo, a walk hashes its first hashAfter blocks one by
// one (a miss there hashes nothing it does not use), then windows of 2, 4, 8, 16 ahead;
// past the block where it stops it has hashed at most one window and probed at most that
// block.
func TestHashAheadBound(t *testing.T) {
	p := vllmProfile(t)
	tokens := seqTokens(16 * 64)
	keys := chainKeys(t, p, 16, "", "", tokens)
	for _, stored := range []int{0, 1, 3, 4, 5, 9, 20, 63, 64} {
		e := newTestEngine(t, Config{})
		s := Slot{"a", 0}
		mustRegister(t, e, ctxA, p, s)
		if stored > 0 {
			mustApply(t, e, ctxA, store(s, TierDisk, keys[:stored]...))
			settled(e)
		}
		var res Result
		if err := e.queryWith(&Query{Key: ctxA, Tokens: tokens}, &res, walkProbed); err != nil {
			t.Fatal(err)
		}
		walked := min(stored+1, 64)
		if got := res.Instances[0].Disk; got != int64(16*stored) || res.w.walked != walked {
			t.Fatalf("stored %d: disk %d, walked %d", stored, got, res.w.walked)
		}
		// Windows: blocks [4,6), [6,10), [10,18), [18,34), [34,50), [50,64); the batch
		// of the window holding the last block walked hashed the next window too.
		hashed := walked
		for start, size := hashAfter, 2; start < walked; start, size = start+size, min(2*size, probeMax) {
			hashed = min(start+size+min(2*size, probeMax), 64)
		}
		if res.hashed != hashed || res.hashed > walked+2*probeMax-1 {
			t.Fatalf("stored %d: hashed %d, want %d", stored, res.hashed, hashed)
		}
		if res.w.pb.probed > max(walked-hashAfter, 0) {
			t.Fatalf("stored %d: probed %d blocks ahead, walked %d", stored, res.w.pb.probed, walked)
		}
	}
}

// TestWalkSwitchesToProbesMidWalk: in a table over probeMinEntries a walk goes its first
// leanBlocks blocks without probes and then, when they were slow, continues with probes
// from where it is; a walk whose blocks are SHA-hashed probes from block hashAfter. Whichever way it goes, the answer and the blocks walked are those of
// a walk that never probes, for stops before, at and after the switch, over walk1's
// tiers, through precomputed keys and through the hashing Query (memo cold and warm).
func TestWalkSwitchesToProbesMidWalk(t *testing.T) {
	e := newTestEngine(t, Config{MaxBlocksPerContext: -1})
	p := vllmProfile(t)
	a, b := Slot{"a", 0}, Slot{"b", 1}
	mustRegister(t, e, ctxA, p, a)
	mustRegister(t, e, ctxA, p, b)
	// Filler blocks so that the table is past probeMinEntries.
	filler := make([]uint64, probeMinEntries)
	for i := range filler {
		filler[i] = benchKey(1<<30 + i)
	}
	mustApply(t, e, ctxA, store(b, TierDisk, filler...))
	const blocks = 3 * leanBlocks
	toks := make([]int32, blocks*16)
	for i := range toks {
		toks[i] = int32(i*7 + 3)
	}
	keys := chainKeys(t, p, 16, "", "", toks)
	settled(e)
	if n := len(e.lookup(ctxA).state.Load().tab.entries); n <= probeMinEntries {
		t.Fatalf("table of %d entries: not past probeMinEntries", n)
	}
	for _, stop := range []int{5, leanBlocks - 1, leanBlocks, leanBlocks + 1, 2*leanBlocks + 3, blocks} {
		mustApply(t, e, ctxA, clearOp(a, MaskAllEngine), clearOp(b, MaskCPULocal))
		mustApply(t, e, ctxA, store(a, TierDisk, keys[:stop]...), store(a, TierDevice, keys[:stop/2]...),
			store(b, TierCPULocal, keys[:min(stop+7, blocks)]...))
		settled(e)
		var want Result
		if err := e.queryKeysWith(ctxA, keys, nil, blocks*16, "", &want, walkLean); err != nil {
			t.Fatal(err)
		}
		for _, sw := range []walkMode{walkSwitchProbed, walkSwitchLean, walkAuto} {
			var got Result
			if err := e.queryKeysWith(ctxA, keys, nil, blocks*16, "", &got, sw); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got.Instances) != fmt.Sprint(want.Instances) || got.w.walked != want.w.walked {
				t.Fatalf("stop %d switch %d: %+v walked %d, want %+v walked %d", stop, sw,
					got.Instances, got.w.walked, want.Instances, want.w.walked)
			}
			if sw == walkSwitchProbed && stop > leanBlocks && got.w.pb.probed == 0 {
				t.Fatalf("stop %d: the walk did not switch to probes", stop)
			}
			if sw == walkSwitchLean && got.w.pb.probed != 0 {
				t.Fatalf("stop %d: probed %d blocks without switching", stop, got.w.pb.probed)
			}
			for round := 0; round < 2; round++ { // memo cold, then warm
				q := Query{Key: ctxA, Tokens: toks}
				if err := e.queryWith(&q, &got, sw); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(got.Instances) != fmt.Sprint(want.Instances) {
					t.Fatalf("stop %d switch %d Query round %d: %+v, want %+v", stop, sw, round,
						got.Instances, want.Instances)
				}
				// Without a memo every block is SHA-hashed: walkAuto probes ahead from
				// block hashAfter on (no timed lean start), every block it walks past it.
				if sw == walkAuto && got.w.pb.probed < got.w.walked-hashAfter-1 {
					t.Fatalf("stop %d Query round %d: probed %d of %d blocks walked", stop, round, got.w.pb.probed, got.w.walked)
				}
			}
		}
	}
}

// TestSameRunBatchGrowsOnlyWhenWalked: where a slot leaves at every block, each sameRun
// call goes through no block, so its batch stays at probeFirst and the table entries it
// loads ahead stay within a batch of the walk's end (a batch that doubled per call would
// load aheadWalk of them within a few blocks).
func TestSameRunBatchGrowsOnlyWhenWalked(t *testing.T) {
	const slots, blocks = 20, 512
	keys := make([]uint64, blocks)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	e := newTestEngine(t, Config{})
	for s := 0; s < slots; s++ {
		sl := Slot{"a", s}
		mustRegister(t, e, ctxA, vllmProfile(t), sl)
		mustApply(t, e, ctxA, store(sl, TierDisk, keys[:s+1]...))
	}
	settled(e)
	var res Result
	if err := e.QueryKeys(ctxA, keys, blocks*16, "", &res); err != nil {
		t.Fatal(err)
	}
	if res.w.walked != slots+1 {
		t.Fatalf("walked %d blocks, want %d", res.w.walked, slots+1)
	}
	if res.w.pb.loaded > res.w.walked+probeFirst {
		t.Fatalf("loaded %d table entries ahead for a walk of %d blocks", res.w.pb.loaded, res.w.walked)
	}
}
