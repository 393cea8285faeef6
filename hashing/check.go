package hashing

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// The profile self-check: engines publish, with each BlockStored, the hashes of the
// blocks and the tokens they cover, so the hashes a registered profile gives those
// tokens can be compared with the engine's own. A profile that does not match makes
// every query miss; the check makes that visible (counters, a status, and which
// profile would match) instead of silent.

// Defaults of CheckConfig.
const (
	DefaultCheckWarmup      = 64
	DefaultCheckSampleEvery = 128
	DefaultCheckDigests     = 4096
	// checkSampleWindow is how many batches in a row a due sample may wait for an event
	// it can verify before the next sample is scheduled.
	checkSampleWindow = 8
	// checkDiagnoseBlocks bounds the blocks hashed per candidate profile in a diagnosis.
	checkDiagnoseBlocks = 2
)

// CheckConfig sets how much of a stream a ProfileCheck verifies. Zero fields take the
// defaults.
type CheckConfig struct {
	// Warmup: every batch is checked until this many events were verified (agreed or
	// not: a mismatching stream is sampled too, so a wrong profile costs no more than
	// a right one) (DefaultCheckWarmup).
	Warmup int
	// SampleEvery: after the warm-up, one batch in SampleEvery is checked, and the few
	// after it until one of its events could be verified (DefaultCheckSampleEvery).
	SampleEvery int
	// Digests bounds the block digests remembered so that an event continuing an earlier
	// one (a parent hash) can be verified (DefaultCheckDigests; FIFO).
	Digests int
}

func (c CheckConfig) withDefaults() CheckConfig {
	if c.Warmup <= 0 {
		c.Warmup = DefaultCheckWarmup
	}
	if c.SampleEvery <= 0 {
		c.SampleEvery = DefaultCheckSampleEvery
	}
	if c.Digests <= 0 {
		c.Digests = DefaultCheckDigests
	}
	return c
}

// StoredEvent is one engine BlockStored as the check reads it. Slices are read during
// Check only.
type StoredEvent struct {
	// Hashes are the engine's block keys, projected as the index keys them.
	Hashes []uint64
	// Parent is the key of the block before the first one, when HasParent.
	Parent    uint64
	HasParent bool
	// Tokens are the event's token ids; for SGLang bigram pages, the [a,b] pairs
	// flattened (Pairs set).
	Tokens []int32
	Pairs  bool
	// BlockSize is the event's block_size (SGLang: the page's length).
	BlockSize int
	// Salt is the cache salt: vLLM's from the first block's extra keys, SGLang's
	// cache_salt.
	Salt string
	// LoraName is the event's lora_name (the check hashes with its context's, which
	// events are routed by).
	LoraName string
	// Lookahead are vLLM's lookahead_token_ids, LookaheadPerBlock per block, when
	// HasLookahead.
	Lookahead         []int32
	LookaheadPerBlock int
	HasLookahead      bool
	// Opaque marks extra keys the check cannot reproduce (multimodal inputs, prompt
	// embeddings): the event is not verified.
	Opaque bool
}

// CheckOutcome is what Check made of one event.
type CheckOutcome uint8

// Outcomes of Check.
const (
	// CheckSkipped: the batch was not due (sampling), nothing was hashed.
	CheckSkipped CheckOutcome = iota
	// CheckUnverifiable: the event lacks what a check needs (its parent's digest, its
	// tokens, reproducible extra keys).
	CheckUnverifiable
	// CheckAgreed: every block hashed as the engine published it.
	CheckAgreed
	// CheckMismatch: a block hashed otherwise under the registered profile.
	CheckMismatch
)

// CheckStatus is a check's verdict so far.
type CheckStatus uint8

// Statuses, as /services shows them.
const (
	// CheckStatusUnverified: no event could be verified yet.
	CheckStatusUnverified CheckStatus = iota
	// CheckStatusOK: events were verified and every one agreed.
	CheckStatusOK
	// CheckStatusMismatch: at least one event disagreed (since NewProfileCheck).
	CheckStatusMismatch
)

// String returns "unverified", "ok" or "mismatch".
func (s CheckStatus) String() string {
	switch s {
	case CheckStatusOK:
		return "ok"
	case CheckStatusMismatch:
		return "mismatch"
	}
	return "unverified"
}

