// Package snapshots measures a conductor's peer snapshot routes (POST and GET
// /cluster/snapshot) as an attacker or an unlucky operator would use them: the memory a
// conductor holds while it receives large snapshots it must refuse or stream (Upload),
// and what concurrent downloads of an index that keeps changing get (Downloads).
package snapshots

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/snapshot"
)

// Path is the conductor's snapshot route.
const Path = "/cluster/snapshot"

// UploadConfig configures an upload measurement.
type UploadConfig struct {
	// Addr is the conductor's HTTP address and PID its process (required: the RSS is
	// the figure).
	Addr string
	PID  int
	// Token is the conductor's admin_token, sent with every POST ("" none: a conductor
	// without one refuses every POST).
	Token string
	// Bytes is the snapshot's size (about; at least this many) and Posts how many times
	// it is posted, one after the other.
	Bytes int64
	Posts int
	// Unsigned signs the snapshot with a random key instead of the one the token
	// derives (snapshot.KeyFromToken): the conductor can only refuse it, after reading
	// it whole. Signed, it is valid but useless: its entries belong to an instance
	// nobody registers.
	Unsigned bool
	// Settle is the wait after the last POST before the settled RSS is read.
	Settle time.Duration
	// Dir holds the snapshot file while the measurement runs ("" os.TempDir()).
	Dir string
	// Progress gets a line per phase (nil = silent).
	Progress io.Writer
}

// PostResult is one POST's outcome.
type PostResult struct {
	// Status is the HTTP status (0 when no answer came back: Error says why).
	Status int    `json:"status"`
	Answer string `json:"answer,omitempty"`
	Error  string `json:"error,omitempty"`
	// Seconds from sending the request to reading the whole answer.
	Seconds float64 `json:"seconds"`
	// RSSAfterBytes is the conductor's RSS right after the answer.
	RSSAfterBytes uint64 `json:"rss_after_bytes"`
}

// UploadResult is an upload measurement. Sizes are bytes.
type UploadResult struct {
	SnapshotBytes int64        `json:"snapshot_bytes"`
	Signed        bool         `json:"signed"`
	Posts         []PostResult `json:"posts"`
	// RSSStartBytes is the RSS before the first POST, RSSPeakBytes the highest during
	// the POSTs (VmHWM, reset before the first, and samples every 20 ms), RSSAfterBytes
	// right after the last answer and RSSSettledBytes SettleSeconds later.
	RSSStartBytes   uint64  `json:"rss_start_bytes"`
	RSSPeakBytes    uint64  `json:"rss_peak_bytes"`
	RSSAfterBytes   uint64  `json:"rss_after_bytes"`
	SettleSeconds   float64 `json:"settle_seconds"`
	RSSSettledBytes uint64  `json:"rss_settled_bytes"`
}

