package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/publisher"
)

// maxMemoEntries caps query_memo_entries (20 GiB of memo at 20 bytes a block).
const maxMemoEntries = 1 << 30

// Default ports of the contract.
const (
	DefaultHTTPPort = 13333
	DefaultRPCPort  = 13334
)

// FileConfig is the parsed conductor configuration file.
type FileConfig struct {
	Path     string
	Found    bool // false: the file was missing, defaults apply
	HTTPPort int
	RPCPort  int // 0 disables RPC
	// Services are the valid kvevent_instance entries, ordered by entry name.
	Services []ServiceConfig
	// Skipped describes each invalid entry that was left out (the others still start).
	Skipped []error
	// StateFile persists services registered over HTTP/RPC: the "state_file" key, default
	// conductor_state.json beside the config file; "" disables.
	StateFile string
	// AccessLog holds the access_log* keys (see AccessLogConfig).
	AccessLog AccessLogConfig
	// MemoEntries sizes the query key memo: the "query_memo_entries" key, default
	// hashing.DefaultMemoEntries; 0 disables the memo.
	MemoEntries int
	// PopulateMemo is the "query_memo_populate" key, default true: make the whole memo
	// resident at start rather than as queries first write each page.
	PopulateMemo bool
	// HTTPBindAddress and RPCBindAddress: the interfaces to listen on ("" = all).
	HTTPBindAddress string
	RPCBindAddress  string
	// AdminToken, when set, is required on state-changing HTTP routes.
	AdminToken string
	// Limits from the limit keys (zero fields: defaults).
	Limits Limits
	// MaxBlocks is the "max_blocks" key: the most blocks indexed over all contexts
	// (oldest-written evicted first); 0 (the default) means no engine-wide bound.
	MaxBlocks int
	// MemoryLimitBytes is the "memory_limit_bytes" key: the memory the index's blocks and
	// shared bindings may be charged over all contexts (engine.Config.MemoryLimitBytes;
	// oldest-written evicted first); 0 (the default) means no bound.
	MemoryLimitBytes int64
	// ZMQMaxMessageSize is "zmq_max_message_size": bytes one ZMQ message may have (0:
	// ingest.DefaultMaxMessageSize, -1: unlimited).
	ZMQMaxMessageSize int64
	// ZMQIOThreads is "zmq_io_threads": libzmq I/O threads of the shared context (0: 1).
	ZMQIOThreads int
	// ZMQJoinCheckDelayMS is "zmq_join_check_delay_ms": milliseconds after a subscription
	// first connects before its join check (0: 1000; -1: no join check).
	ZMQJoinCheckDelayMS int
	// IngestLogBurst and IngestLogIntervalSeconds are "ingest_log_burst" and
	// "ingest_log_interval_seconds": per subscription and kind of log line, how many
	// lines pass per interval (0: defaults 10 and 10 s; burst -1: unlimited).
	IngestLogBurst           int
	IngestLogIntervalSeconds int
	// Cluster is the "cluster" key (nil when absent: a single node with the state file).
	Cluster *cluster.Config
}

// configKeys are the top-level keys understood; any other key is an error rather than
// silently ignored (a mistyped limit or bind address must not go unnoticed).
// "services" is accepted and ignored, as upstream does (its own tests write it).
var configKeys = []string{
	"http_server_port", "rpc_server_port", "kvevent_instance", "state_file", "services",
	"http_bind_address", "rpc_bind_address", "admin_token",
	"max_query_body_bytes", "max_admin_body_bytes", "max_inflight_body_bytes", "http_max_connections", "http_read_buffer_bytes",
	"http_read_timeout_ms", "http_idle_timeout_ms", "rpc_max_connections", "rpc_read_timeout_ms",
	"rpc_idle_timeout_ms", "max_services", "max_registration_field_bytes", "shutdown_timeout_ms",
	"query_memo_entries", "query_memo_populate", "access_log", "access_log_trace_header", "access_log_buffer_bytes",
	"access_log_flush_interval_ms", "max_blocks", "memory_limit_bytes", "zmq_max_message_size", "zmq_io_threads", "zmq_join_check_delay_ms",
	"ingest_log_burst", "ingest_log_interval_seconds", "cluster",
}

