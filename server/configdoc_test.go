package server

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateConfigDoc = flag.Bool("update-config-doc", false, "rewrite docs/configuration.md from the settings tables")

// TestConfigurationDoc: docs/configuration.md is what the settings tables generate, so
// that a key added, removed or changed in the table without its documentation (or the
// reverse) fails here. `go generate ./server` rewrites the file.
func TestConfigurationDoc(t *testing.T) {
	path := filepath.Join("..", "docs", "configuration.md")
	want := configurationDoc()
	if *updateConfigDoc {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go generate ./server writes it)", err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from the settings tables: run go generate ./server", path)
	}
}

// TestSettingsTableComplete: every key of the tables appears once and is documented with
// a type, a default, its bounds and a text (an empty cell would leave a key half
// documented in docs/configuration.md).
func TestSettingsTableComplete(t *testing.T) {
	checkSettingsTable(t, "", fileSettings())
	checkSettingsTable(t, "cluster.", clusterSettings())
}

// checkSettingsTable reports each key (named with prefix) that stands twice in table or
// whose entry is incomplete.
func checkSettingsTable[C any](t *testing.T, prefix string, table []setting[C]) {
	t.Helper()
	seen := map[string]bool{}
	for _, s := range table {
		if seen[s.key] {
			t.Errorf("%s%s: twice in the table", prefix, s.key)
		}
		seen[s.key] = true
		if s.typ == "" || s.def == "" || s.bounds == "" || s.doc == "" || s.parse == nil {
			t.Errorf("%s%s: incomplete entry %+v", prefix, s.key, s)
		}
	}
}

// TestReadmeSettings: the README's table of the most used settings names keys of the
// settings table with the table's defaults, so that a default changed in the code (or a
// key renamed) cannot leave the front page wrong.
func TestReadmeSettings(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defaults := map[string]string{}
	for _, s := range fileSettings() {
		defaults[s.key] = s.def
	}
	rows := 0
	inTable := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "| key | default | meaning |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "| `") {
			break
		}
		cells := strings.Split(line, " | ")
		key := strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")
		def, ok := defaults[key]
		if !ok {
			t.Errorf("README.md names %q, which is not a configuration key", key)
			continue
		}
		if len(cells) < 3 || cells[1] != def {
			t.Errorf("README.md gives %s the default %q; the settings table says %q", key, cells[1], def)
		}
		rows++
	}
	if rows == 0 {
		t.Fatal("README.md has no `| key | default | meaning |` table of settings")
	}
}
