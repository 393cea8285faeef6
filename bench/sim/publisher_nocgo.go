//go:build !cgo

package sim

import (
	"errors"
	"time"
)

// ErrNoCgo is what NewHub returns in a build without cgo: the simulated engines publish
// over libzmq.
var ErrNoCgo = errors.New("sim: ZMQ publishers need cgo (built with CGO_ENABLED=0)")

// Publisher cannot be created without cgo.
type Publisher struct{}

// Endpoint is "".
func (p *Publisher) Endpoint() string { return "" }

// ReplayEndpoint is "".
func (p *Publisher) ReplayEndpoint() string { return "" }

// Seq is 0.
func (p *Publisher) Seq() uint64 { return 0 }

// Replays is 0.
func (p *Publisher) Replays() uint64 { return 0 }

// Publish returns ErrNoCgo.
func (p *Publisher) Publish([]byte) error { return ErrNoCgo }

// LoseFromRing does nothing.
func (p *Publisher) LoseFromRing(uint64) {}

// WaitSubscribed returns ErrNoCgo.
func (p *Publisher) WaitSubscribed(time.Duration) error { return ErrNoCgo }

// Hub cannot be created without cgo: NewHub returns ErrNoCgo.
type Hub struct{}

// NewHub returns ErrNoCgo.
func NewHub() (*Hub, error) { return nil, ErrNoCgo }

// NewPublisher returns ErrNoCgo.
func (h *Hub) NewPublisher(PublisherConfig) (*Publisher, error) { return nil, ErrNoCgo }

// Start does nothing.
func (h *Hub) Start() {}

// Close does nothing.
func (h *Hub) Close() {}
