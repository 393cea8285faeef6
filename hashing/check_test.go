package hashing

import (
	"strings"
	"testing"
)

// simEngine publishes BlockStored events as an engine hashing under its own profile
// would (the chain is checked against CPython and engine goldens elsewhere).
type simEngine struct {
	p          Profile
	bs         int
	lora, salt string
	toks       []int32
	keys       []uint64
	noLook     bool // the engine publishes no lookahead_token_ids
}

// openCheck is a check of registered profile p at block size 4 with the default
// config, its first batch begun (the warm-up checks every batch).
func openCheck(p Profile, lora string) *ProfileCheck {
	chk := NewProfileCheck(p, 4, lora, CheckConfig{})
	chk.BeginBatch()
	return chk
}

func newSimEngine(t *testing.T, p Profile, bs int, lora, salt string, n int) *simEngine {
	t.Helper()
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(100000 + 7*i)
	}
	e := &simEngine{p: p, bs: bs, lora: lora, salt: salt, toks: toks}
	var ch Chain
	ch.Reset(&p, bs, lora, salt, toks)
	for {
		k, err := ch.Next()
		if err != nil {
			break
		}
		e.keys = append(e.keys, k)
	}
	return e
}

// event returns the BlockStored of blocks [a, b).
func (e *simEngine) event(a, b int) *StoredEvent {
	ev := &StoredEvent{Hashes: e.keys[a:b], Tokens: e.toks[a*e.bs : b*e.bs], BlockSize: e.bs, LoraName: e.lora}
	if a > 0 {
		ev.Parent, ev.HasParent = e.keys[a-1], true
	} else {
		ev.Salt = e.salt
	}
	if L := e.p.Lookahead; L > 0 && e.p.Strategy == StrategyVLLMV1 && !e.noLook {
		ev.HasLookahead, ev.LookaheadPerBlock = true, L
		for i := a; i < b; i++ {
			ev.Lookahead = append(ev.Lookahead, e.toks[(i+1)*e.bs:(i+1)*e.bs+L]...)
		}
	}
	return ev
}

func specWith(algo, seed string, mut func(*Spec)) Spec {
	s := vllmSpec(algo, seed)
	if mut != nil {
		mut(&s)
	}
	return s
}

