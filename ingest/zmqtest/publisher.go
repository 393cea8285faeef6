//go:build cgo

package zmqtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Publisher is a running in-process publisher. Its methods are safe for concurrent use.
type Publisher struct {
	cfg   Config
	ctx   *zmq.Context
	topic []byte

	mu        sync.Mutex
	pub       *zmq.Socket // XPUB, so subscriptions can be waited for
	endpoint  string
	seq       uint64
	seqBuf    [8]byte
	ring      []ringSlot
	subs      int
	unsubs    int
	responder Responder
	requests  []uint64
	closed    bool
	sent      uint64 // messages sent on the PUB socket

	replayEndpoint string
	stop           chan struct{}
	done           chan struct{}
}

type ringSlot struct {
	seq     uint64
	payload []byte
	used    bool
}

// TB is the part of testing.TB that NewForTest uses (this package is also built into
// tools, which need not link the testing package).
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Await waits until cond holds. The subscriber and what it feeds work on goroutines of
// their own, so a test asks until their state shows the step: the sleep only paces the
// asking, and the deadline, far beyond what any step takes, only ends a run that would
// hang.
func Await(t TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// NewForTest is NewPublisher for one test: a failure fails the test, and the publisher
// is closed at its end.
func NewForTest(t TB, cfg Config) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// NewPublisher binds the endpoints and starts serving replay requests.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:*"
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmqtest: new context: %w", err)
	}
	p := &Publisher{cfg: cfg, ctx: ctx, topic: []byte(cfg.Topic)}
	if err := p.bindPub(); err != nil {
		_ = ctx.Term()
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		p.ring = make([]ringSlot, cfg.BufferSteps)
		p.stop = make(chan struct{})
		p.done = make(chan struct{})
		ready := make(chan error, 1)
		go p.serveReplay(ready)
		if err := <-ready; err != nil {
			_ = p.pub.Close()
			_ = ctx.Term()
			return nil, err
		}
	}
	return p, nil
}

func (p *Publisher) bindPub() error {
	s, err := p.ctx.NewSocket(zmq.XPUB)
	if err != nil {
		return fmt.Errorf("zmqtest: new PUB socket: %w", err)
	}
	// Verbose both ways: every subscriber's subscription and, when it closes, its
	// unsubscription are counted, even while another subscriber holds the same topic.
	ep, err := bind(s, p.cfg.Endpoint, errors.Join(s.SetLinger(0), s.SetSndhwm(0), s.SetXpubVerbose(1), s.SetXpubVerboser(1)))
	if err != nil {
		_ = s.Close()
		return fmt.Errorf("zmqtest: bind PUB %q: %w", p.cfg.Endpoint, err)
	}
	p.pub, p.endpoint = s, ep
	return nil
}

// bind binds s to endpoint once its options are set (optErr: the error setting them)
// and returns the endpoint a local client connects to.
func bind(s *zmq.Socket, endpoint string, optErr error) (string, error) {
	if optErr != nil {
		return "", optErr
	}
	if err := s.Bind(endpoint); err != nil {
		return "", err
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		return "", err
	}
	return connectable(ep), nil
}

// connectable turns a wildcard bind address into one a local client can connect to.
func connectable(ep string) string {
	ep = strings.Replace(ep, "//0.0.0.0:", "//127.0.0.1:", 1)
	return strings.Replace(ep, "//[::]:", "//[::1]:", 1)
}

// Endpoint is the address subscribers connect to (the bound port filled in).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the replay ROUTER's connectable address, or "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// NextSeq is the sequence the next Publish will use.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Publish sends payload as the next batch and keeps it for replay. It returns its seq.
func (p *Publisher) Publish(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("zmqtest: publisher closed")
	}
	seq := p.seq
	binary.BigEndian.PutUint64(p.seqBuf[:], seq)
	if err := p.sendLocked(p.topic, p.seqBuf[:], payload); err != nil {
		return 0, fmt.Errorf("zmqtest: publish seq %d: %w", seq, err)
	}
	p.recordLocked(seq, payload)
	p.seq++
	return seq, nil
}

// Lose takes the next sequence number for payload and keeps it for replay without sending
// it, as if the PUB socket had dropped it.
func (p *Publisher) Lose(payload []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.recordLocked(seq, payload)
	p.seq++
	return seq
}

// Skip burns n sequence numbers: nothing is sent and nothing can be replayed.
func (p *Publisher) Skip(n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq += n
}

// SendRaw sends frames as one multipart message on the PUB socket, bypassing sequencing.
func (p *Publisher) SendRaw(frames ...[]byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("zmqtest: publisher closed")
	}
	if err := p.sendLocked(frames...); err != nil {
		return fmt.Errorf("zmqtest: send raw: %w", err)
	}
	return nil
}

func (p *Publisher) sendLocked(frames ...[]byte) error {
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := p.pub.SendBytes(f, flag); err != nil {
			return err
		}
	}
	p.sent++
	return nil
}

// Sent is the number of messages sent on the PUB socket (Publish and SendRaw; not Lose
// or Skip). A subscriber connected before the first of them (WaitSubscribers) reads
// exactly that many, in order: tests wait for its count to reach Sent to know that it
// has read everything published so far.
func (p *Publisher) Sent() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

