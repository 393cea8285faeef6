//go:build cgo

package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// replayEndSeq is the sequence frame of the replay end marker (-1 as signed BE).
const replayEndSeq = ^uint64(0)

type ringSlot struct {
	seq     uint64
	payload []byte
}

// Publisher is one engine rank's event stream: an XPUB socket (so the simulator can wait
// for the conductor's subscription instead of losing the first batches to ZMQ's slow
// joiner) and a ROUTER replay endpoint speaking vLLM's legacy replay protocol from a ring
// of recent batches. Publish is safe for concurrent use.
type Publisher struct {
	cfg PublisherConfig

	mu        sync.Mutex
	pub       *zmq.Socket
	seq       uint64
	seqBuf    [8]byte
	ring      []ringSlot // circular, len(ring) grows up to BufferSteps
	ringHead  int        // index of the oldest slot
	ringLen   int
	ringBytes int
	closed    bool

	router         *zmq.Socket // owned by the hub's replay goroutine once started
	endpoint       string
	replayEndpoint string
	replays        uint64
	// lost: batches the replay endpoint leaves out (LoseFromRing).
	lost map[uint64]bool
}

// Endpoint is the PUB endpoint to register (tcp://host:port).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the ROUTER replay endpoint to register.
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Seq is the sequence number the next batch will carry (= batches published).
func (p *Publisher) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Replays is the number of replay requests served.
func (p *Publisher) Replays() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replays
}

// Publish sends one batch as [topic "", u64 BE seq, payload] and keeps a copy for replay.
// The payload may be reused by the caller afterwards.
func (p *Publisher) Publish(payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("publish: publisher closed")
	}
	binary.BigEndian.PutUint64(p.seqBuf[:], p.seq)
	if _, err := p.pub.SendBytes(nil, zmq.SNDMORE); err != nil {
		return fmt.Errorf("publish seq %d topic frame: %w", p.seq, err)
	}
	if _, err := p.pub.SendBytes(p.seqBuf[:], zmq.SNDMORE); err != nil {
		return fmt.Errorf("publish seq %d sequence frame: %w", p.seq, err)
	}
	if _, err := p.pub.SendBytes(payload, 0); err != nil {
		return fmt.Errorf("publish seq %d payload frame: %w", p.seq, err)
	}
	p.remember(p.seq, payload)
	p.seq++
	return nil
}

// remember stores payload in the replay ring, recycling the oldest slot's buffer.
func (p *Publisher) remember(seq uint64, payload []byte) {
	for p.ringLen > 0 && (p.ringLen >= p.cfg.BufferSteps || p.ringBytes+len(payload) > p.cfg.BufferBytes) {
		p.ringBytes -= len(p.ring[p.ringHead].payload)
		p.ringHead = (p.ringHead + 1) % len(p.ring)
		p.ringLen--
	}
	if p.ringLen == len(p.ring) {
		// Grow: unroll the circle so the oldest slot is first again.
		grown := make([]ringSlot, 0, max(8, 2*len(p.ring)))
		for i := 0; i < p.ringLen; i++ {
			grown = append(grown, p.ring[(p.ringHead+i)%len(p.ring)])
		}
		grown = grown[:cap(grown)]
		p.ring, p.ringHead = grown, 0
	}
	s := &p.ring[(p.ringHead+p.ringLen)%len(p.ring)]
	s.seq = seq
	s.payload = append(s.payload[:0], payload...)
	p.ringLen++
	p.ringBytes += len(payload)
}

// LoseFromRing makes the replay endpoint leave batch seq out of every later answer, as
// a ring that has moved past it would, for tests of gaps that no replay can close.
func (p *Publisher) LoseFromRing(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lost == nil {
		p.lost = map[uint64]bool{}
	}
	p.lost[seq] = true
}

