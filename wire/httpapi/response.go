package httpapi

import (
	"strconv"

	"github.com/tinylib/msgp/msgp"
)

// RankTiers is one DP rank's cumulative hit counts, in tokens.
type RankTiers struct {
	Rank                             int
	Device, CPULocal, CPUShare, Disk int64
}

// AppendStatusRegistered appends the POST /register success body.
func AppendStatusRegistered(dst []byte, instanceID string) []byte {
	dst = msgp.AppendMapHeader(dst, 2)
	dst = msgp.AppendString(dst, "status")
	dst = msgp.AppendString(dst, "registered successfully")
	dst = msgp.AppendString(dst, "instance_id")
	return msgp.AppendString(dst, instanceID)
}

// AppendStatusUnregistered appends the POST /unregister success body; key is the service
// key (instance|tenant|rank) that was removed.
func AppendStatusUnregistered(dst []byte, key string) []byte {
	dst = msgp.AppendMapHeader(dst, 2)
	dst = msgp.AppendString(dst, "status")
	dst = msgp.AppendString(dst, "unregistered successfully")
	dst = msgp.AppendString(dst, "removed_instances")
	dst = msgp.AppendArrayHeader(dst, 1)
	return msgp.AppendString(dst, key)
}

// The /query response's keys, msgpack-encoded once (fixstr header byte, then the
// text): a response of 8 instances writes about a hundred of them.
const (
	keyInstances      = "\xa9instances"
	keyLongestMatched = "\xaflongest_matched"
	keyDP             = "\xa2dp"
	keyRankMatches    = "\xacrank_matches"
	keyDevice         = "\xa6device"
	keyCPULocal       = "\xa9cpu_local"
	keyCPUShare       = "\xa9cpu_share"
	keyDisk           = "\xa4disk"
)

// AppendQueryResponseHeader opens a POST /query body {"instances": {...}} for exactly
// nInstances entries, each to be written with AppendInstanceHit. Streaming the entries
// lets the server encode straight from its result without building a map.
func AppendQueryResponseHeader(dst []byte, nInstances int) []byte {
	dst = msgp.AppendMapHeader(dst, 1)
	dst = append(dst, keyInstances...)
	return msgp.AppendMapHeader(dst, uint32(nInstances))
}

// AppendInstanceHit appends one entry of the "instances" map: the instance id, then its
// counts {longest_matched, dp, rank_matches, device, cpu_local, cpu_share, disk}. dp maps
// each rank to its device count and rank_matches to all four tiers; rank keys are
// decimal strings, as the contract requires of msgpack and JSON alike.
func AppendInstanceHit(dst []byte, id string, longest, device, cpuLocal, cpuShare, disk int64, ranks []RankTiers) []byte {
	dst = msgp.AppendString(dst, id)
	dst = msgp.AppendMapHeader(dst, 7)
	dst = append(dst, keyLongestMatched...)
	dst = msgp.AppendInt64(dst, longest)
	dst = append(dst, keyDP...)
	dst = msgp.AppendMapHeader(dst, uint32(len(ranks)))
	for i := range ranks {
		dst = appendRankKey(dst, ranks[i].Rank)
		dst = msgp.AppendInt64(dst, ranks[i].Device)
	}
	dst = append(dst, keyRankMatches...)
	dst = msgp.AppendMapHeader(dst, uint32(len(ranks)))
	for i := range ranks {
		r := &ranks[i]
		dst = appendRankKey(dst, r.Rank)
		dst = appendTiers(dst, r.Device, r.CPULocal, r.CPUShare, r.Disk, 4)
	}
	return appendTiers(dst, device, cpuLocal, cpuShare, disk, 0)
}

// appendTiers appends the four tier counts as map entries, preceded by a map header of
// size header when header is non-zero.
func appendTiers(dst []byte, device, cpuLocal, cpuShare, disk int64, header uint32) []byte {
	if header != 0 {
		dst = msgp.AppendMapHeader(dst, header)
	}
	dst = msgp.AppendInt64(append(dst, keyDevice...), device)
	dst = msgp.AppendInt64(append(dst, keyCPULocal...), cpuLocal)
	dst = msgp.AppendInt64(append(dst, keyCPUShare...), cpuShare)
	return msgp.AppendInt64(append(dst, keyDisk...), disk)
}

// appendRankKey appends rank as a msgpack str of its decimal digits without formatting
// into a temporary string: an int has at most 20 digits, so the header is always a
// one-byte fixstr, patched once the digits are written.
func appendRankKey(dst []byte, rank int) []byte {
	at := len(dst)
	dst = append(dst, 0xa0)
	dst = strconv.AppendInt(dst, int64(rank), 10)
	dst[at] = 0xa0 | byte(len(dst)-at-1)
	return dst
}
