package hashing

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/internal/enginevectors"
)

func loadVectors(t *testing.T) *enginevectors.HashFile {
	t.Helper()
	return enginevectors.HashVectors(t, "..")
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func strOrEmpty(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func TestVectorsNoneHash(t *testing.T) {
	v := loadVectors(t)
	seen := 0
	for algo, bySeed := range v.VLLM.NoneHash {
		for seed, want := range bySeed {
			p, err := Resolve("vllm_v1", algo, seed, "low64_be")
			if err != nil {
				t.Fatalf("Resolve(%s,%q): %v", algo, seed, err)
			}
			if got := p.RootHex(); got != want.HashHex {
				t.Errorf("%s seed %q root = %s, want %s", algo, seed, got, want.HashHex)
			}
			// The preimage is what rootDigest hashes; check the encoders directly too.
			var pre []byte
			if algo == "sha256" {
				var pk pickler
				pk.begin()
				pk.saveStr(seed)
				pk.stop()
				pre = pk.b
			} else {
				pre = appendCBORHead(nil, cborMajorText, uint64(len(seed)))
				pre = append(pre, seed...)
			}
			if hex.EncodeToString(pre) != want.PreimageHex {
				t.Errorf("%s seed %q preimage = %x, want %s", algo, seed, pre, want.PreimageHex)
			}
			seen++
		}
	}
	if seen != 6 {
		t.Errorf("checked %d none_hash vectors, want 6", seen)
	}
}

func TestVectorsVLLM(t *testing.T) {
	v := loadVectors(t)
	checked, skipped := 0, 0
	var ch Chain
	for _, tc := range v.VLLM.Cases {
		if len(tc.MMFeatures) > 0 && string(tc.MMFeatures) != "null" {
			// Multimodal extra keys cannot be expressed by the query API.
			if !strings.HasPrefix(tc.Variant, "mm ") {
				t.Errorf("case %s/%d/%s has mm_features but is not an mm variant", tc.Algo, tc.BlockSize, tc.Variant)
			}
			skipped++
			continue
		}
		name := tc.Algo + "/" + tc.Variant + "/bs" + strconv.Itoa(tc.BlockSize)
		t.Run(name, func(t *testing.T) {
			p, err := Resolve("vllm_v1", tc.Algo, v.VLLM.Seed, "low64_be")
			if err != nil {
				t.Fatal(err)
			}
			lora, salt := strOrEmpty(tc.LoraName), strOrEmpty(tc.CacheSalt)
			ch.Reset(&p, tc.BlockSize, lora, salt, v.Prompt)
			if ch.NumBlocks() != len(tc.Blocks) {
				t.Fatalf("NumBlocks = %d, want %d", ch.NumBlocks(), len(tc.Blocks))
			}
			if want := len(v.Prompt) - len(tc.Blocks)*tc.BlockSize; want != len(tc.Unhashed) {
				t.Fatalf("vector tail %d tokens, chain leaves %d", len(tc.Unhashed), want)
			}
			parent := p.Root
			for i, blk := range tc.Blocks {
				if hex.EncodeToString(parent[:]) != blk.ParentHex {
					t.Fatalf("block %d parent = %x, want %s", i, parent, blk.ParentHex)
				}
				toks := v.Prompt[blk.TokenRange[0]:blk.TokenRange[1]]
				blkSalt := ""
				if i == 0 {
					blkSalt = salt
				}
				// Preimage from the reference (general) encoders.
				var pre []byte
				if tc.Algo == "sha256" {
					var pk pickler
					pk.vllmBlock(parent[:], toks, blockExtras{lora: lora, salt: blkSalt}, nil)
					pre = pk.b
				} else {
					pre = appendCBORVLLMBlock(nil, parent[:], toks, blockExtras{lora: lora, salt: blkSalt}, nil)
				}
				if got := hex.EncodeToString(pre); got != blk.PreimageHex {
					t.Fatalf("block %d preimage\n got %s\nwant %s", i, got, blk.PreimageHex)
				}
				key, err := ch.Next()
				if err != nil {
					t.Fatalf("Next block %d: %v", i, err)
				}
				d := ch.Digest()
				if hex.EncodeToString(d[:]) != blk.HashHex {
					t.Fatalf("block %d digest = %x, want %s", i, d, blk.HashHex)
				}
				if key != blk.EventU64 {
					t.Fatalf("block %d key = %d, want %d", i, key, blk.EventU64)
				}
				if want := mustHex(t, blk.EventU64Hex); !bytes.Equal(want, d[24:]) {
					t.Fatalf("block %d event_u64_hex %x is not the digest tail %x", i, want, d[24:])
				}
				parent = d
				checked++
			}
			if _, err := ch.Next(); !errors.Is(err, ErrChainEnd) {
				t.Fatalf("Next after last block: %v, want ErrChainEnd", err)
			}
		})
	}
	if skipped != 2 {
		t.Errorf("skipped %d vLLM cases, want exactly the 2 multimodal ones", skipped)
	}
	if want := 2 * 4 * (40/16 + 40/4); checked != want {
		t.Errorf("checked %d vLLM blocks, want %d", checked, want)
	}
}

func TestVectorsPickleMultiframe(t *testing.T) {
	v := loadVectors(t)
	mf := v.VLLM.Multiframe
	if mf.Tokens != "range(100000,120000)" {
		t.Fatalf("unexpected multiframe token spec %q", mf.Tokens)
	}
	toks := make([]int32, 0, 20000)
	for x := int32(100000); x < 120000; x++ {
		toks = append(toks, x)
	}
	p, err := Resolve("vllm_v1", "sha256", v.VLLM.Seed, "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	var pk pickler
	pk.vllmBlock(p.Root[:], toks, blockExtras{}, nil)
	if len(pk.b) != mf.PreimageLen {
		t.Fatalf("preimage length %d, want %d", len(pk.b), mf.PreimageLen)
	}
	if d := sum256(pk.b); hex.EncodeToString(d[:]) != mf.PreimageSHA256 {
		t.Fatalf("preimage sha256 %x, want %s", d, mf.PreimageSHA256)
	}
	// The chain must take the framed path for such a block and agree.
	var ch Chain
	ch.Reset(&p, len(toks), "", "", toks)
	if ch.pickleFast {
		t.Fatalf("a 20000-token block must not use the single-frame fast path")
	}
	if _, err := ch.Next(); err != nil {
		t.Fatal(err)
	}
	if d := ch.Digest(); d != sum256(pk.b) {
		t.Fatalf("chain digest %x differs from the pickler's", d)
	}
}

func TestVectorsSGLang(t *testing.T) {
	v := loadVectors(t)
	checked, skipped := 0, 0
	var ch Chain
	for _, tc := range v.SGLang.Cases {
		var salt string
		switch {
		case tc.Variant == "unsalted":
		case strings.HasPrefix(tc.Variant, "event cache_salt="):
			salt = strings.TrimPrefix(tc.Variant, "event cache_salt=")
		case strings.HasPrefix(tc.Variant, "storage "):
			// HiCache L3 storage namespace chains: not expressible by the query API.
			skipped++
			continue
		default:
			t.Fatalf("unknown SGLang variant %q", tc.Variant)
		}
		strategy := "sglang"
		if tc.Bigram {
			strategy = "sglang_bigram"
		}
		t.Run(strategy+"/"+tc.Variant+"/ps"+strconv.Itoa(tc.PageSize), func(t *testing.T) {
			p, err := Resolve(strategy, "sha256_raw", "", "first64_be")
			if err != nil {
				t.Fatal(err)
			}
			ch.Reset(&p, tc.PageSize, "lora-is-ignored", salt, v.Prompt)
			if seed := ch.Digest(); tc.ChainSeedHex == nil {
				if seed != ([32]byte{}) {
					t.Fatalf("unsalted chain seed %x, want none", seed)
				}
			} else if hex.EncodeToString(seed[:]) != *tc.ChainSeedHex {
				t.Fatalf("chain seed %x, want %s", seed, *tc.ChainSeedHex)
			}
			if ch.NumBlocks() != len(tc.Pages) {
				t.Fatalf("NumBlocks = %d, want %d", ch.NumBlocks(), len(tc.Pages))
			}
			wantPos := len(v.Prompt)
			if tc.Bigram {
				wantPos--
			}
			if ch.Positions() != wantPos {
				t.Fatalf("Positions = %d, want %d", ch.Positions(), wantPos)
			}
			for i, pg := range tc.Pages {
				key, err := ch.Next()
				if err != nil {
					t.Fatalf("Next page %d: %v", i, err)
				}
				d := ch.Digest()
				if hex.EncodeToString(d[:]) != pg.HashHex {
					t.Fatalf("page %d digest %x, want %s", i, d, pg.HashHex)
				}
				if key != pg.First8U64 || int64(key) != pg.EventI64 {
					t.Fatalf("page %d key %d, want %d / %d", i, key, pg.First8U64, pg.EventI64)
				}
				if last := i == len(tc.Pages)-1; pg.Partial != (last && pg.UnitRange[1]-pg.UnitRange[0] < tc.PageSize) {
					t.Fatalf("page %d partial flag %v inconsistent with its range", i, pg.Partial)
				}
				checked++
			}
		})
	}
	if skipped != 4 {
		t.Errorf("skipped %d SGLang cases, want exactly the 4 storage-namespace chains", skipped)
	}
	// page 4: {plain, bigram} x {unsalted, salted} x 10 pages; page 16: same x 3 pages.
	if want := 4*10 + 4*3; checked != want {
		t.Errorf("checked %d SGLang pages, want %d", checked, want)
	}
}
