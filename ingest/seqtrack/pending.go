package seqtrack

// pendingBuf holds live batches, ordered by sequence, while a gap is recovered. Payloads
// are copied into one arena that is reused, so buffering allocates nothing once warm.
// The arena is truncated only by compact, at the start of a tracker call: a payload
// handed out in an Apply action stays valid until the owner's next call.
type pendingBuf struct {
	msgs  []pendingMsg
	head  int
	arena []byte
	bytes int // topic + payload bytes, the quantity the byte limit applies to
}

type pendingMsg struct {
	seq    uint64
	off, n int
	cost   int
}

// Above these capacities an emptied buffer is released instead of kept for reuse.
const (
	pendingKeepArena = 8 << 20
	pendingKeepMsgs  = 1 << 16
)

func (p *pendingBuf) len() int { return len(p.msgs) - p.head }

func (p *pendingBuf) min() (uint64, bool) {
	if p.len() == 0 {
		return 0, false
	}
	return p.msgs[p.head].seq, true
}

func (p *pendingBuf) first() pendingMsg { return p.msgs[p.head] }

func (p *pendingBuf) payload(m pendingMsg) []byte { return p.arena[m.off : m.off+m.n : m.off+m.n] }

// search returns the index in msgs where seq is or would be inserted.
func (p *pendingBuf) search(seq uint64) (int, bool) {
	lo, hi := p.head, len(p.msgs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if p.msgs[mid].seq < seq {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(p.msgs) && p.msgs[lo].seq == seq
}

// insert copies payload in; the caller has checked for duplicates and limits.
func (p *pendingBuf) insert(seq uint64, cost int, payload []byte) {
	m := pendingMsg{seq: seq, off: len(p.arena), n: len(payload), cost: cost}
	p.arena = append(p.arena, payload...)
	p.bytes += cost
	if p.len() == 0 || seq > p.msgs[len(p.msgs)-1].seq {
		p.msgs = append(p.msgs, m)
		return
	}
	i, _ := p.search(seq)
	p.msgs = append(p.msgs, pendingMsg{})
	copy(p.msgs[i+1:], p.msgs[i:])
	p.msgs[i] = m
}

func (p *pendingBuf) pop() {
	p.bytes -= p.msgs[p.head].cost
	p.head++
	if p.head == len(p.msgs) {
		p.reset()
	}
}

// reset forgets every message. The arena is truncated only by compact; an outsized one
// is dropped here (which leaves payloads already handed out intact), so that a stream
// that goes stale does not hold its recovery buffer until it is stopped.
func (p *pendingBuf) reset() {
	p.msgs = p.msgs[:0]
	p.head, p.bytes = 0, 0
	if cap(p.arena) > pendingKeepArena {
		p.arena = nil
	}
}

// compact truncates the arena of an empty buffer, releasing an outsized one.
func (p *pendingBuf) compact() {
	if p.len() > 0 {
		return
	}
	p.msgs, p.arena = p.msgs[:0], p.arena[:0]
	p.head = 0
	if cap(p.arena) > pendingKeepArena {
		p.arena = nil
	}
	if cap(p.msgs) > pendingKeepMsgs {
		p.msgs = nil
	}
}
