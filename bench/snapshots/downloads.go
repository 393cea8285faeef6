package snapshots

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/snapshot"
	"github.com/conductor-go/conductor/wire/publisher"
)

// DownloadsConfig configures a downloads measurement.
type DownloadsConfig struct {
	// Addr is the conductor's HTTP address; Token its admin_token (sent with every
	// request; the snapshots are checked with the key it derives).
	Addr, Token string
	// Gets downloads start at once, while a simulated vLLM engine holding Blocks
	// blocks on its device keeps storing new prompts of 64 blocks (each evicting as
	// many), one every ChurnInterval (0: flat out).
	Gets          int
	Blocks        int
	ChurnInterval time.Duration
	// Dir holds the downloaded snapshots while they are checked ("" os.TempDir()).
	Dir string
	// Progress gets a line per phase (nil = silent).
	Progress io.Writer
}

// Outcomes of one download.
const (
	// OutcomeVerified: 200, the body ended cleanly, and its checksum, signature and
	// structure verify.
	OutcomeVerified = "complete, verified"
	// OutcomeRefused: an answer other than 200 (503 past max_snapshot_downloads).
	OutcomeRefused = "refused"
	// OutcomeAborted: 200, but the body ended with a transport error (the conductor
	// closed the connection mid-stream): a visible failure.
	OutcomeAborted = "200, body aborted"
	// OutcomeV1Checksum: 200, a clean body in stream version 1 (an older conductor's,
	// which this harness does not decode) whose CRC-32C trailer matches the stream.
	OutcomeV1Checksum = "complete, version 1 checksum verifies"
	// OutcomeOtherVersion: 200 with a clean body in a stream version this harness
	// knows nothing of, so not checked.
	OutcomeOtherVersion = "complete, unknown stream version (not checked)"
	// OutcomeSilent: 200, a body that ended cleanly, yet it does not verify: a reader
	// would take a cut-short or damaged snapshot for a whole one.
	OutcomeSilent = "complete, does NOT verify"
	// OutcomeNoAnswer: the request failed before an answer.
	OutcomeNoAnswer = "no answer"
)

// GetResult is one download.
type GetResult struct {
	Outcome string  `json:"outcome"`
	Status  int     `json:"status,omitempty"`
	Bytes   int64   `json:"bytes"`
	Entries int64   `json:"entries,omitempty"`
	Detail  string  `json:"detail,omitempty"`
	Seconds float64 `json:"seconds"`
}

// DownloadsResult is a downloads measurement.
type DownloadsResult struct {
	Gets int `json:"gets"`
	// IndexedBlocks is the index's prefix_count before the churn began.
	IndexedBlocks uint64 `json:"indexed_blocks"`
	// ChurnedBlocks counts the blocks stored and removed by the engine while the
	// downloads ran.
	ChurnedBlocks int64          `json:"churned_blocks"`
	Outcomes      map[string]int `json:"outcomes"`
	Results       []GetResult    `json:"results"`
	Seconds       float64        `json:"seconds"`
}

// Silent counts the downloads that ended cleanly but do not verify.
func (r *DownloadsResult) Silent() int { return r.Outcomes[OutcomeSilent] }

// promptBlocks is the length of the engine's prompts, in blocks.
const promptBlocks = 64

// Downloads fills the conductor's index from a simulated engine, then starts cfg.Gets
// downloads at once while the engine keeps changing the index, and checks each: a
// download either delivers a snapshot that verifies or fails visibly.
func Downloads(ctx context.Context, cfg DownloadsConfig) (*DownloadsResult, error) {
	if cfg.Gets <= 0 || cfg.Blocks < promptBlocks || cfg.ChurnInterval < 0 {
		return nil, fmt.Errorf("snapshot downloads: %d gets, %d blocks, churn interval %v: gets positive, at least %d blocks", cfg.Gets, cfg.Blocks, cfg.ChurnInterval, promptBlocks)
	}
	if err := target.WaitReady(ctx, cfg.Addr, 30*time.Second); err != nil {
		return nil, fmt.Errorf("snapshot downloads: %w", err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{Instances: 1, DPRanks: 1, Kind: publisher.VLLM, Hash: sim.VLLMHash("sha256_cbor", "0"),
		Model: "snapshot-bench", BlockSize: 16, Cache: sim.CacheConfig{Device: cfg.Blocks}, Publish: true, MaxBatchEvents: 64,
		InstancePrefix: "snapshot-bench-"})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cl, detach, err := f.Attach(cfg.Addr, httpclient.Options{Timeout: time.Minute, AdminToken: cfg.Token}, 30*time.Second)
	if err != nil {
		return nil, err
	}
	defer detach()
	// Twice the cache in distinct prompts, stored in turn: from the second half on,
	// every prompt evicts one stored earlier.
	pool, err := prompts(f.Hasher(), 2*cfg.Blocks/promptBlocks+1)
	if err != nil {
		return nil, err
	}
	rank := f.Rank(0, 0)
	next := 0
	for ; next < cfg.Blocks/promptBlocks; next++ {
		if _, err := rank.Store(pool[next].tokens, pool[next].keys, sim.Now()); err != nil {
			return nil, err
		}
	}
	indexed, err := f.DrainContext(ctx, cl, 60*time.Second)
	if err != nil {
		return nil, err
	}
	progress(cfg.Progress, "indexed %d blocks; %d downloads while the engine churns", indexed, cfg.Gets)

	res := &DownloadsResult{Gets: cfg.Gets, IndexedBlocks: indexed, Outcomes: map[string]int{}}
	stop := make(chan struct{})
	churned := make(chan error, 1)
	var changes atomic.Int64
	started := make(chan struct{})
	go func() {
		defer close(churned)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			p := &pool[(next+n)%len(pool)]
			if _, err := rank.Store(p.tokens, p.keys, sim.Now()); err != nil {
				churned <- err
				return
			}
			changes.Add(2 * promptBlocks) // as many stored as evicted
			if n == 0 {
				close(started)
			}
			if cfg.ChurnInterval > 0 {
				time.Sleep(cfg.ChurnInterval) // paces the churn
			}
		}
	}()
	select {
	case <-started:
	case err := <-churned:
		return nil, fmt.Errorf("snapshot downloads: churn: %w", err)
	}
	base := changes.Load()
	t0 := time.Now()
	res.Results = make([]GetResult, cfg.Gets)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range res.Results {
		wg.Add(1)
		go func(r *GetResult) {
			defer wg.Done()
			<-gate
			*r = download(ctx, cfg.Addr, cfg.Token, cfg.Dir)
		}(&res.Results[i])
	}
	close(gate)
	wg.Wait()
	res.Seconds = time.Since(t0).Seconds()
	res.ChurnedBlocks = changes.Load() - base
	close(stop)
	if err := <-churned; err != nil {
		return res, fmt.Errorf("snapshot downloads: churn: %w", err)
	}
	for _, r := range res.Results {
		res.Outcomes[r.Outcome]++
	}
	return res, ctx.Err()
}