// LoadConfigFile reads the JSON configuration at path. A missing file gives the defaults
// (Found false). An unreadable file, malformed JSON, a non-object root or a malformed port
// is an error naming the file. Invalid kvevent_instance entries are skipped and reported
// in Skipped, as upstream does.
//
// Unlike upstream (which zeroes http_server_port when the key is absent from an existing
// file), an absent port keeps its default: the contract documents 13333 as the default.
func LoadConfigFile(path string) (FileConfig, error) {
	cfg := FileConfig{Path: path, HTTPPort: DefaultHTTPPort, RPCPort: DefaultRPCPort,
		StateFile: filepath.Join(filepath.Dir(path), StateFileName), MemoEntries: hashing.DefaultMemoEntries,
		PopulateMemo: true}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config file %s: %w", path, err)
	}
	cfg.Found = true
	var root map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return cfg, fmt.Errorf("config file %s: malformed JSON: %w", path, err)
	}
	if root == nil {
		return cfg, fmt.Errorf("config file %s: root must be a JSON object", path)
	}
	if dec.More() {
		return cfg, fmt.Errorf("config file %s: trailing data after the JSON object", path)
	}
	var unknown []string
	for k := range root {
		known := false
		for _, c := range configKeys {
			known = known || k == c
		}
		if !known {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		hint := ""
		if _, ok := root["bind_address"]; ok {
			hint = " (bind_address is split into http_bind_address and rpc_bind_address)"
		}
		return cfg, fmt.Errorf("config file %s: unknown key(s) %s%s; known keys: %s", path,
			strings.Join(unknown, ", "), hint, strings.Join(configKeys, ", "))
	}
	for _, p := range []struct {
		key string
		dst *string
	}{{"http_bind_address", &cfg.HTTPBindAddress}, {"rpc_bind_address", &cfg.RPCBindAddress}, {"admin_token", &cfg.AdminToken}} {
		raw, ok := root[p.key]
		if !ok {
			continue
		}
		v, ok := jsonString(raw)
		if !ok {
			return cfg, fmt.Errorf("config file %s: %s must be a string", path, p.key)
		}
		*p.dst = v
	}
	for _, p := range []struct {
		key string
		set func(int64)
	}{
		{"max_query_body_bytes", func(v int64) { cfg.Limits.MaxQueryBodyBytes = int(v) }},
		{"max_admin_body_bytes", func(v int64) { cfg.Limits.MaxAdminBodyBytes = int(v) }},
		{"max_inflight_body_bytes", func(v int64) { cfg.Limits.MaxInflightBodyBytes = v }},
		{"http_max_connections", func(v int64) { cfg.Limits.HTTPMaxConnections = int(v) }},
		{"http_read_buffer_bytes", func(v int64) { cfg.Limits.HTTPReadBufferBytes = int(v) }},
		{"http_read_timeout_ms", func(v int64) { cfg.Limits.HTTPReadTimeout = time.Duration(v) * time.Millisecond }},
		{"http_idle_timeout_ms", func(v int64) { cfg.Limits.HTTPIdleTimeout = time.Duration(v) * time.Millisecond }},
		{"rpc_max_connections", func(v int64) { cfg.Limits.RPCMaxConnections = int(v) }},
		{"rpc_read_timeout_ms", func(v int64) { cfg.Limits.RPCReadTimeout = time.Duration(v) * time.Millisecond }},
		{"rpc_idle_timeout_ms", func(v int64) { cfg.Limits.RPCIdleTimeout = time.Duration(v) * time.Millisecond }},
		{"max_services", func(v int64) { cfg.Limits.MaxServices = int(v) }},
		{"max_registration_field_bytes", func(v int64) { cfg.Limits.MaxFieldBytes = int(v) }},
		{"shutdown_timeout_ms", func(v int64) { cfg.Limits.ShutdownTimeout = time.Duration(v) * time.Millisecond }},
	} {
		raw, ok := root[p.key]
		if !ok {
			continue
		}
		v, err := jsonInt(raw)
		if err != nil || v <= 0 || v > 1<<40 {
			return cfg, fmt.Errorf("config file %s: %s must be a positive integer", path, p.key)
		}
		p.set(v)
	}
	// Each open connection holds one read buffer: a typo must not make it gigabytes.
	if n := cfg.Limits.HTTPReadBufferBytes; n != 0 && (n < MinHTTPReadBufferBytes || n > MaxHTTPReadBufferBytes) {
		return cfg, fmt.Errorf("config file %s: http_read_buffer_bytes must be in %d..%d", path, MinHTTPReadBufferBytes, MaxHTTPReadBufferBytes)
	}
	for _, p := range []struct {
		key string
		dst *int
	}{{"http_server_port", &cfg.HTTPPort}, {"rpc_server_port", &cfg.RPCPort}} {
		raw, ok := root[p.key]
		if !ok {
			continue
		}
		port, err := jsonInt(raw)
		if err != nil || port < 0 || port > 65535 {
			return cfg, fmt.Errorf("config file %s: %s must be an integer port in 0..65535", path, p.key)
		}
		*p.dst = int(port)
	}
	if raw, ok := root["query_memo_entries"]; ok {
		n, err := jsonInt(raw)
		if err != nil || n < 0 || n > maxMemoEntries {
			return cfg, fmt.Errorf("config file %s: query_memo_entries must be an integer in 0..%d", path, maxMemoEntries)
		}
		cfg.MemoEntries = int(n)
	}
	if raw, ok := root["query_memo_populate"]; ok {
		switch string(bytes.TrimSpace(raw)) {
		case "true":
			cfg.PopulateMemo = true
		case "false":
			cfg.PopulateMemo = false
		default:
			return cfg, fmt.Errorf("config file %s: query_memo_populate must be true or false", path)
		}
	}
	if raw, ok := root["max_blocks"]; ok {
		n, err := jsonInt(raw)
		if err != nil || n < 0 || n > math.MaxInt32 {
			return cfg, fmt.Errorf("config file %s: max_blocks must be an integer in 0..%d", path, math.MaxInt32)
		}
		cfg.MaxBlocks = int(n)
	}
	if raw, ok := root["memory_limit_bytes"]; ok {
		n, err := jsonInt(raw)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("config file %s: memory_limit_bytes must be an integer >= 0", path)
		}
		cfg.MemoryLimitBytes = n
	}
	for _, p := range []struct {
		key      string
		min, max int64
		set      func(int64)
	}{
		{"zmq_max_message_size", -1, 1 << 40, func(v int64) { cfg.ZMQMaxMessageSize = v }},
		{"zmq_io_threads", 0, 64, func(v int64) { cfg.ZMQIOThreads = int(v) }},
		{"zmq_join_check_delay_ms", -1, 3_600_000, func(v int64) { cfg.ZMQJoinCheckDelayMS = int(v) }},
		{"ingest_log_burst", -1, 1 << 20, func(v int64) { cfg.IngestLogBurst = int(v) }},
		{"ingest_log_interval_seconds", 0, 86400, func(v int64) { cfg.IngestLogIntervalSeconds = int(v) }},
	} {
		raw, ok := root[p.key]
		if !ok {
			continue
		}
		v, err := jsonInt(raw)
		if err != nil || v < p.min || v > p.max {
			return cfg, fmt.Errorf("config file %s: %s must be an integer in %d..%d", path, p.key, p.min, p.max)
		}
		p.set(v)
	}
	if raw, ok := root["state_file"]; ok {
		if err := json.Unmarshal(raw, &cfg.StateFile); err != nil {
			return cfg, fmt.Errorf("config file %s: state_file must be a string", path)
		}
	}
	if err := parseAccessLogConfig(path, root, &cfg.AccessLog); err != nil {
		return cfg, err
	}
	if cfg.Cluster, err = parseClusterConfig(path, root); err != nil {
		return cfg, err
	}
	raw, ok := root["kvevent_instance"]
	if !ok || string(raw) == "null" {
		return cfg, nil
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return cfg, fmt.Errorf("config file %s: kvevent_instance must be an object: %w", path, err)
	}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		svc, err := parseConfigEntry(name, entries[name])
		if err != nil {
			cfg.Skipped = append(cfg.Skipped, fmt.Errorf("kvevent_instance %q: %w", name, err))
			continue
		}
		cfg.Services = append(cfg.Services, svc)
	}
	return cfg, nil
}

