package translate

// Limits on the ops one burst holds before they are flushed anyway: bounded work per
// writer request, bounded memory per source.
const (
	burstMaxHashes = 1 << 14
	burstMaxOps    = 1 << 10
)

// burstBuf keeps what the deferred ops of a burst need once the decoder has moved on:
// their block hashes (the decoder reuses its buffers per batch), copied into one reused
// arena, and the sequence of the batch each op came from (for logs).
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
		b.refs = append(b.refs, burstRef{seq: seq, off: len(b.hashes), n: len(op.Hashes)})
		b.hashes = append(b.hashes, op.Hashes...)
		op.Hashes = nil
	}
	if len(b.hashes) >= burstMaxHashes || len(h.ops) >= burstMaxOps {
		h.Flush()
	}
}

// Flush applies the deferred ops of vLLM and SGLang batches in one request to the
// context writer, and returns once they are applied. It implements ingest.BurstHandler.
func (h *EventHandler) Flush() {
	if len(h.ops) == 0 {
		return
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
	if err := h.eng.Apply(h.src.Context, h.ops); err != nil {
		h.rejected.Add(uint64(len(h.ops)))
		h.log.Warn("kv events not applied", "seq", b.refs[0].seq, "last_seq", b.refs[len(b.refs)-1].seq,
			"events", len(h.ops), "err", err)
	} else {
		for i := range h.ops {
			op := &h.ops[i]
			if op.Err != nil {
				h.reject(b.refs[i].seq, op.Err)
				continue
			}
			h.applied.Add(1)
			h.blocks.Add(uint64(len(op.Hashes)))
		}
	}
	clear(h.ops) // drop the references to the arena and the errors
	h.ops = h.ops[:0]
	b.hashes, b.refs = b.hashes[:0], b.refs[:0]
}
