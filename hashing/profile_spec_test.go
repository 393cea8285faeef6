package hashing

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func vllmSpec(algo, seed string) Spec {
	return Spec{Strategy: "vllm_v1", Algorithm: algo, PythonHashSeed: seed, IndexProjection: "low64_be"}
}

func TestResolveSpecFields(t *testing.T) {
	tagged := vllmSpec("sha256", "0")
	tagged.ExtraKeys = "tagged"
	cases := []struct {
		name  string
		spec  Spec
		field string // "" accepted
	}{
		{"xxhash", vllmSpec("xxhash", "0"), ""},
		{"xxhash_cbor", vllmSpec("xxhash_cbor", "4294967295"), ""},
		{"xxhash random seed", vllmSpec("xxhash", "random"), ""},
		{"xxhash unset seed", vllmSpec("xxhash_cbor", "unset"), FieldSeed},
		{"sha256 unset", vllmSpec("sha256", "unset"), ""},
		{"sha256_cbor unset", vllmSpec("sha256_cbor", "unset"), ""},
		{"unknown seed word", vllmSpec("sha256", "UNSET"), FieldSeed},
		{"md5", vllmSpec("md5", "0"), FieldAlgorithm},
		{"algorithm before seed", vllmSpec("xxh3", "bad"), FieldAlgorithm},
		{"untagged explicit", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "untagged"}, ""},
		{"tagged", tagged, ""},
		{"extra_keys value", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "Tagged"}, FieldExtraKeys},
		{"seed before extra_keys", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "x", IndexProjection: "low64_be", ExtraKeys: "bad"}, FieldSeed},
		{"lora_path untagged", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", LoraPath: "/a"}, FieldLoraPath},
		{"lora_path tagged", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/a"}, ""},
		{"lora_path utf8", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "\xff"}, FieldLoraPath},
		{"lookahead 3", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", LookaheadTokens: 3}, ""},
		{"lookahead max", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", LookaheadTokens: MaxLookahead}, ""},
		{"lookahead over", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", LookaheadTokens: MaxLookahead + 1}, FieldLookahead},
		{"lookahead negative", Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", LookaheadTokens: -1}, FieldLookahead},
		{"sglang untagged", Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", ExtraKeys: "untagged"}, ""},
		{"sglang tagged", Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", ExtraKeys: "tagged"}, FieldExtraKeys},
		{"sglang lora_path", Spec{Strategy: "sglang_bigram", Algorithm: "sha256_raw", IndexProjection: "first64_be", LoraPath: "/a"}, ""},
		{"sglang lora_path utf8", Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", LoraPath: "\xff"}, FieldLoraPath},
		{"sglang lookahead", Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", LookaheadTokens: 1}, FieldLookahead},
		{"sglang xxhash", Spec{Strategy: "sglang", Algorithm: "xxhash", IndexProjection: "first64_be"}, FieldAlgorithm},
	}
	for _, c := range cases {
		p, err := ResolveSpec(c.spec)
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: rejected: %v", c.name, err)
				continue
			}
			if p.AlgorithmName() != c.spec.Algorithm || (p.Strategy == StrategyVLLMV1 && p.Seed != c.spec.PythonHashSeed) ||
				p.Lookahead != int(c.spec.LookaheadTokens) || p.LoraPath != c.spec.LoraPath {
				t.Errorf("%s: resolved %+v", c.name, p)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: error %v, want *FieldError on %s", c.name, err, c.field)
		}
		if p != (Profile{}) {
			t.Errorf("%s: rejected profile is not zero: %+v", c.name, p)
		}
	}
}

// Resolve keeps refusing what it refused before the new fields: existing callers see no
// new profile kinds until they move to ResolveSpec.
func TestResolveUnchangedForNewValues(t *testing.T) {
	for _, c := range []struct{ algo, seed, field string }{
		{"xxhash", "0", FieldAlgorithm}, {"xxhash_cbor", "0", FieldAlgorithm}, {"sha256", "unset", FieldSeed},
	} {
		_, err := Resolve("vllm_v1", c.algo, c.seed, "low64_be")
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Resolve(%s, %s) = %v, want *FieldError on %s", c.algo, c.seed, err, c.field)
		}
		if strings.Contains(err.Error(), `"unset" or`) || strings.Contains(err.Error(), "xxhash_cbor)") {
			t.Errorf("Resolve's message offers a value it refuses: %v", err)
		}
	}
	// And a Spec of the four old fields is exactly Resolve.
	for _, seed := range []string{"0", "random", "123"} {
		a, _ := Resolve("vllm_v1", "sha256_cbor", seed, "low64_be")
		b, _ := ResolveSpec(vllmSpec("sha256_cbor", seed))
		if a != b || a.RootDigest() != a.Root {
			t.Errorf("seed %s: Resolve %+v, ResolveSpec %+v", seed, a, b)
		}
	}
}

// TestEngineRoots checks NONE_HASH for the unset seed and the xxhash algorithms against
// digests from CPython (pickle.dumps / cbor2.dumps(canonical=True)) with hashlib and the
// xxhash package (xxh3_128_digest), computed outside this repository.
func TestEngineRoots(t *testing.T) {
	cases := []struct{ algo, seed, root string }{
		{"sha256", "unset", "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"},
		{"sha256_cbor", "unset", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"},
		{"xxhash", "0", "6fb31cc38bba6066183f7f2104b9c051"},
		{"xxhash_cbor", "0", "1ebe36576dcb573f26b99533a20aaeca"},
		{"xxhash", "42", "b6cdd80ea04b31ad0b9fc22fff500882"},
		{"xxhash_cbor", "42", "a9d2e63407fce1a26c9dc9d7fa2d7caf"},
	}
	for _, c := range cases {
		p := mustResolveSpec(t, vllmSpec(c.algo, c.seed))
		if got := hex.EncodeToString(p.Root[32-p.DigestSize():]); got != c.root {
			t.Errorf("%s seed %s: root %s, want %s", c.algo, c.seed, got, c.root)
		}
		if p.DigestSize() < 32 && p.Root[0] != 0 {
			t.Errorf("%s: a 16-byte root must leave the first 16 bytes zero", c.algo)
		}
	}
}

// TestXXHashChainGolden checks chains of the xxhash algorithms, tagged extra keys and
// lookahead against the same outside computation: tokens 1..40, block size 16.
func TestXXHashChainGolden(t *testing.T) {
	toks := make([]int32, 40)
	for i := range toks {
		toks[i] = int32(i + 1)
	}
	cases := []struct {
		spec             Spec
		lora, salt       string
		blocks           []string
		wantKeysFromTail bool
	}{
		{spec: vllmSpec("xxhash", "0"), blocks: []string{"6ba7d7fc1608e5f0a4612b1b0c87458f", "dbd92304eaa08219c5cf8f4ce18166b6"}},
		{spec: vllmSpec("xxhash_cbor", "0"), blocks: []string{"c2d7a75070fc6d6b0c3fb0af456c1009", "93add93233ea572fb2e2b1685bac6f8d"}},
		{spec: Spec{Strategy: "vllm_v1", Algorithm: "xxhash", PythonHashSeed: "42", IndexProjection: "low64_be",
			ExtraKeys: "tagged", LoraPath: "/p/a", LookaheadTokens: 2}, lora: "adapter-A", salt: "s1",
			blocks: []string{"913d54fd8a12def24909529116a0f660", "60a2dc4908f5a7f808ca4da415f154ea"}},
		{spec: Spec{Strategy: "vllm_v1", Algorithm: "xxhash_cbor", PythonHashSeed: "42", IndexProjection: "low64_be",
			ExtraKeys: "tagged", LoraPath: "/p/a", LookaheadTokens: 2}, lora: "adapter-A", salt: "s1",
			blocks: []string{"274d8871aa6c3935b585a001f6a4b0ae", "1f915c69ebf7ffa7cae6d90dd528c791"}},
		{spec: vllmSpec("sha256", "unset"), blocks: []string{
			"7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf",
			"8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577"}},
		{spec: vllmSpec("sha256_cbor", "unset"), blocks: []string{
			"cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682",
			"2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf"}},
	}
	for _, c := range cases {
		p := mustResolveSpec(t, c.spec)
		var ch Chain
		ch.Reset(&p, 16, c.lora, c.salt, toks)
		if ch.NumBlocks() != len(c.blocks) {
			t.Fatalf("%+v: %d blocks, want %d", c.spec, ch.NumBlocks(), len(c.blocks))
		}
		for i, want := range c.blocks {
			key, err := ch.Next()
			if err != nil {
				t.Fatal(err)
			}
			d := ch.Digest()
			if got := hex.EncodeToString(d[32-p.DigestSize():]); got != want {
				t.Errorf("%s %+v block %d: digest %s, want %s", c.spec.Algorithm, c.spec, i, got, want)
			}
			// The event hash: int.from_bytes(digest, "big") & (2**64-1).
			w := mustHex(t, want)
			var ev uint64
			for _, b := range w[len(w)-8:] {
				ev = ev<<8 | uint64(b)
			}
			if key != ev {
				t.Errorf("%s block %d: key %x, want the digest's low 64 bits %x", c.spec.Algorithm, i, key, ev)
			}
		}
	}
}

func TestRootDigestCoversNewFields(t *testing.T) {
	base := vllmSpec("sha256", "0")
	variants := map[string]Spec{"base": base}
	v := base
	v.ExtraKeys = "tagged"
	variants["tagged"] = v
	v.LoraPath = "/a"
	variants["tagged+path"] = v
	v.LoraPath = "/b"
	variants["tagged+path2"] = v
	v = base
	v.LookaheadTokens = 1
	variants["la1"] = v
	v.LookaheadTokens = 2
	variants["la2"] = v
	variants["xxhash"] = vllmSpec("xxhash", "0")
	variants["unset"] = vllmSpec("sha256", "unset")
	seen := map[string]string{}
	for name, s := range variants {
		p := mustResolveSpec(t, s)
		rd := p.RootHex()
		if len(rd) != 64 {
			t.Errorf("%s: root_digest %q is not 64 hex characters", name, rd)
		}
		if other, dup := seen[rd]; dup {
			t.Errorf("%s and %s share root_digest %s", name, other, rd)
		}
		seen[rd] = name
		if string(p.AppendRootHex(nil)) != rd {
			t.Errorf("%s: AppendRootHex differs from RootHex", name)
		}
		legacy := name == "base" || name == "unset"
		if d := p.RootDigest(); (d == p.Root) != legacy {
			t.Errorf("%s: root_digest equals NONE_HASH: %v, want %v", name, d == p.Root, legacy)
		}
	}
}

func TestEqualAndSameEngine(t *testing.T) {
	mk := func(mut func(*Spec)) Profile {
		s := vllmSpec("sha256", "0")
		s.ExtraKeys = "tagged"
		s.LoraPath = "/a"
		mut(&s)
		return mustResolveSpec(t, s)
	}
	base := mk(func(*Spec) {})
	if !base.Equal(mk(func(*Spec) {})) {
		t.Fatal("identical specs are not Equal")
	}
	for name, c := range map[string]struct {
		mut              func(*Spec)
		equal, sameEngin bool
	}{
		"path":      {func(s *Spec) { s.LoraPath = "/b" }, false, true},
		"untagged":  {func(s *Spec) { s.ExtraKeys = ""; s.LoraPath = "" }, false, false},
		"lookahead": {func(s *Spec) { s.LookaheadTokens = 1 }, false, false},
		"seed":      {func(s *Spec) { s.PythonHashSeed = "unset" }, false, false},
		"algorithm": {func(s *Spec) { s.Algorithm = "xxhash" }, false, false},
	} {
		o := mk(c.mut)
		if base.Equal(o) != c.equal || base.SameEngine(o) != c.sameEngin || o.Equal(base) != c.equal {
			t.Errorf("%s: Equal %v SameEngine %v, want %v %v", name, base.Equal(o), base.SameEngine(o), c.equal, c.sameEngin)
		}
	}
}

func TestCheckLora(t *testing.T) {
	tagged := mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "tagged"})
	withPath := mustResolveSpec(t, Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/a"})
	untagged := mustResolveSpec(t, vllmSpec("sha256", "0"))
	sgl := mustResolveSpec(t, Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"})
	sglPath := mustResolveSpec(t, Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", LoraPath: "/a"})
	cases := []struct {
		p    Profile
		lora string
		ok   bool
	}{
		{tagged, "", true}, {tagged, "a", false}, {withPath, "a", true}, {withPath, "", false},
		{untagged, "a", true}, {untagged, "", true}, {sgl, "a", true}, {sglPath, "a", true}, {sglPath, "", false},
	}
	for i, c := range cases {
		err := c.p.CheckLora(c.lora)
		var fe *FieldError
		if c.ok != (err == nil) || (err != nil && (!errors.As(err, &fe) || fe.Field != FieldLoraPath)) {
			t.Errorf("case %d (lora %q): %v", i, c.lora, err)
		}
	}
}

// TestLookaheadWindows: block i's key covers tokens up to (i+1)*bs+L, no further.
func TestLookaheadWindows(t *testing.T) {
	const bs, n = 4, 40
	for _, L := range []int{1, 3, 6} {
		s := vllmSpec("sha256_cbor", "0")
		s.LookaheadTokens = int64(L)
		p := mustResolveSpec(t, s)
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(1000 + i)
		}
		keys := func(tk []int32) []uint64 {
			var ch Chain
			ch.Reset(&p, bs, "", "", tk)
			var out []uint64
			for {
				k, err := ch.Next()
				if err != nil {
					return out
				}
				out = append(out, k)
			}
		}
		base := keys(toks)
		if len(base) != (n-L)/bs {
			t.Fatalf("L %d: %d blocks, want %d", L, len(base), (n-L)/bs)
		}
		for pos := range n {
			mod := append([]int32(nil), toks...)
			mod[pos]++
			got := keys(mod)
			for i := range base {
				covered := pos < (i+1)*bs+L
				if (got[i] != base[i]) != covered {
					t.Fatalf("L %d token %d: block %d changed %v, want %v", L, pos, i, got[i] != base[i], covered)
				}
			}
		}
	}
}

// pythonExtrasScript pickles (parent, tokens, extras) the way vLLM builds them: strings
// come out of a decoder (distinct objects, except CPython's shared singletons), the tags
// are code constants, extras are tagged tuples or bare values, and lookahead tokens
// extend the extras into (extras, *tokens).
const pythonExtrasScript = `
import json, pickle, sys
out = []
for c in json.load(sys.stdin):
    keys = []
    if c["l"]:
        keys.append(("lora", c["l"], c["p"]) if c["tg"] else c["l"])
    if c["s"]:
        keys.append(("cache_salt", c["s"]) if c["tg"] else c["s"])
    e = tuple(keys) if keys else None
    if c["la"]:
        e = (e, *c["la"])
    out.append(pickle.dumps((bytes.fromhex(c["pa"]), tuple(c["t"]), e), protocol=5).hex())
json.dump(out, sys.stdout)
`

type extrasCase struct {
	Parent  string  `json:"pa"`
	Tokens  []int32 `json:"t"`
	Tagged  bool    `json:"tg"`
	Lora    string  `json:"l"`
	Path    string  `json:"p"`
	Salt    string  `json:"s"`
	Lookahd []int32 `json:"la"`
}

func TestPickleExtrasMatchCPython(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 1))
	strs := []string{"", "", "a", "é", "lora", "cache_salt", "adapter-A", "/models/x", randString(r, 300)}
	var cases []extrasCase
	for range 400 {
		parent := randomParent(r)
		c := extrasCase{Parent: hex.EncodeToString(parent), Tagged: r.IntN(2) == 0, Tokens: []int32{},
			Lora: strs[r.IntN(len(strs))], Path: strs[r.IntN(len(strs))], Salt: strs[r.IntN(len(strs))]}
		for range r.IntN(40) {
			c.Tokens = append(c.Tokens, int32(r.IntN(200000))-1000)
		}
		for range r.IntN(5) {
			c.Lookahd = append(c.Lookahd, int32(r.IntN(200000))-1000)
		}
		cases = append(cases, c)
	}
	want := pythonPickles(t, pythonExtrasScript, cases, len(cases))
	var pk pickler
	for i, c := range cases {
		parent := mustHex(t, c.Parent)
		ex := blockExtras{tagged: c.Tagged, lora: c.Lora, path: c.Path, salt: c.Salt}
		w := want[i]
		pk.vllmBlock(parent, c.Tokens, ex, c.Lookahd)
		if !bytes.Equal(pk.b, w) {
			t.Fatalf("case %d %+v: general pickler differs at byte %d\n got %x\nwant %x", i, c, firstDiff(pk.b, w), head(pk.b), head(w))
		}
		// The single-frame fast path, with the chain's precomputed parts (a chain's
		// blocks always hold tokens).
		if len(c.Tokens) == 0 {
			continue
		}
		extra := appendPickleExtrasFast(nil, ex, len(c.Lookahd))
		post := pickleLookaheadEnd(nil, len(c.Lookahd))
		buf := make([]byte, 2+frameHeaderSize+dlBody(len(parent), len(c.Tokens), len(extra), len(c.Lookahd), len(post)))
		if got := encodePickleBlock(buf, parent, c.Tokens, extra, c.Lookahd, post); !bytes.Equal(got, w) {
			t.Fatalf("case %d %+v: fast path differs at byte %d\n got %x\nwant %x", i, c, firstDiff(got, w), head(got), head(w))
		}
	}
}

// randomParent is a random SHA-256 (32 bytes) or xxhash (16 bytes) parent digest.
func randomParent(r *rand.Rand) []byte {
	parent := make([]byte, 16+16*r.IntN(2))
	for i := range parent {
		parent[i] = byte(r.IntN(256))
	}
	return parent
}

// dlBody is the chain's bound on a single-frame pickle body (see Chain.ResetMemo).
func dlBody(dlen, toks, extra, look, post int) int {
	return dlen + 3 + 3 + 5*toks + extra + 5*look + post + 3
}

func TestCBORExtrasMatchFxamacker(t *testing.T) {
	em := canonicalCBOR(t)
	r := rand.New(rand.NewPCG(25, 2))
	strs := []string{"", "", "a", "é", "lora", "adapter-A", randString(r, 300)}
	for range 400 {
		parent := randomParent(r)
		dl := len(parent)
		ex := blockExtras{tagged: r.IntN(2) == 0, lora: strs[r.IntN(len(strs))], path: strs[r.IntN(len(strs))], salt: strs[r.IntN(len(strs))]}
		var toks, look []int32
		for range r.IntN(40) {
			toks = append(toks, int32(r.IntN(200000))-1000)
		}
		for range r.IntN(5) {
			look = append(look, int32(r.IntN(200000))-1000)
		}
		// The oracle's value, built as vLLM builds it.
		items := make([]any, len(toks))
		for i, v := range toks {
			items[i] = int64(v)
		}
		var keys []any
		if ex.lora != "" {
			if ex.tagged {
				keys = append(keys, []any{"lora", ex.lora, ex.path})
			} else {
				keys = append(keys, ex.lora)
			}
		}
		if ex.salt != "" {
			if ex.tagged {
				keys = append(keys, []any{"cache_salt", ex.salt})
			} else {
				keys = append(keys, ex.salt)
			}
		}
		var extras any
		if keys != nil {
			extras = keys
		}
		if len(look) > 0 {
			e := []any{extras}
			for _, v := range look {
				e = append(e, int64(v))
			}
			extras = e
		}
		want, err := em.Marshal([]any{parent, items, extras})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendCBORVLLMBlock(nil, parent, toks, ex, look); !bytes.Equal(got, want) {
			t.Fatalf("%+v look %v: reference encoder\n got %x\nwant %x", ex, look, head(got), head(want))
		}
		extra := appendCBORExtrasLookahead(nil, ex, len(look))
		buf := make([]byte, 3+dl+9+5*len(toks)+len(extra)+5*len(look)+cborSlack)
		if got := encodeCBORBlock(buf, parent, toks, extra, look); !bytes.Equal(got, want) {
			t.Fatalf("%+v look %v: fast encoder\n got %x\nwant %x", ex, look, head(got), head(want))
		}
	}
}
