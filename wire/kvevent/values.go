package kvevent

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
	"github.com/conductor-go/conductor/wire/internal/tokenarray"
	"github.com/conductor-go/conductor/wire/publisher"
)

// reader is the shared msgpack reader plus the field readers of the event formats.
type reader struct{ msgpack.Reader }

// hashMode says how one block hash is read.
type hashMode uint8

const (
	hashVLLM   hashMode = iota // uint, or bin >= 8 bytes (last 8 bytes big-endian)
	hashSGLang                 // int64, kept as its uint64 bit pattern
	hashUint                   // non-negative integer (Mooncake)
)

func (r *reader) readHash(mode hashMode) (uint64, error) {
	switch mode {
	case hashVLLM:
		if c, err := r.Peek(); err == nil && (c == 0xc4 || c == 0xc5 || c == 0xc6) {
			b, err := r.ReadBin()
			if err != nil {
				return 0, err
			}
			if len(b) < 8 {
				return 0, ErrEventOutOfRange
			}
			return binary.BigEndian.Uint64(b[len(b)-8:]), nil
		}
		return r.ReadUint64()
	case hashSGLang:
		// SGLang publishes signed int64; an unsigned value above MaxInt64 cannot
		// come from it and is refused, as upstream does.
		v, err := r.ReadInt64()
		return uint64(v), err
	default:
		return r.ReadUint64()
	}
}

// readHashes reads an array of hashes into the hash buffer. The array header was
// checked against the remaining bytes, so growing by n is bounded by the payload.
func (d *Decoder) readHashes(r *reader, mode hashMode) ([]uint64, error) {
	n, err := r.ReadArrayHeader()
	if err != nil {
		return nil, err
	}
	start := len(d.hashes)
	d.hashes = slices.Grow(d.hashes, n)[:start+n]
	dst := d.hashes[start : start+n : start+n]
	for i := range dst {
		h, err := r.readHash(mode)
		if err != nil {
			d.hashes = d.hashes[:start]
			return nil, err
		}
		dst[i] = h
	}
	return dst, nil
}

// readParent reads a nullable parent hash. vLLM bins of any length are accepted (the
// parent is informational); shorter than 8 bytes they are read whole.
func (r *reader) readParent(mode hashMode) (NullUint, error) {
	if r.ReadNil() {
		return NullUint{}, nil
	}
	if mode == hashVLLM {
		if c, err := r.Peek(); err == nil && (c == 0xc4 || c == 0xc5 || c == 0xc6) {
			b, err := r.ReadBin()
			if err != nil {
				return NullUint{}, err
			}
			if len(b) > 8 {
				b = b[len(b)-8:]
			}
			var v uint64
			for _, x := range b {
				v = v<<8 | uint64(x)
			}
			return NullUint{Uint: v, Valid: true}, nil
		}
	}
	h, err := r.readHash(mode)
	if err != nil {
		return NullUint{}, err
	}
	return NullUint{Uint: h, Valid: true}, nil
}

