package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// Snapshot stream format, version 2 (all integers little endian, strings as u32 length
// then bytes):
//
//	header   "CONDSNAP" u16 version
//	frames   u8 type, u32 payload length, payload
//	  'C' context: tenant, model, lora, i64 block size, strategy, algorithm, seed,
//	      projection, extra keys, lora path, u64 lookahead tokens, u32 n sources then
//	      n × (endpoint, u64 last applied sequence)
//	  'K' chunk of the last context: u32 n slots × (instance, i64 rank); u32 n entries ×
//	      (u64 key, u32 slot, u8 tiers); u32 n bindings × (source, backend, object, u8
//	      tier, u64 hash, u32 n components × component); u32 n journal ops × (u8 kind,
//	      u8 flags (1 retract, 2 clear shared), instance, i64 rank, u8 tier, u8 clear
//	      tiers, u32 n hashes × u64, source, backend, object, component, u8 shared tier,
//	      u64 hash): the changes applied since the previous chunk, applied before it
//	  'E' end: u64 contexts, u64 entries, u64 bindings
//	trailer  u32 CRC-32C of every byte before it
//
// A reader accepts nothing until it has checked the trailer (Read reads the whole
// stream first), so a truncated or corrupted stream loads nothing. Version 1 (earlier
// releases) is read too: its context frames end the profile at the projection (the
// fields of issue 25 hold their defaults).
const (
	snapshotMagic = "CONDSNAP"
	Version       = 2
	// versionNoProfileFields is the version whose context frames have no extra keys,
	// lora path and lookahead.
	versionNoProfileFields = 1
	frameContext           = 'C'
	frameChunk             = 'K'
	frameEnd               = 'E'
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a context's header in a snapshot.
type Header struct {
	Key     engine.ContextKey
	Profile hashing.Profile
	// Sequences: per source endpoint, the last event sequence number applied (where the
	// source numbers its batches); empty when unknown.
	Sequences map[string]uint64
}

// Writer encodes a snapshot stream.
type Writer struct {
	w       *bufio.Writer
	crc     hash.Hash32
	buf     []byte
	err     error
	n       [3]uint64 // contexts, entries, bindings
	written int64
}

// NewWriter starts a stream on w (the header is written at once).
func NewWriter(w io.Writer) *Writer {
	s := &Writer{w: bufio.NewWriterSize(w, 64<<10), crc: crc32.New(castagnoli)}
	h := append([]byte(snapshotMagic), 0, 0)
	binary.LittleEndian.PutUint16(h[len(snapshotMagic):], Version)
	s.write(h)
	return s
}

func (s *Writer) write(b []byte) {
	if s.err != nil {
		return
	}
	s.crc.Write(b)
	_, s.err = s.w.Write(b)
	s.written += int64(len(b))
}

func (s *Writer) frame(typ byte, payload []byte) {
	var h [5]byte
	h[0] = typ
	binary.LittleEndian.PutUint32(h[1:], uint32(len(payload)))
	s.write(h[:])
	s.write(payload)
}

func appendStr(b []byte, v string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// Context starts a context; the chunks that follow belong to it.
func (s *Writer) Context(c *Header) error {
	b := s.buf[:0]
	b = appendStr(b, c.Key.TenantID)
	b = appendStr(b, c.Key.ModelName)
	b = appendStr(b, c.Key.LoraName)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Key.BlockSize))
	b = appendStr(b, c.Profile.StrategyName())
	b = appendStr(b, c.Profile.AlgorithmName())
	b = appendStr(b, c.Profile.Seed)
	b = appendStr(b, c.Profile.ProjectionName())
	b = appendStr(b, c.Profile.ExtraKeysName())
	b = appendStr(b, c.Profile.LoraPath)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Profile.Lookahead))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Sequences)))
	for ep, seq := range c.Sequences {
		b = appendStr(b, ep)
		b = binary.LittleEndian.AppendUint64(b, seq)
	}
	s.buf = b
	s.frame(frameContext, b)
	s.n[0]++
	return s.err
}

