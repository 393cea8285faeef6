package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/hashing"
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
	if raw, ok := entry["index_media"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &r.IndexMedia); err != nil || r.IndexMedia == nil {
			return Config{}, errors.New("index_media must be an array of strings")
		}
		if len(r.IndexMedia) > MaxIndexMedia {
			return Config{}, fmt.Errorf("index_media has %d entries, more than the limit of %d", len(r.IndexMedia), MaxIndexMedia)
		}
	}
	adapters, err := parseAdapters(entry["lora_adapters"])
	if err != nil {
		return Config{}, err
	}
	cfg, verr := r.Resolve()
	if verr != nil {
		return Config{}, verr
	}
	if len(adapters) > 0 {
		if cfg, verr = cfg.WithAdapters(append(cfg.Loras(), adapters...)); verr != nil {
			return Config{}, verr
		}
	}
	return cfg, nil
}

// parseAdapters reads lora_adapters: the other adapters of a multi-LoRA registration,
// [{"lora_name": ..., "lora_path": ...}, ...] (lora_path optional).
func parseAdapters(raw json.RawMessage) ([]Adapter, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("lora_adapters must be an array of objects")
	}
	if len(list) > MaxAdapters {
		return nil, fmt.Errorf("lora_adapters has %d entries, more than the limit of %d", len(list), MaxAdapters)
	}
	out := make([]Adapter, 0, len(list))
	for i, m := range list {
		var a Adapter
		for k, v := range m {
			var ok bool
			switch k {
			case "lora_name":
				a.LoraName, ok = jsonval.String(v)
			case "lora_path":
				a.LoraPath, ok = jsonval.String(v)
			default:
				return nil, fmt.Errorf("lora_adapters[%d]: unknown key %q", i, k)
			}
			if !ok {
				return nil, fmt.Errorf("lora_adapters[%d].%s must be a string", i, k)
			}
		}
		if _, ok := m["lora_name"]; !ok {
			return nil, fmt.Errorf("lora_adapters[%d].lora_name is required", i)
		}
		out = append(out, a)
	}
	return out, nil
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
		case "strategy", "algorithm", "python_hash_seed", "index_projection",
			"extra_keys", "lora_path", "lookahead_tokens":
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
	// The optional fields of issue 25: absent means the default.
	for _, f := range []struct {
		key string
		dst *string
	}{{"extra_keys", &r.ExtraKeys}, {"lora_path", &r.LoraPath}} {
		if v, ok := p[f.key]; ok {
			if *f.dst, ok = jsonval.String(v); !ok {
				return fmt.Errorf("hash_profile.%s must be a string", f.key)
			}
		}
	}
	if v, ok := p["lookahead_tokens"]; ok {
		n, err := jsonval.Int(v)
		if err != nil {
			return fmt.Errorf("hash_profile.lookahead_tokens %w", err)
		}
		r.LookaheadTokens = n
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

// entryJSON is the JSON form of a registration that EncodeEntry writes. The fields of
// issue 25 are left out when they hold their defaults, so that a registration using
// none of them is written as before they existed.
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
	IndexMedia     []string       `json:"index_media,omitempty"`
	LoraAdapters   []adapterJSON  `json:"lora_adapters,omitempty"`
}

type adapterJSON struct {
	LoraName string `json:"lora_name"`
	LoraPath string `json:"lora_path,omitempty"`
}

// ProfileFields is a resolved profile as a registration's hash_profile map: the four
// selectors, and the fields of issue 25 only where they differ from their defaults
// (extra_keys "tagged", a lora_path, lookahead_tokens > 0).
func ProfileFields(p *hashing.Profile) map[string]any {
	prof := map[string]any{
		"strategy": p.StrategyName(), "algorithm": p.AlgorithmName(),
		"python_hash_seed": p.Seed, "index_projection": p.ProjectionName(),
	}
	if p.ExtraKeys != hashing.ExtraKeysUntagged {
		prof["extra_keys"] = p.ExtraKeysName()
	}
	if p.LoraPath != "" {
		prof["lora_path"] = p.LoraPath
	}
	if p.Lookahead != 0 {
		prof["lookahead_tokens"] = p.Lookahead
	}
	return prof
}

// EncodeEntry writes a registration as DecodeEntry reads it (the state file's and the
// cluster registry's entries).
func EncodeEntry(c *Config) (json.RawMessage, error) {
	e := entryJSON{
		Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, Type: c.Kind.String(), ModelName: c.ModelName,
		LoraName: c.LoraName, TenantID: c.TenantID, InstanceID: c.InstanceID, BlockSize: c.BlockSize,
		DPRank: c.DPRank, CacheGroup: c.CacheGroup, HashProfile: ProfileFields(&c.Profile),
	}
	if c.Media.Explicit() {
		e.IndexMedia = c.Media.Names(c.Kind)
	}
	for _, a := range c.Adapters {
		e.LoraAdapters = append(e.LoraAdapters, adapterJSON(a))
	}
	raw, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode state entry %s: %w", c.Key(), err)
	}
	return raw, nil
}
