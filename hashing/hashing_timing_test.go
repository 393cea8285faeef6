package hashing

import (
	stdsha256 "crypto/sha256"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	simdsha256 "github.com/minio/sha256-simd"
)

// benchPrompt is a prompt of realistic token ids (Qwen-sized vocabulary, so most ids need
// the widest int encodings) long enough for 64 blocks at block size 64.
func benchPrompt() []int32 {
	r := rand.New(rand.NewPCG(11, 12))
	toks := make([]int32, 64*64+1)
	for i := range toks {
		toks[i] = int32(r.IntN(151936))
	}
	return toks
}

// reportPerBlock adds the ns/block metric the design targets are stated in.
func reportPerBlock(b *testing.B, blocks int, elapsed time.Duration) {
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*blocks), "ns/block")
}

// benchBlocks runs pass, which hashes or encodes blocks blocks, once per iteration, and
// reports allocations and ns/block.
func benchBlocks(b *testing.B, blocks int, pass func()) {
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		pass()
	}
	reportPerBlock(b, blocks, time.Since(start))
}

// BenchmarkHash compares, per algorithm and block size, the chain (encode + SHA-256 +
// projection) with raw SHA-256 of exactly the same preimages using crypto/sha256 and
// minio/sha256-simd. The gap between "chain" and "raw" is the encoding overhead.
func BenchmarkHash(b *testing.B) {
	toks := benchPrompt()
	profiles := allProfiles(b)
	for _, name := range []string{"pickle", "cbor", "sglang", "sglang_bigram"} {
		p := profiles[name]
		for _, bs := range []int{16, 64} {
			prompt := toks[:64*bs]
			if name == "sglang_bigram" {
				prompt = toks[:64*bs+1]
			}
			preimages := preimagesOf(p, bs, prompt)
			total := 0
			for _, pre := range preimages {
				total += len(pre)
			}
			prefix := name + "/bs" + strconv.Itoa(bs)
			b.Run(prefix+"/chain", func(b *testing.B) {
				var ch Chain
				ch.Reset(&p, bs, "", "", prompt)
				b.SetBytes(int64(total))
				var sink uint64
				benchBlocks(b, len(preimages), func() {
					ch.Reset(&p, bs, "", "", prompt)
					for {
						k, err := ch.Next()
						if err != nil {
							break
						}
						sink ^= k
					}
				})
				_ = sink
			})
			b.Run(prefix+"/raw-std", func(b *testing.B) {
				b.SetBytes(int64(total))
				benchBlocks(b, len(preimages), func() {
					for _, pre := range preimages {
						_ = stdsha256.Sum256(pre)
					}
				})
			})
			b.Run(prefix+"/raw-simd", func(b *testing.B) {
				b.SetBytes(int64(total))
				benchBlocks(b, len(preimages), func() {
					for _, pre := range preimages {
						_ = simdsha256.Sum256(pre)
					}
				})
			})
		}
	}
}

// preimagesOf returns the exact bytes the chain hashes for each block, built with the
// reference encoders.
func preimagesOf(p Profile, bs int, toks []int32) [][]byte {
	var out [][]byte
	switch p.Strategy {
	case StrategyVLLMV1:
		parent := p.Root
		var pk pickler
		for i := 0; (i+1)*bs <= len(toks); i++ {
			var pre []byte
			if p.Algorithm == AlgoSHA256Pickle {
				pk.vllmBlock(parent[:], toks[i*bs:(i+1)*bs], blockExtras{}, nil)
				pre = append([]byte(nil), pk.b...)
			} else {
				pre = appendCBORVLLMBlock(nil, parent[:], toks[i*bs:(i+1)*bs], blockExtras{}, nil)
			}
			parent = sum256(pre)
			out = append(out, pre)
		}
	default:
		var ch Chain
		ch.Reset(&p, bs, "", "", toks)
		hasParent := false
		for i := range ch.NumBlocks() {
			s, e := i*bs, min((i+1)*bs, ch.Positions())
			buf := make([]byte, 32+8*bs)
			var pre []byte
			parent := ch.Digest()
			if p.Strategy == StrategySGLang {
				pre = encodeSGLangBlock(buf, hasParent, &parent, toks[s:e])
			} else {
				pre = encodeBigramBlock(buf, hasParent, &parent, toks[s:e+1])
			}
			out = append(out, pre)
			if _, err := ch.Next(); err != nil {
				panic(err)
			}
			hasParent = true
		}
	}
	return out
}

