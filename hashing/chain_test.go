package hashing

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

func mustResolve(t testing.TB, s, a, seed, pr string) Profile {
	t.Helper()
	p, err := Resolve(s, a, seed, pr)
	if err != nil {
		t.Fatalf("Resolve(%s,%s,%s,%s): %v", s, a, seed, pr, err)
	}
	return p
}

func mustResolveSpec(t testing.TB, s Spec) Profile {
	t.Helper()
	p, err := ResolveSpec(s)
	if err != nil {
		t.Fatalf("ResolveSpec(%+v): %v", s, err)
	}
	return p
}

// allProfiles is one profile per hashing algorithm/strategy, plus the vLLM profiles of
// issue 25 (tagged extra keys with a lora path, lookahead, xxhash, the unset seed).
func allProfiles(t testing.TB) map[string]Profile {
	return map[string]Profile{
		"pickle":        mustResolve(t, "vllm_v1", "sha256", "0", "low64_be"),
		"cbor":          mustResolve(t, "vllm_v1", "sha256_cbor", "random", "low64_be"),
		"sglang":        mustResolve(t, "sglang", "sha256_raw", "", "first64_be"),
		"sglang_bigram": mustResolve(t, "sglang_bigram", "sha256_raw", "", "first64_be"),
		"pickle_tagged_la3": mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset",
			IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/adapters/a", LookaheadTokens: 3}),
		"cbor_tagged_la1": mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0",
			IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "é", LookaheadTokens: 1}),
		"xxhash": mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "xxhash", PythonHashSeed: "0",
			IndexProjection: "low64_be"}),
		"xxhash_cbor_tagged_la2": mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "xxhash_cbor", PythonHashSeed: "7",
			IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "p", LookaheadTokens: 2}),
		"sglang_lora_path": mustResolveSpec(t, Spec{Strategy: "sglang", Algorithm: "sha256_raw",
			IndexProjection: "first64_be", LoraPath: "/adapters/a"}),
	}
}

// keyOf is the published key of a block digest: the projection, or for an SGLang LoRA
// page with a lora path, the namespaced value (checked against SGLang 0.5.23's own in
// engines_test.go).
func keyOf(p Profile, lora string, d *[32]byte) uint64 {
	if p.Strategy.isSGLang() && lora != "" && p.LoraPath != "" {
		var seed [32]byte
		sglangLoraNamespace(nil, lora, p.LoraPath, &seed)
		return sglangNamespacedKey(&seed, d)
	}
	return p.Project(d)
}

// digestOf is the profile's block digest of a preimage, computed from the libraries
// directly (SHA-256, or XXH3-128 in the last 16 bytes).
func digestOf(p Profile, pre []byte) [32]byte {
	var d [32]byte
	if p.Algorithm.xxh() {
		h := xxh3.Hash128(pre)
		binary.BigEndian.PutUint64(d[16:], h.Hi)
		binary.BigEndian.PutUint64(d[24:], h.Lo)
		return d
	}
	return sum256(pre)
}

// eagerDigests is an independent, straightforward computation of every block digest,
// built from the reference encoders rather than the chain's fast paths.
func eagerDigests(p Profile, bs int, lora, salt string, toks []int32) [][32]byte {
	var out [][32]byte
	switch p.Strategy {
	case StrategyVLLMV1:
		parent := p.Root
		dl := p.DigestSize()
		var pk pickler
		L := p.Lookahead
		for i := 0; (i+1)*bs+L <= len(toks); i++ {
			ex := blockExtras{tagged: p.ExtraKeys == ExtraKeysTagged, lora: lora, path: p.LoraPath}
			if i == 0 {
				ex.salt = salt
			}
			blk := toks[i*bs : (i+1)*bs]
			look := toks[(i+1)*bs : (i+1)*bs+L]
			var pre []byte
			if p.Algorithm.cbor() {
				pre = appendCBORVLLMBlock(nil, parent[32-dl:], blk, ex, look)
			} else {
				pk.vllmBlock(parent[32-dl:], blk, ex, look)
				pre = pk.b
			}
			parent = digestOf(p, pre)
			out = append(out, parent)
		}
	default:
		var units [][]int32 // each unit: 1 token, or a bigram pair
		if p.Strategy == StrategySGLang {
			for _, t := range toks {
				units = append(units, []int32{t})
			}
		} else {
			for j := 0; j+1 < len(toks); j++ {
				units = append(units, []int32{toks[j], toks[j+1]})
			}
		}
		var pre []byte
		if salt != "" {
			d := sum256([]byte("sglang-cache-salt-v1\x00" + salt))
			pre = d[:]
		}
		for s := 0; s < len(units); s += bs {
			b := append([]byte(nil), pre...)
			for _, u := range units[s:min(s+bs, len(units))] {
				for _, t := range u {
					b = binary.LittleEndian.AppendUint32(b, uint32(t))
				}
			}
			d := sum256(b)
			out = append(out, d)
			pre = d[:]
		}
	}
	return out
}

