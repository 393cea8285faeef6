package hashing

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"
)

// pythonPickleScript pickles each case with the real CPython C pickler (pickle.dumps,
// protocol 5), building the objects the way vLLM does: extras is None or a tuple of the
// non-empty strings, strings come out of a decoder (so one-character Latin-1 strings are
// CPython's shared singletons, exactly as in a live engine).
const pythonPickleScript = `
import json, pickle, sys
out = []
for c in json.load(sys.stdin):
    if c["k"] == "seed":
        v = c["s"]
    else:
        ex = [x for x in (c["l"], c["s"]) if x]
        v = (bytes.fromhex(c["p"]), tuple(c["t"]), tuple(ex) if ex else None)
    out.append(pickle.dumps(v, protocol=5).hex())
json.dump(out, sys.stdout)
`

type pyCase struct {
	K string  `json:"k"` // "block" or "seed"
	P string  `json:"p"` // parent hex
	T []int32 `json:"t"`
	L string  `json:"l"`
	S string  `json:"s"`
}

// runPython pickles the cases in one python3 process and returns the preimages.
func runPython(t *testing.T, cases []pyCase) [][]byte {
	t.Helper()
	return pythonPickles(t, pythonPickleScript, cases, len(cases))
}

// pythonPickles runs script in one python3 process with cases (a slice of n cases) as
// JSON on its standard input, and returns the pickles it prints: a JSON list of n hex
// strings. Without python3 the test is skipped.
func pythonPickles(t *testing.T, script string, cases any, n int) [][]byte {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: cannot compare the pickle encoder with CPython")
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatalf("encode cases: %v", err)
	}
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 pickle: %v\n%s", err, stderr.String())
	}
	var hexes []string
	if err := json.Unmarshal(out, &hexes); err != nil {
		t.Fatalf("decode python output: %v", err)
	}
	if len(hexes) != n {
		t.Fatalf("python returned %d results for %d cases", len(hexes), n)
	}
	res := make([][]byte, len(hexes))
	for i, h := range hexes {
		res[i] = mustHex(t, h)
	}
	return res
}

// randString returns valid UTF-8 mixing 1- to 4-byte runes, of about n bytes.
func randString(r *rand.Rand, n int) string {
	pools := []string{"a", "Z", "-", "é", "ß", "€", "中", "文", "😀", "𝄞", "\x00", "\""}
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(pools[r.IntN(len(pools))])
	}
	return sb.String()
}

// exactUTF8 returns a non-ASCII string of exactly n UTF-8 bytes.
func exactUTF8(n int) string {
	s := strings.Repeat("é", n/2)
	if n%2 == 1 {
		s += "x"
	}
	return s
}

func randTokens(r *rand.Rand, n int) []int32 {
	edges := []int32{0, 1, 23, 24, 255, 256, 65535, 65536, -1, -24, -25, -256, -257, 1 << 31 / 2, -1 << 31, 1<<31 - 1}
	toks := make([]int32, n)
	mode := r.IntN(4)
	for i := range toks {
		switch mode {
		case 0:
			toks[i] = int32(r.IntN(256))
		case 1:
			toks[i] = int32(r.IntN(200000))
		case 2:
			toks[i] = 100000 + int32(r.IntN(50000)) // all BININT: 5 bytes each
		default:
			if r.IntN(3) == 0 {
				toks[i] = edges[r.IntN(len(edges))]
			} else {
				toks[i] = int32(r.Uint32())
			}
		}
	}
	return toks
}