// CheckStats are a check's counters and verdict, read atomically.
type CheckStats struct {
	// Verified counts events checked (agreed or mismatched); Agreed and Mismatched
	// split it. MismatchedBlocks counts their blocks that did not match.
	Verified, Agreed, Mismatched, MismatchedBlocks uint64
	// Unverifiable counts events of checked batches that could not be verified.
	Unverifiable uint64
	// Status is the verdict; Suggestion, with a mismatch, says which profile reproduces
	// the engine's hashes (or that none tried does), once a diagnosis ran.
	Status     CheckStatus
	Suggestion string
}

// String is the hash_check text: "ok", "unverified", or "mismatch (<suggestion>)".
func (s CheckStats) String() string {
	if s.Status != CheckStatusMismatch {
		return s.Status.String()
	}
	if s.Suggestion == "" {
		return "mismatch (not diagnosed yet)"
	}
	return "mismatch (" + s.Suggestion + ")"
}

// ProfileCheck verifies one context's profile against the hashes its engine publishes.
// Create one per context with NewProfileCheck; BeginBatch and Check are called by the
// one goroutine that handles the stream, Stats from any.
type ProfileCheck struct {
	p         Profile
	blockSize int
	lora      string
	cfg       CheckConfig

	// Sampling state (stream goroutine only).
	batches   uint64
	due       bool
	dueLeft   int
	verifiedB bool // an event of the current due window was verified

	// digests remembers the digests of verified blocks by key, for events that continue
	// them; ring is their insertion order (FIFO eviction).
	digests map[uint64][32]byte
	ring    []uint64
	ringPos int

	ch     Chain
	tokBuf []int32
	keys   []uint64
	// cands are the diagnosis candidates for events publishing candsLook lookahead ids
	// per block (-1: none), built once.
	cands     []candidate
	candsLook int
	diagNext  uint64 // diagnose the mismatch that brings Mismatched to this count
	pending   bool   // a mismatch not diagnosed yet (it had a parent)

	verified, agreed, mismatched, mismatchedBlocks, unverifiable atomic.Uint64
	mu                                                           sync.Mutex
	suggestion                                                   string
}

// NewProfileCheck checks events of the context (profile p, block size, lora name).
func NewProfileCheck(p Profile, blockSize int, loraName string, cfg CheckConfig) *ProfileCheck {
	cfg = cfg.withDefaults()
	return &ProfileCheck{p: p, blockSize: blockSize, lora: loraName, cfg: cfg,
		// The digest map and ring grow as blocks are verified, up to cfg.Digests: a
		// service whose engine publishes nothing (or little) holds next to nothing.
		digests: make(map[uint64][32]byte), diagNext: 1, candsLook: -2}
}

// BeginBatch starts a batch and reports whether its events are to be checked: every
// batch until Warmup events were verified, then one in SampleEvery (kept due for a few
// batches until one event could be verified). A caller that decodes token ids only for
// checked batches calls it before decoding.
func (c *ProfileCheck) BeginBatch() bool {
	c.batches++
	switch {
	case c.verified.Load() < uint64(c.cfg.Warmup):
		c.due = true
	case c.due && !c.verifiedB && c.dueLeft > 0:
		c.dueLeft-- // the sample found nothing verifiable yet: look at the next batch
	case c.batches%uint64(c.cfg.SampleEvery) == 0:
		c.due, c.dueLeft, c.verifiedB = true, checkSampleWindow, false
	default:
		c.due = false
	}
	return c.due
}