func TestChainLazyMatchesEager(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	strs := []string{"", "", "lora-a", "s1", "é", randString(r, 20)}
	for name, p := range allProfiles(t) {
		var ch Chain // reused across every prompt: Reset must fully reinitialise it
		for iter := range 200 {
			bs := 1 + r.IntN(20)
			n := r.IntN(100)
			if iter%40 == 0 {
				bs, n = 14000, 30000 // vLLM pickle blocks beyond one frame
			}
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32(r.IntN(300000))
			}
			lora, salt := strs[r.IntN(len(strs))], strs[r.IntN(len(strs))]
			want := eagerDigests(p, bs, lora, salt, toks)
			ch.Reset(&p, bs, lora, salt, toks)
			if ch.NumBlocks() != len(want) {
				t.Fatalf("%s bs %d n %d: NumBlocks %d, want %d", name, bs, n, ch.NumBlocks(), len(want))
			}
			k := r.IntN(len(want) + 1)
			for i := range k {
				key, err := ch.Next()
				if err != nil {
					t.Fatalf("%s block %d: %v", name, i, err)
				}
				if ch.Digest() != want[i] || ch.Hashed() != i+1 {
					t.Fatalf("%s bs %d n %d lora %q salt %q: block %d digest differs", name, bs, n, lora, salt, i)
				}
				if key != keyOf(p, lora, &want[i]) {
					t.Fatalf("%s block %d: key %d, want %d", name, i, key, keyOf(p, lora, &want[i]))
				}
			}
			if k == len(want) {
				if _, err := ch.Next(); !errors.Is(err, ErrChainEnd) {
					t.Fatalf("%s: Next after the end: %v", name, err)
				}
			}
		}
	}
}

func TestChainCounts(t *testing.T) {
	ps := allProfiles(t)
	var ch Chain
	for n := range 12 {
		toks := make([]int32, n)
		for bs := 1; bs <= 5; bs++ {
			for name, p := range ps {
				ch.Reset(&p, bs, "", "", toks)
				wantPos, wantBlocks := n, max(n-p.Lookahead, 0)/bs
				switch name {
				case "sglang", "sglang_lora_path":
					wantBlocks = (n + bs - 1) / bs
				case "sglang_bigram":
					wantPos = max(n-1, 0)
					wantBlocks = (wantPos + bs - 1) / bs
				}
				if ch.Positions() != wantPos || ch.NumBlocks() != wantBlocks {
					t.Errorf("%s n %d bs %d: positions %d blocks %d, want %d %d",
						name, n, bs, ch.Positions(), ch.NumBlocks(), wantPos, wantBlocks)
				}
				got := 0
				for {
					if _, err := ch.Next(); err != nil {
						if !errors.Is(err, ErrChainEnd) {
							t.Fatalf("%s: %v", name, err)
						}
						break
					}
					got++
				}
				if got != wantBlocks {
					t.Errorf("%s n %d bs %d: Next produced %d blocks, want %d", name, n, bs, got, wantBlocks)
				}
			}
		}
	}
}

