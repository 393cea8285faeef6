package hashing

import (
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the pages of b that are resident (mincore).
func residentPages(t *testing.T, b []byte) (resident, pages int) {
	t.Helper()
	ps := os.Getpagesize()
	vec := make([]byte, (len(b)+ps-1)/ps)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

// TestMemoPopulate: Populate makes every page of the memo resident (a fresh memo has
// none), and it changes no entry: a prompt memoised before it is served after it, whole,
// with the same keys.
func TestMemoPopulate(t *testing.T) {
	m := NewMemo(1 << 16)
	if m.region == nil {
		t.Skip("the memo's mapping failed; it is on the Go heap")
	}
	if got, want := len(m.region), m.Bytes(); got != want {
		t.Fatalf("mapping %d bytes, Bytes %d", got, want)
	}
	if res, _ := residentPages(t, m.region); res != 0 {
		t.Fatalf("a fresh memo has %d resident pages", res)
	}
	p := allProfiles(t)["cbor"]
	r := rand.New(rand.NewPCG(5, 6))
	toks := make([]int32, 16*64)
	for i := range toks {
		toks[i] = int32(r.IntN(150000))
	}
	var ch Chain
	first := runChain(&ch, m, &p, 16, "", "", toks, -1)
	resBefore, _ := residentPages(t, m.region)
	if err := m.Populate(); err != nil {
		t.Skipf("populate unsupported here: %v", err)
	}
	res, pages := residentPages(t, m.region)
	if res != pages || res <= resBefore {
		t.Fatalf("after Populate %d of %d pages resident (%d before)", res, pages, resBefore)
	}
	again := runChain(&ch, m, &p, 16, "", "", toks, -1)
	if !sameRun(first, again) || ch.MemoHits() != 64 {
		t.Fatalf("after Populate: same keys %v, %d of 64 blocks from the memo", sameRun(first, again), ch.MemoHits())
	}
	var nilMemo *Memo
	if nilMemo.Populate() != nil || nilMemo.Bytes() != 0 {
		t.Fatal("a nil memo populates with an error or has bytes")
	}
}

// TestMemoPopulateWhileInUse: Populate running beside chains that insert and read the
// memo changes none of their answers.
func TestMemoPopulateWhileInUse(t *testing.T) {
	p := allProfiles(t)["cbor"]
	r := rand.New(rand.NewPCG(10, 11))
	prompts := memoWorkload(r, 40, false)
	want := make([]chainRun, len(prompts))
	for i, toks := range prompts {
		want[i] = runChain(&Chain{}, nil, &p, 4, "", "", toks, -1)
	}
	m := NewMemo(1 << 20)
	errs := make(chan error, 1)
	go func() { errs <- m.Populate() }()
	var ch Chain
	for k := range 3 * len(prompts) {
		i := (k * 7) % len(prompts)
		if got := runChain(&ch, m, &p, 4, "", "", prompts[i], -1); !sameRun(want[i], got) {
			t.Fatalf("prompt %d differs while the memo is populated", i)
		}
	}
	if err := <-errs; err != nil {
		t.Logf("populate unsupported here: %v", err)
	}
}
