package httpclient

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// TierCounts are cumulative prefix hits in tokens: Device <= CPULocal <= CPUShare <= Disk.
type TierCounts struct {
	Device   int64
	CPULocal int64
	CPUShare int64
	Disk     int64
}

// RankHit is one DP rank of an instance: DP is its entry in the response's "dp" map and
// TierCounts its entry in "rank_matches".
type RankHit struct {
	Rank int64
	DP   int64
	TierCounts
	// Which of the two maps named this rank, so JSON output reproduces the response.
	inDP, inRankMatches bool
}

// InstanceHit is one instance's entry in a query result.
type InstanceHit struct {
	InstanceID     string
	LongestMatched int64
	TierCounts
	// Ranks is ordered by Rank.
	Ranks []RankHit
}

// QueryResult is the body of POST /query, flattened into slices so that decoding into the
// same QueryResult again reuses its memory. Instances keep the server's order.
type QueryResult struct {
	Instances []InstanceHit
}

// Instance returns the hit of the instance with the given id, or nil.
func (r *QueryResult) Instance(id string) *InstanceHit {
	for i := range r.Instances {
		if r.Instances[i].InstanceID == id {
			return &r.Instances[i]
		}
	}
	return nil
}

// Rank returns the entry for rank, or nil.
func (h *InstanceHit) Rank(rank int64) *RankHit {
	for i := range h.Ranks {
		if h.Ranks[i].Rank == rank {
			return &h.Ranks[i]
		}
	}
	return nil
}

// DecodeQueryResult decodes a POST /query body into res, reusing res's slices and, when
// the same instances come back in the same order, their id strings: repeated queries
// decode without allocating.
//
// It is hand-written, unlike the management views (views_gen.go): /query is the hot
// path, and a msgp-generated decoder of the same body (instances and per-rank maps) made
// 40 allocations per decode of an 8-instance, 2-rank answer into a reused value, where
// this one makes none (TestDecodeQueryResultReuseNoAllocs). It also merges "dp" and
// "rank_matches" into one sorted Ranks slice and accepts upstream's tier names, which
// generated code cannot express: "npu" (the current C++ server's device tier) and the
// three-tier server's "gpu" and "cpu" (device, and Mooncake Store's shared pool), so that
// the CLI and the benchmarks read those servers too (bench/upstream).
func DecodeQueryResult(res *QueryResult, b []byte) error {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return fmt.Errorf("query response: %w", err)
	}
	found := false
	for range n {
		var key []byte
		key, b, err = msgp.ReadMapKeyZC(b)
		if err != nil {
			return fmt.Errorf("query response key: %w", err)
		}
		if string(key) != "instances" {
			if b, err = msgp.Skip(b); err != nil {
				return fmt.Errorf("query response %q: %w", key, err)
			}
			continue
		}
		if b, err = res.decodeInstances(b); err != nil {
			return err
		}
		found = true
	}
	if !found {
		return errors.New("query response: missing instances")
	}
	return nil
}

func (res *QueryResult) decodeInstances(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		res.Instances = res.Instances[:0]
		return msgp.ReadNilBytes(b)
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, fmt.Errorf("instances: %w", err)
	}
	// Keep the old elements beyond len: their id strings and rank slices are reused.
	all := res.Instances[:cap(res.Instances)]
	if int(n) > len(all) {
		all = append(all, make([]InstanceHit, int(n)-len(all))...)
	}
	res.Instances = all[:n]
	for i := range res.Instances {
		h := &res.Instances[i]
		var id []byte
		id, b, err = msgp.ReadMapKeyZC(b)
		if err != nil {
			return b, fmt.Errorf("instances key: %w", err)
		}
		if h.InstanceID != string(id) {
			h.InstanceID = string(id)
		}
		if b, err = h.decode(b); err != nil {
			return b, fmt.Errorf("instances[%q].%w", id, err)
		}
	}
	return b, nil
}

