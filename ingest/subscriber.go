// Package ingest subscribes to engine KV-event streams (vLLM, SGLang, Mooncake master) over
// ZMQ, keeps their sequence numbers in order, recovers gaps through the engine's replay
// endpoint and marks a source stale when its stream can no longer be trusted. It does not
// decode payloads: ordered batches go to a Handler.
//
// The work is split in three packages that this one ties together: seqtrack (the pure
// sequence / replay / stale state machine), zmqtransport (the cgo libzmq layer) and
// translate (the events of a batch turned into engine operations: the Handler that
// package ingest/source gives a Subscriber, behind its gate). A Handler that is also a
// BurstHandler gets the batches of a burst (every message ready when the subscriber
// looks) deferred and flushed once, so the engine's context writer is woken once per
// burst rather than once per message.
//
// Resources: every subscriber of a process opens its sockets in one zmqtransport.Transport
// (one libzmq context, its I/O and reaper threads) and waits in Go's network poller, so a
// subscription costs a few descriptors and no OS thread; messages are bounded
// (MaxMessageSize), an outlier's receive buffer is given back, a subscriber that finds
// the process out of descriptors retries, and the owner's logger (internal/lograte) keeps
// a misbehaving source from flooding the log. Built without cgo, the package compiles and Start fails with
// "ZMQ subscriptions need cgo".
package ingest

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/conductor-go/conductor/ingest/seqtrack"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
)

// Defaults of reference notes §5.1 (upstream zmq_client.h); a zero config field takes them.
const (
	// DefaultPollTimeout bounds an idle subscriber's wait when no timer is due sooner.
	// Nothing needs the wake-up (Stop moves the wait's deadline to the past, and every
	// timer shortens the wait), so it is long: a safety net for a lost ZMQ_FD edge, not
	// a poll. Upstream's 100 ms made each idle subscription wake ten times a second.
	DefaultPollTimeout           = 10 * time.Second
	DefaultReplayTimeout         = 5 * time.Second
	DefaultReplayRecoveryTimeout = 30 * time.Second
	DefaultReconnectDelay        = time.Second
	DefaultMaxRecoveryMessages   = 10000
	DefaultMaxRecoveryBytes      = 64 << 20
	// DefaultMaxMessageSize bounds one frame of a ZMQ message (libzmq's ZMQ_MAXMSGSIZE
	// applies per frame; a batch is nearly all payload frame): far above a scheduler
	// step's batch (a step that stores the blocks of a million tokens is 3-5 MiB).
	DefaultMaxMessageSize = 8 << 20
	// DefaultBufferBytes is the byte budget of the messages libzmq may hold for one
	// subscription before the subscriber reads them (SubscriberConfig.BufferBytes): 64
	// messages of DefaultMaxMessageSize. Measured on a flat-out burst, a queue of 64
	// messages costs less CPU per block than one of 16 (the I/O thread is woken half as
	// often) and as little as one of 256, in far less memory than upstream's 200,000.
	DefaultBufferBytes = 512 << 20
	// DefaultOpenRetryMax bounds the backoff between attempts to open the sockets of a
	// subscriber that found the process out of descriptors.
	DefaultOpenRetryMax = 30 * time.Second
	// DefaultJoinCheckDelay is how long after the SUB first connects the join check runs
	// (SubscriberConfig.JoinCheckDelay): far longer than a subscription takes to reach a
	// publisher, short enough that a missed removal is not served for long.
	DefaultJoinCheckDelay = time.Second
)

// Receive buffer sizes: a subscriber starts without one (a registered service that never
// sends, an engine that is down, costs no buffer), allocates one at its first message and
// grows it to fit the largest, and gives a buffer above recvBufKeep back (down to
// recvBufInitial) when it goes idle or after recvShrinkAfter messages in a row that used
// under a quarter of it.
const (
	recvBufInitial  = 64 << 10
	recvBufKeep     = zmqtransport.MappedAbove
	recvShrinkAfter = 64
)

