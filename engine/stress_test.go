package engine

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// stressLog is what one writer did, in its order, for replay into the model.
type stressEvent struct {
	register, unregister bool
	slot                 Slot
	ops                  []Op
}

// TestConcurrentWritersAndReaders: writers apply ops (and churn registrations, pushing
// the context past 64 slots so records widen mid-run) while readers query. Every answer
// must satisfy device <= cpu_local <= cpu_share <= disk <= positions with instance = max
// over ranks; once writers stop, the engine must equal the model. Each writer owns its
// slots and its shared source, so the final state does not depend on interleaving.
func TestConcurrentWritersAndReaders(t *testing.T) {
	const (
		writers = 4
		readers = 3
		ranks   = 24 // 4 x 24 = 96 slots: two-word records
		batches = 250
	)
	e := newTestEngine(t, Config{MaxBlocksPerContext: -1})
	p := vllmProfile(t)
	k := ctxA
	univ := make([]uint64, 40)
	for i := range univ {
		univ[i] = uint64(i+1) * 0x1000193
	}
	mustRegister(t, e, k, p, Slot{"anchor", 0})

	logs := make([][]stressEvent, writers)
	var wg sync.WaitGroup
	// Writers start once every reader has answered a query, so that the readers run
	// during the writes however the goroutines are scheduled.
	var readersUp sync.WaitGroup
	readersUp.Add(readers)
	for wi := 0; wi < writers; wi++ {
		wg.Go(func() {
			readersUp.Wait()
			rng := rand.New(rand.NewPCG(uint64(wi), 77))
			inst := fmt.Sprintf("w%d", wi)
			src := fmt.Sprintf("tcp://src%d", wi)
			for b := 0; b < batches; b++ {
				s := Slot{inst, rng.IntN(ranks)}
				if b%8 == 0 {
					s.DPRank = b / 8 // every rank registers early, interleaved with ops
				}
				switch rng.IntN(10) {
				case 0, 1:
					if _, err := e.RegisterSlot(k, p, s); err != nil {
						t.Error(err)
						return
					}
					logs[wi] = append(logs[wi], stressEvent{register: true, slot: s})
					continue
				case 2:
					if b < batches/2 {
						break
					}
					e.UnregisterSlot(k, s)
					logs[wi] = append(logs[wi], stressEvent{unregister: true, slot: s})
					continue
				}
				ops := make([]Op, 1+rng.IntN(3))
				for i := range ops {
					a := rng.IntN(len(univ))
					hs := univ[a : a+1+rng.IntN(min(len(univ)-a, 10))]
					switch rng.IntN(6) {
					case 0, 1:
						ops[i] = Op{Kind: OpStore, Slot: s, Tier: EngineTier(rng.IntN(3)), Hashes: hs}
					case 2:
						ops[i] = Op{Kind: OpRemove, Slot: s, Tier: EngineTier(rng.IntN(3)), Hashes: hs}
					case 3:
						ops[i] = Op{Kind: OpClear, Slot: s, ClearTiers: TierMask(1 + rng.IntN(7))}
					default:
						kind := OpSharedStore
						if rng.IntN(3) == 0 {
							kind = OpSharedRemove
						}
						ops[i] = Op{Kind: kind, Source: src, Backend: "pool", ObjectKey: fmt.Sprintf("o%d", a),
							SharedTier: SharedTier(rng.IntN(2)), Hash: univ[a]}
					}
				}
				if err := e.Apply(k, ops); err != nil {
					t.Error(err)
					return
				}
				logs[wi] = append(logs[wi], stressEvent{ops: ops})
			}
		})
	}

	var stop atomic.Bool
	var queries atomic.Int64
	var rwg sync.WaitGroup
	for ri := 0; ri < readers; ri++ {
		rwg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(ri), 99))
			var res Result
			mode := walkAuto
			if ri%2 == 0 {
				mode = walkProbed
			}
			first := true
			defer func() {
				if first { // failed before its first answer: let the writers go
					readersUp.Done()
				}
			}()
			for !stop.Load() {
				n := rng.IntN(len(univ) + 1)
				positions := n * 16
				if n > 0 {
					positions -= rng.IntN(16)
				}
				if err := e.queryKeysWith(k, univ[:n], nil, positions, "", &res, mode); err != nil {
					t.Error(err)
					return
				}
				if msg := checkInvariants(res.Instances, int64(positions)); msg != "" {
					t.Errorf("invariant: %s in %s", msg, formatHits(res.Instances))
					return
				}
				queries.Add(1)
				if first {
					first = false
					readersUp.Done()
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	rwg.Wait()
	if t.Failed() {
		return
	}
	if queries.Load() == 0 {
		t.Fatal("readers ran no query")
	}

	m := newRefModel(0)
	m.register(k, Slot{"anchor", 0})
	for _, log := range logs {
		for _, ev := range log {
			switch {
			case ev.register:
				m.register(k, ev.slot)
			case ev.unregister:
				m.unregister(k, ev.slot)
			default:
				errs, _ := m.apply(k, ev.ops)
				for i := range errs {
					if !sameErr(errs[i], ev.ops[i].Err) {
						t.Fatalf("op %+v: err %v, model %v", ev.ops[i], ev.ops[i].Err, errs[i])
					}
				}
			}
		}
	}
	var res Result
	filters := []string{"", "anchor", "w0", "w1", "w2", "w3"}
	for n := 0; n <= len(univ); n++ {
		for _, f := range filters {
			if err := e.QueryKeys(k, univ[:n], n*16, f, &res); err != nil {
				t.Fatal(err)
			}
			if want := m.query(k, univ[:n], n*16, f); !sameHits(res.Instances, want) {
				t.Fatalf("prefix %d filter %q:\nengine %s\nmodel  %s", n, f, formatHits(res.Instances), formatHits(want))
			}
		}
	}
	if st, _ := e.Stats(k); st.Blocks != len(m.ctxs[k].blockKeys()) {
		t.Fatalf("blocks = %d, model %d", st.Blocks, len(m.ctxs[k].blockKeys()))
	}
	if w := e.lookup(k).state.Load().tab.w; w < 2 {
		t.Fatalf("record width %d: the run never passed 64 slots", w)
	}
	t.Logf("%d concurrent queries checked", queries.Load())
}

func checkInvariants(hits []InstanceHit, positions int64) string {
	for i, in := range hits {
		if i > 0 && hits[i-1].InstanceID >= in.InstanceID {
			return "instances not sorted"
		}
		var mx Tiers
		for j, r := range in.Ranks {
			if j > 0 && in.Ranks[j-1].Rank >= r.Rank {
				return "ranks not ascending"
			}
			if !(0 <= r.Device && r.Device <= r.CPULocal && r.CPULocal <= r.CPUShare && r.CPUShare <= r.Disk && r.Disk <= positions) {
				return fmt.Sprintf("rank %d tiers %+v not ordered within %d", r.Rank, r.Tiers, positions)
			}
			mx.Device, mx.CPULocal = max(mx.Device, r.Device), max(mx.CPULocal, r.CPULocal)
			mx.CPUShare, mx.Disk = max(mx.CPUShare, r.CPUShare), max(mx.Disk, r.Disk)
		}
		if mx != in.Tiers {
			return fmt.Sprintf("instance %s tiers %+v are not the max over ranks %+v", in.InstanceID, in.Tiers, mx)
		}
	}
	return ""
}
