package kvevent_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// evTokenElem appends one token_ids element: mostly a vocabulary id as Python's msgpack
// (narrowest unsigned form) or Go's msgp (signed forms) writes it, else one of the
// elements the fast path leaves to the exact one: a negative id, a 64-bit form, one out
// of the int32 range, no integer at all, or an SGLang pair (well formed or not).
func evTokenElem(b []byte, r *rand.Rand, odd bool) []byte {
	if !odd {
		v := r.IntN(151936)
		if r.IntN(2) == 0 {
			return msgp.AppendUint32(b, uint32(v))
		}
		return msgp.AppendInt32(b, int32(v))
	}
	switch r.IntN(9) {
	case 0:
		return msgp.AppendInt8(b, -int8(r.IntN(100)+1))
	case 1:
		return msgp.AppendInt32(b, -int32(r.IntN(1<<30)+1))
	case 2: // in range, in a 64-bit form
		return append(b, 0xcf, 0, 0, 0, 0, 0, 0, 1, byte(r.IntN(256)))
	case 3:
		return msgp.AppendUint32(b, math.MaxInt32+1+uint32(r.IntN(1000)))
	case 4:
		return msgp.AppendInt64(b, math.MinInt32-1-int64(r.IntN(1000)))
	case 5:
		return msgp.AppendNil(b)
	case 6:
		return msgp.AppendFloat64(b, 3)
	case 7:
		return append(msgp.AppendArrayHeader(b, 2), 5, 6)
	default:
		return append(msgp.AppendArrayHeader(b, 3), 5, 6, 7)
	}
}

// TestTokenArraysMatchExactPath: vLLM and SGLang events whose token_ids arrays are long
// enough for tokenarray.DecodeVBMI, with elements it leaves to the exact path at random
// places (or none), in map and positional events, whole or cut anywhere, decode to the same batch or error, token ids
// kept or skipped, as on the exact path alone (evFuzzDecode's checks). It also checks
// that most arrays were long enough to go through the fast path.
func TestTokenArraysMatchExactPath(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	long := 0
	for iter := range 600 {
		kind := publisher.VLLM
		ev := evVLLMStored()
		if iter%3 == 2 {
			kind, ev = publisher.SGLang, evSGLangStored()
		}
		n := r.IntN(2500)
		if iter%5 == 0 {
			n = r.IntN(130)
		}
		odd := 0
		if iter%2 == 1 {
			odd = 1 + r.IntN(3)
		}
		arr := msgp.AppendArrayHeader(nil, uint32(n))
		for range n {
			arr = evTokenElem(arr, r, odd > 0 && r.IntN(n) < odd)
		}
		ev = ev.with("token_ids", arr)
		enc := ev.enc()
		if iter%4 < 2 {
			// Positional: block_size, an integer, follows the array, so a decode that
			// ran past the array's end would take it for a token id.
			enc = evPositional(ev)
		}
		payload := evBatch(msgp.AppendFloat64(nil, evTS), evNil(), enc, evCleared().enc())
		if iter%4 == 3 {
			payload = payload[:1+r.IntN(len(payload)-1)]
		}
		if n >= 64 {
			long++
		}
		evFuzzDecode(t, kind, payload, evBatch(msgp.AppendFloat64(nil, evTS), evNil(), evCleared().enc()))
	}
	if long < 400 {
		t.Fatalf("only %d of 600 arrays had 64 elements or more", long)
	}
}
