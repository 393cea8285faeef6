package source

import "testing"

// TestStreamContinuity: the first batch of a new leader's stream keeps the earlier
// stream's bindings only when it is the next sequence number after the last one applied.
func TestStreamContinuity(t *testing.T) {
	for _, c := range []struct {
		cont streamCont
		seq  uint64
		want contDecision
	}{
		{streamCont{}, 1, contFresh},
		{streamCont{}, 77, contFresh},
		{streamCont{last: 5, has: true}, 6, contKeep},
		{streamCont{last: 5, has: true}, 1, contRetract},
		{streamCont{last: 5, has: true}, 5, contRetract},
		{streamCont{last: 5, has: true}, 7, contRetract},
		{streamCont{last: ^uint64(0), has: true}, 0, contRetract},
	} {
		if got := c.cont.firstBatch(c.seq); got != c.want {
			t.Errorf("%+v first %d: %d, want %d", c.cont, c.seq, got, c.want)
		}
	}
}
