package fdtest

import (
	"os"
	"testing"
)

// With room 0 nothing opens, even when the table has holes; with room 2 exactly two
// descriptors open; the limit and the fillers are gone afterwards.
func TestWithRoom(t *testing.T) {
	// Make a hole below the highest descriptor.
	a, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Close()
	for _, room := range []int{0, 1, 2} {
		var opened []*os.File
		WithRoom(t, room, func() {
			for i := 0; i < room+2; i++ {
				f, err := os.Open("/dev/null")
				if err != nil {
					break
				}
				opened = append(opened, f)
			}
		})
		for _, f := range opened {
			f.Close()
		}
		if len(opened) != room {
			t.Errorf("room %d: opened %d", room, len(opened))
		}
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatalf("after WithRoom: %v", err)
	}
	f.Close()
}