// Chunk writes one snapshot step of the current context.
func (s *Writer) Chunk(ch *engine.SnapshotChunk) error {
	b := s.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ch.Slots)))
	for _, sl := range ch.Slots {
		b = appendStr(b, sl.InstanceID)
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(sl.DPRank)))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ch.Entries)))
	for _, e := range ch.Entries {
		b = binary.LittleEndian.AppendUint64(b, e.Key)
		b = binary.LittleEndian.AppendUint32(b, e.Slot)
		b = append(b, byte(e.Tiers))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ch.Bindings)))
	for _, x := range ch.Bindings {
		b = appendStr(b, x.Source)
		b = appendStr(b, x.Backend)
		b = appendStr(b, x.ObjectKey)
		b = append(b, byte(x.Tier))
		b = binary.LittleEndian.AppendUint64(b, x.Hash)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Components)))
		for _, c := range x.Components {
			b = appendStr(b, c)
		}
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ch.Journal)))
	for i := range ch.Journal {
		op := &ch.Journal[i]
		var flags byte
		if op.Retract {
			flags |= 1
		}
		if op.ClearShared {
			flags |= 2
		}
		b = append(b, byte(op.Kind), flags)
		b = appendStr(b, op.Slot.InstanceID)
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(op.Slot.DPRank)))
		b = append(b, byte(op.Tier), byte(op.ClearTiers))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(op.Hashes)))
		for _, h := range op.Hashes {
			b = binary.LittleEndian.AppendUint64(b, h)
		}
		b = appendStr(b, op.Source)
		b = appendStr(b, op.Backend)
		b = appendStr(b, op.ObjectKey)
		b = appendStr(b, op.Component)
		b = append(b, byte(op.SharedTier))
		b = binary.LittleEndian.AppendUint64(b, op.Hash)
	}
	s.buf = b
	s.frame(frameChunk, b)
	s.n[1] += uint64(len(ch.Entries))
	s.n[2] += uint64(len(ch.Bindings))
	return s.err
}

// Close writes the end frame and the checksum and flushes. It returns the stream's size.
func (s *Writer) Close() (int64, error) {
	b := s.buf[:0]
	for _, n := range s.n {
		b = binary.LittleEndian.AppendUint64(b, n)
	}
	s.frame(frameEnd, b)
	if s.err == nil {
		var t [4]byte
		binary.LittleEndian.PutUint32(t[:], s.crc.Sum32())
		_, s.err = s.w.Write(t[:])
		s.written += 4
	}
	if s.err == nil {
		s.err = s.w.Flush()
	}
	return s.written, s.err
}

// Visitor receives a verified snapshot in stream order.
type Visitor interface {
	Context(c *Header) error
	Chunk(c *Header, ch *engine.SnapshotChunk) error
}

// ErrCorrupt is a stream that fails its checksum or does not parse.
var ErrCorrupt = errors.New("snapshot stream is corrupt")

// Read reads a whole stream of at most limit bytes, checks its version and
// checksum, and only then hands its contexts and chunks to v.
func Read(r io.Reader, limit int64, v Visitor) (Stats, error) {
	var st Stats
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return st, fmt.Errorf("read snapshot: %w", err)
	}
	if int64(len(data)) > limit {
		return st, fmt.Errorf("snapshot is larger than the limit of %d bytes", limit)
	}
	st.Bytes = int64(len(data))
	if len(data) < len(snapshotMagic)+2+4 || string(data[:len(snapshotMagic)]) != snapshotMagic {
		return st, fmt.Errorf("%w: not a conductor snapshot", ErrCorrupt)
	}
	ver := binary.LittleEndian.Uint16(data[len(snapshotMagic):])
	if ver != Version && ver != versionNoProfileFields {
		return st, fmt.Errorf("snapshot version %d is not supported (this build reads %d and %d)", ver, versionNoProfileFields, Version)
	}
	body, trailer := data[:len(data)-4], data[len(data)-4:]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(trailer) {
		return st, fmt.Errorf("%w: checksum mismatch (truncated or damaged)", ErrCorrupt)
	}
	d := &dec{b: body[len(snapshotMagic)+2:]}
	var cur *Header
	var ch engine.SnapshotChunk
	for {
		if len(d.b) == 0 {
			return st, fmt.Errorf("%w: no end frame", ErrCorrupt)
		}
		typ := d.u8()
		n := d.u32()
		if d.err != nil || uint64(n) > uint64(len(d.b)) {
			return st, fmt.Errorf("%w: frame length", ErrCorrupt)
		}
		f := &dec{b: d.b[:n]}
		d.b = d.b[n:]
		switch typ {
		case frameContext:
			c, err := f.context(ver)
			if err != nil {
				return st, err
			}
			cur = c
			st.Contexts++
			if err := v.Context(cur); err != nil {
				return st, err
			}
		case frameChunk:
			if cur == nil {
				return st, fmt.Errorf("%w: chunk before any context", ErrCorrupt)
			}
			if err := f.chunk(&ch); err != nil {
				return st, err
			}
			st.Entries += int64(len(ch.Entries))
			st.Bindings += int64(len(ch.Bindings))
			if err := v.Chunk(cur, &ch); err != nil {
				return st, err
			}
		case frameEnd:
			c, e, b := f.u64(), f.u64(), f.u64()
			if f.err != nil || int64(c) != st.Contexts || int64(e) != st.Entries || int64(b) != st.Bindings || len(d.b) != 0 {
				return st, fmt.Errorf("%w: end frame does not match the stream", ErrCorrupt)
			}
			return st, nil
		default:
			return st, fmt.Errorf("%w: unknown frame type %d", ErrCorrupt, typ)
		}
	}
}

