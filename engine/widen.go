package engine

import (
	"slices"

	"github.com/conductor-go/conductor/arena"
)

// Widening records in bounded steps. A registration whose slot number does not fit the
// record width (past 21, 64, 128... slots) needs every record rewritten at the new width.
// On a large context that is done incrementally, like table growth:
//
//   - The registration reserves its slot number and waits (its request is handed back at
//     the end); the slot is not registered yet, so nothing changes for queries, stores of
//     it are refused as for any slot not yet registered, and the writer goes on serving
//     other requests.
//   - The writer copies the records into a new arena of the new width, index for index
//     (key, meta, write-order link, bitsets converted), a bounded chunk per writer step
//     (and between requests while idle). Every record the writer changes after it was
//     copied is marked (cacheContext.rec) and copied again in the next step, so when the
//     copy reaches the old arena's high-water mark the new arena holds every record
//     exactly as the old one.
//   - The switch is one step of bounded work, taken once every record is copied, the
//     table it publishes is paged in (mapped at the start, a few pages written per step)
//     and no table migration runs: the new arena adopts the old one's allocation state
//     (same indices, same free list), the pending clears are rewritten at the new width,
//     and a view is published whose table, empty, of the new width, reads through to the
//     old table's entries re-homed on the new arena (same entries, same indices: the
//     table's incremental migration then moves them, a few per step, see table.go). The
//     registrations waiting are made in that view; their requests are handed back.
//
// Readers: a query that loaded a view before the switch keeps reading the old table and
// the old arena, which the writer no longer changes after the switch (entries are only
// tombstoned, then released; records are released a chunk per step, reading as zeros):
// never a bit that was not there, but possibly stale or cut short, so the switch bumps
// slotReuse and such a query walks again with the new view (Engine.query), as after a
// slot number's reuse. A miss in the old, dead table never retries in the new one
// (widths differ, see retryMiss). A query that loaded the new view reads only the new
// arena, complete at the switch. Versions (meta) are copied with the records, so the
// seqlock rule holds within each arena.

// defaultWidenChunk is how many records a widening step copies (a few tens of µs).
const defaultWidenChunk = 256

// widening is a running widening. Writer only.
type widening struct {
	w  int          // the new width
	ar *arena.Arena // the new arena: records below pos are copies
	// pos: records below it are copied; dirty lists copied records changed since.
	pos   uint32
	dirty []uint32
	// tab is the table the switch publishes, mapped at the start and written ahead a few
	// pages per step (faulted: entries below are paged in), so that its migration does
	// not take page faults (hundreds per step when it moves entries into fresh pages).
	tab     *table
	faulted int
	// waiters are the registrations waiting for the switch, in arrival order (a repeated
	// registration of a waiting slot waits with it, isNew false).
	waiters []*request
}

// widenSmall is the most records a context may hold for a widening to be done in the
// registration's own step (rebuild: a copy of each live record).
const widenSmall = compactMaxLive

// rec returns record idx of the current arena for the writer to change: while a widening
// runs, a record already copied is marked to be copied again before the switch. Writer
// code that may change a record gets it from here (reads may use the arena directly).
func (c *cacheContext) rec(idx uint32) []uint64 {
	if c.wide != nil { // inlined: the write paths pay a nil check
		c.wide.mark(idx)
	}
	return c.tab.ar.Record(idx)
}

// mark notes that copied record idx changed.
func (wd *widening) mark(idx uint32) {
	if idx < wd.pos {
		wd.dirty = append(wd.dirty, idx)
	}
}

// widenChunk returns the records a widening step copies.
func (c *cacheContext) widenChunk() int {
	if h := c.eng.hooks; h != nil && h.widenChunk > 0 {
		return h.widenChunk
	}
	return defaultWidenChunk
}

// registerWide handles the registration r of slot number n (reserved), which needs
// width need > c.tab.w: at once on a small context, otherwise by a widening (started, or
// joined). It reports whether r waits for the switch.
func (c *cacheContext) registerWide(r *request, n, need int) bool {
	small := widenSmall
	if h := c.eng.hooks; h != nil && h.widenSmall > 0 {
		small = h.widenSmall
	}
	if c.wide == nil && c.tab.ar.Len() <= small && c.tab.prev.Load() == nil {
		c.rebuild(need, false)
		c.slots[r.slot] = n
		return false
	}
	r.slotNum = n
	if c.wide == nil {
		c.startWidening(need)
	}
	c.wide.waiters = append(c.wide.waiters, r)
	if h := c.eng.hooks; h != nil && h.widening != nil {
		h.widening()
	}
	return true
}

// startWidening starts copying the records into an arena of width w (> c.tab.w).
func (c *cacheContext) startWidening(w int) {
	ar := arena.New(arena.Config{RecordWords: recordWords(w)})
	c.wide = &widening{w: w, ar: ar, tab: newTable(sizeFor(c.tab.ar.Len()), ar, w, &c.state)}
	c.widenings++
}

// widenFaultPages bounds the pages of the widening's table a step writes ahead.
const widenFaultPages = 8

// waitingFor returns the waiting registration of s, if any.
func (wd *widening) waitingFor(s Slot) *request {
	for _, r := range wd.waiters {
		if r.isNew && r.slot == s {
			return r
		}
	}
	return nil
}

