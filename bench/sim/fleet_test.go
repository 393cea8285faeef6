package sim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// TestFleetHits: a /query answer in the server's order (ids sorted as strings, so sim-10
// before sim-2) is filed by fleet instance; instances left out read nil, ids outside the
// fleet are ignored, and a reused slice is refiled without allocating.
func TestFleetHits(t *testing.T) {
	f, err := NewFleet(FleetConfig{Instances: 12, DPRanks: 2, Kind: publisher.VLLM, Hash: VLLMHash("sha256_cbor", "0"),
		BlockSize: 16, Cache: CacheConfig{Device: 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Instance i reports 16*i matched tokens; sim-3 and sim-7 are missing, "other" is not ours.
	b := msgp.AppendMapHeader(nil, 1)
	b = msgp.AppendString(b, "instances")
	ids := []string{"other", "sim-0", "sim-1", "sim-10", "sim-11", "sim-2", "sim-4", "sim-5", "sim-6", "sim-8", "sim-9"}
	b = msgp.AppendMapHeader(b, uint32(len(ids)))
	for _, id := range ids {
		b = msgp.AppendString(b, id)
		b = msgp.AppendMapHeader(b, 2)
		b = msgp.AppendString(b, "longest_matched")
		n := int64(999)
		for i := range 12 {
			if f.InstanceID(i) == id {
				n = int64(16 * i)
			}
		}
		b = msgp.AppendInt64(b, n)
		b = msgp.AppendString(b, "rank_matches")
		b = msgp.AppendMapHeader(b, 1)
		b = msgp.AppendString(b, "1")
		b = msgp.AppendMapHeader(b, 1)
		b = msgp.AppendString(b, "disk")
		b = msgp.AppendInt64(b, n)
	}
	var res httpclient.QueryResult
	if err := httpclient.DecodeQueryResult(&res, b); err != nil {
		t.Fatal(err)
	}
	hits := f.Hits(nil, &res)
	if len(hits) != 12 {
		t.Fatalf("%d hits, want 12", len(hits))
	}
	for i, h := range hits {
		switch {
		case i == 3 || i == 7:
			if h != nil {
				t.Errorf("instance %d: %+v, want nil", i, h)
			}
		case h == nil || h.InstanceID != f.InstanceID(i) || h.LongestMatched != int64(16*i) ||
			h.Rank(1) == nil || h.Rank(1).Disk != int64(16*i):
			t.Errorf("instance %d: %+v", i, h)
		}
	}
	if raceEnabled {
		return
	}
	if a := testing.AllocsPerRun(100, func() { hits = f.Hits(hits, &res) }); a != 0 {
		t.Errorf("Hits: %v allocs per call, want 0", a)
	}
}

// TestDrainContextGivesUp: a drain whose marker never shows (the conductor knows none of
// the fleet's ranks) ends with the context's cause instead of waiting for its timeout.
func TestDrainContextGivesUp(t *testing.T) {
	c := target.StartInProcess(t)
	cl, err := httpclient.New(c.Addr, httpclient.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f, err := NewFleet(FleetConfig{Instances: 1, DPRanks: 1, Kind: publisher.VLLM, Hash: VLLMHash("sha256", "0"),
		Model: "drain", BlockSize: 16, Cache: CacheConfig{Device: 8}, Publish: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cause := errors.New("source went stale")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	if _, err := f.DrainContext(ctx, cl, time.Hour); !errors.Is(err, cause) {
		t.Fatalf("drain: %v, want the cause", err)
	}
}
