package sim

import (
	"fmt"

	"github.com/conductor-go/conductor/wire/publisher"
)

// CacheConfig sizes one rank's tiers in blocks. Device must be positive; CPU and Disk are
// SGLang HiCache tiers (0 = absent) and are ignored for vLLM ranks, whose conductor index
// only tracks GPU blocks.
type CacheConfig struct {
	Device, CPU, Disk int
}

// Match is how many leading blocks of a prompt a rank holds, cumulative over tiers the way
// the conductor counts them: Device in GPU memory, CPULocal in GPU or host memory, Disk in
// any tier (disk >= cpu_local >= device). Without a shared Mooncake tier the conductor's
// cpu_share equals CPULocal.
type Match struct {
	Device, CPULocal, Disk int
}

// RankStats counts what a rank did.
type RankStats struct {
	// Requests is the number of prompts stored.
	Requests uint64
	// Batches and Events are the batches published and event maps inside them.
	Batches, Events uint64
	// Stored and Removed count block hashes in BlockStored / BlockRemoved events.
	Stored, Removed uint64
	// Bytes is the payload bytes published.
	Bytes uint64
}

func (s *RankStats) add(o RankStats) {
	s.Requests += o.Requests
	s.Batches += o.Batches
	s.Events += o.Events
	s.Stored += o.Stored
	s.Removed += o.Removed
	s.Bytes += o.Bytes
}

// Rank is one data-parallel rank of a simulated engine: exclusive tiers with LRU
// eviction (a block lives in exactly one tier; eviction demotes it to the next tier,
// a hit in a lower tier promotes it back to the device), and the events describing every
// change. A Rank is not safe for concurrent use.
type Rank struct {
	instance, dpRank int
	kind             publisher.Kind
	blockSize        int
	tiers            [numTiers]*lru
	enc              *BatchEncoder
	sink             Sink
	pub              *Publisher // the sink when it is a ZMQ publisher (for endpoints)
	maxEvents        int
	one              [1]uint64
	err              error
	stats            RankStats
}

// maxEventsPerBlock bounds the events caching one block can cause: a removal from a lower
// tier, a device eviction demoting through CPU and disk (five events), and its BlockStored
// (or the end of a vLLM run). Batches are cut early enough to stay under the cap.
const maxEventsPerBlock = 7

// Sink receives a rank's finished batch payloads; *Publisher is the real one. The payload
// is only valid during the call.
type Sink interface {
	Publish(payload []byte) error
}

func newRank(instance, dpRank int, kind publisher.Kind, blockSize int, cc CacheConfig, sink Sink, style EventStyle, lora string, maxEvents int) (*Rank, error) {
	if cc.Device <= 0 {
		return nil, fmt.Errorf("rank %d/%d: device capacity %d blocks: must be positive", instance, dpRank, cc.Device)
	}
	r := &Rank{instance: instance, dpRank: dpRank, kind: kind, blockSize: blockSize, sink: sink, maxEvents: maxEvents}
	if sink != nil {
		r.enc = NewBatchEncoder(kind, style, blockSize, lora)
		r.pub, _ = sink.(*Publisher)
	}
	r.tiers[TierDevice] = newLRU(cc.Device)
	if kind == publisher.SGLang {
		if cc.CPU > 0 {
			r.tiers[TierCPU] = newLRU(cc.CPU)
		}
		if cc.Disk > 0 {
			if cc.CPU <= 0 {
				return nil, fmt.Errorf("rank %d/%d: a disk tier needs a CPU tier to demote through", instance, dpRank)
			}
			r.tiers[TierDisk] = newLRU(cc.Disk)
		}
	}
	if r.maxEvents <= 0 {
		r.maxEvents = 1024
	}
	r.maxEvents = max(r.maxEvents, maxEventsPerBlock)
	return r, nil
}

// Instance and DPRank identify the rank within its fleet.
func (r *Rank) Instance() int { return r.instance }

// DPRank is the rank's data-parallel index.
func (r *Rank) DPRank() int { return r.dpRank }

// Stats returns the rank's counters.
func (r *Rank) Stats() RankStats { return r.stats }

// Publisher is the rank's event stream, or nil when the fleet does not publish.
func (r *Rank) Publisher() *Publisher { return r.pub }

// Blocks is the number of blocks held in tier t.
func (r *Rank) Blocks(t Tier) int {
	if r.tiers[t] == nil {
		return 0
	}
	return r.tiers[t].len()
}

// where returns the tier holding k.
func (r *Rank) where(k uint64) (Tier, bool) {
	for t := TierDevice; t < numTiers; t++ {
		if r.tiers[t] != nil && r.tiers[t].has(k) {
			return t, true
		}
	}
	return 0, false
}

// Match counts the leading blocks of keys that this rank holds, per cumulative tier.
// It does not change recency.
func (r *Rank) Match(keys []uint64) Match {
	var m Match
	dev, loc := true, true
	for _, k := range keys {
		t, ok := r.where(k)
		if !ok {
			break
		}
		if dev && t == TierDevice {
			m.Device++
		} else {
			dev = false
		}
		if loc && t <= TierCPU {
			m.CPULocal++
		} else {
			loc = false
		}
		m.Disk++
	}
	return m
}

