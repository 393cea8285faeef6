package seqtrack

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestPendingBuffer: batches come out in sequence order whatever the insertion order, the
// byte count follows, and a warm buffer cycles without allocating.
func TestPendingBuffer(t *testing.T) {
	var p pendingBuf
	for _, seq := range []uint64{10, 12, 11, 15, 13} {
		p.insert(seq, 3, []byte(fmt.Sprint(seq)))
	}
	if _, found := p.search(12); !found {
		t.Fatal("12 not found")
	}
	if _, found := p.search(14); found {
		t.Fatal("14 found")
	}
	if p.len() != 5 || p.bytes != 15 {
		t.Fatalf("len %d bytes %d", p.len(), p.bytes)
	}
	var got []string
	for p.len() > 0 {
		m := p.first()
		got = append(got, fmt.Sprintf("%d:%s", m.seq, p.payload(m)))
		p.pop()
	}
	if strings.Join(got, " ") != "10:10 11:11 12:12 13:13 15:15" || p.bytes != 0 {
		t.Fatalf("drained %v, bytes %d", got, p.bytes)
	}
	payload := bytes.Repeat([]byte{1}, 5000)
	cycle := func() {
		for i := range uint64(64) {
			p.insert(100+i, 5000, payload)
		}
		for p.len() > 0 {
			_ = p.payload(p.first())
			p.pop()
		}
		p.compact() // what the tracker's next call does
	}
	cycle()
	if allocs := testing.AllocsPerRun(20, cycle); allocs != 0 {
		t.Fatalf("buffer cycle allocates %v", allocs)
	}
}

// TestPendingBufferReleasedOnReset: an outsized arena is let go at reset (a stale stream
// does not keep it), while a payload handed out before stays intact.
func TestPendingBufferReleasedOnReset(t *testing.T) {
	var p pendingBuf
	big := bytes.Repeat([]byte{9}, pendingKeepArena/2+1)
	p.insert(1, len(big), big)
	p.insert(2, len(big), big)
	held := p.payload(p.first())
	p.reset()
	if p.arena != nil || p.len() != 0 || p.bytes != 0 {
		t.Fatalf("after reset: arena cap %d, len %d, bytes %d", cap(p.arena), p.len(), p.bytes)
	}
	if !bytes.Equal(held, big) {
		t.Fatal("payload handed out before reset was overwritten")
	}
}

// TestReleaseDropsPayloadReferences: after Release the tracker's last actions no longer
// refer to the buffered payloads.
func TestReleaseDropsPayloadReferences(t *testing.T) {
	tr := New(cfgReplay())
	tr.Live(t0, 0, 1, []byte("a"))
	tr.Live(t0, 2, 1, []byte("c"))
	acts := tr.ReplayBatch(t0, 1, []byte("b"))
	if render(acts) != "apply 1:b close apply 2:c" {
		t.Fatalf("actions %q", render(acts))
	}
	tr.Release()
	for i, a := range acts[:cap(acts)] {
		if a.Payload != nil {
			t.Fatalf("action %d still refers to %q", i, a.Payload)
		}
	}
}
