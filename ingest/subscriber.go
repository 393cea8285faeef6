// Package ingest subscribes to engine KV-event streams (vLLM, SGLang, Mooncake master) over
// ZMQ, keeps their sequence numbers in order, recovers gaps through the engine's replay
// endpoint and marks a source stale when its stream can no longer be trusted. It does not
// decode payloads: ordered batches go to a Handler.
package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of reference notes §5.1 (upstream zmq_client.h); a zero config field takes them.
const (
	DefaultPollTimeout           = 100 * time.Millisecond
	DefaultReplayTimeout         = 5 * time.Second
	DefaultReplayRecoveryTimeout = 30 * time.Second
	DefaultReconnectDelay        = time.Second
	DefaultMaxRecoveryMessages   = 10000
	DefaultMaxRecoveryBytes      = 64 << 20
)

// subRcvHWM matches upstream: deep enough that a burst of scheduler steps is not dropped
// by libzmq while the handler is busy.
const subRcvHWM = 200000

// Handler receives the ordered, de-duplicated batches of one source. Both methods run on
// the subscriber's goroutine, one call at a time.
type Handler interface {
	// HandleBatch applies one batch (payload = third frame). The payload is only valid
	// during the call: the subscriber reuses the buffer, so a handler that keeps it must
	// copy it. A non-nil error is a batch-level rejection: the subscriber marks the source
	// stale.
	HandleBatch(seq uint64, payload []byte) error
	// OnStale is called once when the source becomes stale (reason for logs). After it, no
	// more batches are delivered until the subscriber is stopped.
	OnStale(reason string)
}

// RestartHandler may be implemented by a Handler that wants to hear about publisher
// restarts: the engine process behind the stream was replaced, so whatever it announced
// before is gone from its cache and the handler should drop it. It is called before the
// first batch of the new stream is handled.
type RestartHandler interface {
	OnPublisherRestart(lastSeq, firstSeq uint64)
}

