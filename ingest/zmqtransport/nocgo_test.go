//go:build !cgo

package zmqtransport

import (
	"errors"
	"strings"
	"testing"
)

// TestNoCgoTransportFailsClearly: without cgo a transport cannot be made, and the error
// says why.
func TestNoCgoTransportFailsClearly(t *testing.T) {
	tr, err := NewTransport(TransportConfig{})
	if tr != nil || !errors.Is(err, ErrNoCgo) || !strings.Contains(err.Error(), "ZMQ subscriptions need cgo") {
		t.Fatalf("NewTransport = %v, %v; want nil, ErrNoCgo", tr, err)
	}
	if c, err := NewConn(nil, 0); c != nil || !errors.Is(err, ErrNoCgo) {
		t.Fatalf("NewConn = %v, %v; want nil, ErrNoCgo", c, err)
	}
}
