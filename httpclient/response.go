package httpclient

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// Decoders here are lenient where the request side is strict: unknown keys are skipped
// so that a newer server with extra fields still works with an older client, integers
// may arrive signed or unsigned, and nil reads as the zero value.

// RegisterResult is the body of a successful POST /register.
type RegisterResult struct {
	Status     string `json:"status"`
	InstanceID string `json:"instance_id"`
}

// UnregisterResult is the body of a successful POST /unregister; RemovedInstances holds
// service keys (instance|tenant|rank).
type UnregisterResult struct {
	Status           string   `json:"status"`
	RemovedInstances []string `json:"removed_instances"`
}

// Service is one entry of GET /services. The JSON names are the PascalCase keys the
// server sends, unlike the registration input.
type Service struct {
	Endpoint       string      `json:"Endpoint"`
	ReplayEndpoint string      `json:"ReplayEndpoint"`
	Type           string      `json:"Type"`
	ModelName      string      `json:"ModelName"`
	LoraName       string      `json:"LoraName"`
	TenantID       string      `json:"TenantID"`
	InstanceID     string      `json:"InstanceID"`
	BlockSize      int64       `json:"BlockSize"`
	DPRank         int64       `json:"DPRank"`
	CacheGroup     *int64      `json:"CacheGroup"`
	HashProfile    HashProfile `json:"HashProfile"`
}

// ServiceList is the body of GET /services.
type ServiceList struct {
	Count    int64     `json:"count"`
	Services []Service `json:"services"`
}

// ContextView is one indexed context of GET /global_view. Instances maps an instance id
// to the DP ranks registered for it.
type ContextView struct {
	ModelName   string             `json:"model_name"`
	LoraName    string             `json:"lora_name"`
	BlockSize   int64              `json:"block_size"`
	TenantID    string             `json:"tenant_id"`
	PrefixCount int64              `json:"prefix_count"`
	HashProfile HashProfile        `json:"hash_profile"`
	Instances   map[string][]int64 `json:"instances"`
}

