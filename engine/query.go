package engine

// Tiers are cumulative token counts: Device <= CPULocal <= CPUShare <= Disk.
type Tiers struct {
	Device, CPULocal, CPUShare, Disk int64
}

// RankHit is the result of one registered rank.
type RankHit struct {
	Rank int
	Tiers
}

// InstanceHit is the result of one instance. Its Tiers are the maximum over its Ranks
// (never a concatenation of ranks); longest_matched is Disk. dp is Ranks[i].Device.
type InstanceHit struct {
	InstanceID string
	Ranks      []RankHit
	Tiers
}

// Result receives a query answer. Reuse one per goroutine: after warm-up a query
// allocates nothing. Instances and their Ranks are valid until the next query into it.
type Result struct {
	// Instances are sorted by InstanceID; ranks ascending. Registered ranks without any hit
	// are present with zero counts.
	Instances []InstanceHit

	// hashed and fromMemo describe the last Query: blocks it hashed, and how many of
	// those came from the key memo (both 0 for QueryKeys or a query that hashed nothing).
	hashed, fromMemo int
	w                walker // the walk's state and buffers, reused from query to query
}

// Query is one prefix lookup.
type Query struct {
	Key       ContextKey
	Tokens    []int32
	CacheSalt string // "" means no salt
	// InstanceFilter restricts the answer to one instance; "" means every instance.
	InstanceFilter string
}

// Query answers q into res. An unknown context, a context without engine slots, or a filter
// naming no registered instance give empty Instances and a nil error, and create nothing.
// A token the profile cannot hash (*hashing.TokenError) gives an error and empty Instances.
func (e *Engine) Query(q *Query, res *Result) error {
	return e.query(q.Key, q.InstanceFilter, walkInput{hash: true, tokens: q.Tokens, salt: q.CacheSalt}, res, walkAuto)
}

// QueryKeys is Query with the block keys already computed: keys[i] is the projected key of
// block i and positions the number of queried token positions (the count clamp for a
// partial last block). It serves callers that hash elsewhere, and benchmarks of the walk.
func (e *Engine) QueryKeys(key ContextKey, keys []uint64, positions int, instanceFilter string, res *Result) error {
	return e.query(key, instanceFilter, walkInput{keys: keys, positions: positions}, res, walkAuto)
}

// walkInput is what a query walks: with hash, the prompt's tokens (and salt), hashed
// block by block as the walk goes; without, keys already computed, with positions queried
// token positions and, in tests, record hints (one per key, or nil: see sameAlive1; the
// walk corrects them in place).
type walkInput struct {
	hash      bool
	tokens    []int32
	salt      string
	keys      []uint64
	hints     []uint32
	positions int
}

// maxViewRetries bounds how often a query walks again because a slot number was reused
// during its walk.
const maxViewRetries = 8

// query is Query and QueryKeys: it walks in from the context's current view, and walks
// again when a slot number was handed to a new registration since that view's slot table
// was built (the walk may have credited the new owner's bits to the old one). After
// maxViewRetries such walks it settles for every covered rank with zero counts, which
// under-reports and never invents a hit. mode is walkAuto but in tests and benchmarks.
func (e *Engine) query(key ContextKey, filter string, in walkInput, res *Result, mode walkMode) error {
	res.Instances = res.Instances[:0]
	res.hashed, res.fromMemo = 0, 0
	c := e.lookup(key)
	if c == nil {
		return nil
	}
	hook := e.walkHook()
	w := &res.w
	for attempt := 0; ; attempt++ {
		v := c.state.Load()
		insts, mask := v.slots.selectInstances(filter)
		if insts == nil {
			return nil
		}
		var err error
		if in.hash {
			w.chain.ResetMemo(e.memo, &c.profile, int(key.BlockSize), key.LoraName, in.salt, in.tokens)
			w.chain.SetHintOwner(c.hintOwner)
			err = w.run(v, mask, hook, mode, &w.chain, w.chain.NumBlocks(), int64(w.chain.Positions()), key.BlockSize)
			w.chain.Done() // publishes the walk's memo inserts and counters
			res.hashed, res.fromMemo = w.chain.Hashed(), w.chain.MemoHits()
			e.memoAheadOfIndex(res)
		} else {
			w.keys = sliceKeys{keys: in.keys, hints: in.hints}
			err = w.run(v, mask, hook, mode, &w.keys, len(in.keys), int64(in.positions), key.BlockSize)
			w.keys = sliceKeys{}
		}
		switch {
		case err != nil:
			return err
		case c.slotReuse.Load() == v.slots.reuse:
		case attempt < maxViewRetries:
			continue
		default:
			w.zeroCounts(insts)
		}
		res.Instances = w.assemble(insts, res.Instances)
		return nil
	}
}

// selectInstances returns the instances a query covers and the bitset of their slots, or
// nil when there are none.
func (st *slotTable) selectInstances(filter string) ([]instSlots, []uint64) {
	if filter == "" {
		if len(st.insts) == 0 {
			return nil, nil
		}
		return st.insts, st.all
	}
	i, ok := st.byID[filter]
	if !ok {
		return nil, nil
	}
	return st.insts[i : i+1], st.insts[i].mask
}
