package snapshot

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// Snapshot stream format, version 2 (all integers little endian, strings as u32 length
// then bytes):
//
//	header   "CONDSNAP" u16 version
//	frames   u8 type, u32 payload length (at most MaxFrameBytes), payload
//	  'C' context: tenant, model, lora, i64 block size, strategy, algorithm, seed,
//	      projection, extra keys, lora path, u64 lookahead tokens, u32 n sources then
//	      n × (endpoint, u8 flags (1: the sequence cut
//	      below is known, 2: a shared (Mooncake) source), u64 last applied sequence,
//	      instance, i64 rank): the context's registered services when its copy began
//	  'K' chunk of the last context: u32 n slots × (instance, i64 rank); u32 n entries ×
//	      (u64 key, u32 slot, u8 tiers); u32 n bindings × (source, backend, object, u8
//	      tier, u64 hash, u32 n components × component); u32 n journal ops × (u8 kind,
//	      u8 flags (1 retract, 2 clear shared), instance, i64 rank, u8 tier, u8 clear
//	      tiers, u32 n hashes × u64, source, backend, object, component, u8 shared tier,
//	      u64 hash): the changes applied since the previous chunk, applied before it
//	  'E' end: u64 contexts, u64 entries, u64 bindings
//	trailer  u32 CRC-32C of every byte before the trailer, then the 32-byte HMAC-SHA256 of
//	         the same bytes under the snapshot key
//
// The checksum tells a damaged stream (ErrCorrupt); the HMAC tells a stream that was not
// made with this cluster's key (ErrUnauthenticated): in a cluster, the random key in the
// registry's cluster key, which only processes that can read the registry know; on a
// single node, a key derived from its admin token (KeyFromToken). A reader accepts
// nothing until it has checked both over the whole stream (Receive).
const (
	snapshotMagic = "CONDSNAP"
	// Version is the stream version this build writes and reads.
	Version      = 2
	frameContext = 'C'
	frameChunk   = 'K'
	frameEnd     = 'E'
	headerLen    = len(snapshotMagic) + 2
	trailerLen   = 4 + sha256.Size
	// MaxFrameBytes bounds one frame: a reader holds one frame at a time. A chunk is at
	// most DefaultSnapshotStep records and a journal of engine.MaxSnapshotJournal hashes.
	MaxFrameBytes = 512 << 20
)

