package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/jsonval"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
)

//go:generate go test -run ^TestConfigurationDoc$ -update-config-doc .

// Default ports of the contract.
const (
	DefaultHTTPPort = 13333
	DefaultRPCPort  = 13334
)

// FileConfig is the parsed conductor configuration file. Every field comes from one key
// of the settings table (settings.go), which gives its default, its bounds and its
// documentation (docs/configuration.md is generated from it).
type FileConfig struct {
	Path     string
	Found    bool // false: the file was missing, defaults apply
	HTTPPort int
	RPCPort  int // 0 disables RPC
	// Services are the valid kvevent_instance entries, ordered by entry name.
	Services []service.Config
	// Skipped describes each invalid entry that was left out (the others still start).
	Skipped []error
	// StateFile persists services registered over HTTP/RPC: the "state_file" key, default
	// conductor_state.json beside the config file; "" disables.
	StateFile string
	// AccessLog holds the access_log* keys.
	AccessLog accesslog.Config
	// MemoEntries sizes the query key memo ("query_memo_entries"); 0 disables the memo.
	MemoEntries int
	// PopulateMemo is "query_memo_populate": make each part of the memo resident before
	// queries use it (each growth step, on the memo's grower) rather than as queries first
	// write each page.
	PopulateMemo bool
	// MemoSecondSight is "query_memo_second_sight": the memo remembers a prompt from the
	// second time its first run is asked.
	MemoSecondSight bool
	// QueryPulseMS is "query_pulse_ms": the period of the timer kept firing while queries
	// arrive (package internal/pulse); 0 disables it.
	QueryPulseMS int64
	// HTTPBindAddress and RPCBindAddress: the interfaces to listen on ("" = all).
	HTTPBindAddress string
	RPCBindAddress  string
	// AdminToken, when set, is required on state-changing HTTP routes.
	AdminToken string
	// RPCAllowMutations is "rpc_allow_mutations" (nil when absent: RPC Register and
	// Unregister are served only without an admin token).
	RPCAllowMutations *bool
	// Limits from the limit keys.
	Limits Limits
	// MaxBlocks is "max_blocks": the most blocks indexed over all contexts (oldest-written
	// evicted first); 0 means no engine-wide bound.
	MaxBlocks int
	// MemoryLimitBytes is "memory_limit_bytes": the memory the index's blocks and shared
	// bindings may be charged over all contexts (engine.Config.MemoryLimitBytes;
	// oldest-written evicted first); 0 means no bound.
	MemoryLimitBytes int64
	// ZMQMaxMessageSize is "zmq_max_message_size": bytes one ZMQ message may have (-1:
	// unlimited).
	ZMQMaxMessageSize int64
	// ZMQSourceBufferBytes is "zmq_source_buffer_bytes": bytes of messages libzmq may
	// queue for one subscription.
	ZMQSourceBufferBytes int64
	// ZMQIOThreads is "zmq_io_threads": libzmq I/O threads of the shared context.
	ZMQIOThreads int
	// ZMQReconnectMaxMS is "zmq_reconnect_max_ms": the longest pause between attempts
	// to reach a publisher that is not there.
	ZMQReconnectMaxMS int
	// ZMQJoinCheckDelayMS is "zmq_join_check_delay_ms": milliseconds after a subscription
	// first connects before its join check (-1: no join check).
	ZMQJoinCheckDelayMS int
	// IngestLogBurst and IngestLogIntervalSeconds are "ingest_log_burst" and
	// "ingest_log_interval_seconds": per subscription and kind of log line, how many
	// lines pass per interval (burst -1: unlimited).
	IngestLogBurst           int
	IngestLogIntervalSeconds int
	// HashCheck and HashCheckLogIntervalSeconds are "hash_check" and
	// "hash_check_log_interval_seconds": the profile self-check of engine sources, and
	// the least time between two of a context's mismatch warnings.
	HashCheck                   bool
	HashCheckLogIntervalSeconds int
	// Cluster is the "cluster" key (nil when absent: a single node with the state file).
	Cluster *cluster.Config
	// MaxSnapshotBytes and MaxSnapshotDownloads are "max_snapshot_bytes" and
	// "max_snapshot_downloads".
	MaxSnapshotBytes     int64
	MaxSnapshotDownloads int
}