// GlobalView is the body of GET /global_view.
type GlobalView struct {
	ContextCount int64         `json:"context_count"`
	Contexts     []ContextView `json:"contexts"`
}

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
		// "npu" is what the upstream C++ server calls the device tier; accepting it lets
		// the CLI read that server too.
		switch string(key) {
		case "longest_matched":
			h.LongestMatched, b, err = readInt(b)
		case "device", "npu":
			h.Device, b, err = readInt(b)
		case "cpu_local":
			h.CPULocal, b, err = readInt(b)
		case "cpu_share":
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
		case "device", "npu":
			t.Device, b, err = readInt(b)
		case "cpu_local":
			t.CPULocal, b, err = readInt(b)
		case "cpu_share":
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

// readString reads a str (or bin) value, or nil as "".
func readString(b []byte) (string, []byte, error) {
	if msgp.IsNil(b) {
		o, err := msgp.ReadNilBytes(b)
		return "", o, err
	}
	if msgp.NextType(b) == msgp.BinType {
		v, o, err := msgp.ReadBytesZC(b)
		return string(v), o, err
	}
	return msgp.ReadStringBytes(b)
}

// DecodeRegisterResult decodes a POST /register success body.
func DecodeRegisterResult(b []byte) (RegisterResult, error) {
	var r RegisterResult
	err := decodeMap(b, "register response", func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "status":
			r.Status, v, err = readString(v)
		case "instance_id":
			r.InstanceID, v, err = readString(v)
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
	return r, err
}

// DecodeUnregisterResult decodes a POST /unregister success body.
func DecodeUnregisterResult(b []byte) (UnregisterResult, error) {
	var r UnregisterResult
	err := decodeMap(b, "unregister response", func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "status":
			r.Status, v, err = readString(v)
		case "removed_instances":
			r.RemovedInstances, v, err = readStrings(v)
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
	return r, err
}

// DecodeServiceList decodes a GET /services body.
func DecodeServiceList(b []byte) (ServiceList, error) {
	var l ServiceList
	err := decodeMap(b, "services response", func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "count":
			l.Count, v, err = readInt(v)
		case "services":
			v, err = decodeArray(v, func(i int, v []byte) ([]byte, error) {
				l.Services = append(l.Services, Service{})
				return decodeService(&l.Services[len(l.Services)-1], v)
			})
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
	return l, err
}

func decodeService(s *Service, b []byte) ([]byte, error) {
	return decodeMapInto(b, func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "Endpoint":
			s.Endpoint, v, err = readString(v)
		case "ReplayEndpoint":
			s.ReplayEndpoint, v, err = readString(v)
		case "Type":
			s.Type, v, err = readString(v)
		case "ModelName":
			s.ModelName, v, err = readString(v)
		case "LoraName":
			s.LoraName, v, err = readString(v)
		case "TenantID":
			s.TenantID, v, err = readString(v)
		case "InstanceID":
			s.InstanceID, v, err = readString(v)
		case "BlockSize":
			s.BlockSize, v, err = readInt(v)
		case "DPRank":
			s.DPRank, v, err = readInt(v)
		case "CacheGroup":
			if msgp.IsNil(v) {
				s.CacheGroup = nil
				v, err = msgp.ReadNilBytes(v)
				break
			}
			var g int64
			g, v, err = readInt(v)
			s.CacheGroup = &g
		case "HashProfile":
			v, err = decodeProfile(&s.HashProfile, v)
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
}

func decodeProfile(p *HashProfile, b []byte) ([]byte, error) {
	return decodeMapInto(b, func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "strategy":
			p.Strategy, v, err = readString(v)
		case "algorithm":
			p.Algorithm, v, err = readString(v)
		case "python_hash_seed":
			p.PythonHashSeed, v, err = readString(v)
		case "root_digest":
			p.RootDigest, v, err = readString(v)
		case "index_projection":
			p.IndexProjection, v, err = readString(v)
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
}

// DecodeGlobalView decodes a GET /global_view body.
func DecodeGlobalView(b []byte) (GlobalView, error) {
	var g GlobalView
	err := decodeMap(b, "global_view response", func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "context_count":
			g.ContextCount, v, err = readInt(v)
		case "contexts":
			v, err = decodeArray(v, func(i int, v []byte) ([]byte, error) {
				g.Contexts = append(g.Contexts, ContextView{})
				return decodeContext(&g.Contexts[len(g.Contexts)-1], v)
			})
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
	return g, err
}

func decodeContext(c *ContextView, b []byte) ([]byte, error) {
	return decodeMapInto(b, func(key, v []byte) ([]byte, error) {
		var err error
		switch string(key) {
		case "model_name":
			c.ModelName, v, err = readString(v)
		case "lora_name":
			c.LoraName, v, err = readString(v)
		case "block_size":
			c.BlockSize, v, err = readInt(v)
		case "tenant_id":
			c.TenantID, v, err = readString(v)
		case "prefix_count":
			c.PrefixCount, v, err = readInt(v)
		case "hash_profile":
			v, err = decodeProfile(&c.HashProfile, v)
		case "instances":
			c.Instances = map[string][]int64{}
			v, err = decodeMapInto(v, func(id, v []byte) ([]byte, error) {
				ranks := []int64{}
				v, err := decodeArray(v, func(i int, v []byte) ([]byte, error) {
					r, v, err := readInt(v)
					ranks = append(ranks, r)
					return v, err
				})
				c.Instances[string(id)] = ranks
				return v, err
			})
		default:
			v, err = msgp.Skip(v)
		}
		return v, err
	})
}

// decodeMap decodes a top-level response map, naming what in errors.
func decodeMap(b []byte, what string, field func(key, v []byte) ([]byte, error)) error {
	if _, err := decodeMapInto(b, field); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// decodeMapInto walks a map, calling field for each key with the bytes at its value;
// field returns the bytes after the value. A nil map reads as empty.
func decodeMapInto(b []byte, field func(key, v []byte) ([]byte, error)) ([]byte, error) {
	if msgp.IsNil(b) {
		return msgp.ReadNilBytes(b)
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, fmt.Errorf("key: %w", err)
		}
		if b, err = field(key, b); err != nil {
			return b, fmt.Errorf("%s: %w", key, err)
		}
	}
	return b, nil
}

// decodeArray walks an array, calling elem for each element. A nil array reads as empty.
func decodeArray(b []byte, elem func(i int, v []byte) ([]byte, error)) ([]byte, error) {
	if msgp.IsNil(b) {
		return msgp.ReadNilBytes(b)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for i := range int(n) {
		if b, err = elem(i, b); err != nil {
			return b, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return b, nil
}

func readStrings(b []byte) ([]string, []byte, error) {
	out := []string{}
	b, err := decodeArray(b, func(i int, v []byte) ([]byte, error) {
		s, v, err := readString(v)
		out = append(out, s)
		return v, err
	})
	return out, b, err
}
