//go:build cgo

package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/conductor-go/conductor/wire/publisher"
	zmq "github.com/pebbe/zmq4"
)

func seqFrame(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }

// newTestSocket connects a socket of type typ to ep in its own context; the cleanup
// closes both.
func newTestSocket(t *testing.T, typ zmq.Type, ep string) *zmq.Socket {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(5 * time.Second)
	if typ == zmq.SUB {
		if err := s.SetSubscribe(""); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Connect(ep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		_ = ctx.Term()
	})
	return s
}

// TestPublisherLiveAndReplay: batches go out as [topic "", u64 BE seq, payload] to a
// subscriber, and the ROUTER endpoint replays the buffered ones from a requested
// sequence, ending with the ff*8 marker; the ring forgets the oldest batches.
func TestPublisherLiveAndReplay(t *testing.T) {
	pub := startTestPublisher(t, PublisherConfig{BufferSteps: 3})
	sub := newTestSocket(t, zmq.SUB, pub.Endpoint())
	if err := pub.WaitSubscribed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := pub.Publish([]byte(fmt.Sprintf("batch-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		msg, err := sub.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if len(msg) != 3 || len(msg[0]) != 0 || !bytes.Equal(msg[1], seqFrame(uint64(i))) || string(msg[2]) != fmt.Sprintf("batch-%d", i) {
			t.Fatalf("live message %d: %q", i, msg)
		}
	}
	if pub.Seq() != 5 {
		t.Fatalf("seq %d, want 5", pub.Seq())
	}

	dealer := newTestSocket(t, zmq.DEALER, pub.ReplayEndpoint())
	if _, err := dealer.SendMessage("", seqFrame(0)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		msg, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay recv: %v", err)
		}
		if len(msg) != 3 || len(msg[0]) != 0 {
			t.Fatalf("replay frames %q", msg)
		}
		s := binary.BigEndian.Uint64(msg[1])
		if s == replayEndSeq {
			if len(msg[2]) != 0 {
				t.Fatalf("end marker with payload %q", msg[2])
			}
			break
		}
		got = append(got, fmt.Sprintf("%d:%s", s, msg[2]))
	}
	want := "[2:batch-2 3:batch-3 4:batch-4]"
	if fmt.Sprint(got) != want {
		t.Fatalf("replay from 0 = %v, want %s (ring of 3)", got, want)
	}
	if _, err := dealer.SendMessage("", seqFrame(4)); err != nil {
		t.Fatal(err)
	}
	msg, err := dealer.RecvMessageBytes(0)
	if err != nil || string(msg[2]) != "batch-4" {
		t.Fatalf("replay from 4: %q %v", msg, err)
	}
	if pub.Replays() != 2 {
		t.Fatalf("replays %d, want 2", pub.Replays())
	}
}

// TestPublisherRingBytes: the ring also stays under its byte budget.
func TestPublisherRingBytes(t *testing.T) {
	p := &Publisher{cfg: PublisherConfig{BufferSteps: 100, BufferBytes: 25}.withDefaults()}
	p.cfg.BufferBytes = 25
	for i := 0; i < 10; i++ {
		p.remember(uint64(i), bytes.Repeat([]byte{'x'}, 10))
	}
	if p.ringLen != 2 || p.ringBytes != 20 || p.ring[p.ringHead].seq != 8 {
		t.Fatalf("ring len %d bytes %d oldest %d", p.ringLen, p.ringBytes, p.ring[p.ringHead].seq)
	}
}

