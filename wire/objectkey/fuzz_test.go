package objectkey_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/conductor-go/conductor/wire/objectkey"
)

// vllmKey is the vLLM connector key of the shared vectors' block 0 (vecHash0).
const vllmKey = "Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + okVecVLLMHash

// vecHash0 is sha256/bs16 block 0 of the shared vectors as event_u64: the low 64 bits
// of okVecVLLMHash.
const vecHash0 = uint64(7536218907325174565)

var seedKeys = []string{
	vllmKey,
	"deployA@" + vllmKey,
	"Qwen3-8B@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + okVecVLLMHash,
	"m@pcp0@dcp0@head_or_tp_rank:3@pp_rank:0@" + okVecVLLMHash + "@12",
	"m@3@" + okVecVLLMHash + "@15",
	"tagA_Qwen-Qwen3-8B_" + okVecSGLangHash + "_0_k",
	okVecSGLangHash + "__k",
	"0x" + okVecVLLMHash,
}

func FuzzObjectKeys(f *testing.F) {
	for _, k := range seedKeys {
		f.Add([]byte(k))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		if h, err := objectkey.ParseVLLM(key); err == nil {
			// The hash must be the low 64 bits of one '@' field of the key.
			found := false
			for _, field := range splitAt(key) {
				if ch, err := objectkey.ParseConnectorBlockHash(field); err == nil && ch.Low64 == h {
					found = true
				}
			}
			if !found {
				t.Fatalf("%q: hash %x is not in any field", key, h)
			}
		} else if !errors.Is(err, objectkey.ErrUnrecognized) {
			t.Fatalf("%q: error %v", key, err)
		}
		if h, n, err := objectkey.ParseSGLang(key); err == nil {
			if n < 64 || n > len(key) || (n > 64 && key[n-65] != '_') || (n < len(key) && key[n] != '_') {
				t.Fatalf("%q: logical length %d", key, n)
			}
			ch, err := objectkey.ParseConnectorBlockHash(key[n-64 : n])
			if err != nil || ch.First64 != h {
				t.Fatalf("%q: hash %x vs %+v %v", key, h, ch, err)
			}
		}
		if ch, err := objectkey.ParseConnectorBlockHash(key); err == nil {
			if len(ch.Hex) < 16 || len(ch.Hex)%2 != 0 || !objectkey.HexEqualFold(ch.Hex, ch.Hex) {
				t.Fatalf("%q: %+v", key, ch)
			}
			var low, first uint64
			fmt.Sscanf(string(ch.Hex[len(ch.Hex)-16:]), "%x", &low)
			fmt.Sscanf(string(ch.Hex[:16]), "%x", &first)
			if low != ch.Low64 || first != ch.First64 {
				t.Fatalf("%q: %+v want %x %x", key, ch, low, first)
			}
		}
	})
}

func splitAt(key []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range key {
		if c == '@' {
			out = append(out, key[start:i])
			start = i + 1
		}
	}
	return append(out, key[start:])
}

// TestWriteFuzzSeeds rewrites the committed seed corpus from seedKeys; run with
// EV_WRITE_FUZZ_SEEDS=1 after changing them.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("EV_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set EV_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz seeds")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzObjectKeys")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, k := range seedKeys {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", k)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
