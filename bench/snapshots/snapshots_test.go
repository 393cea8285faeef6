package snapshots

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"testing"
	"testing/iotest"

	"github.com/conductor-go/conductor/snapshot"
)

// TestWriteUseless: the stream is at least the size asked for, verifies under the key it
// was signed with and only under it, and holds entries of the one unregistered instance.
func TestWriteUseless(t *testing.T) {
	var buf bytes.Buffer
	key := snapshot.KeyFromToken("bench")
	n, err := WriteUseless(&buf, 300_000, key)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) || n < 300_000 || n > 300_000+200_000 {
		t.Fatalf("wrote %d bytes (buffer %d), want a little over 300000", n, buf.Len())
	}
	sp, err := snapshot.Receive(bytes.NewReader(buf.Bytes()), snapshot.ReceiveOptions{MaxBytes: 1 << 30, Key: key, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	st, err := sp.Read(discard{})
	if err != nil || st.Contexts != 1 || st.Entries < 300_000/16 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	_, err = snapshot.Receive(bytes.NewReader(buf.Bytes()), snapshot.ReceiveOptions{MaxBytes: 1 << 30, Key: snapshot.KeyFromToken("other"), Dir: t.TempDir()})
	if !errors.Is(err, snapshot.ErrUnauthenticated) {
		t.Fatalf("under another key: %v", err)
	}
}

// TestWatchedReader: the reader keeps the stream version and tells a body that ended
// with an error from one that ended with io.EOF.
func TestWatchedReader(t *testing.T) {
	var buf bytes.Buffer
	if _, err := WriteUseless(&buf, 1000, nil); err != nil {
		t.Fatal(err)
	}
	w := &watchedReader{r: io.MultiReader(bytes.NewReader(buf.Bytes()[:3]), bytes.NewReader(buf.Bytes()[3:]))}
	if _, err := io.Copy(io.Discard, w); err != nil || w.err != nil || w.version != snapshot.Version || w.n != int64(buf.Len()) {
		t.Fatalf("clean body: %v, %+v", err, w)
	}
	cut := &watchedReader{r: io.MultiReader(bytes.NewReader(buf.Bytes()[:100]), errReader{io.ErrUnexpectedEOF})}
	if _, err := io.Copy(io.Discard, cut); !errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(cut.err, io.ErrUnexpectedEOF) || cut.n != 100 {
		t.Fatalf("cut body: %v, %+v", err, cut)
	}
}

// TestWatchedReaderVersion1Checksum: read in pieces of any size, the reader keeps the
// CRC-32C of every byte but the last four, which a version 1 stream's trailer holds.
func TestWatchedReaderVersion1Checksum(t *testing.T) {
	body := append([]byte("CONDSNAP\x01\x00"), bytes.Repeat([]byte("frame bytes "), 1000)...)
	stream := binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
	for _, r := range []io.Reader{bytes.NewReader(stream), iotest.OneByteReader(bytes.NewReader(stream)), iotest.HalfReader(bytes.NewReader(stream))} {
		w := &watchedReader{r: r}
		if _, err := io.Copy(io.Discard, w); err != nil {
			t.Fatal(err)
		}
		if w.version != 1 || w.crc.Sum32() != binary.LittleEndian.Uint32(w.tail) || w.n != int64(len(stream)) {
			t.Fatalf("version %d, crc %x, tail %x, %d bytes", w.version, w.crc.Sum32(), w.tail, w.n)
		}
	}
	cut := &watchedReader{r: bytes.NewReader(stream[:len(stream)-100])}
	if _, err := io.Copy(io.Discard, cut); err != nil || cut.crc.Sum32() == binary.LittleEndian.Uint32(cut.tail) {
		t.Fatalf("a cut stream's checksum matches: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
