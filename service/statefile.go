package service

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// StateFileName is the state file's name beside the config file when none is configured.
const StateFileName = "conductor_state.json"

// StateFile persists the services registered over HTTP or RPC so that they are registered
// again after a restart.
//
// Format (version 2): JSON lines. The first line is {"version":2}; each further line is
// one change, {"op":"put","service":{...}} or {"op":"del","instance_id":...,
// "tenant_id":...,"dp_rank":...}, appended and fsynced before the registration is
// acknowledged, so the cost of a change does not depend on how many services exist. The
// log is compacted in the background (rewritten to one put per live service, atomically)
// once it holds more than twice the live records. A version 1 file (one JSON document,
// as earlier releases wrote) is still read, and rewritten in the new format at start.
type StateFile struct {
	Path string
	// Log receives compaction failures (nil: slog.Default()).
	Log *slog.Logger
	// CompactSlack: compaction starts when the log holds more than twice the live
	// records plus this (0: 64).
	CompactSlack int

	mu      sync.Mutex
	f       *os.File // open for appending; nil until the first write
	size    int64    // bytes of f that hold complete records
	records int      // change records in the file
	live    map[ID][]byte
	broken  error // set when a failed append could not be undone; cleared by compaction

	compacting bool
	pending    [][]byte // records appended while a compaction runs
	// compactHook, in tests, runs between the compaction's snapshot and its switch-over.
	compactHook func()
	compactWG   sync.WaitGroup
}

// stateVersion is the state file format written; legacyStateVersion is still read.
const (
	stateVersion       = 2
	legacyStateVersion = 1
)

// compactMinRecords: the log is compacted when it holds more than twice the live
// records plus this slack.
const compactMinRecords = 64

// compactSlack returns the slack of this file (tests lower it).
func (f *StateFile) compactSlack() int {
	if f.CompactSlack > 0 {
		return f.CompactSlack
	}
	return compactMinRecords
}

type stateDoc struct {
	Version  int               `json:"version"`
	Services []json.RawMessage `json:"services"`
}

type stateRecord struct {
	Op         string          `json:"op"`
	Service    json.RawMessage `json:"service,omitempty"`
	InstanceID string          `json:"instance_id,omitempty"`
	TenantID   string          `json:"tenant_id,omitempty"`
	DPRank     int             `json:"dp_rank,omitempty"`
}

// StateLoad is what Load found.
type StateLoad struct {
	Services []Config
	// Skipped describes entries that failed validation (they are not registered).
	Skipped []error
	// SetAside is where a corrupt file was moved ("" if none).
	SetAside string
}

// Load reads the state file. A missing file is an empty state. A file that is not a valid
// state log is moved aside to "<path>.corrupt-<unix time>" and reported through SetAside
// and the error; the caller logs it and starts without it. An unreadable file is an error
// too (and is left in place). A last line cut short by a crash during an append is
// ignored (that change was never acknowledged).
func (f *StateFile) Load() (StateLoad, error) {
	var out StateLoad
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read state file %s: %w", f.Path, err)
	}
	entries, derr := decodeState(data)
	if derr != nil {
		aside := f.Path + ".corrupt-" + strconv.FormatInt(time.Now().Unix(), 10)
		if rerr := os.Rename(f.Path, aside); rerr != nil {
			return out, fmt.Errorf("state file %s is corrupt (%v) and could not be set aside: %w", f.Path, derr, rerr)
		}
		out.SetAside = aside
		return out, fmt.Errorf("state file %s is corrupt (%v); moved to %s", f.Path, derr, aside)
	}
	for i, raw := range entries {
		cfg, err := DecodeEntry("", raw)
		if err != nil {
			out.Skipped = append(out.Skipped, fmt.Errorf("state file %s: service %d: %w", f.Path, i, err))
			continue
		}
		out.Services = append(out.Services, cfg)
	}
	return out, nil
}

