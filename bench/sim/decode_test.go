package sim

import (
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// testEvent is an event decoded generically (not with the encoder's own code), so the
// tests check the bytes a subscriber actually sees.
type testEvent struct {
	Type      string
	Hashes    []uint64
	Parent    *uint64
	Tokens    []int32
	BlockSize int64
	Medium    string
	Keys      []string
}

type testBatch struct {
	TS     float64
	Events []testEvent
	Rank   int64
}

func readAnyInt(b []byte) (uint64, []byte, error) {
	if msgp.NextType(b) == msgp.UintType {
		return msgp.ReadUint64Bytes(b)
	}
	v, rest, err := msgp.ReadInt64Bytes(b)
	return uint64(v), rest, err
}

func decodeTestBatch(t testing.TB, payload []byte) testBatch {
	t.Helper()
	tb, err := decodeBatchErr(payload)
	if err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	return tb
}

func decodeBatchErr(b []byte) (testBatch, error) {
	var tb testBatch
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n != 3 {
		return tb, fmt.Errorf("envelope: n=%d err=%v", n, err)
	}
	if tb.TS, b, err = msgp.ReadFloat64Bytes(b); err != nil {
		return tb, fmt.Errorf("ts: %w", err)
	}
	ne, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return tb, fmt.Errorf("events: %w", err)
	}
	for i := uint32(0); i < ne; i++ {
		var ev testEvent
		nf, rest, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return tb, fmt.Errorf("event %d: %w", i, err)
		}
		b = rest
		for f := uint32(0); f < nf; f++ {
			var k []byte
			if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return tb, err
			}
			ev.Keys = append(ev.Keys, string(k))
			switch string(k) {
			case "type":
				var s []byte
				s, b, err = msgp.ReadStringZC(b)
				ev.Type = string(s)
			case "medium":
				var s []byte
				s, b, err = msgp.ReadStringZC(b)
				ev.Medium = string(s)
			case "block_hashes":
				var nh uint32
				if nh, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
					return tb, err
				}
				for j := uint32(0); j < nh; j++ {
					var h uint64
					if h, b, err = readAnyInt(b); err != nil {
						return tb, err
					}
					ev.Hashes = append(ev.Hashes, h)
				}
			case "parent_block_hash":
				if msgp.IsNil(b) {
					b, err = msgp.ReadNilBytes(b)
				} else {
					var h uint64
					h, b, err = readAnyInt(b)
					ev.Parent = &h
				}
			case "token_ids":
				var nt uint32
				if nt, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
					return tb, err
				}
				ev.Tokens = []int32{}
				for j := uint32(0); j < nt; j++ {
					var v int32
					if v, b, err = msgp.ReadInt32Bytes(b); err != nil {
						return tb, err
					}
					ev.Tokens = append(ev.Tokens, v)
				}
			case "block_size":
				ev.BlockSize, b, err = msgp.ReadInt64Bytes(b)
			default:
				b, err = msgp.Skip(b)
			}
			if err != nil {
				return tb, fmt.Errorf("event %d key %s: %w", i, k, err)
			}
		}
		tb.Events = append(tb.Events, ev)
	}
	if tb.Rank, b, err = msgp.ReadInt64Bytes(b); err != nil {
		return tb, fmt.Errorf("dp_rank: %w", err)
	}
	if len(b) != 0 {
		return tb, fmt.Errorf("%d trailing bytes", len(b))
	}
	return tb, nil
}

// captureSink records every payload a rank publishes.
type captureSink struct{ batches [][]byte }

func (c *captureSink) Publish(p []byte) error {
	c.batches = append(c.batches, append([]byte(nil), p...))
	return nil
}

// model is what a subscriber reconstructs from a rank's events: the set of keys per
// medium, the way the conductor's index sees that rank.
type model map[string]map[uint64]bool

func (m model) apply(t testing.TB, tb testBatch) {
	t.Helper()
	for _, ev := range tb.Events {
		switch ev.Type {
		case "BlockStored":
			if m[ev.Medium] == nil {
				m[ev.Medium] = map[uint64]bool{}
			}
			for _, h := range ev.Hashes {
				m[ev.Medium][h] = true
			}
		case "BlockRemoved":
			for _, h := range ev.Hashes {
				if !m[ev.Medium][h] {
					t.Fatalf("BlockRemoved %s %x: not stored", ev.Medium, h)
				}
				delete(m[ev.Medium], h)
			}
		case "AllBlocksCleared":
			for k := range m {
				delete(m, k)
			}
		default:
			t.Fatalf("unknown event type %q", ev.Type)
		}
	}
}