// Source flags of a context frame.
const (
	sourceHasSeq = 1
	sourceShared = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a context's header in a snapshot.
type Header struct {
	Key     engine.ContextKey
	Profile hashing.Profile
	// Sources are the context's registered services when its copy began: where each
	// engine slot's and each shared source's entries came from, and the last batch of
	// that endpoint applied before the copy.
	Sources []Source
}

// Source is one registered service of a context in a snapshot.
type Source struct {
	// Endpoint is the service's publisher endpoint.
	Endpoint string
	// Shared is set for a Mooncake source (its bindings carry Endpoint as their
	// source); otherwise Slot is the engine slot the service registers.
	Shared bool
	Slot   engine.Slot
	// Seq is the last batch sequence number applied from Endpoint before the copy
	// began, when HasSeq (a source that has applied none has no cut).
	Seq    uint64
	HasSeq bool
}

// Sequences returns the known cuts by endpoint.
func (h *Header) Sequences() map[string]uint64 {
	out := make(map[string]uint64, len(h.Sources))
	for _, s := range h.Sources {
		if s.HasSeq {
			out[s.Endpoint] = s.Seq
		}
	}
	return out
}

// KeyFromToken derives the snapshot key of a single node from its admin token: a node
// loads only snapshots made by a node with the same token.
func KeyFromToken(token string) []byte {
	m := hmac.New(sha256.New, []byte("conductor snapshot key v1"))
	m.Write([]byte(token))
	return m.Sum(nil)
}

// Writer encodes a snapshot stream.
type Writer struct {
	w       *bufio.Writer
	crc     hash.Hash32
	mac     hash.Hash
	buf     []byte
	err     error
	n       [3]uint64 // contexts, entries, bindings
	written int64
}

// NewWriter starts a stream on w, signed with key (the header is written at once).
func NewWriter(w io.Writer, key []byte) *Writer {
	s := &Writer{w: bufio.NewWriterSize(w, 64<<10), crc: crc32.New(castagnoli), mac: hmac.New(sha256.New, key)}
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
	s.mac.Write(b)
	_, s.err = s.w.Write(b)
	s.written += int64(len(b))
}

func (s *Writer) frame(typ byte, payload []byte) {
	if len(payload) > MaxFrameBytes && s.err == nil {
		s.err = fmt.Errorf("snapshot frame of %d bytes is over the limit of %d", len(payload), MaxFrameBytes)
	}
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
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Sources)))
	for _, src := range c.Sources {
		b = appendStr(b, src.Endpoint)
		var flags byte
		if src.HasSeq {
			flags |= sourceHasSeq
		}
		if src.Shared {
			flags |= sourceShared
		}
		b = append(b, flags)
		b = binary.LittleEndian.AppendUint64(b, src.Seq)
		b = appendStr(b, src.Slot.InstanceID)
		b = binary.LittleEndian.AppendUint64(b, uint64(int64(src.Slot.DPRank)))
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
		t := binary.LittleEndian.AppendUint32(make([]byte, 0, trailerLen), s.crc.Sum32())
		t = s.mac.Sum(t)
		_, s.err = s.w.Write(t)
		s.written += int64(len(t))
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

// Errors of a stream that is refused.
var (
	// ErrCorrupt is a stream that fails its checksum or does not parse.
	ErrCorrupt = errors.New("snapshot stream is corrupt")
	// ErrUnauthenticated is a stream whose signature does not verify under the
	// reader's key: not made by a peer of this cluster (or a node with this token).
	ErrUnauthenticated = errors.New("snapshot is not signed with this cluster's snapshot key")
	// ErrTooLarge is a stream over the reader's size limit.
	ErrTooLarge = errors.New("snapshot is larger than the limit")
)

// ReceiveOptions bound and authenticate a received stream.
type ReceiveOptions struct {
	// MaxBytes bounds the stream (ErrTooLarge past it).
	MaxBytes int64
	// Key checks the stream's signature. Unauthenticated skips that check, for tools
	// that cannot know the key (conductorctl checks a file it saves); a loader never
	// sets it.
	Key             []byte
	Unauthenticated bool
	// Dir holds the temporary file ("" os.TempDir()).
	Dir string
}

// Spool is a received stream whose checksum (and signature) verified: its bytes in a
// temporary file that no other process can open (removed from its directory at once),
// read back frame by frame by Read. Close gives the file back.
type Spool struct {
	f    *os.File
	size int64
}

// Size is the stream's size.
func (s *Spool) Size() int64 { return s.size }

// Close releases the file.
func (s *Spool) Close() error { return s.f.Close() }

// Receive copies a stream from r into a temporary file, at most opts.MaxBytes, checking
// its header as soon as it arrives and its checksum and signature at its end, and
// returns it for Read. Memory stays bounded (a copy buffer); the disk holds at most
// MaxBytes. Nothing of a stream that does not verify is ever decoded.
func Receive(r io.Reader, opts ReceiveOptions) (*Spool, error) {
	f, err := os.CreateTemp(opts.Dir, "conductor-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("snapshot spool: %w", err)
	}
	// Unlinked at once: the open descriptor keeps the data; nothing is left behind by a
	// crash, and no one else can open it.
	_ = os.Remove(f.Name())
	sp := &Spool{f: f}
	if err := sp.fill(r, sp.f, opts); err != nil {
		_ = f.Close()
		return nil, err
	}
	return sp, nil
}

// OpenFile checks a snapshot file as Receive checks a stream, without copying it, and
// returns it for Read (Close closes f).
func OpenFile(f *os.File, opts ReceiveOptions) (*Spool, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	sp := &Spool{f: f}
	if err := sp.fill(f, io.Discard, opts); err != nil {
		return nil, err
	}
	return sp, nil
}

// Reader returns the whole stream, from its first byte (to send it on).
func (sp *Spool) Reader() io.Reader { return io.NewSectionReader(sp.f, 0, sp.size) }

// fill copies r into dst; every byte but the last trailerLen goes through the checksum
// and HMAC (the tail is held back until more arrives or the stream ends).
func (sp *Spool) fill(r io.Reader, dst io.Writer, opts ReceiveOptions) error {
	crc := crc32.New(castagnoli)
	mac := hmac.New(sha256.New, opts.Key)
	w := bufio.NewWriterSize(dst, 256<<10)
	buf := make([]byte, 256<<10)
	var tail []byte // the last up to trailerLen bytes seen, not yet hashed
	var head [headerLen]byte
	headN := 0
	lr := io.LimitReader(r, opts.MaxBytes+1)
	for {
		n, rerr := lr.Read(buf)
		if n > 0 {
			sp.size += int64(n)
			if sp.size > opts.MaxBytes {
				return fmt.Errorf("%w of %d bytes (max_snapshot_bytes)", ErrTooLarge, opts.MaxBytes)
			}
			chunk := buf[:n]
			if headN < headerLen {
				c := copy(head[headN:], chunk)
				headN += c
				if headN == headerLen {
					if err := checkHeader(head[:]); err != nil {
						return err
					}
				}
			}
			if _, err := w.Write(chunk); err != nil {
				return fmt.Errorf("snapshot spool: %w", err)
			}
			// Hash what can no longer be part of the trailer.
			all := len(tail) + len(chunk)
			if hashable := all - trailerLen; hashable > 0 {
				if hashable <= len(tail) {
					crc.Write(tail[:hashable])
					mac.Write(tail[:hashable])
					tail = append(tail[:0], tail[hashable:]...)
					tail = append(tail, chunk...)
				} else {
					crc.Write(tail)
					mac.Write(tail)
					k := hashable - len(tail)
					crc.Write(chunk[:k])
					mac.Write(chunk[:k])
					tail = append(tail[:0], chunk[k:]...)
				}
			} else {
				tail = append(tail, chunk...)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read snapshot: %w", rerr)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("snapshot spool: %w", err)
	}
	if headN < headerLen {
		return fmt.Errorf("%w: not a conductor snapshot", ErrCorrupt)
	}
	if sp.size < int64(headerLen+trailerLen) || len(tail) != trailerLen {
		return fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	if crc.Sum32() != binary.LittleEndian.Uint32(tail) {
		return fmt.Errorf("%w: checksum mismatch (truncated or damaged)", ErrCorrupt)
	}
	if !opts.Unauthenticated && !hmac.Equal(mac.Sum(nil), tail[4:]) {
		return ErrUnauthenticated
	}
	return nil
}

func checkHeader(h []byte) error {
	if string(h[:len(snapshotMagic)]) != snapshotMagic {
		return fmt.Errorf("%w: not a conductor snapshot", ErrCorrupt)
	}
	if ver := binary.LittleEndian.Uint16(h[len(snapshotMagic):]); ver != Version {
		return fmt.Errorf("%w: snapshot version %d is not supported (this build reads %d)", ErrCorrupt, ver, Version)
	}
	return nil
}

// Read decodes the spooled stream frame by frame (one frame in memory at a time) and
// hands its contexts and chunks to v in order; it stops at v's first error.
func (sp *Spool) Read(v Visitor) (Stats, error) {
	st := Stats{Bytes: sp.size}
	if _, err := sp.f.Seek(int64(headerLen), io.SeekStart); err != nil {
		return st, fmt.Errorf("snapshot spool: %w", err)
	}
	left := sp.size - int64(headerLen+trailerLen)
	r := bufio.NewReaderSize(io.LimitReader(sp.f, left), 256<<10)
	var cur *Header
	var ch engine.SnapshotChunk
	var payload []byte
	for {
		var fh [5]byte
		if _, err := io.ReadFull(r, fh[:]); err != nil {
			return st, fmt.Errorf("%w: no end frame", ErrCorrupt)
		}
		typ, n := fh[0], binary.LittleEndian.Uint32(fh[1:])
		left -= 5
		if n > MaxFrameBytes || int64(n) > left {
			return st, fmt.Errorf("%w: frame length %d", ErrCorrupt, n)
		}
		if cap(payload) < int(n) {
			payload = make([]byte, n)
		}
		payload = payload[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return st, fmt.Errorf("snapshot spool: %w", err)
		}
		left -= int64(n)
		f := &dec{b: payload}
		switch typ {
		case frameContext:
			c, err := f.context()
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
			if f.err != nil || int64(c) != st.Contexts || int64(e) != st.Entries || int64(b) != st.Bindings || left != 0 {
				return st, fmt.Errorf("%w: end frame does not match the stream", ErrCorrupt)
			}
			return st, nil
		default:
			return st, fmt.Errorf("%w: unknown frame type %d", ErrCorrupt, typ)
		}
	}
}

// Verify receives and decodes a whole stream without its signature and without applying
// anything (a tool's check of a file it saved or is about to send).
func Verify(r io.Reader, limit int64, dir string) (Stats, error) {
	sp, err := Receive(r, ReceiveOptions{MaxBytes: limit, Unauthenticated: true, Dir: dir})
	if err != nil {
		return Stats{}, err
	}
	defer sp.Close()
	return sp.Read(nopVisitor{})
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

// take consumes the frame's next n bytes; once the frame is short it returns nil and
// d.err says so.
func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: short frame", ErrCorrupt)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() byte {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *dec) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (d *dec) str() string {
	return string(d.take(int(d.u32())))
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

func (d *dec) context() (*Header, error) {
	c := &Header{}
	c.Key.TenantID, c.Key.ModelName, c.Key.LoraName = d.str(), d.str(), d.str()
	c.Key.BlockSize = int64(d.u64())
	spec := hashing.Spec{Strategy: d.str(), Algorithm: d.str(), PythonHashSeed: d.str(), IndexProjection: d.str(),
		ExtraKeys: d.str(), LoraPath: d.str()}
	look := d.u64()
	if look > hashing.MaxLookahead {
		look = hashing.MaxLookahead + 1 // out of range: ResolveSpec refuses it
	}
	spec.LookaheadTokens = int64(look)
	n := d.count(29)
	for range n {
		src := Source{Endpoint: d.str()}
		flags := d.u8()
		src.HasSeq, src.Shared = flags&sourceHasSeq != 0, flags&sourceShared != 0
		src.Seq = d.u64()
		src.Slot = engine.Slot{InstanceID: d.str(), DPRank: int(int64(d.u64()))}
		if d.err == nil && flags&^(sourceHasSeq|sourceShared) != 0 {
			return nil, fmt.Errorf("%w: bad source flags", ErrCorrupt)
		}
		c.Sources = append(c.Sources, src)
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
