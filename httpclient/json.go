package httpclient

import (
	"encoding/json"
	"strconv"
)

// MarshalJSON writes the result in the contract's shape, {"instances": {id: {...}}},
// rather than the flattened Go layout, so scripts see the same keys as the msgpack body:
// longest_matched, dp and rank_matches (keyed by decimal rank strings), then the tiers.
func (r QueryResult) MarshalJSON() ([]byte, error) {
	b := []byte(`{"instances":{`)
	for i := range r.Instances {
		h := &r.Instances[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, h.InstanceID)
		b = append(b, `:{"longest_matched":`...)
		b = strconv.AppendInt(b, h.LongestMatched, 10)
		b = append(b, `,"dp":{`...)
		b = appendRanks(b, h.Ranks, func(rk *RankHit) bool { return rk.inDP }, func(b []byte, rk *RankHit) []byte {
			return strconv.AppendInt(b, rk.DP, 10)
		})
		b = append(b, `},"rank_matches":{`...)
		b = appendRanks(b, h.Ranks, func(rk *RankHit) bool { return rk.inRankMatches }, func(b []byte, rk *RankHit) []byte {
			return append(appendJSONTiers(append(b, '{'), &rk.TierCounts), '}')
		})
		b = append(b, "},"...)
		b = appendJSONTiers(b, &h.TierCounts)
		b = append(b, '}')
	}
	return append(b, "}}"...), nil
}

func appendRankKey(b []byte, rank int64, first bool) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = strconv.AppendInt(b, rank, 10)
	return append(b, `":`...)
}

func appendJSONTiers(b []byte, t *TierCounts) []byte {
	b = append(b, `"device":`...)
	b = strconv.AppendInt(b, t.Device, 10)
	b = append(b, `,"cpu_local":`...)
	b = strconv.AppendInt(b, t.CPULocal, 10)
	b = append(b, `,"cpu_share":`...)
	b = strconv.AppendInt(b, t.CPUShare, 10)
	b = append(b, `,"disk":`...)
	return strconv.AppendInt(b, t.Disk, 10)
}

func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // a string always marshals; keep the output valid regardless
		return append(b, `""`...)
	}
	return append(b, q...)
}

// appendRanks appends, as "rank":value members, the ranks that in selects.
func appendRanks(b []byte, ranks []RankHit, in func(*RankHit) bool, value func([]byte, *RankHit) []byte) []byte {
	first := true
	for j := range ranks {
		rk := &ranks[j]
		if !in(rk) {
			continue
		}
		b = appendRankKey(b, rk.Rank, first)
		first = false
		b = value(b, rk)
	}
	return b
}
