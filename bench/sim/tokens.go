// Package sim simulates a fleet of LLM engine instances for benchmarks: every data-parallel
// rank keeps a bounded, LRU-evicted block cache per tier and, when a request lands on it,
// publishes the BlockStored / BlockRemoved events a real vLLM or SGLang engine would, over a
// real ZMQ PUB socket with a ROUTER replay endpoint. Block keys come from package hashing,
// the same code the conductor uses to hash queries, so a simulated engine and the conductor
// agree on every key by construction (and the tests check both against the shared vectors).
package sim

// TokensPerHashID is how many tokens one trace hash id stands for (Mooncake traces).
const TokensPerHashID = 512

// DefaultVocab bounds synthetic token ids; it is larger than 65535 so that every integer
// width of the pickle and CBOR encoders is exercised by replayed prompts.
const DefaultVocab = 100_000

// markerBase is above any vocabulary used here: marker prompts can never share a block with
// a synthetic prompt, so quiescence markers never disturb measured hits.
const markerBase = 1 << 30

// splitmix64 is the output function of SplitMix64; a few multiplies give well mixed,
// reproducible token ids without a PRNG object per run.
func splitmix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// AppendTokenRun appends the first n tokens (n <= TokensPerHashID) of the deterministic run
// that stands for trace hash id. The same (seed, id) always yields the same tokens, so
// requests that share leading hash ids share a token prefix, and so share KV blocks.
// vocab <= 0 means DefaultVocab.
func AppendTokenRun(dst []int32, seed uint64, id uint32, n int, vocab int32) []int32 {
	if vocab <= 0 {
		vocab = DefaultVocab
	}
	base := seed ^ (uint64(id)+1)*0x9e3779b97f4a7c15
	for j := 0; j < n; j++ {
		z := splitmix64(base + uint64(j)*0x9e3779b97f4a7c15)
		dst = append(dst, int32(z%uint64(vocab)))
	}
	return dst
}

// AppendPrompt appends the synthetic prompt of a trace request: the token runs of its hash
// ids, truncated to inputLen tokens (a trace's last id usually covers a partial block).
func AppendPrompt(dst []int32, seed uint64, hashIDs []uint32, inputLen int, vocab int32) []int32 {
	left := inputLen
	for _, id := range hashIDs {
		if left <= 0 {
			break
		}
		n := min(left, TokensPerHashID)
		dst = AppendTokenRun(dst, seed, id, n, vocab)
		left -= n
	}
	return dst
}

// AppendMarkerPrompt appends one block of marker tokens for generation gen. Marker tokens
// are outside every synthetic vocabulary, so a marker block is unique to its generation.
func AppendMarkerPrompt(dst []int32, gen uint32, blockSize int) []int32 {
	dst = append(dst, int32(markerBase+gen%(1<<29)))
	for j := 1; j < blockSize; j++ {
		dst = append(dst, markerBase-1)
	}
	return dst
}