// Store lands a request on the rank: it returns what the rank held beforehand (the hit)
// and then caches every full block of the prompt on the device, publishing the events.
// keys are the prompt's block keys (Hasher.AppendKeys) and tokens the prompt. Blocks
// beyond the device capacity are not cached. Blocks are ordered so that the prompt's
// first block is the most recently used and its last the first to go, as vLLM frees a
// finished request's blocks in reverse.
func (r *Rank) Store(tokens []int32, keys []uint64, ts float64) (Match, error) {
	if r.err != nil {
		return Match{}, r.err
	}
	m := r.Match(keys)
	r.stats.Requests++
	dev := r.tiers[TierDevice]
	n := min(len(keys), dev.capacity)
	// Pin the blocks already on the device so that making room never evicts them.
	for i := n - 1; i >= 0; i-- {
		dev.touch(keys[i])
	}
	run := -1 // first block of the pending vLLM BlockStored run
	for i := 0; i < n; i++ {
		if r.sink != nil && r.enc.Len() > 0 && r.enc.Len()+maxEventsPerBlock > r.maxEvents {
			if run >= 0 {
				r.storedRun(tokens, keys, run, i)
				run = -1
			}
			r.flush(ts)
		}
		k := keys[i]
		if dev.has(k) {
			if run >= 0 {
				r.storedRun(tokens, keys, run, i)
				run = -1
			}
			continue
		}
		if t, ok := r.where(k); ok {
			r.tiers[t].remove(k)
			r.removed(k, t)
		}
		r.makeRoom(TierDevice)
		dev.insert(k)
		if r.kind == publisher.SGLang {
			r.storedRun(tokens, keys, i, i+1)
		} else if run < 0 {
			run = i
		}
	}
	if run >= 0 {
		r.storedRun(tokens, keys, run, n)
	}
	for i := n - 1; i >= 0; i-- {
		dev.touch(keys[i])
	}
	r.flush(ts)
	return m, r.err
}

// makeRoom evicts tier t's least recently used block when t is full, demoting it to the
// next tier (which may in turn evict).
func (r *Rank) makeRoom(t Tier) {
	l := r.tiers[t]
	if !l.full() {
		return
	}
	victim, ok := l.popLRU()
	if !ok {
		return
	}
	r.removed(victim, t)
	next := t + 1
	if next < numTiers && r.tiers[next] != nil {
		r.makeRoom(next)
		r.tiers[next].insert(victim)
		r.one[0] = victim
		r.stats.Stored++
		if r.sink != nil {
			r.enc.Stored(r.one[:], 0, false, nil, next)
			r.stats.Events++
		}
	}
}

func (r *Rank) removed(k uint64, t Tier) {
	r.stats.Removed++
	if r.sink == nil {
		return
	}
	r.one[0] = k
	r.enc.Removed(r.one[:], t)
	r.stats.Events++
}

// storedRun emits one BlockStored for blocks [from, to) on the device.
func (r *Rank) storedRun(tokens []int32, keys []uint64, from, to int) {
	r.stats.Stored += uint64(to - from)
	if r.sink == nil {
		return
	}
	var parent uint64
	if from > 0 {
		parent = keys[from-1]
	}
	bs := r.blockSize
	r.enc.Stored(keys[from:to], parent, from > 0, tokens[from*bs:to*bs], TierDevice)
	r.stats.Events++
}

// flush publishes the pending events as one batch.
func (r *Rank) flush(ts float64) {
	if r.sink == nil || r.enc.Len() == 0 {
		return
	}
	payload := r.enc.Finish(ts, r.dpRank)
	r.stats.Batches++
	r.stats.Bytes += uint64(len(payload))
	if err := r.sink.Publish(payload); err != nil && r.err == nil {
		r.err = fmt.Errorf("rank %d/%d: %w", r.instance, r.dpRank, err)
	}
}

// Clear drops every block of every tier and publishes AllBlocksCleared.
func (r *Rank) Clear(ts float64) error {
	for _, l := range r.tiers {
		if l != nil {
			l.clear()
		}
	}
	if r.sink != nil {
		r.enc.Cleared()
		r.stats.Events++
		r.flush(ts)
	}
	return r.err
}

// publishOne publishes a single-event batch for a marker block that is not cached: it
// lets the harness observe when the conductor has applied everything before it.
func (r *Rank) publishOne(key uint64, tokens []int32, stored bool, ts float64) error {
	if r.sink == nil {
		return nil
	}
	r.one[0] = key
	if stored {
		r.enc.Stored(r.one[:], 0, false, tokens, TierDevice)
	} else {
		r.enc.Removed(r.one[:], TierDevice)
	}
	r.stats.Events++
	r.flush(ts)
	return r.err
}

// eachKey calls fn for every block key the rank holds, in any tier.
func (r *Rank) eachKey(fn func(uint64)) {
	for _, l := range r.tiers {
		if l != nil {
			l.each(fn)
		}
	}
}