// Stats counts what a stream held.
type Stats struct {
	Bytes                       int64
	Contexts, Entries, Bindings int64
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) need(n int) bool {
	if d.err != nil {
		return false
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: short frame", ErrCorrupt)
		return false
	}
	return true
}

func (d *dec) u8() byte {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *dec) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) str() string {
	n := d.u32()
	if !d.need(int(n)) {
		return ""
	}
	v := string(d.b[:n])
	d.b = d.b[n:]
	return v
}

// count reads a count of items at least min bytes each, refusing counts the frame cannot hold.
func (d *dec) count(min int) int {
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(min) > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: count %d exceeds the frame", ErrCorrupt, n)
		return 0
	}
	return int(n)
}

func (d *dec) context(ver uint16) (*Header, error) {
	c := &Header{}
	c.Key.TenantID, c.Key.ModelName, c.Key.LoraName = d.str(), d.str(), d.str()
	c.Key.BlockSize = int64(d.u64())
	spec := hashing.Spec{Strategy: d.str(), Algorithm: d.str(), PythonHashSeed: d.str(), IndexProjection: d.str()}
	if ver != versionNoProfileFields {
		spec.ExtraKeys, spec.LoraPath = d.str(), d.str()
		look := d.u64()
		if look > hashing.MaxLookahead {
			look = hashing.MaxLookahead + 1 // out of range: ResolveSpec refuses it
		}
		spec.LookaheadTokens = int64(look)
	}
	n := d.count(12)
	c.Sequences = make(map[string]uint64, n)
	for range n {
		ep := d.str()
		c.Sequences[ep] = d.u64()
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: trailing bytes in a context frame", ErrCorrupt)
	}
	p, err := hashing.ResolveSpec(spec)
	if err == nil {
		err = p.CheckLora(c.Key.LoraName)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot context %s/%s: hash profile: %w", c.Key.TenantID, c.Key.ModelName, err)
	}
	c.Profile = p
	return c, nil
}

func (d *dec) chunk(ch *engine.SnapshotChunk) error {
	ch.Reset()
	n := d.count(12)
	for range n {
		ch.Slots = append(ch.Slots, engine.Slot{InstanceID: d.str(), DPRank: int(int64(d.u64()))})
	}
	n = d.count(13)
	for range n {
		e := engine.SnapshotEntry{Key: d.u64(), Slot: d.u32(), Tiers: engine.TierMask(d.u8())}
		if d.err == nil && (int(e.Slot) >= len(ch.Slots) || e.Tiers == 0 || e.Tiers&^engine.MaskAllEngine != 0) {
			return fmt.Errorf("%w: bad entry", ErrCorrupt)
		}
		ch.Entries = append(ch.Entries, e)
	}
	n = d.count(29)
	for range n {
		b := engine.SnapshotBinding{Source: d.str(), Backend: d.str(), ObjectKey: d.str(), Tier: engine.SharedTier(d.u8()), Hash: d.u64()}
		m := d.count(4)
		for range m {
			b.Components = append(b.Components, d.str())
		}
		ch.Bindings = append(ch.Bindings, b)
	}
	n = d.count(44)
	for range n {
		var op engine.SnapshotOp
		op.Kind = engine.OpKind(d.u8())
		flags := d.u8()
		op.Retract, op.ClearShared = flags&1 != 0, flags&2 != 0
		op.Slot = engine.Slot{InstanceID: d.str(), DPRank: int(int64(d.u64()))}
		op.Tier, op.ClearTiers = engine.EngineTier(d.u8()), engine.TierMask(d.u8())
		m := d.count(8)
		if m > 0 {
			op.Hashes = make([]uint64, m)
			for i := range op.Hashes {
				op.Hashes[i] = d.u64()
			}
		}
		op.Source, op.Backend, op.ObjectKey, op.Component = d.str(), d.str(), d.str(), d.str()
		op.SharedTier = engine.SharedTier(d.u8())
		op.Hash = d.u64()
		ch.Journal = append(ch.Journal, op)
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: trailing bytes in a chunk frame", ErrCorrupt)
	}
	return nil
}
