package client

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// Tiers are cumulative matched-token counts (device <= cpu_local <= cpu_share <= disk).
type Tiers struct {
	Device, CPULocal, CPUShare, Disk int64
}

// InstanceResult is one instance of a /query answer.
type InstanceResult struct {
	// Present is false for a known instance the answer did not mention.
	Present bool
	// LongestMatched is longest_matched (equal to Tiers.Disk).
	LongestMatched int64
	Tiers
	// Ranks holds rank_matches indexed by dp rank; RankSeen marks the ranks present.
	Ranks    []Tiers
	RankSeen []bool
}

// Result is a decoded /query answer. Instances the caller announced with SetInstances are
// decoded in place by index without allocating; others go to Other, allocating.
type Result struct {
	ids   []string
	index map[string]int
	// Known has one entry per SetInstances id, in that order.
	Known []InstanceResult
	// Other holds instances the answer named that were not announced, by id.
	Other map[string]*InstanceResult
}

// SetInstances announces the instance ids the caller expects.
func (r *Result) SetInstances(ids []string) {
	r.ids = append(r.ids[:0], ids...)
	r.index = make(map[string]int, len(ids))
	for i, id := range ids {
		r.index[id] = i
	}
	r.Known = make([]InstanceResult, len(ids))
	r.Other = nil
}

// Count is the number of instances in the last answer.
func (r *Result) Count() int {
	n := len(r.Other)
	for i := range r.Known {
		if r.Known[i].Present {
			n++
		}
	}
	return n
}

func (r *Result) reset() {
	for i := range r.Known {
		k := &r.Known[i]
		k.Present = false
		k.LongestMatched = 0
		k.Tiers = Tiers{}
		for j := range k.RankSeen {
			k.RankSeen[j] = false
			k.Ranks[j] = Tiers{}
		}
	}
	for id := range r.Other {
		delete(r.Other, id)
	}
}

// Decode parses a /query answer body.
func (r *Result) Decode(b []byte) error {
	r.reset()
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return err
		}
		if string(k) != "instances" {
			if b, err = msgp.Skip(b); err != nil {
				return err
			}
			continue
		}
		var ni uint32
		if ni, b, err = msgp.ReadMapHeaderBytes(b); err != nil {
			return fmt.Errorf("instances: %w", err)
		}
		for j := uint32(0); j < ni; j++ {
			var id []byte
			if id, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return fmt.Errorf("instance key: %w", err)
			}
			var dst *InstanceResult
			if idx, ok := r.index[string(id)]; ok {
				dst = &r.Known[idx]
			} else {
				if r.Other == nil {
					r.Other = make(map[string]*InstanceResult)
				}
				dst = &InstanceResult{}
				r.Other[string(id)] = dst
			}
			if b, err = decodeInstance(b, dst); err != nil {
				return fmt.Errorf("instance %q: %w", id, err)
			}
		}
	}
	return nil
}

func decodeInstance(b []byte, dst *InstanceResult) ([]byte, error) {
	dst.Present = true
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for i := uint32(0); i < n; i++ {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, err
		}
		switch string(k) {
		case "longest_matched":
			dst.LongestMatched, b, err = msgp.ReadInt64Bytes(b)
		case "device":
			dst.Device, b, err = msgp.ReadInt64Bytes(b)
		case "cpu_local":
			dst.CPULocal, b, err = msgp.ReadInt64Bytes(b)
		case "cpu_share":
			dst.CPUShare, b, err = msgp.ReadInt64Bytes(b)
		case "disk":
			dst.Disk, b, err = msgp.ReadInt64Bytes(b)
		case "rank_matches":
			b, err = decodeRanks(b, dst)
		default: // "dp" repeats rank_matches' device counts
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, fmt.Errorf("%s: %w", k, err)
		}
	}
	return b, nil
}

// parseRank reads a decimal rank key without allocating.
func parseRank(k []byte) (int, error) {
	if len(k) == 0 || len(k) > 6 {
		return 0, fmt.Errorf("rank key %q: not a small decimal", k)
	}
	v := 0
	for _, c := range k {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("rank key %q: not a small decimal", k)
		}
		v = v*10 + int(c-'0')
	}
	return v, nil
}

func decodeRanks(b []byte, dst *InstanceResult) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for i := uint32(0); i < n; i++ {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, err
		}
		rank, err := parseRank(k)
		if err != nil {
			return b, err
		}
		for len(dst.Ranks) <= rank {
			dst.Ranks = append(dst.Ranks, Tiers{})
			dst.RankSeen = append(dst.RankSeen, false)
		}
		dst.RankSeen[rank] = true
		t := &dst.Ranks[rank]
		var nf uint32
		if nf, b, err = msgp.ReadMapHeaderBytes(b); err != nil {
			return b, err
		}
		for f := uint32(0); f < nf; f++ {
			var fk []byte
			if fk, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return b, err
			}
			switch string(fk) {
			case "device":
				t.Device, b, err = msgp.ReadInt64Bytes(b)
			case "cpu_local":
				t.CPULocal, b, err = msgp.ReadInt64Bytes(b)
			case "cpu_share":
				t.CPUShare, b, err = msgp.ReadInt64Bytes(b)
			case "disk":
				t.Disk, b, err = msgp.ReadInt64Bytes(b)
			default:
				b, err = msgp.Skip(b)
			}
			if err != nil {
				return b, fmt.Errorf("rank %d %s: %w", rank, fk, err)
			}
		}
	}
	return b, nil
}