func TestProfileCheckDiagnoses(t *testing.T) {
	tagged := func(s *Spec) { s.ExtraKeys = "tagged" }
	cases := []struct {
		name             string
		registered, eng  Spec
		lora, salt       string
		engineNoLook     bool
		wantStatus       CheckStatus
		wantSuggestion   string // substring; "" with ok
		wantNoSuggestion bool
	}{
		{name: "same profile", registered: vllmSpec("sha256", "0"), eng: vllmSpec("sha256", "0"), salt: "s1", wantStatus: CheckStatusOK},
		{name: "same tagged lookahead xxhash", registered: specWith("xxhash", "5", func(s *Spec) { tagged(s); s.LoraPath = "/a"; s.LookaheadTokens = 2 }),
			eng: specWith("xxhash", "5", func(s *Spec) { tagged(s); s.LoraPath = "/a"; s.LookaheadTokens = 2 }), lora: "ad", salt: "s", wantStatus: CheckStatusOK},
		{name: "seed unset", registered: vllmSpec("sha256", "0"), eng: vllmSpec("sha256", "unset"),
			wantStatus: CheckStatusMismatch, wantSuggestion: `engine hashes match python_hash_seed "unset"`},
		{name: "tagged salt", registered: vllmSpec("sha256_cbor", "0"), eng: specWith("sha256_cbor", "0", tagged), salt: "tenant",
			wantStatus: CheckStatusMismatch, wantSuggestion: `engine hashes match extra_keys "tagged"`},
		{name: "untagged salt", registered: specWith("sha256", "0", tagged), eng: vllmSpec("sha256", "0"), salt: "tenant",
			wantStatus: CheckStatusMismatch, wantSuggestion: `engine hashes match extra_keys "untagged"`},
		{name: "lookahead published", registered: vllmSpec("sha256", "0"), eng: specWith("sha256", "0", func(s *Spec) { s.LookaheadTokens = 3 }),
			wantStatus: CheckStatusMismatch, wantSuggestion: "engine hashes match lookahead_tokens 3"},
		{name: "lookahead registered, engine has none", registered: specWith("sha256", "0", func(s *Spec) { s.LookaheadTokens = 1 }), eng: vllmSpec("sha256", "0"),
			wantStatus: CheckStatusMismatch, wantSuggestion: "engine hashes match lookahead_tokens 0"},
		{name: "algorithm", registered: vllmSpec("sha256", "0"), eng: vllmSpec("sha256_cbor", "0"),
			wantStatus: CheckStatusMismatch, wantSuggestion: `engine hashes match algorithm "sha256_cbor"`},
		{name: "seed and tagged together", registered: vllmSpec("sha256", "0"), eng: specWith("sha256", "unset", tagged), salt: "x",
			wantStatus: CheckStatusMismatch, wantSuggestion: `engine hashes match python_hash_seed "unset", extra_keys "tagged"`},
		{name: "tagged LoRA, path unknown", registered: vllmSpec("sha256", "0"), eng: specWith("sha256", "0", func(s *Spec) { tagged(s); s.LoraPath = "/p" }), lora: "ad",
			wantStatus: CheckStatusMismatch, wantSuggestion: `no profile tried reproduces the engine's hashes; LoRA blocks of vLLM >= 0.31 need extra_keys "tagged" and lora_path`},
		{name: "wrong lora path", registered: specWith("sha256", "0", func(s *Spec) { tagged(s); s.LoraPath = "/old" }),
			eng: specWith("sha256", "0", func(s *Spec) { tagged(s); s.LoraPath = "/new" }), lora: "ad",
			wantStatus: CheckStatusMismatch, wantSuggestion: "no profile tried reproduces the engine's hashes; tagged LoRA blocks hash the adapter's path"},
		{name: "random seed", registered: vllmSpec("sha256", "1"), eng: vllmSpec("sha256", "2"),
			wantStatus: CheckStatusMismatch, wantSuggestion: "no profile tried reproduces"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := mustResolveSpec(t, c.registered)
			eng := newSimEngine(t, mustResolveSpec(t, c.eng), 4, c.lora, c.salt, 40)
			eng.noLook = c.engineNoLook
			chk := NewProfileCheck(reg, 4, c.lora, CheckConfig{})
			if !chk.BeginBatch() {
				t.Fatal("the first batch is not checked")
			}
			out := chk.Check(eng.event(0, 3))
			st := chk.Stats()
			if st.Status != c.wantStatus || !strings.Contains(st.Suggestion, c.wantSuggestion) {
				t.Fatalf("outcome %d, stats %+v (%s), want %s %q", out, st, st, c.wantStatus, c.wantSuggestion)
			}
			if c.wantStatus == CheckStatusOK {
				if out != CheckAgreed || st.String() != "ok" || st.Agreed != 1 || st.Mismatched != 0 {
					t.Fatalf("stats %+v", st)
				}
				// The next event continues from a remembered digest.
				if out := chk.Check(eng.event(3, 6)); out != CheckAgreed {
					t.Fatalf("continuation: %d", out)
				}
				return
			}
			if out != CheckMismatch || st.Mismatched != 1 || st.MismatchedBlocks == 0 || st.MismatchedBlocks > 3 ||
				st.String() != "mismatch ("+st.Suggestion+")" {
				t.Fatalf("outcome %d stats %+v", out, st)
			}
		})
	}
}

