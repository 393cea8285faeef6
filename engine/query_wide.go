package engine

// walkN is walk1 for any number of bitset words.
func (r *walker) walkN(tab *table, clr *clearSet, hook func(int, int), mode walkMode, src keySource, nblocks int, positions, bs int64, mask []uint64) error {
	w := len(mask)
	if cap(r.alive) < 4*w {
		r.alive = make([]uint64, 4*w)
		r.words = make([]uint64, 3*w)
	}
	alive, words := r.alive[:4*w], r.words[:3*w]
	for t := 0; t < 4; t++ {
		copy(alive[t*w:(t+1)*w], mask)
	}
	prev := tab.prev.Load() // before any probe of tab: see table.findPrev
	pb := &r.pb
	pb.reset(src)
	// As walk1: no probes in a table that stays in the caches.
	probe := mode == walkProbed || (mode != walkLean && len(tab.entries) > probeMinEntries)
	for i := 0; i < nblocks; i++ {
		if probe && i >= pb.end && i != pb.stop {
			pb.next(tab, i, nblocks, 0)
		}
		key, rec := pb.ahead(i)
		if rec == nil {
			if key, rec = pb.fetch(tab, i); rec == nil {
				if tab, prev, rec = pb.missed(tab, prev, key); rec == nil {
					return r.finishN(i, nblocks, positions, bs, alive) // not indexed, or not hashed
				}
			}
		}
		var meta, k, m2 uint64
		if hook == nil {
			meta, k, m2 = readN(rec, words)
		} else {
			meta, k, m2 = hookedReadN(rec, hook, i, words)
		}
		if m2 != meta || meta&(metaBusy|metaFree) != 0 || k != key {
			var ok bool
			if meta, ok = reread(tab, hook, i, key, words); !ok {
				return r.finishN(i, nblocks, positions, bs, alive)
			}
		}
		if clr != nil {
			clr.apply(meta, words) // pending clears (clear.go)
		}
		shCPU, shAny := meta&metaSharedCPU != 0, meta&(metaSharedCPU|metaSharedDisk) != 0
		pos := min(int64(i)*bs, positions)
		var any3 uint64
		for j := 0; j < w; j++ {
			dev, loc, dsk := words[j], words[w+j], words[2*w+j]
			local := dev | loc
			a0, a1, a2, a3 := alive[j], alive[w+j], alive[2*w+j], alive[3*w+j]
			n0, n1, n2, n3 := a0&dev, a1&local, a2, a3
			if !shCPU {
				n2 &= local
			}
			if !shAny {
				n3 &= local | dsk
			}
			if n0 != a0 || n1 != a1 || n2 != a2 || n3 != a3 {
				r.drop(0, j, a0&^n0, pos)
				r.drop(1, j, a1&^n1, pos)
				r.drop(2, j, a2&^n2, pos)
				r.drop(3, j, a3&^n3, pos)
				alive[j], alive[w+j], alive[2*w+j], alive[3*w+j] = n0, n1, n2, n3
			}
			any3 |= n3
		}
		if any3 == 0 {
			r.walked = i + 1
			return nil
		}
	}
	return r.finishN(nblocks, nblocks, positions, bs, alive)
}

// finishN ends walkN at block end (nblocks: it went through every block): the error of
// a block that could not be hashed, or the counts of the slots still alive.
func (r *walker) finishN(end, nblocks int, positions, bs int64, alive []uint64) error {
	if r.pb.err != nil {
		return hashError(end, r.pb.err)
	}
	r.walked = min(end+1, nblocks)
	pos := min(int64(end)*bs, positions)
	w := len(alive) / 4
	for t := 0; t < 4; t++ {
		for j := 0; j < w; j++ {
			r.drop(t, j, alive[t*w+j], pos)
		}
	}
	return nil
}
