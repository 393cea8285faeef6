package replay

import (
	"math/rand/v2"

	"github.com/conductor-go/conductor/bench/sim"
)

// SyntheticTrace generates n requests shaped like multi-turn chat: a few shared system
// prompts, conversations whose every turn extends the previous prompt by a few new
// blocks, interleaved arrivals. It keeps the Mooncake traces' property that a hash id
// always follows the same prefix, so it can stand in for them in quick runs and tests.
func SyntheticTrace(n int, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, seed^0xc0ffee))
	next := uint32(0)
	fresh := func(k int) []uint32 {
		ids := make([]uint32, k)
		for i := range ids {
			ids[i] = next
			next++
		}
		return ids
	}
	systems := make([][]uint32, 4)
	for i := range systems {
		systems[i] = fresh(1 + rng.IntN(3))
	}
	type conv struct{ ids []uint32 }
	var live []*conv
	out := make([]Request, 0, n)
	ts := int64(0)
	for len(out) < n {
		ts += int64(rng.IntN(400))
		var c *conv
		if len(live) < 3 || rng.IntN(4) == 0 {
			c = &conv{ids: append(append([]uint32(nil), systems[rng.IntN(len(systems))]...), fresh(1+rng.IntN(3))...)}
			live = append(live, c)
		} else {
			k := rng.IntN(len(live))
			c = live[k]
			c.ids = append(c.ids, fresh(1+rng.IntN(3))...)
			if len(c.ids) > 40 || rng.IntN(8) == 0 {
				live = append(live[:k], live[k+1:]...)
			}
		}
		ids := append([]uint32(nil), c.ids...)
		out = append(out, Request{
			TimestampMs:  ts,
			InputLength:  len(ids)*sim.TokensPerHashID - rng.IntN(sim.TokensPerHashID),
			OutputLength: 10 + rng.IntN(500),
			HashIDs:      ids,
		})
	}
	return out
}