// SubscriberConfig configures one subscription (one registered service).
type SubscriberConfig struct {
	// Name is the service key, used in logs.
	Name string
	// Endpoint is the engine's ZMQ PUB endpoint; the SUB socket connects to it.
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay endpoint; "" disables replay (Mooncake
	// master streams have none), and then any sequence gap marks the source stale.
	ReplayEndpoint string
	// PollTimeout bounds every wait, so Stop is noticed within it.
	PollTimeout time.Duration
	// ReplayTimeout is how long one replay attempt waits for its next reply message.
	ReplayTimeout time.Duration
	// ReplayRecoveryTimeout is the total time allowed to close one gap, retries included.
	ReplayRecoveryTimeout time.Duration
	// ReconnectDelay is the pause before retrying a failed replay attempt and before
	// reopening the SUB socket after a socket error.
	ReconnectDelay time.Duration
	// MaxRecoveryMessages bounds the live messages buffered while a gap is recovered.
	MaxRecoveryMessages int
	// MaxRecoveryBytes bounds their bytes (topic plus payload).
	MaxRecoveryBytes int
	// CatchUpOnStart asks the replay endpoint, right after Start and without waiting for
	// a live batch, for everything the publisher still buffers, so that batches
	// published before the subscriber existed are applied too; it is repeated after a
	// detected publisher restart. It is best effort: the publisher's ring rarely
	// reaches back to sequence 0, and the index starts empty, so history older than
	// the ring can only make answers under-report. A replay that starts later than
	// asked is accepted, and a catch-up that fails (no reply within ReplayTimeout, no
	// replay server, a malformed reply) is counted and the first live batch becomes
	// the baseline; neither marks the source stale. Once a replayed batch has been
	// applied, any later gap is recovered under the strict rules. Ignored without a
	// ReplayEndpoint.
	CatchUpOnStart bool
	// Logger receives the subscriber's log lines; nil discards them.
	Logger *slog.Logger
}

// SubscriberStats is a snapshot of a subscriber's counters.
type SubscriberStats struct {
	Received      uint64 // live multipart messages read from the SUB socket
	Applied       uint64 // batches the handler accepted (live and replayed)
	Dropped       uint64 // sequence numbers missing at gaps (counted even when replay recovers them)
	Duplicates    uint64 // live or replayed batches dropped as already applied
	Gaps          uint64 // gaps detected in the live stream
	ReplaysOK     uint64 // recoveries that closed their gap
	ReplaysFailed uint64 // gap recoveries that ended with the source stale
	ReplayRetries uint64 // replay attempts that failed and were retried
	ConsumeErrors uint64 // malformed live messages (frame count, sequence length or range)
	Rejected      uint64 // batches the handler rejected
	Restarts      uint64 // publisher restarts detected (sequence reset)
	Reconnects    uint64 // SUB reconnections to the publisher
	// CatchUps counts catch-ups (CatchUpOnStart) that completed, including those that
	// found nothing to replay.
	CatchUps uint64
	// CatchUpsFailed counts catch-ups that did not complete. Before any replayed batch
	// was applied the source carries on from the live stream and stays fresh. After
	// one, the strict rules hold: a timeout continues as a gap recovery (counted under
	// Replays*), and a skipped sequence or a full buffer makes the source stale.
	CatchUpsFailed uint64
	Stale          bool
	// LastEventUnixNano is when the last live message arrived (0 = never).
	LastEventUnixNano int64
}

type counters struct {
	received, applied, dropped, duplicates, gaps  atomic.Uint64
	replaysOK, replaysFailed, replayRetries       atomic.Uint64
	consumeErrors, rejected, restarts, reconnects atomic.Uint64
	catchUps, catchUpsFailed                      atomic.Uint64
	stale                                         atomic.Bool
	lastEvent                                     atomic.Int64
}

// Subscriber follows one publisher. All ZMQ work happens on one goroutine started by
// Start; Stats may be called from anywhere.
type Subscriber struct {
	cfg SubscriberConfig
	h   Handler
	rh  RestartHandler
	log *slog.Logger

	mu      sync.Mutex
	started bool
	stopped bool
	stopCh  chan struct{}
	done    chan struct{}
	stop    atomic.Bool
	// A pipe whose write end Stop closes: its read end is in every poll, so Stop does
	// not wait out a PollTimeout (servers stop many subscribers in a row).
	wakeR, wakeW *os.File
	wakeFD       int

	st counters

	// Owned by the subscriber goroutine.
	z     *zconn
	buf   []byte
	sizes [maxKeptFrames]int
	seqState
}

// NewSubscriber validates cfg, fills in defaults and returns a subscriber that is not yet
// connected.
func NewSubscriber(cfg SubscriberConfig, h Handler) (*Subscriber, error) {
	if h == nil {
		return nil, errors.New("new subscriber: nil handler")
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("new subscriber: empty endpoint")
	}
	if cfg.PollTimeout < 0 || cfg.ReplayTimeout < 0 || cfg.ReplayRecoveryTimeout < 0 ||
		cfg.ReconnectDelay < 0 || cfg.MaxRecoveryMessages < 0 || cfg.MaxRecoveryBytes < 0 {
		return nil, fmt.Errorf("new subscriber %q: negative timeout or limit", cfg.Name)
	}
	cfg.PollTimeout = orDefault(cfg.PollTimeout, DefaultPollTimeout)
	cfg.ReplayTimeout = orDefault(cfg.ReplayTimeout, DefaultReplayTimeout)
	cfg.ReplayRecoveryTimeout = orDefault(cfg.ReplayRecoveryTimeout, DefaultReplayRecoveryTimeout)
	cfg.ReconnectDelay = orDefault(cfg.ReconnectDelay, DefaultReconnectDelay)
	cfg.MaxRecoveryMessages = orDefault(cfg.MaxRecoveryMessages, DefaultMaxRecoveryMessages)
	cfg.MaxRecoveryBytes = orDefault(cfg.MaxRecoveryBytes, DefaultMaxRecoveryBytes)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Subscriber{
		cfg:    cfg,
		h:      h,
		log:    log.With("service", cfg.Name, "endpoint", cfg.Endpoint),
		stopCh: make(chan struct{}),
		done:   make(chan struct{}),
		buf:    make([]byte, 64<<10),
		wakeFD: -1,
	}
	s.rh, _ = h.(RestartHandler)
	s.initSeq()
	return s, nil
}

func orDefault[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Start creates the sockets, connects, and starts the receive goroutine. It fails when the
// endpoint is malformed or a socket cannot be created; a publisher that is not up yet is
// not an error (libzmq keeps trying to connect).
func (s *Subscriber) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("failed to start ZMQ client: subscriber stopped")
	}
	if s.started {
		return errors.New("failed to start ZMQ client: already started")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("failed to start ZMQ client: wake pipe: %w", err)
	}
	s.wakeR, s.wakeW, s.wakeFD = r, w, int(r.Fd())
	ready := make(chan error, 1)
	go s.run(ready)
	if err := <-ready; err != nil {
		s.stopped = true
		_ = w.Close()
		return fmt.Errorf("failed to start ZMQ client: %w", err)
	}
	s.started = true
	return nil
}