// readTokens reads nil or an int32 array; with pairs, elements may also be [a,b]
// SGLang bigram tuples, flattened in order.
func (d *Decoder) readTokens(r *reader, ev *Event, pairs bool) error {
	if r.ReadNil() {
		return nil
	}
	n, err := r.ReadArrayHeader()
	if err != nil {
		return err
	}
	if d.SkipTokenIDs {
		pairs, err := d.scanTokens(r, n, pairs)
		if err != nil {
			return err
		}
		ev.HasTokenIDs, ev.TokenPairs = true, pairs
		return nil
	}
	start := len(d.tokens)
	// n is bounded by the remaining bytes; a pair takes at least 3 bytes, so 2n
	// also covers flattened pairs.
	want := n
	if pairs {
		want = 2 * n
	}
	toks := slices.Grow(d.tokens, want)
	// The leading elements that every path decodes alike, a window at a time where the
	// CPU can (a vocabulary's ids all are); the loop below goes on from the first other
	// one, or the last few, and decides every error.
	i := 0
	if tokenarray.HasVBMI && !d.noVBMI && n >= tokenarray.MinElems {
		k, used := tokenarray.DecodeVBMI(r.Buf[r.Pos:], toks[len(toks):len(toks)+n])
		toks, r.Pos, i = toks[:len(toks)+k], r.Pos+used, k
	}
	buf, p := r.Buf, r.Pos
	for ; i < n; i++ {
		// Fast path: positive fixint and the unsigned widths msgspec writes for
		// vocabulary ids (uint8/16/32). Everything else goes through readInt.
		if p < len(buf) {
			c := buf[p]
			if c <= 0x7f {
				toks = append(toks, int32(c))
				p++
				continue
			}
			if c == 0xcd && p+3 <= len(buf) {
				toks = append(toks, int32(binary.BigEndian.Uint16(buf[p+1:])))
				p += 3
				continue
			}
			if c == 0xce && p+5 <= len(buf) {
				v := binary.BigEndian.Uint32(buf[p+1:])
				if v > math.MaxInt32 {
					r.Pos = p
					return ErrEventOutOfRange
				}
				toks = append(toks, int32(v))
				p += 5
				continue
			}
		}
		r.Pos = p
		if pairs && p < len(buf) && msgpack.IsArray(buf[p]) {
			m, err := r.ReadArrayHeader()
			if err != nil {
				return err
			}
			if m != 2 {
				return ErrEventWrongType
			}
			for j := 0; j < 2; j++ {
				t, err := readToken(r)
				if err != nil {
					return err
				}
				toks = append(toks, t)
			}
			ev.TokenPairs = true
		} else {
			t, err := readToken(r)
			if err != nil {
				return err
			}
			toks = append(toks, t)
		}
		p = r.Pos
	}
	r.Pos = p
	d.tokens = toks
	end := len(toks)
	ev.TokenIDs = toks[start:end:end]
	ev.HasTokenIDs = true
	return nil
}

// tokenSize is the encoded size of a token id whose lead byte is the index when the
// fast path of scanTokens may take it, else 0: every integer width that always fits
// int32 (fixints, uint8, uint16, int8, int16, int32) and uint32, whose range check is
// tokenHigh, the mask of the byte after the lead byte (a uint32 with its top bit set is
// above MaxInt32). uint64 and int64 take readToken's path.
var tokenSize, tokenHigh = func() (size, high [256]uint8) {
	for c := 0; c <= 0x7f; c++ {
		size[c] = 1
	}
	for c := 0xe0; c <= 0xff; c++ {
		size[c] = 1
	}
	size[0xcc], size[0xcd], size[0xce], high[0xce] = 2, 3, 5, 0x80
	size[0xd0], size[0xd1], size[0xd2] = 2, 3, 5
	return size, high
}()

// scanChunk is how many token ids the decoder's scratch takes per DecodeVBMI call when
// it only checks them (4 KiB; an event of 64 blocks of 16 tokens takes one call).
const scanChunk = 1024

// scanTokens checks n token ids (the array header is read) exactly as readTokens reads
// them, returning the same errors, but keeps nothing; it reports whether an SGLang
// [a,b] pair was seen. The leading ids that every path decodes alike go through
// DecodeVBMI into a scratch buffer, chunk by chunk while it takes any (on CPUs that run
// it); the loop goes on from there. Its fast path has no data-dependent branch: widths come
// from a table and the int32 range check is a mask, so a random mix of widths (token ids
// of a large vocabulary) costs no mispredictions.
func (d *Decoder) scanTokens(r *reader, n int, pairs bool) (sawPair bool, err error) {
	i := 0
	for tokenarray.HasVBMI && !d.noVBMI && n-i >= tokenarray.MinElems {
		if d.scratch == nil {
			d.scratch = make([]int32, scanChunk)
		}
		k, used := tokenarray.DecodeVBMI(r.Buf[r.Pos:], d.scratch[:min(n-i, scanChunk)])
		r.Pos, i = r.Pos+used, i+k
		if k == 0 {
			break
		}
	}
	buf, p := r.Buf, r.Pos
	for ; i < n; i++ {
		if p < len(buf) {
			c := buf[p]
			sz := int(tokenSize[c])
			if sz != 0 && sz <= len(buf)-p {
				if buf[min(p+1, len(buf)-1)]&tokenHigh[c] != 0 {
					r.Pos = p
					return false, ErrEventOutOfRange
				}
				p += sz
				continue
			}
		}
		r.Pos = p
		if pairs && p < len(buf) && msgpack.IsArray(buf[p]) {
			m, err := r.ReadArrayHeader()
			if err != nil {
				return false, err
			}
			if m != 2 {
				return false, ErrEventWrongType
			}
			for j := 0; j < 2; j++ {
				if _, err := readToken(r); err != nil {
					return false, err
				}
			}
			sawPair = true
		} else if _, err := readToken(r); err != nil {
			return false, err
		}
		p = r.Pos
	}
	r.Pos = p
	return sawPair, nil
}