func TestProfileCheckParents(t *testing.T) {
	p := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	eng := newSimEngine(t, p, 4, "", "", 64)
	chk := openCheck(p, "")
	// A continuation whose parent was never seen cannot be verified.
	if out := chk.Check(eng.event(5, 7)); out != CheckUnverifiable {
		t.Fatalf("unknown parent: %d", out)
	}
	if st := chk.Stats(); st.Status != CheckStatusUnverified || st.String() != "unverified" || st.Unverifiable != 1 {
		t.Fatalf("stats %+v", st)
	}
	for _, r := range [][2]int{{0, 2}, {2, 5}, {5, 7}} {
		if out := chk.Check(eng.event(r[0], r[1])); out != CheckAgreed {
			t.Fatalf("blocks %v: %d", r, out)
		}
	}
	// Forget (a publisher restart): parents from before are gone.
	chk.Forget()
	if out := chk.Check(eng.event(7, 8)); out != CheckUnverifiable {
		t.Fatalf("after Forget: %d", out)
	}
	// Shapes the check cannot rehash.
	bad := []*StoredEvent{
		{Hashes: eng.keys[:1], Tokens: eng.toks[:4], BlockSize: 4, Opaque: true},
		{Hashes: eng.keys[:1], BlockSize: 0},                                                                          // offloading placeholder
		{Hashes: eng.keys[:1], Tokens: eng.toks[:3], BlockSize: 4},                                                    // tokens short
		{Hashes: eng.keys[:2], Tokens: eng.toks[:8], BlockSize: 8},                                                    // another block size
		{Hashes: eng.keys[1:2], Tokens: eng.toks[4:8], BlockSize: 4, Parent: eng.keys[0], HasParent: true, Salt: "s"}, // salt past block 0
	}
	for i, ev := range bad {
		if out := chk.Check(ev); out != CheckUnverifiable {
			t.Errorf("bad event %d: %d", i, out)
		}
	}
	// A mismatch in a continuation waits for a root event to be diagnosed.
	reg := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	unset := newSimEngine(t, mustResolveSpec(t, vllmSpec("sha256", "unset")), 4, "", "", 64)
	chk = openCheck(reg, "")
	cont := unset.event(1, 2)
	cont.Parent = eng.keys[0] // a parent the check knows (verified below), blocks of another profile
	chk.Check(eng.event(0, 1))
	if out := chk.Check(cont); out != CheckMismatch {
		t.Fatalf("continuation mismatch: %d", out)
	}
	if st := chk.Stats(); st.Suggestion != "" || st.String() != "mismatch (not diagnosed yet)" {
		t.Fatalf("diagnosed from a continuation: %+v", st)
	}
	chk.Check(unset.event(0, 2))
	if st := chk.Stats(); !strings.Contains(st.Suggestion, `python_hash_seed "unset"`) {
		t.Fatalf("root event not diagnosed: %+v", st)
	}
}

func TestProfileCheckLookaheadShapes(t *testing.T) {
	p := mustResolveSpec(t, specWith("sha256_cbor", "0", func(s *Spec) { s.LookaheadTokens = 3 }))
	eng := newSimEngine(t, p, 4, "", "", 40)
	chk := openCheck(p, "")
	if out := chk.Check(eng.event(0, 4)); out != CheckAgreed {
		t.Fatalf("with lookahead ids: %d", out)
	}
	// Without the lookahead ids the last block cannot be hashed; the others are.
	eng.noLook = true
	if out := chk.Check(eng.event(4, 6)); out != CheckAgreed {
		t.Fatalf("without lookahead ids: %d", out)
	}
	if out := chk.Check(eng.event(6, 7)); out != CheckUnverifiable {
		t.Fatalf("one block without lookahead ids: %d", out)
	}
	// Lookahead longer than a block.
	p5 := mustResolveSpec(t, specWith("sha256", "0", func(s *Spec) { s.LookaheadTokens = 6 }))
	eng5 := newSimEngine(t, p5, 4, "", "", 40)
	chk5 := openCheck(p5, "")
	if out := chk5.Check(eng5.event(0, 3)); out != CheckAgreed {
		t.Fatalf("lookahead 6, block 4: %d", out)
	}
}