func TestPickleMatchesCPython(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var cases []pyCase
	add := func(n int, lora, salt string) {
		var parent [32]byte
		for i := range parent {
			parent[i] = byte(r.Uint32())
		}
		cases = append(cases, pyCase{K: "block", P: hex.EncodeToString(parent[:]), T: randTokens(r, n), L: lora, S: salt})
	}
	strs := []string{"", "", "a", "lora-a", "s1", exactUTF8(255), exactUTF8(256), "é", randString(r, 40)}
	for range 300 {
		add(r.IntN(70), strs[r.IntN(len(strs))], strs[r.IntN(len(strs))])
	}
	// Shared one-character singletons (BINGET) versus equal longer strings (two copies).
	for _, s := range []string{"a", "é", "ÿ", "Ā", "€", "ab", "😀"} {
		add(4, s, s)
		add(2, s, s)
		add(0, s, s)
	}
	for n := range 5 {
		add(n, "", "")
		add(n, "x", "")
		add(n, "", "yy")
	}
	// Frame splitting: bodies around 64 KiB, 20000 and 70000 tokens, large strings.
	for n := 13085; n <= 13115; n++ {
		cases = append(cases, pyCase{K: "block", P: strings.Repeat("ab", 32), T: bigTokens(n)})
	}
	add(20000, "", "")
	add(20000, "lora-b", "salt")
	add(70000, "", "")
	add(70000, randString(r, 300), randString(r, 70000))
	for _, n := range []int{65534, 65535, 65536, 65537, 70000} {
		add(3, exactUTF8(n), "")
		add(5, "", exactUTF8(n))
		add(13000, "tail", exactUTF8(n))
		add(13100, exactUTF8(n), exactUTF8(n))
	}
	// Seeds as python_hash_seed strings (roots).
	seeds := []string{"0", "00", "random", "42", "4294967295", strings.Repeat("0", 300) + "7", strings.Repeat("0", 70000)}
	for _, s := range seeds {
		cases = append(cases, pyCase{K: "seed", S: s})
	}

	want := runPython(t, cases)
	var pk pickler
	fastChecked := 0
	for i, c := range cases {
		if c.K == "seed" {
			pk.begin()
			pk.saveStr(c.S)
			pk.stop()
			if !bytes.Equal(pk.b, want[i]) {
				t.Fatalf("seed %.20q: pickle differs\n got %x\nwant %x", c.S, head(pk.b), head(want[i]))
			}
			p, err := Resolve("vllm_v1", "sha256", c.S, "low64_be")
			if err != nil {
				t.Fatalf("Resolve seed %.20q: %v", c.S, err)
			}
			if p.Root != sum256(want[i]) {
				t.Fatalf("seed %.20q: root differs from SHA-256 of CPython pickle", c.S)
			}
			continue
		}
		if !utf8.ValidString(c.L) || !utf8.ValidString(c.S) {
			t.Fatalf("test generated invalid UTF-8")
		}
		var parent [32]byte
		copy(parent[:], mustHex(t, c.P))
		pk.vllmBlock(parent[:], c.T, blockExtras{lora: c.L, salt: c.S}, nil)
		if !bytes.Equal(pk.b, want[i]) {
			t.Fatalf("case %d (%d tokens, lora %d B, salt %d B): pickle differs at byte %d (len %d vs %d)\n got %x\nwant %x",
				i, len(c.T), len(c.L), len(c.S), firstDiff(pk.b, want[i]), len(pk.b), len(want[i]), head(pk.b), head(want[i]))
		}
		// The single-frame fast path must agree wherever the chain would use it.
		if len(c.T) > 0 {
			extra := appendPickleExtrasFast(nil, blockExtras{lora: c.L, salt: c.S}, 0)
			if 35+3+5*len(c.T)+len(extra)+3 < frameSizeTarget {
				buf := make([]byte, 2+frameHeaderSize+35+3+5*len(c.T)+len(extra)+3)
				if got := encodePickleBlock(buf, parent[:], c.T, extra, nil, nil); !bytes.Equal(got, want[i]) {
					t.Fatalf("case %d: fast path differs at byte %d\n got %x\nwant %x", i, firstDiff(got, want[i]), head(got), head(want[i]))
				}
				fastChecked++
			}
		}
	}
	if fastChecked < 300 {
		t.Errorf("fast path checked on only %d cases", fastChecked)
	}
}

// bigTokens returns n tokens that each pickle as a 5-byte BININT, so the frame size is
// a known function of n.
func bigTokens(n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = 100000 + int32(i)
	}
	return toks
}

func head(b []byte) []byte {
	if len(b) > 96 {
		return b[:96]
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