// parseConfigEntry applies the per-entry rules of reference notes §1.5, then the same
// validation as every other registration path.
func parseConfigEntry(name string, raw json.RawMessage) (ServiceConfig, error) {
	var entry map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&entry); err != nil || entry == nil {
		return ServiceConfig{}, errors.New("entry must be an object")
	}
	var r Registration
	var err error
	if r.Type, err = optString(entry, "type", ""); err != nil {
		return ServiceConfig{}, err
	}
	if _, ok := publisher.Parse(r.Type); !ok {
		return ServiceConfig{}, fmt.Errorf("type must be vLLM, SGLang or Mooncake, got %q", r.Type)
	}
	// Upstream reads these leniently (non-strings become "") and checks emptiness later.
	r.Endpoint = looseString(entry["endpoint"])
	r.ReplayEndpoint = looseString(entry["replay_endpoint"])
	r.ModelName = looseString(entry["modelname"])
	if r.LoraName, err = optString(entry, "lora_name", ""); err != nil {
		return ServiceConfig{}, err
	}
	if r.TenantID, err = optString(entry, "tenant_id", ""); err != nil {
		return ServiceConfig{}, err
	}
	r.InstanceID = name
	if v, ok := entry["instance_id"]; ok {
		s, ok := jsonString(v)
		if !ok || s == "" {
			return ServiceConfig{}, errors.New("instance_id must be a non-empty string")
		}
		r.InstanceID = s
	}
	bs, ok := entry["block_size"]
	if !ok {
		return ServiceConfig{}, errors.New("block_size is required")
	}
	if r.BlockSize, err = jsonInt(bs); err != nil {
		return ServiceConfig{}, fmt.Errorf("block_size: %w", err)
	}
	dp, ok := entry["dp_rank"]
	if !ok {
		return ServiceConfig{}, errors.New("dp_rank is required")
	}
	if r.DPRank, err = jsonInt(dp); err != nil || r.DPRank < 0 || r.DPRank > maxDPRank {
		return ServiceConfig{}, errors.New("dp_rank must be an integer in 0..2147483647")
	}
	if g, ok := entry["cache_group"]; ok && string(g) != "null" {
		v, err := jsonInt(g)
		if err != nil || v != 0 {
			return ServiceConfig{}, errors.New("cache_group must be null or 0")
		}
		r.CacheGroup = &v
	}
	if err := parseConfigProfile(entry["hash_profile"], &r); err != nil {
		return ServiceConfig{}, err
	}
	cfg, verr := r.Resolve()
	if verr != nil {
		return ServiceConfig{}, verr
	}
	return cfg, nil
}

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
		if *f.dst, ok = jsonString(p[f.key]); !ok {
			return fmt.Errorf("hash_profile.%s must be a string", f.key)
		}
	}
	sglang := r.Strategy == "sglang" || r.Strategy == "sglang_bigram"
	if v, ok := p["python_hash_seed"]; ok {
		if r.PythonHashSeed, ok = jsonString(v); !ok {
			return errors.New("hash_profile.python_hash_seed must be a string")
		}
	} else if !sglang {
		return errors.New("hash_profile.python_hash_seed is required for vllm_v1")
	}
	return nil
}