// LoadConfigFile reads the JSON configuration at path. A missing file gives the defaults
// (Found false). An unreadable file, malformed JSON, a non-object root, an unknown key or
// a value of the wrong type or out of its bounds is an error naming the file. Invalid
// kvevent_instance entries are skipped and reported in Skipped, as upstream does.
//
// Unlike upstream (which zeroes http_server_port when the key is absent from an existing
// file), an absent port keeps its default: the contract documents 13333 as the default.
func LoadConfigFile(path string) (FileConfig, error) {
	cfg := FileConfig{Path: path}
	table := fileSettings()
	for i := range table {
		table[i].setDefault(&cfg)
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config file %s: %w", path, err)
	}
	cfg.Found = true
	// encoding/json keeps the last of two equal keys: a file that sets admin_token twice
	// would run with whichever came last, so a repeated key is an error.
	if err := jsonval.CheckDuplicateKeys(data); err != nil {
		return cfg, fmt.Errorf("config file %s: %w", path, err)
	}
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
	if unknown := unknownKeys(root, table); len(unknown) > 0 {
		hint := ""
		if _, ok := root["bind_address"]; ok {
			hint = " (bind_address is split into http_bind_address and rpc_bind_address)"
		}
		return cfg, fmt.Errorf("config file %s: unknown key(s) %s%s; known keys: %s", path,
			strings.Join(unknown, ", "), hint, strings.Join(settingKeys(table), ", "))
	}
	// In table order: kvevent_instance comes last, after every limit it may need.
	for i := range table {
		s := &table[i]
		raw, ok := root[s.key]
		if !ok {
			continue
		}
		if err := s.apply(&cfg, raw); err != nil {
			return cfg, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	return cfg, nil
}

// unknownKeys lists, quoted and sorted, the keys of root that no setting of table has.
func unknownKeys[T any](root map[string]json.RawMessage, table []setting[T]) []string {
	var unknown []string
	for k := range root {
		known := false
		for i := range table {
			known = known || table[i].key == k
		}
		if !known {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	sort.Strings(unknown)
	return unknown
}

func settingKeys[T any](table []setting[T]) []string {
	keys := make([]string, len(table))
	for i := range table {
		keys[i] = table[i].key
	}
	return keys
}

// parseServices reads kvevent_instance: each entry is validated as every registration
// is; an invalid one is skipped and reported.
func parseServices(cfg *FileConfig, raw json.RawMessage) error {
	if string(raw) == "null" {
		return nil
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return fmt.Errorf("kvevent_instance must be an object: %w", err)
	}
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		svc, err := service.DecodeEntry(name, entries[name])
		if err != nil {
			cfg.Skipped = append(cfg.Skipped, fmt.Errorf("kvevent_instance %q: %w", name, err))
			continue
		}
		cfg.Services = append(cfg.Services, svc)
	}
	return nil
}

// parseCluster reads the "cluster" object (nil when null: a single node); its members
// are the settings of clusterSettings.
func parseCluster(cfg *FileConfig, raw json.RawMessage) error {
	if string(raw) == "null" {
		cfg.Cluster = nil
		return nil
	}
	table := clusterSettings()
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return fmt.Errorf("cluster must be an object with %s", strings.Join(settingKeys(table), ", "))
	}
	if unknown := unknownKeys(obj, table); len(unknown) > 0 {
		return fmt.Errorf("cluster must be an object with %s: unknown key(s) %s",
			strings.Join(settingKeys(table), ", "), strings.Join(unknown, ", "))
	}
	c := &cluster.Config{}
	for i := range table {
		table[i].setDefault(c)
	}
	for i := range table {
		s := &table[i]
		if v, ok := obj[s.key]; ok {
			if err := s.apply(c, v); err != nil {
				return fmt.Errorf("cluster.%w", err)
			}
		}
	}
	if len(c.Endpoints) == 0 {
		return errors.New("cluster.etcd_endpoints must list at least one etcd URL")
	}
	cfg.Cluster = c
	return nil
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
		RPCAllowMutations: f.RPCAllowMutations,
		Limits:            f.Limits, AccessLog: f.AccessLog, MemoEntries: memo, PopulateMemo: f.PopulateMemo, MemoSecondSight: f.MemoSecondSight, MaxBlocks: f.MaxBlocks,
		QueryPulse:        time.Duration(f.QueryPulseMS) * time.Millisecond,
		MemoryLimitBytes:  f.MemoryLimitBytes,
		ZMQMaxMessageSize: f.ZMQMaxMessageSize, ZMQSourceBufferBytes: f.ZMQSourceBufferBytes, ZMQIOThreads: f.ZMQIOThreads,
		ZMQReconnectMax:   time.Duration(f.ZMQReconnectMaxMS) * time.Millisecond,
		ZMQJoinCheckDelay: time.Duration(f.ZMQJoinCheckDelayMS) * time.Millisecond,
		IngestLogBurst:    f.IngestLogBurst, IngestLogInterval: time.Duration(f.IngestLogIntervalSeconds) * time.Second,
		HashCheckOff: !f.HashCheck, HashCheckLogInterval: time.Duration(f.HashCheckLogIntervalSeconds) * time.Second,
		Cluster: f.Cluster, MaxSnapshotBytes: f.MaxSnapshotBytes, MaxSnapshotDownloads: f.MaxSnapshotDownloads}
}

// besideConfig resolves a path from the config file against the file's directory (as
// the default state_file is), so that the process's working directory does not decide
// where a relative path lands. "" stays "" (off).
func (f *FileConfig) besideConfig(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(f.Path), p)
}

// checkToken refuses an admin token with a control byte: HTTP header values cannot
// carry one (a newline pasted with the token), so no request could ever match it.
func checkToken(v string) string {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return fmt.Sprintf("must not contain control bytes (0x%02x at byte %d)", c, i)
		}
	}
	return ""
}

// memoMemoryShare is the part of the process's memory the query key memo may take.
const memoMemoryShare = 4

// checkMemoFits refuses a query_memo_entries whose memo would take more than a quarter
// of the memory the process may use.
func checkMemoFits(f *FileConfig) error {
	phys, err := limits.PhysicalMemory()
	if err != nil {
		return nil // not measurable here (not Linux): the key's own bounds hold
	}
	return memoFits(f.MemoEntries, phys)
}

// memoFits is checkMemoFits for a given amount of memory.
func memoFits(entries int, phys int64) error {
	need := hashing.MemoBytes(entries)
	if need <= phys/memoMemoryShare {
		return nil
	}
	return fmt.Errorf("query_memo_entries %d needs %.1f GiB of memo, more than a quarter of the %.1f GiB this process "+
		"may use; at most %d entries fit", entries, float64(need)/(1<<30), float64(phys)/(1<<30),
		maxMemoFor(phys))
}

// maxMemoFor is the largest memo (in blocks, a power of two as the memo rounds its
// size) that fits a quarter of phys.
func maxMemoFor(phys int64) int {
	b := 1
	for hashing.MemoBytes(2*b) <= phys/memoMemoryShare && 2*b <= maxMemoEntries {
		b *= 2
	}
	return b
}
