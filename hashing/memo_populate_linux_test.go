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

// tableBytes returns the memory of the entries and of the hints of m's current table.
func tableBytes(m *Memo) (ents, hints []byte) {
	tab := m.cur()
	return unsafe.Slice((*byte)(unsafe.Pointer(&tab.ents[0])), len(tab.ents)*memoLineBytes),
		unsafe.Slice((*byte)(unsafe.Pointer(&tab.hints[0])), len(tab.hints)*4)
}

// tableResident counts the resident pages of m's current table (entries and hints).
func tableResident(t *testing.T, m *Memo) (resident, pages int) {
	t.Helper()
	e, h := tableBytes(m)
	r1, p1 := residentPages(t, e)
	r2, p2 := residentPages(t, h)
	return r1 + r2, p1 + p2
}

// TestMemoPopulate: Populate makes every page of the memo resident (a fresh memo has
// none), and it changes no entry: a prompt memoised before it is served after it, whole,
// with the same keys. The memo spans several huge pages (THP backs the first writes'
// pages with 2 MiB ones), and the prompt writes two runs: some pages stay untouched.
func TestMemoPopulate(t *testing.T) {
	m := NewMemo(1 << 20)
	if m.region == nil {
		t.Skip("the memo's mapping failed; it is on the Go heap")
	}
	if e, h := tableBytes(m); len(e)+len(h) != m.Bytes() {
		t.Fatalf("table %d bytes, Bytes %d", len(e)+len(h), m.Bytes())
	}
	if res, _ := residentPages(t, m.region); res != 0 {
		t.Fatalf("a fresh memo has %d resident pages", res)
	}
	p := allProfiles(t)["cbor"]
	r := rand.New(rand.NewPCG(5, 6))
	toks := make([]int32, 16*16)
	for i := range toks {
		toks[i] = int32(r.IntN(150000))
	}
	var ch Chain
	first := runChain(&ch, m, &p, 16, "", "", toks, -1)
	resBefore, _ := tableResident(t, m)
	if err := m.Populate(); err != nil {
		t.Skipf("populate unsupported here: %v", err)
	}
	res, pages := tableResident(t, m)
	if res != pages || res <= resBefore {
		t.Fatalf("after Populate %d of %d pages resident (%d before)", res, pages, resBefore)
	}
	again := runChain(&ch, m, &p, 16, "", "", toks, -1)
	if !sameRun(first, again) || ch.MemoHits() != 16 {
		t.Fatalf("after Populate: same keys %v, %d of 16 blocks from the memo", sameRun(first, again), ch.MemoHits())
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
	want := plainRuns(&p, "", prompts)
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