// Stop ends the subscription and waits until the goroutine has closed its sockets, which
// includes waiting for an in-flight HandleBatch to return. It is idempotent. The
// subscriber's own waits are bounded by PollTimeout; only a handler that never returns
// can hold Stop.
func (s *Subscriber) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.doneOrClosed()
		return
	}
	s.stopped = true
	started := s.started
	s.stop.Store(true)
	close(s.stopCh)
	s.mu.Unlock()
	if started {
		_ = s.wakeW.Close()
		<-s.done
	}
}

// doneOrClosed is what a second Stop waits on: the goroutine's end if one ran.
func (s *Subscriber) doneOrClosed() <-chan struct{} {
	if s.started {
		return s.done
	}
	c := make(chan struct{})
	close(c)
	return c
}

// Stats returns the counters; each field is read atomically.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{
		Received:          s.st.received.Load(),
		Applied:           s.st.applied.Load(),
		Dropped:           s.st.dropped.Load(),
		Duplicates:        s.st.duplicates.Load(),
		Gaps:              s.st.gaps.Load(),
		ReplaysOK:         s.st.replaysOK.Load(),
		ReplaysFailed:     s.st.replaysFailed.Load(),
		ReplayRetries:     s.st.replayRetries.Load(),
		ConsumeErrors:     s.st.consumeErrors.Load(),
		Rejected:          s.st.rejected.Load(),
		Restarts:          s.st.restarts.Load(),
		Reconnects:        s.st.reconnects.Load(),
		CatchUps:          s.st.catchUps.Load(),
		CatchUpsFailed:    s.st.catchUpsFailed.Load(),
		Stale:             s.st.stale.Load(),
		LastEventUnixNano: s.st.lastEvent.Load(),
	}
}