// BenchmarkResolve measures profile resolution (root derivation), a registration-time cost.
func BenchmarkResolve(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Resolve("vllm_v1", "sha256", "4294967295", "low64_be"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSHA256 compares the two SHA-256 implementations on block-sized inputs; sum256
// uses whichever wins here.
func BenchmarkSHA256(b *testing.B) {
	for _, n := range []int{100, 128, 256, 400} {
		buf := make([]byte, n)
		b.Run("std/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				_ = stdsha256.Sum256(buf)
			}
		})
		b.Run("simd/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				_ = simdsha256.Sum256(buf)
			}
		})
	}
}

// BenchmarkMemo measures an 8K-token prompt (512 blocks of 16, sha256_cbor) through a
// chain with a memo: "warm" serves every block from the memo (cheap chain + verified
// lookup per block), "cold" hashes every block and inserts it (a new salt per run),
// "plain" hashes every block without a memo, and "lanes" is the cheap chain alone. The memo is sized like the default so that lookups
// miss the CPU caches as in a server.
func BenchmarkMemo(b *testing.B) {
	p := mustResolve(b, "vllm_v1", "sha256_cbor", "0", "low64_be")
	toks := make([]int32, 8192)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range toks {
		toks[i] = int32(r.IntN(151936))
	}
	m := NewMemo(DefaultMemoEntries)
	const blocks = 512
	run := func(ch *Chain, salt string) {
		ch.ResetMemo(m, &p, 16, "", salt, toks)
		drain(ch)
		ch.Done()
	}
	b.Run("warm", func(b *testing.B) {
		var ch Chain
		// Fill with many prompts first so the benchmark's own entries are not all cached.
		run(&ch, "w")
		benchBlocks(b, blocks, func() { run(&ch, "w") })
		if ch.MemoHits() != blocks {
			b.Fatalf("%d memo hits", ch.MemoHits())
		}
	})
	b.Run("cold", func(b *testing.B) {
		var ch Chain
		// A salt of its own per prompt keeps every chain cold; the salts are made before
		// the timer starts so that allocs/op counts the chain's allocations alone.
		salts := make([]string, b.N)
		for i := range salts {
			salts[i] = "cold-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			run(&ch, salts[i])
		}
		reportPerBlock(b, blocks, time.Since(start))
	})
	b.Run("plain", func(b *testing.B) {
		var ch Chain
		benchBlocks(b, blocks, func() {
			ch.Reset(&p, 16, "", "", toks)
			drain(&ch)
		})
	})
	b.Run("lanes", func(b *testing.B) {
		var ch Chain
		ch.ResetMemo(m, &p, 16, "", "", toks)
		benchBlocks(b, blocks, func() {
			ch.mc.cx = 0
			for ch.mc.cx < blocks {
				ch.advance()
			}
		})
	})
}

// BenchmarkSaltedChain is the query-side cost of issue 25's tagged extra keys: a salted
// 8K-token prompt (512 blocks of 16, realistic ids), hashed block by block without a
// memo, untagged against tagged, with and without a LoRA adapter, per algorithm. The
// extra keys are encoded once per prompt (Chain.Reset), so tagged costs what untagged
// does up to the few bytes more that each block hashes.
func BenchmarkSaltedChain(b *testing.B) {
	toks := make([]int32, 8192)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range toks {
		toks[i] = int32(r.IntN(151936))
	}
	const blocks = 512
	for _, algo := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		for _, lora := range []string{"", "adapter-A"} {
			for _, form := range []string{"untagged", "tagged"} {
				s := Spec{Strategy: "vllm_v1", Algorithm: algo, PythonHashSeed: "0", IndexProjection: "low64_be", ExtraKeys: form}
				if form == "tagged" && lora != "" {
					s.LoraPath = "/models/adapters/adapter-A"
				}
				p := mustResolveSpec(b, s)
				name := algo + "/" + form
				if lora != "" {
					name += "+lora"
				}
				b.Run(name, func(b *testing.B) {
					var ch Chain
					benchBlocks(b, blocks, func() {
						ch.Reset(&p, 16, lora, "tenant-salt-0123", toks)
						drain(&ch)
					})
				})
			}
		}
	}
}
