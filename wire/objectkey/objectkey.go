// Package objectkey parses the Mooncake Store object keys that a Mooncake `stored`/`removed`
// event carries back into the block hash the index keys on: the vLLM and vLLM-Ascend
// connector layouts (ParseVLLM), SGLang HiCache keys (ParseSGLang) and the hex
// connector_block_hash field (ParseConnectorBlockHash), reference notes §5.4–§5.5.
// Parsers work on the key bytes in place and allocate nothing.
package objectkey

import (
	"bytes"
	"errors"
)

// Object-key and connector-hash parse failures (reference notes §5.5, §5.4). The
// handler rejects the Mooncake event that carried the key.
var (
	// ErrUnrecognized means a key matches none of the vLLM / vLLM-Ascend
	// Mooncake connector layouts.
	ErrUnrecognized = errors.New("unrecognized vLLM/vLLM-Ascend object_key")
	// ErrSGLangKeyNoHash means the key has no isolated run of exactly 64 hex digits.
	ErrSGLangKeyNoHash = errors.New("SGLang object_key does not contain an isolated 64-hex hash")
	// ErrSGLangKeyPrefix means the 64-hex run is preceded by something other than '_'.
	ErrSGLangKeyPrefix = errors.New("SGLang hash must be separated from its namespace by '_'")
	// ErrSGLangKeySuffix means the 64-hex run is followed by something other than '_'.
	ErrSGLangKeySuffix = errors.New("SGLang hash must be followed by a '_' component suffix")
)

// The connector_block_hash parse failure (the key parsers' are above).
var (
	// ErrConnectorBlockHash means connector_block_hash is not an optional 0x plus an
	// even number (>= 16) of hex digits.
	ErrConnectorBlockHash = errors.New("connector_block_hash must be even-length hex with at least eight bytes")
)

// maxTail is how many trailing '@' fields the vLLM parser keeps. The longest layout
// anchored at the end (vLLM-Ascend: pcp, dcp, head_or_tp_rank, pp_rank, group,
// cache_role, cache_family, layer_id, hash, historical layer) spans 10 fields, so a
// match can never start before the window, however many fields a cache_prefix adds.
const maxTail = 16

// parts is the '@'-split tail of a key, held on the stack.
type parts struct {
	n    int // fields in the whole key
	off  int // index of p[0] in the whole key
	p    [maxTail][]byte
	kept int
}

func splitTail(key []byte) parts {
	var ps parts
	ps.n = 1
	for _, c := range key {
		if c == '@' {
			ps.n++
		}
	}
	end := len(key)
	for ps.kept < maxTail {
		i := bytes.LastIndexByte(key[:end], '@')
		ps.kept++
		ps.p[maxTail-ps.kept] = key[i+1 : end]
		if i < 0 {
			break
		}
		end = i
	}
	// Shift so that p[0] is the first kept field.
	copy(ps.p[:], ps.p[maxTail-ps.kept:])
	ps.off = ps.n - ps.kept
	return ps
}

// at returns field i of the whole key; ok is false outside the kept window.
func (ps *parts) at(i int) ([]byte, bool) {
	if i < ps.off || i >= ps.n {
		return nil, false
	}
	return ps.p[i-ps.off], true
}

func isHex(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
}

func nibble(c byte) uint64 {
	switch {
	case c <= '9':
		return uint64(c - '0')
	case c >= 'a':
		return uint64(c-'a') + 10
	default:
		return uint64(c-'A') + 10
	}
}

// hex64 reads 16 hex digits already known to be valid.
func hex64(h []byte) uint64 {
	var v uint64
	for _, c := range h[:16] {
		v = v<<4 | nibble(c)
	}
	return v
}

func strip0x(s []byte) []byte {
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		return s[2:]
	}
	return s
}

// isHashText: at least 8 bytes of hex, whole bytes only.
func isHashText(s []byte) bool {
	if len(s) < 16 || len(s)%2 != 0 {
		return false
	}
	for _, c := range s {
		if !isHex(c) {
			return false
		}
	}
	return true
}

// isDecimal mirrors std::from_chars into uint64: digits only, no sign, no overflow.
func isDecimal(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	var v uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
		d := uint64(c - '0')
		if v > (^uint64(0)-d)/10 {
			return false
		}
		v = v*10 + d
	}
	return true
}

func hasLabel(s []byte, label string) bool {
	return len(s) > len(label) && string(s[:len(label)]) == label
}

func hasDecimalLabel(s []byte, label string) bool {
	return len(s) >= len(label) && string(s[:len(label)]) == label && isDecimal(s[len(label):])
}

func (ps *parts) label(i int, label string) bool {
	s, ok := ps.at(i)
	return ok && hasLabel(s, label)
}

func (ps *parts) decimalLabel(i int, label string) bool {
	s, ok := ps.at(i)
	return ok && hasDecimalLabel(s, label)
}

// optLabel is an optional labelled field; decimal: a number follows the label.
type optLabel struct {
	label   string
	decimal bool
}

// optionalLabels are the optional fields of the vLLM layouts, in the order they stand in.
var optionalLabels = [...]optLabel{
	{"pp_rank:", true}, {"group:", true}, {"cache_role:", false}, {"cache_family:", false}, {"layer_id:", true},
}

// skipLabels steps c over those of labels that stand, in their order, from field c on
// and before field end, and returns the field after them.
func (ps *parts) skipLabels(c, end int, labels []optLabel) int {
	for _, l := range labels {
		if c < end && (l.decimal && ps.decimalLabel(c, l.label) || !l.decimal && ps.label(c, l.label)) {
			c++
		}
	}
	return c
}

func (ps *parts) vllmHash(i int) bool {
	s, ok := ps.at(i)
	return ok && isHashText(strip0x(s))
}

