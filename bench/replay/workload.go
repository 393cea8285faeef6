package replay

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/conductor-go/conductor/bench/sim"
)

// WorkloadConfig says how trace requests become prompts and block keys.
type WorkloadConfig struct {
	Hash      sim.HashSpec
	BlockSize int
	Lora      string
	// Seed and Vocab drive the synthetic token runs (sim.AppendTokenRun).
	Seed  uint64
	Vocab int32
	// Workers hash in parallel; 0 means GOMAXPROCS.
	Workers int
}

// Workload is a trace with every prompt's block keys computed once, so that each routing
// policy replays the same keys without hashing again.
type Workload struct {
	Reqs []Request
	cfg  WorkloadConfig
	off  []int // keys of request i are keys[off[i]:off[i+1]]
	keys []uint64
}

// NewWorkload hashes every prompt of reqs.
func NewWorkload(reqs []Request, cfg WorkloadConfig) (*Workload, error) {
	if cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("workload: block size %d must be positive", cfg.BlockSize)
	}
	w := &Workload{Reqs: reqs, cfg: cfg, off: make([]int, len(reqs)+1)}
	for i, r := range reqs {
		w.off[i+1] = w.off[i] + r.InputLength/cfg.BlockSize
	}
	w.keys = make([]uint64, w.off[len(reqs)])
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = max(1, min(workers, len(reqs)))
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			h, err := sim.NewHasher(cfg.Hash, cfg.BlockSize, cfg.Lora, "")
			if err != nil {
				errs[g] = err
				return
			}
			var toks []int32
			for i := g; i < len(reqs); i += workers {
				toks = w.Prompt(toks[:0], i)
				dst := w.keys[w.off[i]:w.off[i]:w.off[i+1]]
				got, err := h.AppendKeys(dst, toks)
				if err != nil {
					errs[g] = fmt.Errorf("request %d: %w", i, err)
					return
				}
				if len(got) != w.off[i+1]-w.off[i] {
					errs[g] = fmt.Errorf("request %d: %d keys, want %d", i, len(got), w.off[i+1]-w.off[i])
					return
				}
			}
		}(g)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("workload: %w", err)
		}
	}
	return w, nil
}

// Len is the number of requests.
func (w *Workload) Len() int { return len(w.Reqs) }

// BlockSize is the tokens per block.
func (w *Workload) BlockSize() int { return w.cfg.BlockSize }

// Keys returns request i's block keys (do not modify).
func (w *Workload) Keys(i int) []uint64 { return w.keys[w.off[i]:w.off[i+1]] }

// Blocks is the total number of prompt blocks over the trace.
func (w *Workload) Blocks() int { return len(w.keys) }

// Prompt appends request i's synthetic prompt to dst.
func (w *Workload) Prompt(dst []int32, i int) []int32 {
	r := &w.Reqs[i]
	return sim.AppendPrompt(dst, w.cfg.Seed, r.HashIDs, r.InputLength, w.cfg.Vocab)
}

// PromptTokens is the sum of input lengths.
func (w *Workload) PromptTokens() int64 {
	var n int64
	for i := range w.Reqs {
		n += int64(w.Reqs[i].InputLength)
	}
	return n
}

// InfiniteCacheHitRate is the prefix hit rate of one engine with unlimited cache serving
// the whole trace: no routing policy can do better. It relies on the trace's property
// that a hash id always follows the same prefix, and counts whole blocks only.
func (w *Workload) InfiniteCacheHitRate() float64 {
	seen := make(map[uint32]int) // hash id -> most tokens of its run ever cached
	var hit, total int64
	bs := w.cfg.BlockSize
	for i := range w.Reqs {
		r := &w.Reqs[i]
		total += int64(r.InputLength)
		lead, matching := 0, true
		for j, id := range r.HashIDs {
			cur := min(sim.TokensPerHashID, r.InputLength-j*sim.TokensPerHashID)
			if cur <= 0 {
				break
			}
			if matching {
				s := seen[id]
				lead += min(s, cur)
				matching = s >= cur
			}
			if cur > seen[id] {
				seen[id] = cur
			}
		}
		hit += int64(lead / bs * bs)
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}