// decodeState returns the live service entries of a state file (either version).
func decodeState(data []byte) ([]json.RawMessage, error) {
	var doc stateDoc
	if err := json.Unmarshal(data, &doc); err == nil && doc.Version != stateVersion {
		// One JSON document: a version 1 file (a version 2 log holding only its header
		// parses as one document too, and is read as a log below).
		if doc.Version != legacyStateVersion {
			return nil, fmt.Errorf("unsupported state version %d", doc.Version)
		}
		return doc.Services, nil
	}
	lines := bytes.Split(data, []byte("\n"))
	torn := len(data) > 0 && data[len(data)-1] != '\n'
	if err := json.Unmarshal(lines[0], &doc); err != nil || doc.Version != stateVersion {
		return nil, errors.New("not a state file: the first line must be {\"version\":2}")
	}
	var order []ID
	live := map[ID]json.RawMessage{}
	for i, line := range lines[1:] {
		if len(line) == 0 {
			continue
		}
		var rec stateRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			if torn && i == len(lines)-2 {
				break // an append cut short by a crash: never acknowledged
			}
			return nil, fmt.Errorf("line %d: %w", i+2, err)
		}
		switch rec.Op {
		case "put":
			var e entryJSON
			if err := json.Unmarshal(rec.Service, &e); err != nil {
				return nil, fmt.Errorf("line %d: %w", i+2, err)
			}
			tenant := e.TenantID
			if tenant == "" {
				tenant = "default"
			}
			id := ID{InstanceID: e.InstanceID, TenantID: tenant, DPRank: e.DPRank}
			if _, ok := live[id]; !ok {
				order = append(order, id)
			}
			live[id] = rec.Service
		case "del":
			delete(live, ID{InstanceID: rec.InstanceID, TenantID: rec.TenantID, DPRank: rec.DPRank})
		default:
			return nil, fmt.Errorf("line %d: unknown op %q", i+2, rec.Op)
		}
	}
	out := make([]json.RawMessage, 0, len(live))
	for _, id := range order {
		if raw, ok := live[id]; ok {
			out = append(out, raw)
			delete(live, id) // a re-put after a delete is listed once
		}
	}
	return out, nil
}

func putRecord(c *Config) ([]byte, error) {
	raw, err := EncodeEntry(c)
	if err != nil {
		return nil, err
	}
	line, err := json.Marshal(stateRecord{Op: "put", Service: raw})
	if err != nil {
		return nil, err
	}
	return append(line, '\n'), nil
}

// Reset makes the file hold exactly svcs (one atomic rewrite); used once at start after
// the restored services were registered. With no services and no file, nothing is
// created.
func (f *StateFile) Reset(svcs []Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live = make(map[ID][]byte, len(svcs))
	for i := range svcs {
		line, err := putRecord(&svcs[i])
		if err != nil {
			return err
		}
		f.live[svcs[i].ID()] = line
	}
	if len(svcs) == 0 {
		if _, err := os.Stat(f.Path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
	}
	return f.rewriteLocked(f.snapshotLocked(), nil)
}

// Put appends a registration and syncs it; a registration the file already holds as is
// writes nothing. On error nothing was recorded.
func (f *StateFile) Put(c *Config) error {
	line, err := putRecord(c)
	if err != nil {
		return err
	}
	f.mu.Lock()
	held := f.broken == nil && f.f != nil && bytes.Equal(f.live[c.ID()], line)
	f.mu.Unlock()
	if held {
		return nil
	}
	return f.appendRecord(line, func() { f.live[c.ID()] = line })
}

// Delete appends an unregistration and syncs it. On error nothing was recorded.
func (f *StateFile) Delete(id ID) error {
	line, err := json.Marshal(stateRecord{Op: "del", InstanceID: id.InstanceID, TenantID: id.TenantID, DPRank: id.DPRank})
	if err != nil {
		return err
	}
	return f.appendRecord(append(line, '\n'), func() { delete(f.live, id) })
}

func (f *StateFile) appendRecord(line []byte, apply func()) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live == nil {
		f.live = map[ID][]byte{}
	}
	if f.broken != nil {
		return fmt.Errorf("state file %s: %w", f.Path, f.broken)
	}
	if f.f == nil {
		// First write: create the file (with its header) atomically.
		if err := f.rewriteLocked(f.snapshotLocked(), nil); err != nil {
			return err
		}
	}
	_, err := f.f.Write(line)
	if err == nil {
		err = f.f.Sync()
	}
	if err != nil {
		// Undo a partial record so that later ones stay readable.
		if terr := f.f.Truncate(f.size); terr != nil {
			f.broken = fmt.Errorf("append failed (%v) and could not be undone: %w", err, terr)
		} else if _, serr := f.f.Seek(f.size, io.SeekStart); serr != nil {
			f.broken = serr
		}
		return fmt.Errorf("append to state file %s: %w", f.Path, err)
	}
	f.size += int64(len(line))
	f.records++
	apply()
	if f.compacting {
		f.pending = append(f.pending, line)
	} else if f.records > 2*len(f.live)+f.compactSlack() {
		f.compacting = true
		f.pending = nil
		snap := f.snapshotLocked()
		f.compactWG.Add(1)
		go f.compact(snap)
	}
	return nil
}

