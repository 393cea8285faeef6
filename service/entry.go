package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/internal/jsonval"
	"github.com/conductor-go/conductor/wire/publisher"
)

// DecodeEntry reads one registration written as a JSON object: an entry of the config
// file's kvevent_instance (name is its key, the instance_id when the entry has none), of
// the state file, or of the cluster registry (name ""). It applies the per-entry rules of
// reference notes §1.5, then Resolve, as every other registration path does.
func DecodeEntry(name string, raw json.RawMessage) (Config, error) {
	var entry map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&entry); err != nil || entry == nil {
		return Config{}, errors.New("entry must be an object")
	}
	var r Registration
	var err error
	if r.Type, err = optString(entry, "type", ""); err != nil {
		return Config{}, err
	}
	if _, ok := publisher.Parse(r.Type); !ok {
		return Config{}, fmt.Errorf("type must be vLLM, SGLang or Mooncake, got %q", r.Type)
	}
	// Upstream reads these leniently (non-strings become "") and checks emptiness later.
	r.Endpoint = looseString(entry["endpoint"])
	r.ReplayEndpoint = looseString(entry["replay_endpoint"])
	r.ModelName = looseString(entry["modelname"])
	if r.LoraName, err = optString(entry, "lora_name", ""); err != nil {
		return Config{}, err
	}
	if r.TenantID, err = optString(entry, "tenant_id", ""); err != nil {
		return Config{}, err
	}
	r.InstanceID = name
	if v, ok := entry["instance_id"]; ok {
		s, ok := jsonval.String(v)
		if !ok || s == "" {
			return Config{}, errors.New("instance_id must be a non-empty string")
		}
		r.InstanceID = s
	}
	bs, ok := entry["block_size"]
	if !ok {
		return Config{}, errors.New("block_size is required")
	}
	if r.BlockSize, err = jsonval.Int(bs); err != nil {
		return Config{}, fmt.Errorf("block_size: %w", err)
	}
	dp, ok := entry["dp_rank"]
	if !ok {
		return Config{}, errors.New("dp_rank is required")
	}
	if r.DPRank, err = jsonval.Int(dp); err != nil || r.DPRank < 0 || r.DPRank > maxDPRank {
		return Config{}, errors.New("dp_rank must be an integer in 0..2147483647")
	}
	if g, ok := entry["cache_group"]; ok && string(g) != "null" {
		v, err := jsonval.Int(g)
		if err != nil || v != 0 {
			return Config{}, errors.New("cache_group must be null or 0")
		}
		r.CacheGroup = &v
	}
	if err := parseConfigProfile(entry["hash_profile"], &r); err != nil {
		return Config{}, err
	}
	cfg, verr := r.Resolve()
	if verr != nil {
		return Config{}, verr
	}
	return cfg, nil
}

// parseConfigProfile reads an entry's hash_profile object into r.
func parseConfigProfile(raw json.RawMessage, r *Registration) error {
	if raw == nil {
		return errors.New("hash_profile is required")
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(raw, &p); err != nil || p == nil {
		return errors.New("hash_profile must be an object")
	}
	for k := range p {
		switch k {
		case "strategy", "algorithm", "python_hash_seed", "index_projection":
		default:
			return fmt.Errorf("hash_profile: unknown key %q", k)
		}
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"strategy", &r.Strategy}, {"algorithm", &r.Algorithm}, {"index_projection", &r.IndexProjection}} {
		var ok bool
		if *f.dst, ok = jsonval.String(p[f.key]); !ok {
			return fmt.Errorf("hash_profile.%s must be a string", f.key)
		}
	}
	sglang := r.Strategy == "sglang" || r.Strategy == "sglang_bigram"
	if v, ok := p["python_hash_seed"]; ok {
		if r.PythonHashSeed, ok = jsonval.String(v); !ok {
			return errors.New("hash_profile.python_hash_seed must be a string")
		}
	} else if !sglang {
		return errors.New("hash_profile.python_hash_seed is required for vllm_v1")
	}
	return nil
}

// optString reads an optional string member (def when absent).
func optString(entry map[string]json.RawMessage, key, def string) (string, error) {
	v, ok := entry[key]
	if !ok {
		return def, nil
	}
	s, ok := jsonval.String(v)
	if !ok {
		return "", fmt.Errorf("%s must be a string", key)
	}
	return s, nil
}

// looseString reads a string member leniently: anything else is "".
func looseString(raw json.RawMessage) string {
	s, _ := jsonval.String(raw)
	return s
}

// entryJSON is the JSON form of a registration that EncodeEntry writes.
type entryJSON struct {
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

// EncodeEntry writes a registration as DecodeEntry reads it (the state file's and the
// cluster registry's entries).
func EncodeEntry(c *Config) (json.RawMessage, error) {
	prof := map[string]any{
		"strategy": c.Profile.StrategyName(), "algorithm": c.Profile.AlgorithmName(),
		"python_hash_seed": c.Profile.Seed, "index_projection": c.Profile.ProjectionName(),
	}
	raw, err := json.Marshal(entryJSON{
		Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, Type: c.Kind.String(), ModelName: c.ModelName,
		LoraName: c.LoraName, TenantID: c.TenantID, InstanceID: c.InstanceID, BlockSize: c.BlockSize,
		DPRank: c.DPRank, CacheGroup: c.CacheGroup, HashProfile: prof,
	})
	if err != nil {
		return nil, fmt.Errorf("encode state entry %s: %w", c.Key(), err)
	}
	return raw, nil
}