// widenStep moves a running widening on by a bounded step: it copies again the records
// changed since they were copied, then the next chunk, and switches once every record is
// copied and no table migration runs (the switch starts one of its own).
func (c *cacheContext) widenStep() {
	wd := c.wide
	if wd == nil {
		return
	}
	for _, idx := range wd.dirty {
		c.copyWide(idx)
	}
	wd.dirty = wd.dirty[:0]
	hw := c.tab.ar.HighWater()
	end := min(hw, wd.pos+uint32(c.widenChunk()))
	wd.ar.Reserve(end)
	for ; wd.pos < end; wd.pos++ {
		c.copyWide(wd.pos)
	}
	// The table's pages, in proportion to the records copied (one chunk ahead). A
	// context that grew past the table's size meanwhile gets a larger one, paged in
	// from the start.
	if size := sizeFor(c.tab.ar.Len()); size > len(wd.tab.entries) {
		c.releaseLater(wd.tab.entries[:wd.faulted])
		wd.tab, wd.faulted = newTable(size, wd.ar, wd.w, &c.state), 0
	}
	e := wd.tab.entries
	want := len(e)
	if wd.pos < hw {
		want = int(uint64(len(e)) * uint64(wd.pos+uint32(c.widenChunk())) / uint64(hw))
	}
	for n := 0; wd.faulted < min(want, len(e)) && n < widenFaultPages; n++ {
		e[wd.faulted] = 0 // a write: the kernel maps a page now
		wd.faulted += pageWords
	}
	if wd.pos == hw && wd.faulted >= len(e) && c.tab.prev.Load() == nil {
		c.switchWide()
	}
}

// copyWide copies record idx into the widening's arena.
func (c *cacheContext) copyWide(idx uint32) {
	wd := c.wide
	src, dst := c.tab.ar.Record(idx), wd.ar.Record(idx)
	dst[recKey], dst[recMeta], dst[recLink] = src[recKey], src[recMeta], src[recLink]
	clear(dst[recBits:])
	convertBits(dst[recBits:], wd.w, src[recBits:], c.tab.w)
	c.widenCopied++
}

// switchWide makes the widened arena current (see the comment at the top).
func (c *cacheContext) switchWide() {
	wd := c.wide
	old := c.tab
	if h := c.eng.hooks; h != nil && h.widened != nil {
		h.widened(c.wideMismatches())
	}
	wd.ar.Adopt(old.ar)
	rehomed := &table{entries: old.entries, mask: old.mask, shift: old.shift, ar: wd.ar, w: wd.w, pub: &c.state,
		live: old.live, tombs: old.tombs}
	nt := wd.tab // sized for the records (widenStep)
	nt.prev.Store(rehomed)
	nt.quota = quotaFor(old.live, len(nt.entries))
	if c.next != nil {
		c.releaseLater(c.next.entries) // a table of the old arena
		c.next, c.nextFaulted = nil, 0
	}
	for i := range c.clears {
		b := make([]uint64, bitWords(wd.w))
		convertBits(b, wd.w, c.clears[i].bits, old.w)
		c.clears[i].bits = b
	}
	c.eng.bytes.Add(int64(wd.ar.Len()) * (blockBytes(wd.w) - blockBytes(old.w)))
	c.tab = nt
	c.migrations++
	c.buildClearSet()
	c.wide = nil
	// The waiting registrations whose numbers fit now are made; the others (a number
	// reserved during this widening past its width) wait for the next one.
	var done, later []*request
	need := 0
	for _, r := range wd.waiters {
		switch {
		case r.isNew && widthFor(r.slotNum) <= nt.w:
			c.slots[r.slot] = r.slotNum
			done = append(done, r)
		case !r.isNew && c.registered(r.slot):
			done = append(done, r) // its first registration, earlier in the list, was made

		default:
			if r.isNew {
				need = max(need, widthFor(r.slotNum))
			}
			later = append(later, r)
		}
	}
	// Queries that loaded an older view walk again (Engine.query): the old arena stops
	// changing now and is released over the next steps.
	c.slotReuse.Add(1)
	c.publish()
	old.dead.Store(true)
	// The old table's entries are the re-homed table's: released when its migration
	// ends. The old arena's slabs go back a chunk per step.
	for _, slab := range old.ar.Slabs() {
		c.releaseLater(slab)
	}
	if len(later) > 0 {
		c.startWidening(need)
		c.wide.waiters = later
	}
	for _, r := range done {
		r.done <- struct{}{}
	}
}

func (c *cacheContext) registered(s Slot) bool {
	_, ok := c.slots[s]
	return ok
}

// wideMismatches counts the records of the widening's arena that differ from the current
// arena's (tests check it is 0 at every switch).
func (c *cacheContext) wideMismatches() int {
	wd := c.wide
	bad := 0
	hw := c.tab.ar.HighWater()
	want := make([]uint64, bitWords(wd.w))
	for idx := uint32(0); idx < hw; idx++ {
		src, dst := c.tab.ar.Record(idx), wd.ar.Record(idx)
		clear(want)
		convertBits(want, wd.w, src[recBits:], c.tab.w)
		if dst[recKey] != src[recKey] || dst[recMeta] != src[recMeta] || dst[recLink] != src[recLink] || !slices.Equal(dst[recBits:], want) {
			bad++
		}
	}
	return bad
}

// endWidening hands back, when the engine closes, the registrations waiting for a
// widening (ErrClosed).
func (c *cacheContext) endWidening() {
	if c.wide == nil {
		return
	}
	for _, r := range c.wide.waiters {
		r.closed = true
		r.done <- struct{}{}
	}
	c.wide = nil
}