func (f *StateFile) snapshotLocked() [][]byte {
	out := make([][]byte, 0, len(f.live))
	for _, line := range f.live {
		out = append(out, line)
	}
	return out
}

// compact rewrites the log from a snapshot of the live records, then appends what was
// recorded meanwhile, and switches over by rename. Appends go on during the slow part.
func (f *StateFile) compact(snap [][]byte) {
	defer f.compactWG.Done()
	tmp, err := f.writeTemp(snap)
	if f.compactHook != nil {
		f.compactHook()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compacting = false
	if err == nil {
		err = f.switchLocked(tmp, len(snap), f.pending)
	}
	f.pending = nil
	if err != nil {
		f.logger().Warn("state file compaction failed; the log keeps growing until the next try", "path", f.Path, "err", err)
	}
}

// WaitCompaction waits for a running background compaction (tests, shutdown).
func (f *StateFile) WaitCompaction() { f.compactWG.Wait() }

func (f *StateFile) logger() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.Default()
}

// rewriteLocked replaces the file with the header and lines (plus extra), atomically.
func (f *StateFile) rewriteLocked(lines, extra [][]byte) error {
	tmp, err := f.writeTemp(lines)
	if err != nil {
		return err
	}
	return f.switchLocked(tmp, len(lines), extra)
}

// writeTemp writes a complete log (header and lines) to a synced temporary file beside
// the state file.
func (f *StateFile) writeTemp(lines [][]byte) (*os.File, error) {
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("create temporary state file: %w", err)
	}
	w := bufio.NewWriter(tmp)
	_, werr := fmt.Fprintf(w, "{\"version\":%d}\n", stateVersion)
	for _, line := range lines {
		if werr == nil {
			_, werr = w.Write(line)
		}
	}
	if werr == nil {
		werr = w.Flush()
	}
	if werr == nil {
		werr = tmp.Sync()
	}
	if werr != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write state file %s: %w", f.Path, werr)
	}
	return tmp, nil
}

// switchLocked appends extra to the synced temporary file and renames it over the state
// file, which it then keeps open for appending.
func (f *StateFile) switchLocked(tmp *os.File, n int, extra [][]byte) error {
	var err error
	for _, line := range extra {
		if err == nil {
			_, err = tmp.Write(line)
		}
	}
	if err == nil && len(extra) > 0 {
		err = tmp.Sync()
	}
	var size int64
	if err == nil {
		size, err = tmp.Seek(0, io.SeekCurrent)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.Path)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write state file %s: %w", f.Path, err)
	}
	if d, derr := os.Open(filepath.Dir(f.Path)); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	if f.f != nil {
		f.f.Close()
	}
	f.f, f.size, f.records, f.broken = tmp, size, n+len(extra), nil
	return nil
}

// Close waits for a running compaction and closes the file.
func (f *StateFile) Close() error {
	f.compactWG.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	return err
}