// Check verifies one BlockStored event of the current batch (CheckSkipped when the
// batch is not due). Mismatching events are counted and, now and then, diagnosed.
func (c *ProfileCheck) Check(ev *StoredEvent) CheckOutcome {
	if !c.due {
		return CheckSkipped
	}
	if c.p.Strategy.isSGLang() && len(ev.Hashes) > 0 && len(ev.Tokens) > 0 &&
		ev.Pairs != (c.p.Strategy == StrategySGLangBigram) {
		// Bigram pages publish [a,b] pairs, plain ones single ids: the strategy is wrong
		// whatever the hashes.
		want := StrategySGLangBigram
		if !ev.Pairs {
			want = StrategySGLang
		}
		c.verified.Add(1)
		c.verifiedB = true
		c.mismatchedBlocks.Add(uint64(len(ev.Hashes)))
		c.mismatched.Add(1)
		c.setSuggestion(fmt.Sprintf("engine hashes match strategy %q", want.String()))
		return CheckMismatch
	}
	toks, ok := c.eventTokens(&c.p, ev)
	var keys []uint64
	var n int
	if ok {
		keys, n, ok = c.compute(&c.p, ev, toks, true)
	}
	if !ok {
		c.unverifiable.Add(1)
		return CheckUnverifiable
	}
	c.verified.Add(1)
	c.verifiedB = true
	bad := 0
	for i := range n {
		if keys[i] != ev.Hashes[i] {
			bad++
		}
	}
	if bad == 0 {
		c.agreed.Add(1)
		return CheckAgreed
	}
	c.mismatchedBlocks.Add(uint64(bad))
	m := c.mismatched.Add(1)
	if ev.HasParent {
		c.pending = true // diagnosable only from the root: wait for such an event
	} else if m >= c.diagNext || c.pending {
		c.diagnose(ev)
		c.pending = false
		c.diagNext = 2 * m
	}
	return CheckMismatch
}

// Forget drops the remembered digests: a restarted engine's blocks start again from the
// root. Counters and status stay.
func (c *ProfileCheck) Forget() {
	clear(c.digests)
	c.ring = c.ring[:0]
	c.ringPos = 0
}

// Stats returns the counters and verdict.
func (c *ProfileCheck) Stats() CheckStats {
	s := CheckStats{Verified: c.verified.Load(), Agreed: c.agreed.Load(), Mismatched: c.mismatched.Load(),
		MismatchedBlocks: c.mismatchedBlocks.Load(), Unverifiable: c.unverifiable.Load()}
	switch {
	case s.Mismatched > 0:
		s.Status = CheckStatusMismatch
		c.mu.Lock()
		s.Suggestion = c.suggestion
		c.mu.Unlock()
	case s.Verified > 0:
		s.Status = CheckStatusOK
	}
	return s
}

// eventTokens returns the token sequence the event's blocks are hashed from under p's
// strategy (valid until the next call): vLLM blocks' tokens followed by the last block's
// lookahead ids, or the SGLang page sequence; ok false when the event's shape does not
// allow a check.
func (c *ProfileCheck) eventTokens(p *Profile, ev *StoredEvent) ([]int32, bool) {
	nh := len(ev.Hashes)
	if nh == 0 || ev.Opaque || len(ev.Tokens) == 0 || ev.BlockSize <= 0 {
		return nil, false
	}
	if p.Strategy != StrategyVLLMV1 {
		if ev.Pairs != (p.Strategy == StrategySGLangBigram) {
			return nil, false
		}
		return c.sglangTokens(ev, nh)
	}
	if ev.BlockSize != c.blockSize || len(ev.Tokens) != nh*ev.BlockSize {
		return nil, false
	}
	if !ev.HasLookahead || ev.LookaheadPerBlock == 0 {
		return ev.Tokens, true
	}
	if len(ev.Lookahead) != nh*ev.LookaheadPerBlock {
		return nil, false
	}
	last := ev.Lookahead[(nh-1)*ev.LookaheadPerBlock:]
	c.tokBuf = append(append(c.tokBuf[:0], ev.Tokens...), last...)
	return c.tokBuf, true
}

// compute hashes the event's blocks under p from toks (eventTokens), starting from its
// parent (a remembered digest) or the root, and returns the keys (valid until the next
// call) and how many of the event's blocks they cover; ok false when the event cannot be
// verified. With remember, the digests of blocks that match the event are kept for
// later events.
func (c *ProfileCheck) compute(p *Profile, ev *StoredEvent, toks []int32, remember bool) ([]uint64, int, bool) {
	var parent *[32]byte
	salt := ev.Salt
	if ev.HasParent {
		if ev.Salt != "" && p.Strategy == StrategyVLLMV1 {
			return nil, 0, false // vLLM salts only a request's block 0, which has no parent
		}
		d, ok := c.digests[ev.Parent]
		if !ok {
			return nil, 0, false
		}
		parent, salt = &d, ""
	}
	ch := &c.ch
	ch.Reset(p, ev.BlockSize, c.lora, salt, toks)
	if parent != nil {
		ch.parent, ch.hasParent = *parent, true
	}
	n := min(ch.NumBlocks(), len(ev.Hashes))
	if n == 0 {
		return nil, 0, false
	}
	keys := c.keysBuf(n)
	for i := range n {
		k, err := ch.Next()
		if err != nil {
			return nil, 0, false
		}
		keys[i] = k
		if remember && k == ev.Hashes[i] {
			c.remember(k, ch.Digest())
		}
	}
	return keys, n, true
}