// TestFleetPublishes: a publishing fleet registers one endpoint pair per rank and its
// ranks' batches reach a subscriber with their dp_rank.
func TestFleetPublishes(t *testing.T) {
	f, err := NewFleet(FleetConfig{
		Instances: 2, DPRanks: 2, Kind: publisher.VLLM, Hash: VLLMHash("sha256_cbor", "0"),
		Model: "m", BlockSize: 4, Cache: CacheConfig{Device: 8}, Publish: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	regs := f.Registrations()
	if len(regs) != 4 || regs[3].InstanceID != "sim-1" || regs[3].DPRank != 1 || regs[3].TenantID != "default" ||
		regs[0].Endpoint == regs[1].Endpoint || regs[0].ReplayEndpoint == "" {
		t.Fatalf("registrations %+v", regs)
	}
	sub := newTestSocket(t, zmq.SUB, regs[3].Endpoint)
	r := f.Rank(1, 1)
	if err := r.Publisher().WaitSubscribed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	toks := AppendPrompt(nil, 7, []uint32{1, 2}, 600, 0)
	keys, err := f.Hasher().AppendKeys(nil, toks)
	if err != nil || len(keys) != 150 {
		t.Fatalf("%d keys, err %v", len(keys), err)
	}
	if _, err := r.Store(toks, keys, Now()); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	tb := decodeTestBatch(t, msg[2])
	if tb.Rank != 1 || len(tb.Events) != 1 || len(tb.Events[0].Hashes) != 8 {
		t.Fatalf("batch rank %d events %+v", tb.Rank, tb.Events)
	}
	if f.Stats().Batches != 1 || f.UnionBlocks() != 8 {
		t.Fatalf("stats %+v union %d", f.Stats(), f.UnionBlocks())
	}
}

// TestPromptsShareByHashID: prompts built from trace hash ids share exactly the token
// prefix their ids share, and are deterministic.
func TestPromptsShareByHashID(t *testing.T) {
	a := AppendPrompt(nil, 1, []uint32{5, 6, 7}, 1400, 0)
	b := AppendPrompt(nil, 1, []uint32{5, 6, 9}, 1536, 0)
	c := AppendPrompt(nil, 2, []uint32{5}, 512, 0)
	if len(a) != 1400 || len(b) != 1536 {
		t.Fatalf("lengths %d %d", len(a), len(b))
	}
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	if common != 1024 {
		t.Fatalf("shared prefix %d tokens, want 1024", common)
	}
	if slices0 := AppendPrompt(nil, 1, []uint32{5, 6, 7}, 1400, 0); string(fmt.Sprint(slices0)) != fmt.Sprint(a) {
		t.Fatal("prompt not deterministic")
	}
	same := 0
	for i := range c {
		if c[i] == a[i] {
			same++
		}
	}
	if same > 20 {
		t.Fatalf("different seeds share %d of 512 tokens", same)
	}
	for _, tok := range a {
		if tok < 0 || tok >= DefaultVocab {
			t.Fatalf("token %d outside vocab", tok)
		}
	}
	m := AppendMarkerPrompt(nil, 3, 4)
	if len(m) != 4 || m[0] < DefaultVocab {
		t.Fatalf("marker %v", m)
	}
}

// TestPublisherSendHWM: the publisher's high-water mark applies to the conductor's
// connection. A subscriber that does not read (one-message pipe, small kernel buffer)
// backs batches up into the publisher; with SendHWM above the batches sent none is
// dropped, where libzmq's default of 1000 (what the connection got when the mark was set
// after the bind) plus a few MiB in TCP buffers would have dropped most of them.
func TestPublisherSendHWM(t *testing.T) {
	const batches, size = 5900, 4096
	pub := startTestPublisher(t, PublisherConfig{SendHWM: batches + 100})
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Term()
	sub, err := ctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, set := range []func() error{
		func() error { return sub.SetLinger(0) },
		func() error { return sub.SetRcvhwm(1) },
		func() error { return sub.SetRcvbuf(64 << 10) },
		func() error { return sub.SetRcvtimeo(5 * time.Second) },
		func() error { return sub.SetSubscribe("") },
		func() error { return sub.Connect(pub.Endpoint()) },
	} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.WaitSubscribed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, size)
	for range batches {
		if err := pub.Publish(payload); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < batches; i++ {
		msg, err := sub.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("batch %d of %d: %v", i, batches, err)
		}
		if got := binary.BigEndian.Uint64(msg[1]); got != uint64(i) {
			t.Fatalf("batch %d arrived as sequence %d: %d dropped", i, got, got-uint64(i))
		}
	}
}
