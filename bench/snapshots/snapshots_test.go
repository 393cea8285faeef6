package snapshots

import (
	"bytes"
	"errors"
	"io"
	"testing"

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

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
