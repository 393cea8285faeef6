package service

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/publisher"
)

func stateCfg(t testing.TB, i int) Config {
	t.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	return Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 1000+i), Kind: publisher.VLLM, ModelName: "m",
		TenantID: "default", InstanceID: fmt.Sprint("e", i), BlockSize: 16, Profile: p}
}

func loadIDs(t testing.TB, path string) []string {
	t.Helper()
	st, err := (&StateFile{Path: path}).Load()
	if err != nil || len(st.Skipped) != 0 {
		t.Fatalf("load: %v %v", err, st.Skipped)
	}
	var ids []string
	for _, c := range st.Services {
		ids = append(ids, c.InstanceID)
	}
	sort.Strings(ids)
	return ids
}

// TestStateFileAppendCostIsConstant: a change appends one record of its own size,
// however many services the file already holds (no whole-file rewrite per change).
func TestStateFileAppendCostIsConstant(t *testing.T) {
	path := filepath.Join(t.TempDir(), StateFileName)
	f := &StateFile{Path: path, CompactSlack: 1 << 20}
	defer f.Close()
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	c0 := stateCfg(t, 0)
	if err := f.Put(&c0); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 300; i++ {
		c := stateCfg(t, i)
		if err := f.Put(&c); err != nil {
			t.Fatal(err)
		}
	}
	before := size()
	c := stateCfg(t, 300)
	if err := f.Put(&c); err != nil {
		t.Fatal(err)
	}
	line, _ := putRecord(&c)
	if grew := size() - before; grew != int64(len(line)) {
		t.Fatalf("one put with 300 services grew the file by %d bytes, want one record (%d)", grew, len(line))
	}
	if got := loadIDs(t, path); len(got) != 301 {
		t.Fatalf("loaded %d services", len(got))
	}
}

// TestStateFileCompactionInterleaved: changes made while a background compaction runs
// (the hook runs between its snapshot and its switch-over) are neither lost nor
// duplicated, and the compacted file holds only the live services.
func TestStateFileCompactionInterleaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), StateFileName)
	f := &StateFile{Path: path, CompactSlack: 2}
	defer f.Close()
	c := make([]Config, 8)
	for i := range c {
		c[i] = stateCfg(t, i)
	}
	hookRan := 0
	f.compactHook = func() {
		hookRan++
		// During the compaction: one new service, one removal, one re-put.
		if err := f.Put(&c[7]); err != nil {
			t.Error(err)
		}
		if err := f.Delete(c[1].ID()); err != nil {
			t.Error(err)
		}
		if err := f.Put(&c[0]); err != nil {
			t.Error(err)
		}
	}
	// Churn until the log passes twice the live records plus the slack and a
	// compaction starts (each step waits for it, so hookRan is read race-free).
	for _, op := range []struct {
		put bool
		i   int
	}{{true, 0}, {true, 1}, {true, 2}, {false, 2}, {true, 3}, {false, 3}, {true, 4}, {false, 4}} {
		var err error
		if op.put {
			err = f.Put(&c[op.i])
		} else {
			err = f.Delete(c[op.i].ID())
		}
		if err != nil {
			t.Fatal(err)
		}
		f.WaitCompaction()
		if hookRan > 0 {
			break
		}
	}
	f.WaitCompaction()
	if hookRan != 1 {
		t.Fatalf("compaction ran %d times", hookRan)
	}
	want := []string{"e0", "e7"}
	if got := loadIDs(t, path); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("after compaction: %v, want %v", got, want)
	}
	data, _ := os.ReadFile(path)
	if n := strings.Count(string(data), "\n"); n > 6 {
		t.Errorf("compacted file has %d lines:\n%s", n, data)
	}
	// Appends after the switch-over go to the new file.
	f.compactHook = nil
	if err := f.Delete(c[7].ID()); err != nil {
		t.Fatal(err)
	}
	if got := loadIDs(t, path); strings.Join(got, ",") != "e0" {
		t.Fatalf("after delete: %v", got)
	}
}

// TestStateFileTornTailAndLegacy: a last record cut short by a crash is ignored (it was
// never acknowledged); a version 1 document is still read; a bad record mid-file makes
// the file corrupt (set aside).
func TestStateFileTornTailAndLegacy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StateFileName)
	f := &StateFile{Path: path}
	c0, c1 := stateCfg(t, 0), stateCfg(t, 1)
	if err := f.Put(&c0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	line, _ := putRecord(&c1)
	fh, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	fh.Write(line[:len(line)/2])
	fh.Close()
	if got := loadIDs(t, path); strings.Join(got, ",") != "e0" {
		t.Fatalf("torn tail: %v", got)
	}
	legacy := `{"version":1,"services":[{"endpoint":"tcp://127.0.0.1:9","type":"vLLM","modelname":"m","instance_id":"old","block_size":16,"dp_rank":0,
	  "hash_profile":{"strategy":"vllm_v1","algorithm":"sha256","python_hash_seed":"0","index_projection":"low64_be"}}]}`
	os.WriteFile(path, []byte(legacy), 0o644)
	if got := loadIDs(t, path); strings.Join(got, ",") != "old" {
		t.Fatalf("legacy: %v", got)
	}
	// A log holding only its header (no service left) is an empty state, not corrupt.
	empty := &StateFile{Path: path}
	if err := empty.Reset(nil); err != nil {
		t.Fatal(err)
	}
	empty.Close()
	if got := loadIDs(t, path); len(got) != 0 {
		t.Fatalf("header-only log: %v", got)
	}
	os.WriteFile(path, []byte("{\"version\":2}\n{bad\n"+string(line)), 0o644)
	if st, err := (&StateFile{Path: path}).Load(); err == nil || st.SetAside == "" {
		t.Fatalf("bad middle record: %v %+v", err, st)
	}
}

// BenchmarkStateFilePut measures one durable registration record (append + fsync) with
// few and with many services already in the file: the cost should not depend on it.
func BenchmarkStateFilePut(b *testing.B) {
	for _, existing := range []int{10, 500} {
		b.Run(fmt.Sprintf("services=%d", existing), func(b *testing.B) {
			f := &StateFile{Path: filepath.Join(b.TempDir(), StateFileName), CompactSlack: 1 << 30}
			defer f.Close()
			for i := 0; i < existing; i++ {
				c := stateCfg(b, i)
				if err := f.Put(&c); err != nil {
					b.Fatal(err)
				}
			}
			c := stateCfg(b, existing)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := f.Put(&c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
