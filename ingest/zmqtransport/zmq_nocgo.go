//go:build !cgo

package zmqtransport

import (
	"os"
	"sync/atomic"
	"time"
)

// Socket names one of a Conn's sockets.
type Socket int

// The sockets of a Conn (same numbering as the cgo build).
const (
	// SockSub is the SUB socket connected to the publisher.
	SockSub Socket = 0
	// SockDealer is the DEALER of the replay attempt in progress.
	SockDealer Socket = 1
	// SockMon is the reader of the SUB socket's connection monitor.
	SockMon Socket = 2
)

// Monitor event ids (libzmq's values).
const (
	// EvConnected: the SUB socket (re)connected to its publisher.
	EvConnected = 0x0001
	// EvDisconnected: the connection was lost.
	EvDisconnected = 0x0200
	// EvConnectRetried: libzmq scheduled a reconnect.
	EvConnectRetried = 0x0004
)

// MaxFrames is how many frames of one message are kept.
const MaxFrames = 4

// Transport cannot be created without cgo: NewTransport returns ErrNoCgo.
type Transport struct{}

// NewTransport returns ErrNoCgo: libzmq is reached through cgo.
func NewTransport(TransportConfig) (*Transport, error) { return nil, ErrNoCgo }

// Close does nothing.
func (t *Transport) Close() error { return nil }

// Open is always 0.
func (t *Transport) Open() int { return 0 }

// NoteReceived does nothing.
func (t *Transport) NoteReceived(int64) {}

// Trims is always 0.
func (t *Transport) Trims() uint64 { return 0 }

// Conn cannot be created without cgo: NewConn returns ErrNoCgo.
type Conn struct{}

// NewConn returns ErrNoCgo.
func NewConn(*Transport, int64) (*Conn, error) { return nil, ErrNoCgo }

// PollFile is nil.
func (z *Conn) PollFile() *os.File { return nil }

// OpenSub returns ErrNoCgo.
func (z *Conn) OpenSub(string, int) error { return ErrNoCgo }

// CloseSub does nothing.
func (z *Conn) CloseSub() {}

// HasSub is false.
func (z *Conn) HasSub() bool { return false }

// RcvHWM returns ErrNoCgo.
func (z *Conn) RcvHWM() (int, error) { return 0, ErrNoCgo }

// OpenDealer returns ErrNoCgo.
func (z *Conn) OpenDealer(string) error { return ErrNoCgo }

// CloseDealer does nothing.
func (z *Conn) CloseDealer() {}

// HasDealer is false.
func (z *Conn) HasDealer() bool { return false }

// SendReplay returns ErrNoCgo.
func (z *Conn) SendReplay(uint64) error { return ErrNoCgo }

// Recv returns ErrNoCgo.
func (z *Conn) Recv(Socket, *RecvBuf, *[MaxFrames]int) (int, error) { return 0, ErrNoCgo }

// Used is 0.
func (z *Conn) Used() int { return 0 }

// Wait returns ErrNoCgo.
func (z *Conn) Wait(time.Duration, *atomic.Bool) (int, error) { return 0, ErrNoCgo }

// MonEvent returns ErrNoCgo.
func (z *Conn) MonEvent() (int, uint32, error) { return 0, 0, ErrNoCgo }

// Free does nothing.
func (z *Conn) Free() {}
