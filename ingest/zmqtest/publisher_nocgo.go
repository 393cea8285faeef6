//go:build !cgo

package zmqtest

import "time"

// Publisher cannot be created without cgo: NewPublisher returns ErrNoCgo.
type Publisher struct{}

// NewPublisher returns ErrNoCgo.
func NewPublisher(Config) (*Publisher, error) { return nil, ErrNoCgo }

// Endpoint is "".
func (p *Publisher) Endpoint() string { return "" }

// ReplayEndpoint is "".
func (p *Publisher) ReplayEndpoint() string { return "" }

// NextSeq is 0.
func (p *Publisher) NextSeq() uint64 { return 0 }

// Publish returns ErrNoCgo.
func (p *Publisher) Publish([]byte) (uint64, error) { return 0, ErrNoCgo }

// Lose is 0.
func (p *Publisher) Lose([]byte) uint64 { return 0 }

// Skip does nothing.
func (p *Publisher) Skip(uint64) {}

// SendRaw returns ErrNoCgo.
func (p *Publisher) SendRaw(...[]byte) error { return ErrNoCgo }

// WaitSubscribers returns ErrNoCgo.
func (p *Publisher) WaitSubscribers(int, time.Duration) error { return ErrNoCgo }

// SetResponder does nothing.
func (p *Publisher) SetResponder(Responder) {}

// ReplayRequests is nil.
func (p *Publisher) ReplayRequests() []uint64 { return nil }

// ReplayFromRing does nothing.
func (p *Publisher) ReplayFromRing(uint64, func(frames ...[]byte) error) {}

// Close does nothing.
func (p *Publisher) Close() error { return nil }