// protocolErrorGrace is how long a disconnect may go without libzmq scheduling a
// reconnect before the subscriber takes it for a protocol error (after which libzmq
// gives the connection up) and reopens the socket itself.
const protocolErrorGrace = 500 * time.Millisecond

// maxRcvHWM caps the SUB socket's high-water mark at upstream's RCVHWM (200,000
// messages), whatever the budget.
const maxRcvHWM = 200000

// RcvHWM is the SUB socket's receive high-water mark for a byte budget: libzmq bounds
// what it queues in messages, not bytes, so the budget becomes as many messages of the
// largest size allowed (maxMessageSize; -1, unlimited, counts as DefaultMaxMessageSize,
// and then the budget only holds for messages no larger), at least 1 and at most
// upstream's 200,000. When the queue is full libzmq stops reading the connection: what
// the publisher sends next waits in TCP buffers and in the publisher's own queue (vLLM:
// 100,000 messages), and only what overflows that is dropped, which the next batch shows
// as a sequence gap, recovered through replay.
func RcvHWM(budget, maxMessageSize int64) int {
	if maxMessageSize <= 0 {
		maxMessageSize = DefaultMaxMessageSize
	}
	return int(min(max(budget/maxMessageSize, 1), maxRcvHWM))
}

// ErrSourceStale is what a Handler returns (wrapped or not) from HandleBatch or
// HandleBatchDeferred when it has made the source stale on its own side and told
// itself so (a replica's bootstrap gate, whose held batches no snapshot continues): the
// subscriber then goes stale too, closes its sockets and delivers nothing more, without
// calling OnStale again and without counting the batch as rejected.
var ErrSourceStale = errors.New("source is stale")

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

// BurstHandler may be implemented by a Handler that applies the batches of a burst
// together. The subscriber then hands it each batch with HandleBatchDeferred (same
// contract as HandleBatch, except that the batch need not be applied yet) and calls
// Flush once it has read everything that was ready: before it waits for more input,
// before it stops. A handler must apply whatever is deferred before OnStale and
// OnPublisherRestart act.
type BurstHandler interface {
	Handler
	HandleBatchDeferred(seq uint64, payload []byte) error
	Flush()
}

// RestartHandler may be implemented by a Handler that wants to hear about publisher
// restarts: the engine process behind the stream was replaced, so whatever it announced
// before is gone from its cache and the handler should drop it. It is called before the
// first batch of the new stream is handled.
type RestartHandler interface {
	OnPublisherRestart(lastSeq, firstSeq uint64)
}

// HoleHandler may be implemented by a Handler that can hold batches from elsewhere: a
// replica bootstrapping from a peer's snapshot. When a gap cannot be closed (the
// publisher's replay ring has moved past the missing batches, or there is no replay
// endpoint), the subscriber offers it to OnHole (batches first..last, reason for logs)
// before it marks the source stale: a handler that takes it (true) goes on receiving the
// batches after last; one that does not (false) is told OnStale with the same reason.
// It runs on the subscriber's goroutine, after the batches before first were handed on.
type HoleHandler interface {
	OnHole(first, last uint64, reason string) bool
}

// counters are the subscriber's own; the sequence counts are the tracker's.
type counters struct {
	received, applied, consumeErrors, rejected atomic.Uint64
	protocolErrors, openFailures               atomic.Uint64
	holesTaken                                 atomic.Uint64
	waiting, stale                             atomic.Bool
	recvBuf                                    atomic.Int64
	lastEvent                                  atomic.Int64
}