// run is the subscriber goroutine: it owns the libzmq context and every socket.
func (s *Subscriber) run(ready chan<- error) {
	// libzmq sockets may move between threads only with a full barrier; pinning the
	// goroutine keeps every call for this subscriber on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(s.done)
	defer s.wakeR.Close()
	if err := s.open(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	s.log.Info("ZMQ subscriber started", "replay_endpoint", s.cfg.ReplayEndpoint)
	if s.catchUp {
		s.startCatchUp(time.Now())
	}
	for !s.stop.Load() {
		if s.stale {
			// A stale source stays stale until it is unregistered: close the sockets so
			// the publisher stops sending to us, and wait for Stop.
			s.z.free()
			runtime.UnlockOSThread() // no socket left to pin the thread for
			<-s.stopCh
			break
		}
		if !s.z.hasSub() {
			s.reopen()
			continue
		}
		s.step()
	}
	s.z.free()
	s.log.Info("ZMQ subscriber stopped")
}

// open creates the context and the SUB socket on the calling goroutine.
func (s *Subscriber) open() error {
	z, err := newZconn()
	if err != nil {
		return err
	}
	if err := z.openSub(s.cfg.Endpoint, subRcvHWM); err != nil {
		z.free()
		return err
	}
	if s.replay {
		// Each replay attempt opens its own DEALER; connecting one now rejects a
		// malformed replay endpoint at registration instead of at the first gap.
		if err := z.openDealer(s.cfg.ReplayEndpoint); err != nil {
			z.free()
			return err
		}
		z.closeDealer()
	}
	s.z = z
	return nil
}

// reopen recreates the SUB socket after a socket error, after ReconnectDelay.
func (s *Subscriber) reopen() {
	t := time.NewTimer(s.cfg.ReconnectDelay)
	select {
	case <-s.stopCh:
		t.Stop()
		return
	case <-t.C:
	}
	if err := s.z.openSub(s.cfg.Endpoint, subRcvHWM); err != nil {
		s.log.Warn("ZMQ subscriber reconnect failed", "err", err)
		return
	}
	// The new socket's monitor reports the connection; onReconnect runs from there.
	s.log.Info("ZMQ subscriber socket reopened")
}

// socketFailed closes the sockets after an unexpected libzmq error; run reopens them.
func (s *Subscriber) socketFailed(err error) {
	s.log.Warn("ZMQ subscriber socket error, reconnecting", "err", err, "delay", s.cfg.ReconnectDelay)
	s.dropAttempt()
	s.z.closeSub()
}

// recvBatch bounds how many messages one step reads before it looks at timers and the
// replay socket again.
const recvBatch = 256

// step reads what is ready on the sockets, and waits up to PollTimeout (or the next replay
// timer) when nothing is.
func (s *Subscriber) step() {
	now := time.Now()
	if s.rec.active {
		s.driveRecovery(now)
		if s.stale {
			return
		}
	}
	got := 0
	for got < recvBatch && !s.stop.Load() && !s.stale {
		n, err := s.pumpSub()
		if err != nil {
			s.socketFailed(err)
			return
		}
		if n == 0 {
			break
		}
		got++
	}
	for s.z.hasDealer() && !s.stop.Load() && !s.stale {
		n, err := s.pumpDealer()
		if err != nil || n == 0 {
			break
		}
		got++
	}
	if got > 0 || s.stale || s.stop.Load() {
		return
	}
	mask, err := s.z.poll(s.waitFor(now), s.wakeFD)
	if err != nil {
		s.socketFailed(err)
		return
	}
	if mask&(1<<sockMon) != 0 {
		s.drainMonitor()
	}
}

// pumpSub reads and handles one live message; it returns 0 when none was ready.
func (s *Subscriber) pumpSub() (int, error) {
	n, err := s.z.recv(sockSub, &s.buf, &s.sizes)
	if n == 0 || err != nil {
		return 0, err
	}
	s.onLiveMessage(n)
	return n, nil
}

// pumpDealer reads and handles one replay reply; it returns 0 when none was ready.
func (s *Subscriber) pumpDealer() (int, error) {
	n, err := s.z.recv(sockDealer, &s.buf, &s.sizes)
	if err != nil {
		s.attemptFailed(time.Now(), fmt.Sprintf("replay receive: %v", err))
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	s.onReplayMessage(n)
	return n, nil
}

// drainMonitor consumes the SUB connection events queued so far.
func (s *Subscriber) drainMonitor() {
	for {
		ev, err := s.z.monEvent()
		if err != nil {
			s.log.Debug("ZMQ monitor event unreadable", "err", err)
			return
		}
		switch ev {
		case 0:
			return
		case evConnected:
			if s.connectedOnce {
				s.onReconnect()
			}
			s.connectedOnce = true
		case evDisconnected:
			s.log.Info("ZMQ publisher disconnected")
		}
	}
}
