package idle

import (
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// DeadEndpoints are loopback TCP ports that nobody listens on, held for as long as they
// are needed: each is a socket bound to 127.0.0.1 that never listens, so a connection
// to it is refused at once (as to a crashed engine's port) and no other program can take
// the port meanwhile (nor can the kernel pick it as a connecting socket's own port).
type DeadEndpoints struct {
	fds   []int
	ports []int
}

// ReserveDeadEndpoints binds n such sockets on ports the kernel picks.
func ReserveDeadEndpoints(n int) (*DeadEndpoints, error) {
	d := &DeadEndpoints{}
	for range n {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("reserve dead endpoint %d of %d: %w", len(d.fds)+1, n, err)
		}
		d.fds = append(d.fds, fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			d.Close()
			return nil, fmt.Errorf("reserve dead endpoint %d of %d: bind: %w", len(d.fds), n, err)
		}
		sa, err := unix.Getsockname(fd)
		in4, ok := sa.(*unix.SockaddrInet4)
		if err != nil || !ok {
			d.Close()
			return nil, fmt.Errorf("reserve dead endpoint %d of %d: port: %w", len(d.fds), n, errors.Join(err, errors.New("not an IPv4 address")))
		}
		d.ports = append(d.ports, in4.Port)
	}
	return d, nil
}

// Endpoints returns the ZMQ endpoints, tcp://127.0.0.1:port.
func (d *DeadEndpoints) Endpoints() []string {
	out := make([]string, len(d.ports))
	for i, p := range d.ports {
		out[i] = "tcp://127.0.0.1:" + strconv.Itoa(p)
	}
	return out
}

// Close releases the ports.
func (d *DeadEndpoints) Close() {
	for _, fd := range d.fds {
		_ = unix.Close(fd)
	}
	d.fds, d.ports = nil, nil
}