// Upload writes a snapshot of cfg.Bytes to a temporary file, posts it cfg.Posts times
// and reads the conductor's RSS around the POSTs. A POST the conductor refuses is an
// outcome, not an error.
func Upload(ctx context.Context, cfg UploadConfig) (*UploadResult, error) {
	if cfg.PID <= 0 {
		return nil, errors.New("snapshot upload: the conductor's pid is needed to read its RSS")
	}
	if cfg.Bytes <= 0 || cfg.Posts <= 0 || cfg.Settle < 0 {
		return nil, fmt.Errorf("snapshot upload: %d bytes, %d posts, settle %v: bytes and posts positive, settle not negative", cfg.Bytes, cfg.Posts, cfg.Settle)
	}
	if err := target.WaitReady(ctx, cfg.Addr, 30*time.Second); err != nil {
		return nil, fmt.Errorf("snapshot upload: %w", err)
	}
	key := snapshot.KeyFromToken(cfg.Token)
	if cfg.Unsigned {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	}
	f, err := os.CreateTemp(cfg.Dir, "conductor-bench-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot upload: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	t0 := time.Now()
	size, err := WriteUseless(f, cfg.Bytes, key)
	if err != nil {
		return nil, fmt.Errorf("snapshot upload: write the snapshot: %w", err)
	}
	progress(cfg.Progress, "wrote a %.1f MiB snapshot (%s) in %.1f s", mib(uint64(size)), map[bool]string{true: "signed, useless", false: "unsigned"}[!cfg.Unsigned], time.Since(t0).Seconds())

	res := &UploadResult{SnapshotBytes: size, Signed: !cfg.Unsigned}
	s, err := target.ReadProc(cfg.PID)
	if err != nil {
		return nil, err
	}
	res.RSSStartBytes = s.RSSBytes
	_ = target.ResetPeakRSS(cfg.PID) // the 20 ms samples still bound the peak where this is refused
	peak := newPeakSampler(cfg.PID, s.RSSBytes)
	for i := 0; i < cfg.Posts; i++ {
		p := post(ctx, cfg.Addr, cfg.Token, f, size)
		if s, err := target.ReadProc(cfg.PID); err == nil {
			p.RSSAfterBytes = s.RSSBytes
		}
		res.Posts = append(res.Posts, p)
		progress(cfg.Progress, "POST %d of %d: %d %s%s in %.1f s, RSS %.1f MiB", i+1, cfg.Posts, p.Status, p.Answer, p.Error, p.Seconds, mib(p.RSSAfterBytes))
		if err := ctx.Err(); err != nil {
			peak.stop()
			return res, err
		}
	}
	res.RSSPeakBytes = peak.stop()
	if s, err = target.ReadProc(cfg.PID); err != nil {
		return res, err
	}
	res.RSSAfterBytes = s.RSSBytes
	res.RSSPeakBytes = max(res.RSSPeakBytes, s.PeakRSSBytes, s.RSSBytes)
	t1 := time.Now()
	if err := sleep(ctx, cfg.Settle); err != nil {
		return res, err
	}
	res.SettleSeconds = time.Since(t1).Seconds()
	if s, err = target.ReadProc(cfg.PID); err != nil {
		return res, err
	}
	res.RSSSettledBytes = s.RSSBytes
	return res, nil
}

// post sends the size bytes of f as one POST with a Content-Length, as curl -T does.
func post(ctx context.Context, addr, token string, f *os.File, size int64) (p PostResult) {
	t0 := time.Now()
	defer func() { p.Seconds = time.Since(t0).Seconds() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+Path, io.NewSectionReader(f, 0, size))
	if err != nil {
		p.Error = err.Error()
		return p
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.Error = err.Error()
		return p
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	p.Status, p.Answer = resp.StatusCode, strings.TrimSpace(string(body))
	if err != nil {
		p.Error = "reading the answer: " + err.Error()
	}
	return p
}

// peakSampler reads a process's RSS every 20 ms and keeps the highest.
type peakSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

func newPeakSampler(pid int, start uint64) *peakSampler {
	p := &peakSampler{done: make(chan struct{}), peak: start}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if s, err := target.ReadProc(pid); err == nil {
				p.peak = max(p.peak, s.RSSBytes, s.PeakRSSBytes)
			}
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends the sampling and returns the highest RSS read.
func (p *peakSampler) stop() uint64 {
	close(p.done)
	p.wg.Wait()
	return p.peak
}

// WriteUseless writes to w a valid snapshot stream of at least size bytes, signed with
// key, whose one context (model "m", block size 16, vLLM's sha256_cbor profile) holds
// entries of an instance nobody registers: a conductor that accepts it applies nothing.
// It returns the stream's size.
func WriteUseless(w io.Writer, size int64, key []byte) (int64, error) {
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: w}
	sw := snapshot.NewWriter(cw, key)
	if err := sw.Context(&snapshot.Header{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p}); err != nil {
		return 0, err
	}
	ch := &engine.SnapshotChunk{Slots: []engine.Slot{{InstanceID: "nobody"}}, Entries: make([]engine.SnapshotEntry, 4096)}
	next := uint64(1)
	// The writer buffers what it has not passed on: the count trails by its buffer, and
	// the stream ends a chunk or so past size.
	for cw.n < size {
		for i := range ch.Entries {
			ch.Entries[i] = engine.SnapshotEntry{Key: next, Tiers: engine.MaskDevice}
			next++
		}
		if err := sw.Chunk(ch); err != nil {
			return cw.n, err
		}
	}
	return sw.Close()
}

// countingWriter counts the bytes passed to w.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
