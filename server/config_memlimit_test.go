package server

import (
	"strings"
	"testing"
)

// TestLoadConfigMemoryLimit: the engine memory budget key, its default and its errors.
func TestLoadConfigMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		text string
		want int64
	}{
		{`{}`, 0},
		{`{"memory_limit_bytes": 0}`, 0},
		{`{"memory_limit_bytes": 68719476736}`, 64 << 30},
	} {
		cfg, err := LoadConfigFile(writeConfig(t, c.text))
		if err != nil {
			t.Fatalf("%s: %v", c.text, err)
		}
		if cfg.MemoryLimitBytes != c.want || cfg.AppConfig().MemoryLimitBytes != c.want {
			t.Errorf("%s: memory_limit_bytes %d (app %d), want %d", c.text, cfg.MemoryLimitBytes, cfg.AppConfig().MemoryLimitBytes, c.want)
		}
	}
	for _, text := range []string{`{"memory_limit_bytes": -1}`, `{"memory_limit_bytes": "1G"}`, `{"memory_limit_bytes": 1.5}`, `{"memory_limit_bytes": 1e30}`} {
		if _, err := LoadConfigFile(writeConfig(t, text)); err == nil || !strings.Contains(err.Error(), "memory_limit_bytes") {
			t.Errorf("%s: %v", text, err)
		}
	}
}