// jsonInt accepts a JSON integer that fits int64 (no fraction, no exponent). A quoted
// number is a string, not an integer: json.Number alone would accept "16".
func jsonInt(raw json.RawMessage) (int64, error) {
	var n json.Number
	if len(raw) == 0 || raw[0] == '"' || json.Unmarshal(raw, &n) != nil || n == "" {
		return 0, errors.New("must be an integer")
	}
	v, err := n.Int64()
	if err != nil {
		return 0, errors.New("must be an integer in int64 range")
	}
	return v, nil
}

func optString(entry map[string]json.RawMessage, key, def string) (string, error) {
	v, ok := entry[key]
	if !ok {
		return def, nil
	}
	s, ok := jsonString(v)
	if !ok {
		return "", fmt.Errorf("%s must be a string", key)
	}
	return s, nil
}

// jsonString decodes a JSON string. Null is not a string: json.Unmarshal would accept it
// into a string without error and leave "", turning an invalid entry into a default.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func looseString(raw json.RawMessage) string {
	s, _ := jsonString(raw)
	return s
}

// AppConfig turns the file into the process configuration: rpc_server_port 0 disables RPC.
func (f *FileConfig) AppConfig() AppConfig {
	rpc := f.RPCPort
	if rpc == 0 {
		rpc = -1
	}
	memo := f.MemoEntries
	if memo == 0 {
		memo = -1
	}
	return AppConfig{HTTPPort: f.HTTPPort, RPCPort: rpc, Services: f.Services,
		SkippedServices: len(f.Skipped), ConfigPath: f.Path, StateFile: f.StateFile,
		HTTPBindAddress: f.HTTPBindAddress, RPCBindAddress: f.RPCBindAddress, AdminToken: f.AdminToken,
		Limits: f.Limits, AccessLog: f.AccessLog, MemoEntries: memo, PopulateMemo: f.PopulateMemo, MaxBlocks: f.MaxBlocks,
		MemoryLimitBytes:  f.MemoryLimitBytes,
		ZMQMaxMessageSize: f.ZMQMaxMessageSize, ZMQIOThreads: f.ZMQIOThreads,
		ZMQJoinCheckDelay: time.Duration(f.ZMQJoinCheckDelayMS) * time.Millisecond,
		IngestLogBurst:    f.IngestLogBurst, IngestLogInterval: time.Duration(f.IngestLogIntervalSeconds) * time.Second,
		Cluster: f.Cluster}
}