// projectLow64 returns the last 16 hex digits of a field already checked by vllmHash.
func (ps *parts) projectLow64(i int) uint64 {
	s, _ := ps.at(i)
	s = strip0x(s)
	return hex64(s[len(s)-16:])
}

// ParseVLLM parses a vLLM MooncakeStoreConnector or vLLM-Ascend
// AscendStoreConnector Store key (fields separated by '@') and returns the projected
// low 64 bits of its block hash (the last 16 hex digits), the same value vLLM puts in
// its KV events. Layouts, tried in this order as upstream does:
//
//	model@HASH@rank, model@group@HASH@rank                  (compact Ascend layerwise)
//	[prefix@]model@tp_rank:N@pcpN@dcpN@pp_rank:N[@group:N][@cache_role:X][@cache_family:Y]@HASH
//	model@…@pcpN@dcpN@head_or_tp_rank:N[@pp_rank:N][@group:N][@cache_role:X][@cache_family:Y][@layer_id:N]@HASH
//	(or the historical …@HASH@layer)
//
// HASH is an optional 0x and an even number (>= 16) of hex digits. No allocation.
func ParseVLLM(key []byte) (hash uint64, err error) {
	ps := splitTail(key)
	n := ps.n
	if n == 3 || n == 4 {
		hashIdx := n - 2
		first, _ := ps.at(0)
		group, _ := ps.at(1)
		rank, _ := ps.at(n - 1)
		if len(first) > 0 && (n == 3 || isDecimal(group)) && ps.vllmHash(hashIdx) && isDecimal(rank) {
			return ps.projectLow64(hashIdx), nil
		}
	}
	if n < 6 {
		return 0, ErrUnrecognized
	}
	first := max(1, ps.off)
	last := n - 1
	for i := first; i < n; i++ {
		if !ps.decimalLabel(i, "tp_rank:") {
			continue
		}
		if i+3 >= last || !ps.decimalLabel(i+1, "pcp") || !ps.decimalLabel(i+2, "dcp") ||
			!ps.decimalLabel(i+3, "pp_rank:") {
			continue
		}
		// After pp_rank, the optional group, cache_role and cache_family, then the hash.
		if c := ps.skipLabels(i+4, last, optionalLabels[1:4]); c != last || !ps.vllmHash(last) {
			continue
		}
		return ps.projectLow64(last), nil
	}
	for i := first; i < n; i++ {
		if !ps.decimalLabel(i, "pcp") || i+2 >= n || !ps.decimalLabel(i+1, "dcp") ||
			!ps.decimalLabel(i+2, "head_or_tp_rank:") {
			continue
		}
		h := last
		if !ps.ascendLayout(i, h) {
			lastField, _ := ps.at(last)
			if last > i+3 && isDecimal(lastField) && ps.ascendLayout(i, last-1) {
				h = last - 1
			} else {
				continue
			}
		}
		return ps.projectLow64(h), nil
	}
	return 0, ErrUnrecognized
}

// ascendLayout reports whether fields i.. (pcp, dcp, head_or_tp_rank, then the
// optional labels in order) end exactly at a hash in field h.
func (ps *parts) ascendLayout(i, h int) bool {
	if h <= i+2 || !ps.vllmHash(h) {
		return false
	}
	return ps.skipLabels(i+3, h, optionalLabels[:]) == h
}

// ParseSGLang parses an SGLang HiCache Mooncake Store key: the first maximal
// run of exactly 64 hex digits is the page hash; it must start the key or follow '_',
// and end the key or be followed by '_'. logical_key is key[:logicalLen] (what the
// K/V/side-pool component keys of one page share) and the component suffix is
// key[logicalLen:]; the hash digits are key[logicalLen-64:logicalLen]. hash is the
// first 16 hex digits (SGLang's event id bits). No allocation.
func ParseSGLang(key []byte) (hash uint64, logicalLen int, err error) {
	const hexLen = 64
	start := -1
	for i := 0; i < len(key); {
		if !isHex(key[i]) {
			i++
			continue
		}
		j := i
		for j < len(key) && isHex(key[j]) {
			j++
		}
		if j-i == hexLen {
			start = i
			break
		}
		i = j
	}
	if start < 0 {
		return 0, 0, ErrSGLangKeyNoHash
	}
	end := start + hexLen
	if start > 0 && key[start-1] != '_' {
		return 0, 0, ErrSGLangKeyPrefix
	}
	if end < len(key) && key[end] != '_' {
		return 0, 0, ErrSGLangKeySuffix
	}
	return hex64(key[start:end]), end, nil
}

// ConnectorHash is a parsed Mooncake connector_block_hash.
type ConnectorHash struct {
	// Hex is the digits without the 0x prefix, in their original case (a sub-slice of
	// the input); compare with HexEqualFold.
	Hex []byte
	// Low64 is the last 16 hex digits: the vllm_v1 projection.
	Low64 uint64
	// First64 is the first 16 hex digits: the sglang projection (for which Hex must
	// also be exactly 64 digits, equal to the object key's hash).
	First64 uint64
}

// ParseConnectorBlockHash parses connector_block_hash: an optional 0x/0X, then an
// even number (at least 16) of hex digits. No allocation.
func ParseConnectorBlockHash(s []byte) (ConnectorHash, error) {
	h := strip0x(s)
	if !isHashText(h) {
		return ConnectorHash{}, ErrConnectorBlockHash
	}
	return ConnectorHash{Hex: h, Low64: hex64(h[len(h)-16:]), First64: hex64(h)}, nil
}

// HexEqualFold reports whether two hex strings are equal ignoring ASCII case, the
// comparison the handler needs between connector_block_hash and a key's hash.
func HexEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'F' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'F' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