// prompt is a prompt with its block keys.
type prompt struct {
	tokens []int32
	keys   []uint64
}

// prompts makes n distinct prompts of promptBlocks blocks (fixed seed).
func prompts(h *sim.Hasher, n int) ([]prompt, error) {
	rng := rand.New(rand.NewPCG(27, 1))
	out := make([]prompt, n)
	for i := range out {
		toks := make([]int32, promptBlocks*h.BlockSize())
		for j := range toks {
			toks[j] = int32(rng.IntN(100000))
		}
		keys, err := h.AppendKeys(nil, toks)
		if err != nil {
			return nil, err
		}
		out[i] = prompt{toks, keys}
	}
	return out, nil
}

// download GETs one snapshot and classifies it.
func download(ctx context.Context, addr, token, dir string) (r GetResult) {
	t0 := time.Now()
	defer func() { r.Seconds = time.Since(t0).Seconds() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+Path, nil)
	if err != nil {
		return GetResult{Outcome: OutcomeNoAnswer, Detail: err.Error()}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return GetResult{Outcome: OutcomeNoAnswer, Detail: err.Error()}
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		r.Outcome, r.Detail = OutcomeRefused, strings.TrimSpace(string(body))
		return r
	}
	body := &watchedReader{r: resp.Body}
	sp, err := snapshot.Receive(body, snapshot.ReceiveOptions{MaxBytes: 1 << 40, Key: snapshot.KeyFromToken(token), Dir: dir})
	if err == nil {
		var st snapshot.Stats
		st, err = sp.Read(discard{})
		sp.Close()
		r.Entries = st.Entries
	}
	_, _ = io.Copy(io.Discard, body) // what a refused stream left unread
	r.Bytes = body.n
	switch {
	case body.err != nil:
		r.Outcome, r.Detail = OutcomeAborted, body.err.Error()
	case err == nil:
		r.Outcome = OutcomeVerified
	case body.n >= int64(len(body.head)) && body.version == 1:
		// Version 1: header, frames, then the CRC-32C of every byte before it.
		if body.n > int64(len(body.head))+4 && body.crc.Sum32() == binary.LittleEndian.Uint32(body.tail) {
			r.Outcome = OutcomeV1Checksum
		} else {
			r.Outcome, r.Detail = OutcomeSilent, "version 1 stream whose checksum does not match: cut short or damaged"
		}
	case body.n >= int64(len(body.head)) && body.version != snapshot.Version:
		r.Outcome, r.Detail = OutcomeOtherVersion, fmt.Sprintf("stream version %d, this harness reads %d", body.version, snapshot.Version)
	default:
		r.Outcome, r.Detail = OutcomeSilent, err.Error()
	}
	return r
}

// watchedReader passes a body on, counting its bytes, keeping its stream header (magic
// and version) and the first error other than io.EOF (a body the server cut short ends
// with one, a complete body with io.EOF), and the CRC-32C of every byte but the last 4
// (tail): a version 1 stream's trailer.
type watchedReader struct {
	r       io.Reader
	n       int64
	head    [10]byte
	version uint16
	err     error
	crc     hash.Hash32
	tail    []byte
}

func (w *watchedReader) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if w.crc == nil {
		w.crc = crc32.New(crc32.MakeTable(crc32.Castagnoli))
	}
	if all := append(w.tail, p[:n]...); len(all) > 4 {
		w.crc.Write(all[:len(all)-4])
		w.tail = append(w.tail[:0], all[len(all)-4:]...)
	} else {
		w.tail = all
	}
	if w.n < int64(len(w.head)) {
		copy(w.head[w.n:], p[:n])
		if w.n+int64(n) >= int64(len(w.head)) {
			w.version = binary.LittleEndian.Uint16(w.head[8:])
		}
	}
	w.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && w.err == nil {
		w.err = err
	}
	return n, err
}

// discard is a snapshot.Visitor that only lets the stream be decoded.
type discard struct{}

func (discard) Context(*snapshot.Header) error                      { return nil }
func (discard) Chunk(*snapshot.Header, *engine.SnapshotChunk) error { return nil }

// SortedOutcomes lists the outcomes as "count outcome", most frequent first.
func (r *DownloadsResult) SortedOutcomes() []string {
	names := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := r.Outcomes[names[i]], r.Outcomes[names[j]]
		return a > b || (a == b && names[i] < names[j])
	})
	out := make([]string, len(names))
	for i, k := range names {
		out[i] = fmt.Sprintf("%d %s", r.Outcomes[k], k)
	}
	return out
}
