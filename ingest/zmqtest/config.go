// Package zmqtest provides an in-process engine-style KV-event publisher for tests, end-to-end
// runs and load simulation: a PUB endpoint that sends [topic, u64 BE seq, payload] batches
// like vLLM's ZmqEventPublisher, and an optional ROUTER replay endpoint that serves the
// legacy replay protocol from a ring of recent batches. Faults (lost batches, raw malformed
// messages, silent or broken replay) can be injected.
//
// It needs cgo (pebbe/zmq4). Built with CGO_ENABLED=0, NewPublisher returns ErrNoCgo, so
// that packages whose tests use it still build and vet; tests skip on that error.
package zmqtest

import (
	"encoding/binary"
	"errors"
)

// ErrNoCgo is what NewPublisher returns in a build without cgo.
var ErrNoCgo = errors.New("zmqtest: publishers need cgo (built with CGO_ENABLED=0)")

// EndMarkerSeq is the sequence of the replay end marker (sent with an empty payload).
const EndMarkerSeq = ^uint64(0)

// DefaultBufferSteps is vLLM's default replay ring size (KVEventsConfig.buffer_steps).
const DefaultBufferSteps = 10000

// Config describes a publisher. Endpoints default to a free port on 127.0.0.1.
type Config struct {
	// Endpoint is the PUB bind address; "" binds "tcp://127.0.0.1:*".
	Endpoint string
	// ReplayEndpoint is the ROUTER bind address; "" means no replay endpoint. Use
	// "tcp://127.0.0.1:*" for a free port.
	ReplayEndpoint string
	// Topic is the first frame of every batch (vLLM's default is "").
	Topic string
	// BufferSteps is how many recent batches the replay ring keeps; 0 = DefaultBufferSteps.
	BufferSteps int
	// ReplayWithTopic makes replay replies ["", topic, seq, payload] (newer vLLM) instead
	// of ["", seq, payload].
	ReplayWithTopic bool
}

// Responder answers one replay request whose start sequence is from. send writes one
// reply message (the frames after the requester's identity, starting with the empty
// delimiter). It runs on the replay goroutine.
type Responder func(from uint64, send func(frames ...[]byte) error)

// Silent is a Responder that never answers.
func Silent(uint64, func(...[]byte) error) {}

// Malformed is a Responder that answers every request with one reply whose sequence
// frame is 7 bytes long.
func Malformed(from uint64, send func(...[]byte) error) {
	_ = send([]byte{}, make([]byte, 7), []byte("x"))
}

// SeqFrame encodes seq as a sequence frame (8 bytes, big-endian).
func SeqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}