func TestProfileCheckSGLang(t *testing.T) {
	sgl := mustResolve(t, "sglang", "sha256_raw", "", "first64_be")
	big := mustResolve(t, "sglang_bigram", "sha256_raw", "", "first64_be")
	for _, salt := range []string{"", "tenant"} {
		eng := newSimEngine(t, sgl, 4, "", salt, 14) // pages 4,4,4,2
		chk := openCheck(sgl, "")
		ev := eng.event(0, 3)
		ev.Salt = salt
		if out := chk.Check(ev); out != CheckAgreed {
			t.Fatalf("salt %q pages: %d", salt, out)
		}
		last := &StoredEvent{Hashes: eng.keys[3:4], Parent: eng.keys[2], HasParent: true, Tokens: eng.toks[12:14], BlockSize: 2, Salt: salt}
		if out := chk.Check(last); out != CheckAgreed {
			t.Fatalf("salt %q partial page: %d", salt, out)
		}
	}
	// SGLang >= 0.5.23 LoRA pages: namespaced by the adapter's path when registered with it.
	withPath := mustResolveSpec(t, Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", LoraPath: "/p"})
	lengine := newSimEngine(t, withPath, 4, "ad", "", 12)
	for _, c := range []struct {
		p    Profile
		want CheckOutcome
		hint string
	}{{withPath, CheckAgreed, ""}, {sgl, CheckMismatch, "need lora_path"}} {
		chk := openCheck(c.p, "ad")
		if out := chk.Check(lengine.event(0, 2)); out != c.want || !strings.Contains(chk.Stats().Suggestion, c.hint) {
			t.Fatalf("LoRA pages under %+v: %d %+v", c.p, out, chk.Stats())
		}
		if c.want == CheckAgreed {
			if out := chk.Check(lengine.event(2, 3)); out != CheckAgreed { // a namespaced parent
				t.Fatalf("namespaced continuation: %d", out)
			}
		}
	}
	// Bigram pages publish pairs.
	eng := newSimEngine(t, big, 4, "", "", 13) // 12 units: 3 pages
	pairs := func(a, b int) []int32 {
		var out []int32
		for j := a; j < b; j++ {
			out = append(out, eng.toks[j], eng.toks[j+1])
		}
		return out
	}
	chk := openCheck(big, "")
	ev := &StoredEvent{Hashes: eng.keys[:2], Tokens: pairs(0, 8), Pairs: true, BlockSize: 4}
	if out := chk.Check(ev); out != CheckAgreed {
		t.Fatalf("bigram pages: %d", out)
	}
	// Registered sglang, pages of pairs: the strategy is wrong.
	chk = openCheck(sgl, "")
	if out := chk.Check(ev); out != CheckMismatch || !strings.Contains(chk.Stats().Suggestion, `strategy "sglang_bigram"`) {
		t.Fatalf("pairs under sglang: %d %+v", out, chk.Stats())
	}
}

func TestProfileCheckSampling(t *testing.T) {
	p := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	eng := newSimEngine(t, p, 4, "", "", 4*64)
	chk := NewProfileCheck(p, 4, "", CheckConfig{Warmup: 3, SampleEvery: 10, Digests: 4})
	// Warm-up: every batch is due until 3 events agreed; unverifiable ones do not count.
	for i := range 5 {
		if !chk.BeginBatch() {
			t.Fatalf("warm-up batch %d not due", i)
		}
		if out := chk.Check(eng.event(40, 41)); out != CheckUnverifiable {
			t.Fatalf("unknown parent: %d", out)
		}
	}
	for i := range 3 {
		if !chk.BeginBatch() {
			t.Fatalf("warm-up batch %d not due after %d agreed", i, i)
		}
		chk.Check(eng.event(0, 1))
	}
	// Then one batch in 10 is due; an undue batch checks nothing.
	due := 0
	for range 100 {
		if chk.BeginBatch() {
			due++
			if out := chk.Check(eng.event(0, 1)); out != CheckAgreed {
				t.Fatalf("sampled root event: %d", out)
			}
		} else if out := chk.Check(eng.event(0, 1)); out != CheckSkipped {
			t.Fatalf("undue batch checked: %d", out)
		}
	}
	if due < 9 || due > 11 {
		t.Fatalf("%d of 100 batches due, want about 10", due)
	}
	// A sample whose events cannot be verified stays due for a few more batches.
	for !chk.BeginBatch() {
	}
	streak := 1
	chk.Check(eng.event(50, 51))
	for chk.BeginBatch() {
		streak++
		chk.Check(eng.event(50, 51))
		if streak > 2*checkSampleWindow {
			t.Fatal("a sample of unverifiable events stays due for ever")
		}
	}
	if streak < checkSampleWindow {
		t.Fatalf("an unverifiable sample stayed due for %d batches, want %d", streak, checkSampleWindow+1)
	}
	// The digest memory is bounded (Digests: 4).
	if len(chk.digests) > 4 || len(chk.ring) > 4 {
		t.Fatalf("%d digests remembered", len(chk.digests))
	}
}

// A mismatching stream is diagnosed at the 1st, 2nd, 4th, 8th... root mismatch, not
// at every one; past the warm-up it is sampled like an agreeing one.
func TestProfileCheckDiagnosisIsRare(t *testing.T) {
	reg := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	eng := newSimEngine(t, mustResolveSpec(t, vllmSpec("sha256", "unset")), 4, "", "", 8)
	chk := NewProfileCheck(reg, 4, "", CheckConfig{Warmup: 1000})
	diagnosed := 0
	for range 100 {
		chk.BeginBatch()
		chk.setSuggestion("")
		chk.Check(eng.event(0, 2))
		if chk.Stats().Suggestion != "" {
			diagnosed++
		}
	}
	if st := chk.Stats(); st.Mismatched != 100 || diagnosed != 7 { // 1,2,4,...,64
		t.Fatalf("%d diagnoses for %d mismatches", diagnosed, st.Mismatched)
	}
	sampled := NewProfileCheck(reg, 4, "", CheckConfig{Warmup: 5, SampleEvery: 10})
	due := 0
	for range 105 {
		if sampled.BeginBatch() {
			due++
			sampled.Check(eng.event(0, 2))
		}
	}
	if due != 5+10 {
		t.Fatalf("a mismatching stream: %d of 105 batches checked, want the warm-up's 5 and 1 in 10", due)
	}
}

// Stats may be read while the stream's goroutine checks (the server's metrics and views
// do): counters are atomic and the suggestion is locked, as -race verifies.
func TestProfileCheckStatsWhileChecking(t *testing.T) {
	reg := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	eng := newSimEngine(t, mustResolveSpec(t, vllmSpec("sha256", "unset")), 4, "", "", 8)
	chk := NewProfileCheck(reg, 4, "", CheckConfig{Warmup: 1000})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			chk.BeginBatch()
			chk.Check(eng.event(0, 2))
		}
	}()
	for {
		select {
		case <-done:
			if st := chk.Stats(); st.Mismatched != 200 || st.Suggestion == "" {
				t.Fatalf("stats %+v", st)
			}
			return
		default:
			_ = chk.Stats().String()
		}
	}
}

// A warm check allocates nothing per event, agreeing or not (a diagnosis, rare,
// allocates its text).
func TestProfileCheckAllocatesNothing(t *testing.T) {
	reg := mustResolveSpec(t, specWith("sha256", "0", func(s *Spec) { s.LookaheadTokens = 2 }))
	same := newSimEngine(t, reg, 16, "", "", 16*40)
	other := newSimEngine(t, mustResolveSpec(t, specWith("sha256", "unset", func(s *Spec) { s.LookaheadTokens = 2 })), 16, "", "", 16*40)
	chk := NewProfileCheck(reg, 16, "", CheckConfig{Warmup: 1 << 30})
	a, b, c := same.event(0, 8), same.event(8, 16), other.event(1, 9)
	c.Parent = same.keys[0] // a continuation from a known digest: mismatch, no diagnosis
	run := func() {
		chk.BeginBatch()
		chk.Check(a)
		chk.Check(b)
		chk.Check(c)
	}
	run()
	if a := testing.AllocsPerRun(100, run); a != 0 {
		t.Fatalf("%v allocs per batch", a)
	}
	if st := chk.Stats(); st.Agreed == 0 || st.Mismatched == 0 {
		t.Fatalf("stats %+v", st)
	}
}