// Subscriber follows one publisher. All ZMQ work happens on one goroutine started by
// Start; Stats may be called from anywhere.
type Subscriber struct {
	cfg SubscriberConfig
	h   Handler
	bh  BurstHandler // h, when it defers; nil otherwise
	rh  RestartHandler
	hh  HoleHandler
	log *slog.Logger

	mu      sync.Mutex
	started bool
	stopped bool
	stopCh  chan struct{}
	done    chan struct{}
	stop    atomic.Bool
	// The poll file of the open sockets: Stop moves its read deadline to the past, so
	// Stop does not wait out a PollTimeout (servers stop many subscribers in a row).
	pollFile atomic.Pointer[os.File]
	// private: the transport was created for this subscriber alone.
	private bool

	st counters

	// tr is the sequence state; its counters may be read from anywhere.
	tr *seqtrack.Tracker

	// Owned by the subscriber goroutine.
	z     *zmqtransport.Conn
	rbuf  zmqtransport.RecvBuf
	buf   []byte // rbuf.B
	sizes [zmqtransport.MaxFrames]int
	// Receive-buffer shrinking: messages in a row that used under a quarter of a large
	// buffer, and the largest of them.
	smallRun, smallMax int
	// deferred counts the batches a BurstHandler accepted and has not flushed yet.
	deferred uint64
	// handlerStale: the handler made the source stale itself (ErrSourceStale), so the
	// tracker's Stale is not passed on to OnStale.
	handlerStale bool
	// rcvd is the bytes of messages read since the sockets were last drained (told to
	// the transport then: Transport.NoteReceived).
	rcvd int64
	// discAt: when the SUB's peer disconnected without a reconnect scheduled yet.
	discAt time.Time
	// Malformed live messages are logged at most once a second.
	consumeLogAt      time.Time
	consumeSuppressed int
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
		cfg.ReconnectDelay < 0 || cfg.MaxRecoveryMessages < 0 || cfg.MaxRecoveryBytes < 0 ||
		cfg.MaxMessageSize < -1 || cfg.OpenRetryMax < 0 || cfg.BufferBytes < 0 {
		return nil, fmt.Errorf("new subscriber %q: negative timeout or limit", cfg.Name)
	}
	cfg.PollTimeout = cmp.Or(cfg.PollTimeout, DefaultPollTimeout)
	cfg.ReplayTimeout = cmp.Or(cfg.ReplayTimeout, DefaultReplayTimeout)
	cfg.ReplayRecoveryTimeout = cmp.Or(cfg.ReplayRecoveryTimeout, DefaultReplayRecoveryTimeout)
	cfg.ReconnectDelay = cmp.Or(cfg.ReconnectDelay, DefaultReconnectDelay)
	cfg.MaxRecoveryMessages = cmp.Or(cfg.MaxRecoveryMessages, DefaultMaxRecoveryMessages)
	cfg.MaxRecoveryBytes = cmp.Or(cfg.MaxRecoveryBytes, DefaultMaxRecoveryBytes)
	cfg.MaxMessageSize = cmp.Or(cfg.MaxMessageSize, DefaultMaxMessageSize)
	cfg.BufferBytes = cmp.Or(cfg.BufferBytes, DefaultBufferBytes)
	cfg.OpenRetryMax = cmp.Or(cfg.OpenRetryMax, DefaultOpenRetryMax)
	cfg.JoinCheckDelay = cmp.Or(cfg.JoinCheckDelay, DefaultJoinCheckDelay)
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
	}
	s.rh, _ = h.(RestartHandler)
	s.bh, _ = h.(BurstHandler)
	s.hh, _ = h.(HoleHandler)
	s.tr = s.newTracker()
	return s, nil
}

// Start creates the sockets, connects, and starts the receive goroutine. It fails when the
// endpoint is malformed or a socket cannot be created; a publisher that is not up yet is
// not an error (libzmq keeps trying to connect), and neither is a process out of file
// descriptors: the subscriber is then Waiting, and its goroutine retries with a bounded
// backoff (OpenRetryMax) until the sockets open or Stop.
func (s *Subscriber) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("failed to start ZMQ client: subscriber stopped")
	}
	if s.started {
		return errors.New("failed to start ZMQ client: already started")
	}
	if s.cfg.Transport == nil {
		t, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
		if err != nil {
			s.stopped = true
			return fmt.Errorf("failed to start ZMQ client: %w", err)
		}
		s.cfg.Transport, s.private = t, true
	}
	z, err := s.open()
	switch {
	case err == nil:
		s.z = z
		s.pollFile.Store(z.PollFile())
	case resourceExhausted(err):
		s.st.waiting.Store(true)
		s.st.openFailures.Add(1)
		s.log.Warn("ZMQ subscriber cannot open its sockets yet (out of resources); retrying",
			"err", err, "retry_in", s.cfg.ReconnectDelay)
	default:
		s.stopped = true
		s.closePrivate()
		return fmt.Errorf("failed to start ZMQ client: %w", err)
	}
	s.started = true
	go s.run()
	return nil
}

