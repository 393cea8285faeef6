package server

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/server/internal/limits"
)

// TestConfigDuplicateKeysRefused: a key given twice in one object of the config file (at
// the root, in cluster, in a service entry) is an error naming the key and the file;
// encoding/json alone would keep the last one silently.
func TestConfigDuplicateKeysRefused(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{`{"admin_token": "a", "admin_token": "b"}`, `duplicate key "admin_token" in the root object`},
		{`{"cluster": {"etcd_endpoints": ["http://127.0.0.1:2379"], "key_prefix": "/a/", "key_prefix": "/b/"}}`,
			`duplicate key "key_prefix" in "cluster"`},
		{`{"kvevent_instance": {"e": {"endpoint": "tcp://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:2"}}}`,
			`duplicate key "endpoint" in "kvevent_instance.e"`},
	} {
		path := writeConfig(t, c.text)
		_, err := LoadConfigFile(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want one naming the file and %s", c.text, err, c.want)
		}
	}
}

// TestConfigAdminTokenControlBytes: a token with a newline or another control byte is
// refused at load (no HTTP header can carry it, so no request could match it).
func TestConfigAdminTokenControlBytes(t *testing.T) {
	for _, tok := range []string{`s3cret\n`, `s3\tcret`, `\u0000x`, `x\u007f`} {
		_, err := LoadConfigFile(writeConfig(t, `{"admin_token": "`+tok+`"}`))
		if err == nil || !strings.Contains(err.Error(), "admin_token must not contain control bytes") {
			t.Errorf("token %s: err = %v", tok, err)
		}
	}
	cfg, err := LoadConfigFile(writeConfig(t, `{"admin_token": "s3 cret-é"}`))
	if err != nil || cfg.AdminToken != "s3 cret-é" {
		t.Fatalf("printable token: %q %v", cfg.AdminToken, err)
	}
}

// TestConfigRelativePathsBesideConfig: relative state_file and access_log paths are
// taken from the config file's directory, not the working directory; absolute paths,
// "" and "-" stay as written.
func TestConfigRelativePathsBesideConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf", "conductor_config.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(text string) FileConfig {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfigFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cfg := write(`{"state_file": "state/s.json", "access_log": "logs/access.log"}`)
	if want := filepath.Join(dir, "conf", "state", "s.json"); cfg.StateFile != want {
		t.Errorf("state_file = %s, want %s", cfg.StateFile, want)
	}
	if want := filepath.Join(dir, "conf", "logs", "access.log"); cfg.AccessLog.Path != want {
		t.Errorf("access_log = %s, want %s", cfg.AccessLog.Path, want)
	}
	cfg = write(`{"state_file": "/var/lib/c/s.json", "access_log": "-"}`)
	if cfg.StateFile != "/var/lib/c/s.json" || cfg.AccessLog.Path != "-" {
		t.Errorf("absolute and stdout: %s %s", cfg.StateFile, cfg.AccessLog.Path)
	}
	cfg = write(`{"state_file": "", "access_log": ""}`)
	if cfg.StateFile != "" || cfg.AccessLog.Path != "" {
		t.Errorf("off: %q %q", cfg.StateFile, cfg.AccessLog.Path)
	}
	if _, err := LoadConfigFile(writeConfig(t, `{"state_file": null}`)); err == nil || !strings.Contains(err.Error(), "state_file") {
		t.Errorf("null state_file: %v", err)
	}
}

// TestConfigMemoBoundedByMemory: a memo larger than a quarter of the memory the process
// may use is refused with the size it needs and the most that fits.
func TestConfigMemoBoundedByMemory(t *testing.T) {
	const gib = 1 << 30
	if err := memoFits(hashing.DefaultMemoEntries, 2*gib); err != nil {
		t.Errorf("default memo (160 MiB) on 2 GiB: %v", err)
	}
	err := memoFits(200_000_000, 16*gib)
	if err == nil || !strings.Contains(err.Error(), "needs 5.0 GiB") || !strings.Contains(err.Error(), "16.0 GiB") {
		t.Fatalf("2e8 entries on 16 GiB: %v", err)
	}
	// The most that fits is accepted, twice that is not.
	most := maxMemoFor(16 * gib)
	if memoFits(most, 16*gib) != nil || memoFits(2*most, 16*gib) == nil || !strings.Contains(err.Error(), "at most 134217728") {
		t.Errorf("most that fits 16 GiB: %d (%v)", most, err)
	}
	// Through the file, on this machine: the smallest memo over a quarter of its memory.
	phys, perr := limits.PhysicalMemory()
	if perr != nil {
		t.Skip(perr)
	}
	over := maxMemoFor(phys) * 2
	if over > maxMemoEntries {
		t.Skipf("this machine (%d GiB) fits the largest memo the key accepts", phys>>30)
	}
	path := writeConfig(t, `{"query_memo_entries": `+strconv.Itoa(over)+`}`)
	if _, err := LoadConfigFile(path); err == nil || !strings.Contains(err.Error(), "query_memo_entries") ||
		!strings.Contains(err.Error(), "more than a quarter") {
		t.Fatalf("query_memo_entries %d on %d GiB: %v", over, phys>>30, err)
	}
}

// TestConfigMalformedEndpointEntry: a kvevent_instance entry with a malformed endpoint
// is skipped with an error naming the entry, the field and what is wrong (the others
// start, as for any invalid entry).
func TestConfigMalformedEndpointEntry(t *testing.T) {
	cfg := loadEntries(t, map[string]any{
		"bad-host": entryWith("endpoint", "tcp://*:5557"), "bad-port": entryWith("endpoint", "tcp://127.0.0.1:70000"),
		"bad-path": entryWith("replay_endpoint", "tcp://127.0.0.1:5558/x"), "good": entryWith("instance_id", "good"),
	})
	if len(cfg.Services) != 1 || cfg.Services[0].InstanceID != "good" || len(cfg.Skipped) != 3 {
		t.Fatalf("services %v skipped %v", cfg.Services, cfg.Skipped)
	}
	for i, want := range []string{`kvevent_instance "bad-host": endpoint has the wildcard host *`,
		`kvevent_instance "bad-path": replay_endpoint has "/x" after the port`,
		`kvevent_instance "bad-port": endpoint has port 70000, outside 1..65535`} {
		if !strings.Contains(cfg.Skipped[i].Error(), want) {
			t.Errorf("skipped[%d] = %v, want %s", i, cfg.Skipped[i], want)
		}
	}
}
