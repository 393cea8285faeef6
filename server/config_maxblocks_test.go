package server

import (
	"strings"
	"testing"
)

// TestLoadConfigMaxBlocks: the engine-wide block budget key, its default and its errors.
func TestLoadConfigMaxBlocks(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
	}{
		{`{}`, 0},
		{`{"max_blocks": 0}`, 0},
		{`{"max_blocks": 5000000}`, 5_000_000},
	} {
		cfg, err := LoadConfigFile(writeConfig(t, c.text))
		if err != nil {
			t.Fatalf("%s: %v", c.text, err)
		}
		if cfg.MaxBlocks != c.want || cfg.AppConfig().MaxBlocks != c.want {
			t.Errorf("%s: max_blocks %d (app %d), want %d", c.text, cfg.MaxBlocks, cfg.AppConfig().MaxBlocks, c.want)
		}
	}
	for _, text := range []string{`{"max_blocks": -1}`, `{"max_blocks": "10"}`, `{"max_blocks": 1.5}`, `{"max_blocks": 1e12}`} {
		if _, err := LoadConfigFile(writeConfig(t, text)); err == nil || !strings.Contains(err.Error(), "max_blocks") {
			t.Errorf("%s: %v", text, err)
		}
	}
}