func TestChainTokenError(t *testing.T) {
	ps := allProfiles(t)
	var ch Chain
	toks := []int32{1, 2, 3, 4, 5, -7, 7, 8, 9}
	for _, name := range []string{"sglang", "sglang_bigram"} {
		p := ps[name]
		ch.Reset(&p, 4, "", "", toks)
		// Block 0 covers tokens 0..3 (bigram: pairs 0..3, i.e. tokens 0..4): fine.
		if _, err := ch.Next(); err != nil {
			t.Fatalf("%s block 0: %v", name, err)
		}
		before := ch.Digest()
		_, err := ch.Next()
		var te *TokenError
		if !errors.As(err, &te) || te.Index != 5 || te.Value != -7 {
			t.Fatalf("%s block 1: %v, want TokenError{5,-7}", name, err)
		}
		if err.Error() == "" {
			t.Fatal("empty error text")
		}
		// The error is sticky and the chain does not advance.
		if _, err2 := ch.Next(); err2 != err || ch.Digest() != before || ch.Hashed() != 1 {
			t.Fatalf("%s: error not sticky: %v", name, err2)
		}
		// Reset clears it.
		ch.Reset(&p, 4, "", "", toks[:4])
		if _, err := ch.Next(); err != nil {
			t.Fatalf("%s after Reset: %v", name, err)
		}
	}
	// A bigram block also needs the token just past its last position.
	p := ps["sglang_bigram"]
	ch.Reset(&p, 4, "", "", []int32{1, 2, 3, 4, -1, 6})
	var te *TokenError
	if _, err := ch.Next(); !errors.As(err, &te) || te.Index != 4 {
		t.Fatalf("bigram: %v, want TokenError at index 4", err)
	}
	// vLLM hashes any int32.
	for _, name := range []string{"pickle", "cbor"} {
		p := ps[name]
		ch.Reset(&p, 3, "", "", []int32{-1, -1 << 31, 1<<31 - 1})
		if _, err := ch.Next(); err != nil {
			t.Fatalf("%s with negative tokens: %v", name, err)
		}
	}
}

func TestChainMisuse(t *testing.T) {
	var ch Chain
	if _, err := ch.Next(); !errors.Is(err, ErrChainEnd) {
		t.Errorf("zero Chain Next: %v, want ErrChainEnd", err)
	}
	ch.Reset(nil, 16, "", "", []int32{1})
	if _, err := ch.Next(); err == nil || errors.Is(err, ErrChainEnd) {
		t.Errorf("nil profile: %v", err)
	}
	ch.Reset(&Profile{}, 16, "", "", []int32{1})
	if _, err := ch.Next(); err == nil || errors.Is(err, ErrChainEnd) {
		t.Errorf("zero profile: %v", err)
	}
	p := mustResolve(t, "sglang", "sha256_raw", "", "first64_be")
	ch.Reset(&p, 0, "", "", []int32{1})
	if _, err := ch.Next(); err == nil || ch.NumBlocks() != 0 {
		t.Errorf("block size 0: %v, %d blocks", err, ch.NumBlocks())
	}
	// A profile with a mismatched algorithm (hand-built) is refused, not misencoded.
	bad := p
	bad.Algorithm = AlgoSHA256CBOR
	ch.Reset(&bad, 4, "", "", []int32{1, 2, 3, 4})
	if _, err := ch.Next(); err == nil || errors.Is(err, ErrChainEnd) {
		t.Errorf("sglang with cbor algorithm: %v", err)
	}
	// Before the first Next, Digest is the vLLM root.
	v := mustResolve(t, "vllm_v1", "sha256", "0", "low64_be")
	ch.Reset(&v, 4, "", "", []int32{1, 2, 3, 4})
	if ch.Digest() != v.Root {
		t.Error("Digest before Next is not the root")
	}
}

func TestChainZeroAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	toks := make([]int32, 4096)
	for i := range toks {
		toks[i] = int32(r.IntN(200000))
	}
	big := make([]int32, 40000)
	for i := range big {
		big[i] = 100000 + int32(i)
	}
	type tc struct {
		name       string
		bs         int
		lora, salt string
		toks       []int32
	}
	cases := []tc{
		{"bs16", 16, "", "", toks},
		{"bs64-lora-salt", 64, "lora-a", "salt-1", toks},
		{"same-singleton", 16, "a", "a", toks},
		{"framed", 20000, "lora-a", "salt", big}, // pickle general path
	}
	for name, p := range allProfiles(t) {
		for _, c := range cases {
			var ch Chain
			run := func() {
				ch.Reset(&p, c.bs, c.lora, c.salt, c.toks)
				drain(&ch)
			}
			run() // warm-up sizes the buffers
			if a := testing.AllocsPerRun(20, run); a != 0 {
				t.Errorf("%s/%s: %v allocs per Reset+Next loop, want 0", name, c.name, a)
			}
			if ch.Hashed() == 0 {
				t.Errorf("%s/%s hashed nothing", name, c.name)
			}
		}
	}
}

// drain hashes every block left in ch.
func drain(ch *Chain) {
	for {
		if _, err := ch.Next(); err != nil {
			return
		}
	}
}
