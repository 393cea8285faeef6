package translate

// Limits on the ops one burst holds before they are flushed anyway: bounded work per
// writer request, bounded memory per source.
const (
	burstMaxHashes = 1 << 14
	burstMaxOps    = 1 << 10
)

// burstBuf keeps what the deferred ops of a burst need once the decoder has moved on:
// their block hashes (the decoder reuses its buffers per batch), copied into one reused
// arena, the sequence of the batch each op came from (for logs) and its context.
type burstBuf struct {
	hashes []uint64
	refs   []burstRef
	// deferred: some of the ops came from batches handed over deferred (a burst), so
	// the flush that applies them counts as a burst flush.
	deferred bool
}

type burstRef struct {
	seq    uint64
	off, n int
	route  *route
	dup    bool // a copy of the previous op for another context: not counted again
}

// deferOps keeps the ops h.ops[first:] of batch seq for Flush, flushing at once when the
// burst is full; deferred: the batch came through HandleBatchDeferred.
func (h *EventHandler) deferOps(seq uint64, first int, deferred bool) {
	b := &h.burst
	if deferred && len(h.ops) > first {
		b.deferred = true
	}
	for i := first; i < len(h.ops); i++ {
		op := &h.ops[i]
		ref := burstRef{seq: seq, off: len(b.hashes), n: len(op.Hashes), route: h.opRoutes[i], dup: h.opDup[i]}
		if ref.dup {
			// A copy follows its op within the batch: it shares the op's hashes.
			ref.off = b.refs[len(b.refs)-1].off
		} else {
			b.hashes = append(b.hashes, op.Hashes...)
		}
		b.refs = append(b.refs, ref)
		op.Hashes = nil
	}
	if len(b.hashes) >= burstMaxHashes || len(h.ops) >= burstMaxOps {
		h.Flush()
	}
}

// Flush applies the deferred ops of vLLM and SGLang batches to the context writers, one
// request per run of ops of one context (one request for a single-context source), and
// returns once they are applied. It implements ingest.BurstHandler.
func (h *EventHandler) Flush() {
	if len(h.ops) == 0 {
		return
	}
	if h.src.BeforeApply != nil {
		h.src.BeforeApply()
	}
	b := &h.burst
	if b.deferred {
		h.burstFlushes.Add(1)
		b.deferred = false
	}
	for i := range h.ops {
		r := b.refs[i]
		h.ops[i].Hashes = b.hashes[r.off : r.off+r.n : r.off+r.n]
	}
	for from := 0; from < len(h.ops); {
		to := from + 1
		for to < len(h.ops) && b.refs[to].route == b.refs[from].route {
			to++
		}
		h.applyRun(from, to)
		from = to
	}
	clear(h.ops) // drop the references to the arena and the errors
	h.ops = h.ops[:0]
	clear(h.opRoutes)
	h.opRoutes, h.opDup = h.opRoutes[:0], h.opDup[:0]
	clear(b.refs)
	b.hashes, b.refs = b.hashes[:0], b.refs[:0]
}

// applyRun applies h.ops[from:to], which share one context, and counts them (copies of
// an op for another context count once, with the first).
func (h *EventHandler) applyRun(from, to int) {
	b := &h.burst
	ops := h.ops[from:to]
	if err := h.eng.Apply(b.refs[from].route.key, ops); err != nil {
		n := 0
		for i := from; i < to; i++ {
			if !b.refs[i].dup {
				n++
			}
		}
		h.rejected.Add(uint64(n))
		h.log.Warn("kv events not applied", "seq", b.refs[from].seq, "last_seq", b.refs[to-1].seq,
			"lora_name", b.refs[from].route.key.LoraName, "events", len(ops), "err", err)
		return
	}
	for i := from; i < to; i++ {
		op := &h.ops[i]
		if b.refs[i].dup {
			continue
		}
		if op.Err != nil {
			h.reject(b.refs[i].seq, op.Err)
			continue
		}
		h.applied.Add(1)
		h.blocks.Add(uint64(len(op.Hashes)))
	}
}