func readToken(r *reader) (int32, error) {
	v, err := r.ReadInt64()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, ErrEventOutOfRange
	}
	return int32(v), nil
}

func (r *reader) readNullInt() (NullInt, error) {
	if r.ReadNil() {
		return NullInt{}, nil
	}
	v, err := r.ReadInt64()
	return NullInt{Int: v, Valid: err == nil}, err
}

func (r *reader) readNullStr() (NullBytes, error) {
	if r.ReadNil() {
		return NullBytes{}, nil
	}
	s, err := r.ReadStr()
	return NullBytes{Bytes: s, Valid: err == nil}, err
}

func (r *reader) readStrField() (NullBytes, error) {
	s, err := r.ReadStr()
	return NullBytes{Bytes: s, Valid: err == nil}, err
}

// readExtraKeys checks vLLM extra_keys: nil, or an array of nil-or-array entries.
func (r *reader) readExtraKeys(ev *Event, st *eventState) error {
	if r.ReadNil() {
		return nil
	}
	start := r.Pos
	n, err := r.ReadArrayHeader()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := r.Peek()
		if err != nil {
			return err
		}
		if c != 0xc0 && !msgpack.IsArray(c) {
			return ErrEventWrongType
		}
		if err := r.Skip(); err != nil {
			return err
		}
	}
	ev.ExtraKeys = r.Buf[start:r.Pos:r.Pos]
	st.extraKeysN, st.hasExtraKeys = n, true
	return nil
}

// readLookahead reads vLLM lookahead_token_ids: nil, or an array of int32 arrays, all of
// one length, flattened into the token buffer (only checked with SkipTokenIDs).
func (d *Decoder) readLookahead(r *reader, ev *Event, st *eventState) error {
	if r.ReadNil() {
		return nil
	}
	n, err := r.ReadArrayHeader()
	if err != nil {
		return err
	}
	start := len(d.tokens)
	per := -1
	for i := 0; i < n; i++ {
		m, err := r.ReadArrayHeader()
		if err != nil {
			return err
		}
		if per >= 0 && m != per {
			d.tokens = d.tokens[:start]
			return ErrEventMismatch
		}
		per = m
		for j := 0; j < m; j++ {
			t, err := readToken(r)
			if err != nil {
				d.tokens = d.tokens[:start]
				return err
			}
			if !d.SkipTokenIDs {
				d.tokens = append(d.tokens, t)
			}
		}
	}
	if !d.SkipTokenIDs {
		end := len(d.tokens)
		ev.LookaheadTokenIDs = d.tokens[start:end:end]
	}
	ev.LookaheadPerBlock = max(per, 0)
	ev.HasLookahead = true
	st.lookaheadN = n
	return nil
}