func (p *Publisher) recordLocked(seq uint64, payload []byte) {
	if p.ring == nil {
		return
	}
	s := &p.ring[seq%uint64(len(p.ring))]
	s.seq, s.used = seq, true
	s.payload = append(s.payload[:0], payload...)
}

// WaitSubscribers waits until at least n subscriptions have reached the publisher, so
// batches published afterwards are not lost to the subscriber's connection setup. It
// counts subscriptions since the publisher was created (a reconnecting subscriber counts
// again).
func (p *Publisher) WaitSubscribers(n int, timeout time.Duration) error {
	return p.waitSubscriptions("subscribers", func() int { return p.subs }, n, timeout)
}

// WaitUnsubscribes waits until at least n unsubscriptions have reached the publisher: a
// subscriber that closes its SUB socket sends one (the publisher has one subscription
// per subscriber), after which it reads nothing more.
func (p *Publisher) WaitUnsubscribes(n int, timeout time.Duration) error {
	return p.waitSubscriptions("unsubscribes", func() int { return p.unsubs }, n, timeout)
}

// waitSubscriptions reads the XPUB's subscription messages until count (read under the
// lock) reaches n. The sleep paces the reading; timeout only ends a wait that would hang.
func (p *Publisher) waitSubscriptions(what string, count func() int, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return errors.New("zmqtest: publisher closed")
		}
		for {
			msg, err := p.pub.RecvBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			switch {
			case len(msg) > 0 && msg[0] == 1:
				p.subs++
			case len(msg) > 0 && msg[0] == 0:
				p.unsubs++
			}
		}
		got := count()
		p.mu.Unlock()
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zmqtest: %d of %d %s after %v", got, n, what, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// SetResponder replaces how replay requests are answered; nil restores ReplayFromRing.
func (p *Publisher) SetResponder(r Responder) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.responder = r
}

// ReplayRequests returns the start sequences of the replay requests received so far.
func (p *Publisher) ReplayRequests() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uint64(nil), p.requests...)
}

// ReplayFromRing is the default Responder, the legacy protocol: every kept batch with
// seq >= from, in order, then the end marker. Custom responders may wrap it.
func (p *Publisher) ReplayFromRing(from uint64, send func(frames ...[]byte) error) {
	type batch struct {
		seq     uint64
		payload []byte
	}
	p.mu.Lock()
	var out []batch
	lo := uint64(0)
	if p.seq > uint64(len(p.ring)) {
		lo = p.seq - uint64(len(p.ring))
	}
	for seq := max(from, lo); seq < p.seq; seq++ {
		s := p.ring[seq%uint64(len(p.ring))]
		if s.used && s.seq == seq {
			out = append(out, batch{seq, append([]byte(nil), s.payload...)})
		}
	}
	p.mu.Unlock()
	for _, b := range out {
		if send(p.replyFrames(b.seq, b.payload)...) != nil {
			return
		}
	}
	_ = send(p.replyFrames(EndMarkerSeq, nil)...)
}

func (p *Publisher) replyFrames(seq uint64, payload []byte) [][]byte {
	if p.cfg.ReplayWithTopic {
		return [][]byte{{}, p.topic, SeqFrame(seq), payload}
	}
	return [][]byte{{}, SeqFrame(seq), payload}
}

// serveReplay owns the ROUTER socket for the publisher's lifetime.
func (p *Publisher) serveReplay(ready chan<- error) {
	defer close(p.done)
	r, err := p.ctx.NewSocket(zmq.ROUTER)
	if err != nil {
		ready <- fmt.Errorf("zmqtest: new ROUTER socket: %w", err)
		return
	}
	defer r.Close()
	// SNDHWM 0: a ROUTER silently drops replies to a full peer, which would turn a
	// large replay into a spurious "skipped sequence".
	ep, err := bind(r, p.cfg.ReplayEndpoint, errors.Join(r.SetLinger(0), r.SetSndhwm(0)))
	if err != nil {
		ready <- fmt.Errorf("zmqtest: bind ROUTER %q: %w", p.cfg.ReplayEndpoint, err)
		return
	}
	p.replayEndpoint = ep
	ready <- nil
	poller := zmq.NewPoller()
	poller.Add(r, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		polled, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := r.RecvMessageBytes(0)
		if err != nil || len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) != 8 {
			continue // not a legacy replay request
		}
		id, from := msg[0], binary.BigEndian.Uint64(msg[2])
		p.mu.Lock()
		p.requests = append(p.requests, from)
		resp := p.responder
		p.mu.Unlock()
		if resp == nil {
			resp = p.ReplayFromRing
		}
		resp(from, func(frames ...[]byte) error {
			if _, err := r.SendBytes(id, zmq.SNDMORE); err != nil {
				return err
			}
			for i, f := range frames {
				flag := zmq.SNDMORE
				if i == len(frames)-1 {
					flag = 0
				}
				if _, err := r.SendBytes(f, flag); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// Close stops the replay goroutine, closes the sockets and terminates the context, so the
// ports are free again when it returns. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	if p.stop != nil {
		close(p.stop)
		<-p.done
	}
	p.mu.Lock()
	err := p.pub.Close()
	p.mu.Unlock()
	return errors.Join(err, p.ctx.Term())
}
