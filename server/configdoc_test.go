package server

import (
	"flag"
	"os"
	"path/filepath"
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
	seen := map[string]bool{}
	for _, s := range fileSettings() {
		if seen[s.key] {
			t.Errorf("%s: twice in the table", s.key)
		}
		seen[s.key] = true
		if s.typ == "" || s.def == "" || s.bounds == "" || s.doc == "" || s.parse == nil {
			t.Errorf("%s: incomplete entry %+v", s.key, s)
		}
	}
	seen = map[string]bool{}
	for _, s := range clusterSettings() {
		if seen[s.key] {
			t.Errorf("cluster.%s: twice in the table", s.key)
		}
		seen[s.key] = true
		if s.typ == "" || s.def == "" || s.bounds == "" || s.doc == "" || s.parse == nil {
			t.Errorf("cluster.%s: incomplete entry %+v", s.key, s)
		}
	}
}