// readMetadata reads the metadata map of SGLang's positional BlockStoredWithMetadata:
// cache_salt (and session_id) as nullable strings; other keys are skipped.
func (r *reader) readMetadata(ev *Event) error {
	n, err := r.ReadMapHeader()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := r.ReadStr()
		if err != nil {
			return err
		}
		switch string(key) {
		case "cache_salt":
			ev.CacheSalt, err = r.readNullStr()
		case "session_id":
			ev.SessionID, err = r.readNullStr()
		default:
			err = r.Skip()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeField decodes the value of one recognised key; an error leaves the reader
// anywhere inside the value (the caller rewinds).
func (d *Decoder) decodeField(kind publisher.Kind, r *reader, f field, ev *Event, st *eventState) error {
	var err error
	switch f {
	case efType:
		if kind == publisher.Mooncake {
			st.legacyTag, err = r.ReadStr()
		} else {
			st.tag, err = r.ReadStr()
		}
	case efEventType:
		st.tag, err = r.ReadStr()
	case efBlockHashes:
		switch kind {
		case publisher.VLLM:
			ev.BlockHashes, err = d.readHashes(r, hashVLLM)
		case publisher.SGLang:
			ev.BlockHashes, err = d.readHashes(r, hashSGLang)
		default:
			st.legacyHashes, err = d.readHashes(r, hashUint)
		}
	case efSeqHashes:
		ev.SeqHashes, err = d.readHashes(r, hashUint)
	case efParentBlockHash:
		switch kind {
		case publisher.VLLM:
			ev.ParentBlockHash, err = r.readParent(hashVLLM)
		case publisher.SGLang:
			ev.ParentBlockHash, err = r.readParent(hashSGLang)
		default:
			st.legacyParent, err = r.readParent(hashUint)
		}
	case efParentHash:
		ev.ParentBlockHash, err = r.readParent(hashUint)
	case efTokenIDs:
		err = d.readTokens(r, ev, kind == publisher.SGLang)
	case efBlockSize:
		if kind == publisher.Mooncake {
			ev.BlockSize, err = r.readNullInt()
		} else {
			var v int64
			v, err = r.ReadInt64()
			ev.BlockSize = NullInt{Int: v, Valid: err == nil}
		}
	case efLoraID:
		ev.LoraID, err = r.readNullInt()
	case efMedium:
		ev.Medium, err = r.readNullStr()
	case efLoraName:
		ev.LoraName, err = r.readNullStr()
	case efExtraKeys:
		err = r.readExtraKeys(ev, st)
	case efLookahead:
		err = d.readLookahead(r, ev, st)
	case efMetadata:
		err = r.readMetadata(ev)
	case efGroupIdx:
		ev.GroupIdx, err = r.readNullInt()
	case efSpecKind:
		ev.KVCacheSpecKind, err = r.readNullStr()
	case efSlidingWindow:
		ev.KVCacheSpecSlidingWindow, err = r.readNullInt()
	case efCacheSalt:
		ev.CacheSalt, err = r.readNullStr()
	case efSessionID:
		ev.SessionID, err = r.readNullStr()
	case efEventID:
		ev.EventID, err = r.ReadUint64()
	case efTimestamp:
		ev.Timestamp, err = r.ReadInt64()
	case efModelName:
		ev.ModelName, err = r.readNullStr()
	case efAdditionalSalt:
		ev.AdditionalSalt, err = r.readNullStr()
	case efTenantID:
		ev.TenantID, err = r.ReadStr()
	case efBackendID:
		ev.BackendID, err = r.ReadStr()
	case efDPRank:
		ev.DPRank, err = r.ReadInt64()
		if err == nil && ev.DPRank < 0 {
			err = ErrEventOutOfRange
		}
	case efGroupID:
		ev.GroupID, err = r.readNullStr()
	case efObjectKey:
		ev.ObjectKey, err = r.readStrField()
	case efConnectorBlockHash:
		ev.ConnectorBlockHash, err = r.readStrField()
	case efCachePrefix:
		ev.CachePrefix, err = r.readStrField()
	case efTPRank:
		ev.TPRank, err = r.readNullInt()
	case efHeadOrTPRank:
		ev.HeadOrTPRank, err = r.readNullInt()
	case efPCPRank:
		ev.PCPRank, err = r.readNullInt()
	case efDCPRank:
		ev.DCPRank, err = r.readNullInt()
	case efPPRank:
		ev.PPRank, err = r.readNullInt()
	case efLayerID:
		ev.LayerID, err = r.readNullInt()
	case efBaseBlockIdx:
		ev.BaseBlockIdx, err = r.readNullInt()
	}
	return err
}