func (h *InstanceHit) decode(b []byte) ([]byte, error) {
	h.LongestMatched = 0
	h.TierCounts = TierCounts{}
	h.Ranks = h.Ranks[:0]
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range n {
		var key []byte
		key, b, err = msgp.ReadMapKeyZC(b)
		if err != nil {
			return b, fmt.Errorf("key: %w", err)
		}
		// Tier keys are matched in this switch rather than in a shared helper: this loop
		// is most of decoding a query answer, which sits inside every measured round trip.
		// "npu", "gpu" and "cpu" are upstream's names (DecodeQueryResult).
		switch string(key) {
		case "longest_matched":
			h.LongestMatched, b, err = readInt(b)
		case "device", "npu", "gpu":
			h.Device, b, err = readInt(b)
		case "cpu_local":
			h.CPULocal, b, err = readInt(b)
		case "cpu_share", "cpu":
			h.CPUShare, b, err = readInt(b)
		case "disk":
			h.Disk, b, err = readInt(b)
		case "dp":
			b, err = h.decodeRanks(b, false)
		case "rank_matches":
			b, err = h.decodeRanks(b, true)
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, fmt.Errorf("%s: %w", key, err)
		}
	}
	return b, nil
}

// decodeRanks reads the "dp" map (rank -> device count) or, when tiers is set, the
// "rank_matches" map (rank -> tier map), merging both into h.Ranks by rank.
func (h *InstanceHit) decodeRanks(b []byte, tiers bool) ([]byte, error) {
	if msgp.IsNil(b) {
		return msgp.ReadNilBytes(b)
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range n {
		var rank int64
		if rank, b, err = readRankKey(b); err != nil {
			return b, err
		}
		r := h.rankSlot(rank)
		if !tiers {
			r.inDP = true
			if r.DP, b, err = readInt(b); err != nil {
				return b, fmt.Errorf("%d: %w", rank, err)
			}
			continue
		}
		r.inRankMatches = true
		if b, err = decodeRankTiers(&r.TierCounts, b); err != nil {
			return b, fmt.Errorf("%d: %w", rank, err)
		}
	}
	return b, nil
}

// decodeRankTiers reads one rank's tier map (same keys as an instance's tiers).
func decodeRankTiers(t *TierCounts, b []byte) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, fmt.Errorf("key: %w", err)
		}
		switch string(key) {
		case "device", "npu", "gpu":
			t.Device, b, err = readInt(b)
		case "cpu_local":
			t.CPULocal, b, err = readInt(b)
		case "cpu_share", "cpu":
			t.CPUShare, b, err = readInt(b)
		case "disk":
			t.Disk, b, err = readInt(b)
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, fmt.Errorf("%s: %w", key, err)
		}
	}
	return b, nil
}

// rankSlot finds or inserts rank, keeping Ranks sorted; instances have few ranks, so a
// linear scan beats anything cleverer.
func (h *InstanceHit) rankSlot(rank int64) *RankHit {
	i := 0
	for ; i < len(h.Ranks); i++ {
		if h.Ranks[i].Rank == rank {
			return &h.Ranks[i]
		}
		if h.Ranks[i].Rank > rank {
			break
		}
	}
	h.Ranks = append(h.Ranks, RankHit{})
	copy(h.Ranks[i+1:], h.Ranks[i:])
	h.Ranks[i] = RankHit{Rank: rank}
	return &h.Ranks[i]
}

// readRankKey reads a rank map key: the contract sends decimal strings, and an integer
// key (as older servers wrote) is accepted too.
func readRankKey(b []byte) (int64, []byte, error) {
	if t := msgp.NextType(b); t == msgp.IntType || t == msgp.UintType {
		return readInt(b)
	}
	key, o, err := msgp.ReadMapKeyZC(b)
	if err != nil {
		return 0, b, fmt.Errorf("rank key: %w", err)
	}
	v, ok := parseDecimal(key)
	if !ok {
		return 0, b, fmt.Errorf("rank key %q is not a decimal integer", key)
	}
	return v, o, nil
}

