// Package enginevectors reads the engine vector files of testdata/engines (what the
// published vLLM and SGLang releases computed and sent, see its README.md), and the hash
// vectors of testdata/vectors, for the tests of several packages: one schema of each file
// (EngineFile, HashFile) that they share.
package enginevectors

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Load decodes every testdata/engines file whose name matches pattern (e.g. "vllm-*.json")
// into a T, in file-name order; root is the repository root relative to the test. It
// fails the test when there is none or one does not decode.
func Load[T any](tb testing.TB, root, pattern string) []*T {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "testdata", "engines", pattern))
	if err != nil || len(paths) == 0 {
		tb.Fatalf("no engine vectors %s: %v", pattern, err)
	}
	out := make([]*T, 0, len(paths))
	for _, p := range paths {
		out = append(out, decodeFile[T](tb, p))
	}
	return out
}

// decodeFile decodes the JSON file at path into a T, failing the test on an error.
func decodeFile[T any](tb testing.TB, path string) *T {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return v
}