// sglangTokens returns the token sequence of nh SGLang pages of ev.BlockSize units: the
// tokens as they are, or for bigram pages the sequence the [a,b] pairs slide over.
func (c *ProfileCheck) sglangTokens(ev *StoredEvent, nh int) ([]int32, bool) {
	units := len(ev.Tokens)
	if ev.Pairs {
		units /= 2
	}
	if units != nh*ev.BlockSize || (nh > 1 && ev.BlockSize != c.blockSize) || ev.BlockSize > c.blockSize {
		return nil, false
	}
	if !ev.Pairs {
		return ev.Tokens, true
	}
	t := ev.Tokens
	buf := c.tokBuf[:0]
	for j := 0; j+1 < len(t); j += 2 {
		if j > 0 && t[j] != t[j-1] {
			return nil, false // pairs that do not slide over one sequence
		}
		buf = append(buf, t[j])
	}
	buf = append(buf, t[len(t)-1])
	c.tokBuf = buf
	return buf, true
}

// keysBuf is a reused slice of n keys.
func (c *ProfileCheck) keysBuf(n int) []uint64 {
	if cap(c.keys) < n {
		c.keys = make([]uint64, n)
	}
	return c.keys[:n]
}

// remember keeps a verified block's digest, evicting the oldest beyond cfg.Digests.
func (c *ProfileCheck) remember(key uint64, d [32]byte) {
	if _, ok := c.digests[key]; ok {
		c.digests[key] = d
		return
	}
	if len(c.ring) < c.cfg.Digests {
		c.ring = append(c.ring, key)
	} else {
		delete(c.digests, c.ring[c.ringPos])
		c.ring[c.ringPos] = key
		c.ringPos = (c.ringPos + 1) % len(c.ring)
	}
	c.digests[key] = d
}

// diagnose looks for the profile closest to the registered one that reproduces the
// event's first blocks (a root event) and records the suggestion.
func (c *ProfileCheck) diagnose(ev *StoredEvent) { c.setSuggestion(c.suggest(ev)) }

// setSuggestion records the latest diagnosis for Stats.
func (c *ProfileCheck) setSuggestion(s string) {
	c.mu.Lock()
	c.suggestion = s
	c.mu.Unlock()
}

// candidate is a profile to try in a diagnosis and what it changes.
type candidate struct {
	p       Profile
	changes string
	nChange int
}

// suggest returns the diagnosis text for a mismatching root event: it hashes the
// event's first blocks (checkDiagnoseBlocks) under each candidate profile.
func (c *ProfileCheck) suggest(ev *StoredEvent) string {
	cands := c.candidates(ev)
	full, ok := c.eventTokens(&c.p, ev)
	if !ok {
		return "the event cannot be rehashed"
	}
	short := *ev
	short.Hashes = ev.Hashes[:min(len(ev.Hashes), checkDiagnoseBlocks)]
	toks := full
	if c.p.Strategy == StrategyVLLMV1 {
		// The short event's blocks and as many tokens after them as a candidate's
		// lookahead needs (a chain hashes only the blocks whose lookahead it holds).
		maxL := 0
		for i := range cands {
			maxL = max(maxL, cands[i].p.Lookahead)
		}
		toks = full[:min(len(full), len(short.Hashes)*ev.BlockSize+maxL)]
	}
	best := -1
	for i := range cands {
		keys, n, ok := c.compute(&cands[i].p, &short, toks, false)
		if !ok || n != len(short.Hashes) {
			continue
		}
		match := true
		for j := range n {
			if keys[j] != short.Hashes[j] {
				match = false
				break
			}
		}
		if match && (best < 0 || cands[i].nChange < cands[best].nChange) {
			best = i
		}
	}
	if best >= 0 {
		if cands[best].nChange == 0 {
			return "the registered profile reproduces the event diagnosed: an earlier mismatch may have another cause"
		}
		return cands[best].changes
	}
	msg := "no profile tried reproduces the engine's hashes"
	switch {
	case c.p.Strategy == StrategyVLLMV1 && c.lora != "" && c.p.LoraPath == "":
		msg += `; LoRA blocks of vLLM >= 0.31 need extra_keys "tagged" and lora_path`
	case c.p.Strategy == StrategyVLLMV1 && c.lora != "":
		msg += "; tagged LoRA blocks hash the adapter's path: is lora_path the path the engine was given?"
	case c.p.Strategy.isSGLang() && c.lora != "" && c.p.LoraPath == "":
		msg += "; LoRA pages of SGLang >= 0.5.23 need lora_path (adapters from --lora-paths)"
	case c.p.Strategy.isSGLang() && c.lora != "":
		msg += "; is lora_path the adapter's --lora-paths entry? (an SGLang adapter loaded at run time has a random id: its pages cannot be reproduced)"
	}
	return msg
}