// resourceExhausted tells errors that free resources can cure (descriptors, memory).
func resourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS)
}

func (s *Subscriber) closePrivate() {
	if s.private {
		if err := s.cfg.Transport.Close(); err != nil {
			s.log.Warn("ZMQ subscriber transport not closed", "err", err)
		}
	}
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
		if f := s.pollFile.Load(); f != nil {
			_ = f.SetReadDeadline(zmqtransport.PastDeadline) // fails harmlessly once the file is closed
		}
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

// RcvHWM is the SUB socket's receive high-water mark, in messages: RcvHWM of the
// configured BufferBytes and MaxMessageSize.
func (s *Subscriber) RcvHWM() int { return RcvHWM(s.cfg.BufferBytes, s.cfg.MaxMessageSize) }

// Config returns the subscriber's configuration with its defaults filled in.
func (s *Subscriber) Config() SubscriberConfig { return s.cfg }

// Stats returns the counters; each field is read atomically.
func (s *Subscriber) Stats() SubscriberStats {
	c := s.tr.Counters()
	return SubscriberStats{
		Received:          s.st.received.Load(),
		Applied:           s.st.applied.Load(),
		Dropped:           c.Dropped,
		Duplicates:        c.Duplicates,
		Gaps:              c.Gaps,
		ReplaysOK:         c.ReplaysOK,
		ReplaysFailed:     c.ReplaysFailed,
		ReplayRetries:     c.ReplayRetries,
		ConsumeErrors:     s.st.consumeErrors.Load(),
		Rejected:          s.st.rejected.Load(),
		Restarts:          c.Restarts,
		Reconnects:        c.Reconnects,
		CatchUps:          c.CatchUps,
		CatchUpsFailed:    c.CatchUpsFailed,
		JoinChecks:        c.JoinChecks,
		JoinChecksFailed:  c.JoinChecksFailed,
		HolesTaken:        s.st.holesTaken.Load(),
		ProtocolErrors:    s.st.protocolErrors.Load(),
		OpenFailures:      s.st.openFailures.Load(),
		Waiting:           s.st.waiting.Load(),
		RecvBufferBytes:   s.st.recvBuf.Load(),
		Stale:             s.st.stale.Load(),
		LastEventUnixNano: s.st.lastEvent.Load(),
	}
}

// run is the subscriber goroutine: it owns every socket of the subscriber. It is not
// pinned to an OS thread: it waits in Go's network poller, and libzmq allows a socket to
// move between threads behind a full memory barrier, which the scheduler provides.
func (s *Subscriber) run() {
	defer close(s.done)
	defer s.closePrivate()
	if s.z == nil && !s.openWithRetry() {
		return
	}
	s.log.Info("ZMQ subscriber started", "replay_endpoint", s.cfg.ReplayEndpoint)
	s.do(s.tr.Start(time.Now()))
	for !s.stop.Load() {
		if s.tr.Stale() {
			// A stale source stays stale until it is unregistered: close the sockets so
			// the publisher stops sending to us, and wait for Stop.
			s.flush() // OnStale applied the deferred batches: count them
			s.tr.Release()
			s.z.Free()
			<-s.stopCh
			break
		}
		if !s.z.HasSub() {
			s.reopen()
			continue
		}
		s.step()
		s.flush()
	}
	s.z.Free()
	s.rbuf.Release()
	s.log.Info("ZMQ subscriber stopped")
}

// openWithRetry opens the sockets that Start could not, backing off from ReconnectDelay
// to OpenRetryMax. It returns false when stopped first.
func (s *Subscriber) openWithRetry() bool {
	delay := s.cfg.ReconnectDelay
	for {
		t := time.NewTimer(delay)
		select {
		case <-s.stopCh:
			t.Stop()
			return false
		case <-t.C:
		}
		z, err := s.open()
		if err == nil {
			s.z = z
			s.pollFile.Store(z.PollFile())
			s.st.waiting.Store(false)
			s.log.Info("ZMQ subscriber sockets opened after retrying", "failed_attempts", s.st.openFailures.Load())
			return true
		}
		s.st.openFailures.Add(1)
		delay = min(2*delay, s.cfg.OpenRetryMax)
		s.log.Warn("ZMQ subscriber cannot open its sockets yet; retrying", "err", err, "retry_in", delay)
	}
}

// open creates the poll set and the SUB socket in the transport.
func (s *Subscriber) open() (*zmqtransport.Conn, error) {
	z, err := zmqtransport.NewConn(s.cfg.Transport, s.cfg.MaxMessageSize)
	if err != nil {
		return nil, err
	}
	if err := z.OpenSub(s.cfg.Endpoint, s.RcvHWM()); err != nil {
		z.Free()
		return nil, err
	}
	if s.cfg.ReplayEndpoint != "" {
		// Each replay attempt opens its own DEALER; connecting one now rejects a
		// malformed replay endpoint at registration instead of at the first gap.
		if err := z.OpenDealer(s.cfg.ReplayEndpoint); err != nil {
			z.Free()
			return nil, err
		}
		z.CloseDealer()
	}
	return z, nil
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
	if err := s.z.OpenSub(s.cfg.Endpoint, s.RcvHWM()); err != nil {
		s.log.Warn("ZMQ subscriber reconnect failed", "err", err)
		return
	}
	// The new socket's monitor reports the connection; onReconnect runs from there.
	s.log.Info("ZMQ subscriber socket reopened")
}

// socketFailed closes the sockets after an unexpected libzmq error; run reopens them.
func (s *Subscriber) socketFailed(err error) {
	s.log.Warn("ZMQ subscriber socket error, reconnecting", "err", err, "delay", s.cfg.ReconnectDelay)
	s.do(s.tr.DropAttempt(time.Now()))
	s.z.CloseSub()
	s.discAt = time.Time{}
}

// protocolError reopens the SUB socket after libzmq dropped its connection for a protocol
// error (it would not reconnect by itself). The new connection is a reconnect: with
// replay, what was lost is recovered; without, the next batch shows the gap.
func (s *Subscriber) protocolError() {
	s.st.protocolErrors.Add(1)
	s.log.Warn("ZMQ publisher connection dropped for a protocol error (a message over the size limit, or malformed framing); reopening",
		"max_message_size", s.cfg.MaxMessageSize, "delay", s.cfg.ReconnectDelay)
	s.do(s.tr.DropAttempt(time.Now()))
	s.z.CloseSub()
	s.discAt = time.Time{}
}

// flush applies the batches a BurstHandler deferred.
// Applied counts them only then, so that a batch counted is in the index.
func (s *Subscriber) flush() {
	if s.bh != nil {
		s.bh.Flush()
		if s.deferred > 0 {
			s.st.applied.Add(s.deferred)
			s.deferred = 0
		}
	}
}

// recvBatch bounds how many messages one step reads before it looks at timers and the
// replay socket again.
const recvBatch = 256

// step reads what is ready on the sockets, and waits up to PollTimeout (or the next replay
// timer) when nothing is.
func (s *Subscriber) step() {
	now := time.Now()
	if !s.discAt.IsZero() && now.Sub(s.discAt) >= protocolErrorGrace {
		s.protocolError()
		return
	}
	if at, ok := s.tr.Deadline(); ok && (s.tr.Recovering() || !now.Before(at)) {
		s.do(s.tr.Tick(now))
		if s.tr.Stale() {
			return
		}
	}
	got := 0
	// drained: every socket answered "nothing more", so the step may go on to wait
	// rather than loop to ask again.
	subDrained, dealerDrained := false, true
	for got < recvBatch && !s.stop.Load() && !s.tr.Stale() {
		n, err := s.pumpSub()
		if err != nil {
			s.socketFailed(err)
			return
		}
		if n == 0 {
			subDrained = true
			break
		}
		got++
	}
	for s.z.HasDealer() && !s.stop.Load() && !s.tr.Stale() {
		n, err := s.pumpDealer()
		if err != nil {
			dealerDrained = false
			break
		}
		if n == 0 {
			break
		}
		got++
	}
	if s.tr.Stale() || s.stop.Load() || (got > 0 && !(subDrained && dealerDrained)) {
		return
	}
	if got > 0 {
		now = time.Now() // handling took time: the timers are measured from here
	}
	// Everything that was ready has been read: the burst goes to the index before the
	// wait, and the transport hears what it cost in libzmq's memory.
	s.flush()
	if s.rcvd > 0 {
		s.cfg.Transport.NoteReceived(s.rcvd)
		s.rcvd = 0
	}
	if len(s.buf) > recvBufKeep {
		// Idle: an outlier's buffer is not kept while nothing arrives.
		s.shrinkBuf(recvBufInitial)
	}
	mask, err := s.z.Wait(s.waitFor(now), &s.stop)
	if err != nil {
		s.socketFailed(err)
		return
	}
	if mask&(1<<zmqtransport.SockMon) != 0 {
		s.drainMonitor()
	}
}

// pumpSub reads and handles one live message; it returns 0 when none was ready.
func (s *Subscriber) pumpSub() (int, error) {
	n, err := s.z.Recv(zmqtransport.SockSub, &s.rbuf, &s.sizes)
	s.buf = s.rbuf.B
	if n == 0 || err != nil {
		return 0, err
	}
	s.noteReceived()
	s.onLiveMessage(n)
	s.noteSize()
	return n, nil
}

// noteReceived accounts the message just received: the receive buffer's size where it
// changed, and the bytes libzmq held for it (reported to the transport after the burst).
func (s *Subscriber) noteReceived() {
	if int64(len(s.buf)) != s.st.recvBuf.Load() {
		s.st.recvBuf.Store(int64(len(s.buf)))
	}
	s.rcvd += int64(s.z.Used())
}

// noteSize gives back a large receive buffer once recvShrinkAfter messages in a row
// used under a quarter of it, keeping room for twice the largest of them.
func (s *Subscriber) noteSize() {
	if len(s.buf) <= recvBufKeep {
		return
	}
	used := s.z.Used()
	if used*4 > len(s.buf) {
		s.smallRun, s.smallMax = 0, 0
		return
	}
	s.smallRun++
	s.smallMax = max(s.smallMax, used)
	if s.smallRun >= recvShrinkAfter {
		s.shrinkBuf(max(recvBufInitial, 2*s.smallMax))
	}
}

func (s *Subscriber) shrinkBuf(size int) {
	s.rbuf.Release()
	s.rbuf.B = make([]byte, size)
	s.buf = s.rbuf.B
	s.smallRun, s.smallMax = 0, 0
	s.st.recvBuf.Store(int64(size))
}

// pumpDealer reads and handles one replay reply; it returns 0 when none was ready.
func (s *Subscriber) pumpDealer() (int, error) {
	n, err := s.z.Recv(zmqtransport.SockDealer, &s.rbuf, &s.sizes)
	s.buf = s.rbuf.B
	if err != nil {
		s.do(s.tr.ReplayFailed(time.Now(), fmt.Sprintf("replay receive: %v", err)))
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	s.noteReceived()
	s.onReplayMessage(n)
	s.noteSize()
	return n, nil
}

// drainMonitor consumes the SUB connection events queued so far.
func (s *Subscriber) drainMonitor() {
	for {
		ev, _, err := s.z.MonEvent()
		if err != nil {
			s.log.Debug("ZMQ monitor event unreadable", "err", err)
			return
		}
		switch ev {
		case 0:
			return
		case zmqtransport.EvConnected:
			s.discAt = time.Time{}
			s.do(s.tr.Connected(time.Now()))
		case zmqtransport.EvConnectRetried:
			s.discAt = time.Time{}
		case zmqtransport.EvDisconnected:
			if s.discAt.IsZero() {
				s.discAt = time.Now()
			}
			s.log.Info("ZMQ publisher disconnected")
		}
	}
}
