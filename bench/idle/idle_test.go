package idle

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
)

// TestDeadEndpointsRefuse: every reserved endpoint is a distinct loopback port whose
// connections are refused.
func TestDeadEndpointsRefuse(t *testing.T) {
	d, err := ReserveDeadEndpoints(5)
	if err != nil {
		t.Fatal(err)
	}
	eps := d.Endpoints()
	seen := map[string]bool{}
	for _, ep := range eps {
		addr, ok := strings.CutPrefix(ep, "tcp://")
		if !ok || seen[addr] {
			t.Fatalf("endpoints %v", eps)
		}
		seen[addr] = true
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			t.Fatalf("%s accepted a connection", ep)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("%s: %v, want connection refused", ep, err)
		}
	}
	d.Close()
	if len(d.Endpoints()) != 0 {
		t.Fatalf("endpoints after Close: %v", d.Endpoints())
	}
}

// TestIdleWithDeadEndpoints: the dead services are registered during the measurement and
// unregistered after it; RSS and CPU figures are read.
func TestIdleWithDeadEndpoints(t *testing.T) {
	c := target.StartInProcess(t)
	var log strings.Builder
	res, err := Run(context.Background(), Config{Addr: c.Addr, PID: c.PID, DeadEndpoints: 20, Wait: 20 * time.Millisecond,
		Window: 50 * time.Millisecond, Progress: &log})
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadEndpoints != 20 || res.RSSReadyBytes == 0 || res.RSSRegisteredBytes == 0 || res.RSSBytes == 0 ||
		res.RegisterSeconds <= 0 || res.WindowSeconds < 0.05 || res.CPUSeconds < 0 || res.CPUPercent < 0 {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(log.String(), "registered 20 services on dead endpoints") {
		t.Fatalf("progress:\n%s", log.String())
	}
	cl, err := httpclient.New(c.Addr, httpclient.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if list, err := cl.Services(); err != nil || len(list.Services) != 0 {
		t.Fatalf("services after the run: %+v, %v", list, err)
	}
	if _, err := Run(context.Background(), Config{Addr: c.Addr}); err == nil {
		t.Fatal("Run without a pid succeeded")
	}
}