// WaitSubscribed blocks until a subscriber (the conductor) has subscribed to the PUB
// socket, so that no batch is published into the void.
func (p *Publisher) WaitSubscribed(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		msg, err := p.pub.RecvBytes(zmq.DONTWAIT)
		p.mu.Unlock()
		if err == nil && len(msg) > 0 && msg[0] == 1 {
			return nil
		}
		if err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			return fmt.Errorf("wait for subscriber on %s: %w", p.endpoint, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for subscriber on %s: none after %v", p.endpoint, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// serveReplay answers one replay request read from the ROUTER socket: every buffered
// batch from the requested sequence on, then the end marker. It runs on the hub goroutine.
func (p *Publisher) serveReplay(msg [][]byte) {
	if len(msg) < 2 {
		return
	}
	id := msg[0]
	start := msg[len(msg)-1]
	if len(start) != 8 {
		return
	}
	from := binary.BigEndian.Uint64(start)
	var seq [8]byte
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replays++
	for i := 0; i < p.ringLen; i++ {
		s := &p.ring[(p.ringHead+i)%len(p.ring)]
		if s.seq < from || p.lost[s.seq] {
			continue
		}
		binary.BigEndian.PutUint64(seq[:], s.seq)
		if _, err := p.router.SendMessage(id, "", seq[:], s.payload); err != nil {
			return
		}
	}
	binary.BigEndian.PutUint64(seq[:], replayEndSeq)
	_, _ = p.router.SendMessage(id, "", seq[:], "")
}

// Hub owns the ZMQ context of a fleet's publishers and one goroutine that serves every
// replay endpoint, so an idle fleet costs one poller, not a goroutine per rank.
type Hub struct {
	ctx     *zmq.Context
	pubs    []*Publisher
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	started bool
}

// NewHub creates a ZMQ context. Create every publisher, then call Start.
func NewHub() (*Hub, error) {
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq context: %w", err)
	}
	return &Hub{ctx: ctx, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// bind creates a socket of type t, applies setup (options that must precede the bind:
// libzmq copies a socket's options into its listener when it binds, so a high-water mark
// set afterwards never reaches the connections it accepts) and binds it on a free port.
func (h *Hub) bind(t zmq.Type, host string, setup func(*zmq.Socket) error) (*zmq.Socket, string, error) {
	s, err := h.ctx.NewSocket(t)
	if err != nil {
		return nil, "", fmt.Errorf("new socket: %w", err)
	}
	if err := s.SetLinger(0); err != nil {
		s.Close()
		return nil, "", fmt.Errorf("set linger: %w", err)
	}
	if setup != nil {
		if err := setup(s); err != nil {
			s.Close()
			return nil, "", err
		}
	}
	if err := s.Bind("tcp://" + host + ":*"); err != nil {
		s.Close()
		return nil, "", fmt.Errorf("bind tcp://%s:*: %w", host, err)
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		s.Close()
		return nil, "", fmt.Errorf("last endpoint: %w", err)
	}
	return s, ep, nil
}

// NewPublisher binds a PUB (XPUB) and a ROUTER socket on free ports.
func (h *Hub) NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.withDefaults()
	pub, ep, err := h.bind(zmq.XPUB, cfg.Host, func(s *zmq.Socket) error {
		if err := s.SetSndhwm(cfg.SendHWM); err != nil {
			return fmt.Errorf("set sndhwm: %w", err)
		}
		if err := s.SetXpubVerbose(1); err != nil {
			return fmt.Errorf("set xpub_verbose: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("event endpoint: %w", err)
	}
	router, rep, err := h.bind(zmq.ROUTER, cfg.Host, nil)
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("replay endpoint: %w", err)
	}
	p := &Publisher{cfg: cfg, pub: pub, router: router, endpoint: ep, replayEndpoint: rep}
	h.pubs = append(h.pubs, p)
	return p, nil
}

// Start launches the replay goroutine.
func (h *Hub) Start() {
	h.started = true
	go h.serve()
}

func (h *Hub) serve() {
	// libzmq sockets must not be used from two OS threads without a barrier; pinning the
	// goroutine keeps every ROUTER socket on one thread for its whole life.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(h.done)
	poller := zmq.NewPoller()
	for _, p := range h.pubs {
		poller.Add(p.router, zmq.POLLIN)
	}
	for {
		select {
		case <-h.stop:
			return
		default:
		}
		polled, err := poller.Poll(50 * time.Millisecond)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return
		}
		for _, pl := range polled {
			for _, p := range h.pubs {
				if p.router != pl.Socket {
					continue
				}
				for {
					msg, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
					if err != nil {
						break
					}
					p.serveReplay(msg)
				}
			}
		}
	}
}

// Close stops the replay goroutine and closes every socket and the context.
func (h *Hub) Close() {
	h.once.Do(func() {
		close(h.stop)
		if h.started {
			select {
			case <-h.done:
			case <-time.After(2 * time.Second):
			}
		}
		for _, p := range h.pubs {
			p.mu.Lock()
			p.closed = true
			p.pub.Close()
			p.router.Close()
			p.mu.Unlock()
		}
		_ = h.ctx.Term()
	})
}
