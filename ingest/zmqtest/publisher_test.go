//go:build cgo

package zmqtest

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// replay sends one legacy request from a raw DEALER and returns the replies up to and
// including the end marker.
func replay(t *testing.T, endpoint string, from uint64) [][][]byte {
	t.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := d.SetRcvtimeo(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendMessage([]byte{}, SeqFrame(from)); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		msg, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("after %d replies: %v", len(out), err)
		}
		out = append(out, msg)
		if binary.BigEndian.Uint64(msg[len(msg)-2]) == EndMarkerSeq {
			return out
		}
	}
}

func TestReplayFromRing(t *testing.T) {
	for _, withTopic := range []bool{false, true} {
		t.Run(fmt.Sprintf("topic=%v", withTopic), func(t *testing.T) {
			p, err := NewPublisher(Config{Topic: "kv", ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 3, ReplayWithTopic: withTopic})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for i := range 5 {
				if _, err := p.Publish([]byte(fmt.Sprint("b", i))); err != nil {
					t.Fatal(err)
				}
			}
			p.Lose([]byte("b5"))
			p.Skip(1)
			// The ring holds the last 3 sequences (4, 5 and the skipped 6, which is empty).
			got := replay(t, p.ReplayEndpoint(), 0)
			want := []string{"4:b4", "5:b5", "end:"}
			if len(got) != len(want) {
				t.Fatalf("replies = %q", got)
			}
			for i, msg := range got {
				n := 3
				if withTopic {
					n = 4
				}
				if len(msg) != n || len(msg[0]) != 0 || (withTopic && string(msg[1]) != "kv") {
					t.Fatalf("reply %d frames = %q", i, msg)
				}
				seq := binary.BigEndian.Uint64(msg[n-2])
				s := fmt.Sprintf("%d:%s", seq, msg[n-1])
				if seq == EndMarkerSeq {
					s = fmt.Sprintf("end:%s", msg[n-1])
				}
				if s != want[i] {
					t.Fatalf("reply %d = %s, want %s", i, s, want[i])
				}
			}
			if got := replay(t, p.ReplayEndpoint(), 5); len(got) != 2 {
				t.Fatalf("replay from 5 = %q", got)
			}
			if req := p.ReplayRequests(); len(req) != 2 || req[0] != 0 || req[1] != 5 {
				t.Fatalf("requests = %v", req)
			}
		})
	}
}

func TestPublishFramesAndClose(t *testing.T) {
	p, err := NewPublisher(Config{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetRcvtimeo(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitSubscribers(1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Skip(7)
	if seq, err := p.Publish([]byte("payload")); err != nil || seq != 7 || p.NextSeq() != 8 {
		t.Fatalf("Publish = %d, %v; next %d", seq, err, p.NextSeq())
	}
	msg, err := sub.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != 3 || string(msg[0]) != "t" || binary.BigEndian.Uint64(msg[1]) != 7 || string(msg[2]) != "payload" {
		t.Fatalf("frames = %q", msg)
	}
	ep := p.Endpoint()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := p.Publish(nil); err == nil {
		t.Fatal("Publish after Close succeeded")
	}
	// Close frees the port at once.
	p2, err := NewPublisher(Config{Endpoint: ep})
	if err != nil {
		t.Fatalf("rebind %s: %v", ep, err)
	}
	_ = p2.Close()
}