// candidates are the profiles a diagnosis tries, for vllm_v1: every combination of the
// algorithms, the registered seed, "unset" and "0", both extra-key forms (tagged only where
// the lora path is known or there is no LoRA) and the lookahead registered, published
// with the event, or none. They are built once per lookahead an engine publishes.
func (c *ProfileCheck) candidates(ev *StoredEvent) []candidate {
	p := c.p
	if p.Strategy != StrategyVLLMV1 {
		return nil // SGLang has no hashing option to try but the strategy (see Check)
	}
	look := -1
	if ev.HasLookahead {
		look = ev.LookaheadPerBlock
	}
	if c.candsLook == look {
		return c.cands
	}
	var out []candidate
	seeds := []string{p.Seed}
	for _, s := range []string{SeedUnset, "0"} { // the default, and the usual explicit seed
		if s != p.Seed {
			seeds = append(seeds, s)
		}
	}
	looks := []int{p.Lookahead}
	if ev.HasLookahead && ev.LookaheadPerBlock != p.Lookahead {
		looks = append(looks, ev.LookaheadPerBlock)
	}
	if p.Lookahead != 0 && !(ev.HasLookahead && ev.LookaheadPerBlock == 0) {
		looks = append(looks, 0)
	}
	algos := []Algorithm{p.Algorithm}
	for _, a := range []Algorithm{AlgoSHA256Pickle, AlgoSHA256CBOR, AlgoXXHashPickle, AlgoXXHashCBOR} {
		if a != p.Algorithm {
			algos = append(algos, a)
		}
	}
	for _, a := range algos {
		for _, seed := range seeds {
			if a.xxh() && seed == SeedUnset {
				continue
			}
			for _, ek := range []ExtraKeys{p.ExtraKeys, 1 - p.ExtraKeys} {
				if ek == ExtraKeysTagged && c.lora != "" && p.LoraPath == "" {
					continue // the adapter path is unknown: tagged LoRA blocks cannot be tried
				}
				for _, la := range looks {
					q := Profile{Strategy: p.Strategy, Algorithm: a, Projection: p.Projection, Seed: seed,
						ExtraKeys: ek, Lookahead: la}
					if ek == ExtraKeysTagged {
						q.LoraPath = p.LoraPath
					}
					q.Root = rootDigest(a, noneHashSeed(seed))
					var ch []string
					if a != p.Algorithm {
						ch = append(ch, fmt.Sprintf("algorithm %q", a.String()))
					}
					if seed != p.Seed {
						ch = append(ch, fmt.Sprintf("python_hash_seed %q", seed))
					}
					if ek != p.ExtraKeys {
						ch = append(ch, fmt.Sprintf("extra_keys %q", ek.String()))
					}
					if la != p.Lookahead {
						ch = append(ch, fmt.Sprintf("lookahead_tokens %d", la))
					}
					text := "engine hashes match " + strings.Join(ch, ", ")
					out = append(out, candidate{q, text, len(ch)})
				}
			}
		}
	}
	c.cands, c.candsLook = out, look
	return out
}
