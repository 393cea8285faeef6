package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// StateFileName is the state file's name beside the config file when none is configured.
const StateFileName = "conductor_state.json"

// stateVersion is the state file format; entries use the config file's kvevent_instance schema.
const stateVersion = 1

// StateFile persists the services registered over HTTP or RPC so that they are registered
// again after a restart. Writes replace the file atomically (temporary file, fsync, rename).
type StateFile struct {
	Path string
}

type stateDoc struct {
	Version  int               `json:"version"`
	Services []json.RawMessage `json:"services"`
}

type stateEntry struct {
	Endpoint       string         `json:"endpoint"`
	ReplayEndpoint string         `json:"replay_endpoint"`
	Type           string         `json:"type"`
	ModelName      string         `json:"modelname"`
	LoraName       string         `json:"lora_name"`
	TenantID       string         `json:"tenant_id"`
	InstanceID     string         `json:"instance_id"`
	BlockSize      int64          `json:"block_size"`
	DPRank         int            `json:"dp_rank"`
	CacheGroup     *int64         `json:"cache_group"`
	HashProfile    map[string]any `json:"hash_profile"`
}

// StateLoad is what Load found.
type StateLoad struct {
	Services []ServiceConfig
	// Skipped describes entries that failed validation (they are not registered).
	Skipped []error
	// SetAside is where a corrupt file was moved ("" if none).
	SetAside string
}

// Load reads the state file. A missing file is an empty state. A file that is not a valid
// state document is moved aside to "<path>.corrupt-<unix time>" and reported through
// SetAside and the error; the caller logs it and starts without it. An unreadable file is
// an error too (and is left in place).
func (f *StateFile) Load() (StateLoad, error) {
	var out StateLoad
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read state file %s: %w", f.Path, err)
	}
	var doc stateDoc
	derr := json.Unmarshal(data, &doc)
	if derr == nil && doc.Version != stateVersion {
		derr = fmt.Errorf("unsupported state version %d", doc.Version)
	}
	if derr != nil {
		aside := f.Path + ".corrupt-" + strconv.FormatInt(time.Now().Unix(), 10)
		if rerr := os.Rename(f.Path, aside); rerr != nil {
			return out, fmt.Errorf("state file %s is corrupt (%v) and could not be set aside: %w", f.Path, derr, rerr)
		}
		out.SetAside = aside
		return out, fmt.Errorf("state file %s is corrupt (%v); moved to %s", f.Path, derr, aside)
	}
	for i, raw := range doc.Services {
		cfg, err := parseConfigEntry("", raw)
		if err != nil {
			out.Skipped = append(out.Skipped, fmt.Errorf("state file %s: service %d: %w", f.Path, i, err))
			continue
		}
		out.Services = append(out.Services, cfg)
	}
	return out, nil
}

// Save replaces the state file with the given services.
func (f *StateFile) Save(svcs []ServiceConfig) error {
	doc := stateDoc{Version: stateVersion, Services: make([]json.RawMessage, 0, len(svcs))}
	for i := range svcs {
		c := &svcs[i]
		prof := map[string]any{
			"strategy": c.Profile.StrategyName(), "algorithm": c.Profile.AlgorithmName(),
			"python_hash_seed": c.Profile.Seed, "index_projection": c.Profile.ProjectionName(),
		}
		raw, err := json.Marshal(stateEntry{
			Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, Type: c.Kind.String(), ModelName: c.ModelName,
			LoraName: c.LoraName, TenantID: c.TenantID, InstanceID: c.InstanceID, BlockSize: c.BlockSize,
			DPRank: c.DPRank, CacheGroup: c.CacheGroup, HashProfile: prof,
		})
		if err != nil {
			return fmt.Errorf("encode state entry %s: %w", c.Key(), err)
		}
		doc.Services = append(doc.Services, raw)
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state file: %w", err)
	}
	return writeFileAtomic(f.Path, append(data, '\n'))
}

// writeFileAtomic writes data to a temporary file in the same directory, syncs it and
// renames it over path, so a crash leaves either the old or the new file, never half of one.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create state directory %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary state file: %w", err)
	}
	name := tmp.Name()
	_, werr := tmp.Write(data)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(name, path)
	}
	if werr != nil {
		os.Remove(name)
		return fmt.Errorf("write state file %s: %w", path, werr)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