// parseDecimal parses an optionally negative decimal integer without converting key to a
// string, which would allocate on this hot path.
func parseDecimal(s []byte) (int64, bool) {
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg, s = true, s[1:]
	}
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// readInt reads an integer that may be encoded signed or unsigned, or nil as 0. The
// encodings a server writes for counts are decoded inline, since a query answer is mostly
// integers; anything else goes to msgp for its range checks and its error.
func readInt(b []byte) (int64, []byte, error) {
	if len(b) > 0 {
		switch c := b[0]; {
		case c <= 0x7f: // positive fixint
			return int64(c), b[1:], nil
		case c >= 0xe0: // negative fixint
			return int64(int8(c)), b[1:], nil
		case c == 0xcc && len(b) >= 2: // uint8
			return int64(b[1]), b[2:], nil
		case c == 0xcd && len(b) >= 3: // uint16
			return int64(binary.BigEndian.Uint16(b[1:])), b[3:], nil
		case c == 0xce && len(b) >= 5: // uint32
			return int64(binary.BigEndian.Uint32(b[1:])), b[5:], nil
		case c == 0xd0 && len(b) >= 2: // int8
			return int64(int8(b[1])), b[2:], nil
		case c == 0xd1 && len(b) >= 3: // int16
			return int64(int16(binary.BigEndian.Uint16(b[1:]))), b[3:], nil
		case c == 0xd2 && len(b) >= 5: // int32
			return int64(int32(binary.BigEndian.Uint32(b[1:]))), b[5:], nil
		case c == 0xd3 && len(b) >= 9: // int64
			return int64(binary.BigEndian.Uint64(b[1:])), b[9:], nil
		case c == 0xc0: // nil
			return 0, b[1:], nil
		}
	}
	// uint64 (range-checked), truncated input and non-integers.
	return msgp.ReadInt64Bytes(b)
}

// DecodeRegisterResult decodes a POST /register success body.
func DecodeRegisterResult(b []byte) (RegisterResult, error) {
	var r RegisterResult
	return r, unmarshalBody(&r, b, "register response")
}

// DecodeUnregisterResult decodes a POST /unregister success body.
func DecodeUnregisterResult(b []byte) (UnregisterResult, error) {
	var r UnregisterResult
	err := unmarshalBody(&r, b, "unregister response")
	r.RemovedInstances = nonNil(r.RemovedInstances) // prints as [], as the server sent it, not null
	return r, err
}

// nonNil returns s, or an empty slice for nil (JSON prints it as [], not null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// DecodeServiceList decodes a GET /services body. No services is an empty, non-nil
// Services, which prints as [] in JSON (as the server sent it), not null.
func DecodeServiceList(b []byte) (ServiceList, error) {
	var l ServiceList
	err := unmarshalBody(&l, b, "services response")
	l.Services = nonNil(l.Services)
	return l, err
}

// DecodeGlobalView decodes a GET /global_view body. Empty lists (no contexts, an instance
// without ranks) are empty, non-nil slices, which print as [] in JSON, not null.
func DecodeGlobalView(b []byte) (GlobalView, error) {
	var g GlobalView
	err := unmarshalBody(&g, b, "global_view response")
	g.Contexts = nonNil(g.Contexts)
	for _, c := range g.Contexts {
		for id, ranks := range c.Instances {
			c.Instances[id] = nonNil(ranks) // prints as [], as the server sent it, not null
		}
	}
	return g, err
}

// unmarshalBody decodes a response body with v's generated decoder (views_gen.go), naming
// what in errors. Like the query decoder, it reads the one value and ignores what follows.
func unmarshalBody(v msgp.Unmarshaler, b []byte, what string) error {
	if _, err := v.UnmarshalMsg(b); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
