package loadgen

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/floor"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
)

// TestLoadgenGrid: against a real in-process conductor, every cell of a small grid sends
// queries whose answers match their shape exactly (hit = whole prompt on its owner,
// half = half of it, miss = nothing anywhere), and the index holds what was published.
func TestLoadgenGrid(t *testing.T) {
	c := target.StartInProcess(t)
	var progress bytes.Buffer
	res, err := Run(context.Background(), Config{
		Addr: c.Addr, Instances: 3, IndexedBlocks: 1500, BlockSize: 16, Hash: sim.VLLMHash("sha256", "0"),
		PromptTokens: []int{256, 1000}, Shapes: []Shape{ShapeHit, ShapeHalf, ShapeMiss}, Concurrency: []int{1, 2},
		Duration: 30 * time.Millisecond, Seed: 4, Progress: &progress,
		Sample: func() (uint64, time.Duration, error) {
			s, err := c.Sample()
			return s.RSSBytes, s.CPU, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Indexed prompts are whole 512-token runs: 2 runs = 64 blocks each, 24 prompts.
	if res.IndexedBlocks != 24*64 || res.PopulateSeconds <= 0 || res.RSSBytes == 0 {
		t.Fatalf("setup %+v", res)
	}
	if len(res.Cells) != 12 {
		t.Fatalf("%d cells, want 12", len(res.Cells))
	}
	for _, cell := range res.Cells {
		if cell.Queries < cell.Concurrency || cell.Wrong != 0 || cell.QPS <= 0 || cell.Latency.P50US <= 0 {
			t.Errorf("cell %+v", cell)
		}
	}
	if progress.Len() == 0 {
		t.Error("no progress output")
	}
}

// TestParseShape accepts the three shapes only.
func TestParseShape(t *testing.T) {
	for _, s := range []string{"hit", "half", "miss"} {
		if _, err := ParseShape(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseShape("full"); err == nil {
		t.Error("unknown shape accepted")
	}
}

// TestLoadgenMemoModes: cold and extend cells send each of their prompts exactly once,
// and every answer still matches its shape.
func TestLoadgenMemoModes(t *testing.T) {
	c := target.StartInProcess(t)
	res, err := Run(context.Background(), Config{
		Addr: c.Addr, Instances: 2, IndexedBlocks: 3000, BlockSize: 16, Hash: sim.VLLMHash("sha256_cbor", "0"),
		PromptTokens: []int{512}, Shapes: []Shape{ShapeHit, ShapeMiss}, Concurrency: []int{1, 2},
		Memo: []Memo{MemoCold, MemoExtend, MemoWarm}, ColdPrompts: 5, Duration: 20 * time.Millisecond, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cells) != 12 {
		t.Fatalf("%d cells, want 12", len(res.Cells))
	}
	for _, cell := range res.Cells {
		if cell.Wrong != 0 || (cell.Memo != MemoWarm && cell.Queries != 5) {
			t.Errorf("cell %+v", cell)
		}
	}
	if _, err := ParseMemo("hot"); err == nil {
		t.Error("unknown memo mode accepted")
	}
}

// TestLoadgenColdWarmup: the warm-up's prompts are asked before the cells and kept out of
// the cold cells, which share what is left (94 prompts indexed, 80 warmed up: 14 for 8
// cold and extend cells, one each); a warm-up that takes every prompt leaves cold cells
// none, which is an error, not a cell of warm prompts.
func TestLoadgenColdWarmup(t *testing.T) {
	c, err := target.InProcess(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	cfg := Config{
		Addr: c.Addr, Instances: 2, IndexedBlocks: 3000, BlockSize: 16, Hash: sim.VLLMHash("sha256_cbor", "0"),
		PromptTokens: []int{512}, Shapes: []Shape{ShapeHit, ShapeMiss}, Concurrency: []int{1, 2},
		Memo: []Memo{MemoCold, MemoExtend}, ColdPrompts: 5, ColdWarmup: 80, Duration: 20 * time.Millisecond, Seed: 7,
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cells) != 8 {
		t.Fatalf("%d cells, want 8", len(res.Cells))
	}
	for _, cell := range res.Cells {
		if cell.Wrong != 0 || cell.Queries != 1 {
			t.Errorf("cell %+v", cell)
		}
	}
	cfg.ColdWarmup = 1000
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "no unused indexed prompts") {
		t.Fatalf("a warm-up of every prompt: %v", err)
	}
}

// TestLoadgenByHash: the /query_by_hash mode gets the same exact answers for every shape,
// with 8-byte keys per block instead of 4-byte tokens (bin forms).
func TestLoadgenByHash(t *testing.T) {
	c := target.StartInProcess(t)
	bytesOf := map[bool]float64{}
	for _, byHash := range []bool{false, true} {
		res, err := Run(context.Background(), Config{
			Addr: c.Addr, Instances: 2, IndexedBlocks: 256, BlockSize: 16, Hash: sim.VLLMHash("sha256_cbor", "0"),
			PromptTokens: []int{1024}, Shapes: []Shape{ShapeHit, ShapeHalf, ShapeMiss}, Concurrency: []int{1},
			Duration: 20 * time.Millisecond, Seed: 5, BinaryTokens: true, ByHash: byHash, Model: "m" + map[bool]string{true: "h"}[byHash],
		})
		if err != nil {
			t.Fatal(err)
		}
		if !res.ByHash == byHash || len(res.Cells) != 3 {
			t.Fatalf("result %+v", res)
		}
		for _, cell := range res.Cells {
			if cell.Wrong != 0 || cell.Queries == 0 {
				t.Errorf("by_hash=%v cell %+v", byHash, cell)
			}
		}
		bytesOf[byHash] = res.Cells[0].RequestBytes
	}
	// 1024 tokens: 4096 bytes of tokens vs 64 blocks x 8 bytes of keys; the key
	// "block_hashes" is 3 bytes longer than "token_ids" and the model "mh" 1 longer than "m".
	if d := bytesOf[false] - bytesOf[true]; d != 4096-512-3-1 {
		t.Errorf("request bytes /query %v, /query_by_hash %v", bytesOf[false], bytesOf[true])
	}
}

// TestLoadgenMixedWidths: with mixed widths the index and the prompts agree (no wrong
// answer in any shape), and an array prompt really mixes the three widths: its size is
// what 20% fixint, 50% uint16 and 30% uint32 cost (0.2+1.5+1.5 = 3.2 bytes a token), not
// the uniform ids' (0.65*3+0.35*5 = 3.7).
func TestLoadgenMixedWidths(t *testing.T) {
	toks := sim.AppendPrompt(nil, 3, []uint32{1, 2, 3, 4}, 4*sim.TokensPerHashID, 0)
	MixWidths(toks)
	var fix, u16, u32 int
	for _, v := range toks {
		switch {
		case v < 0:
			t.Fatalf("negative id %d", v)
		case v < 128:
			fix++
		case v < 65536:
			u16++
		default:
			u32++
		}
	}
	if n := len(toks); fix < n/8 || fix > n*3/10 || u16 < n*4/10 || u16 > n*6/10 || u32 < n/5 || u32 > n*4/10 {
		t.Fatalf("widths of %d ids: %d fixint, %d uint16, %d uint32", n, fix, u16, u32)
	}
	c := target.StartInProcess(t)
	res, err := Run(context.Background(), Config{
		Addr: c.Addr, Instances: 2, IndexedBlocks: 256, BlockSize: 16, Hash: sim.VLLMHash("sha256_cbor", "0"),
		PromptTokens: []int{1024}, Shapes: []Shape{ShapeHit, ShapeHalf, ShapeMiss}, Concurrency: []int{1},
		Duration: 20 * time.Millisecond, Seed: 5, MixedWidths: true, Model: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.MixedWidths || len(res.Cells) != 3 {
		t.Fatalf("result %+v", res)
	}
	for _, cell := range res.Cells {
		if cell.Wrong != 0 || cell.Queries == 0 {
			t.Errorf("cell %+v", cell)
		}
		if perToken := cell.RequestBytes / 1024; perToken < 3.0 || perToken > 3.45 {
			t.Errorf("%s: %.2f request bytes a token, want about 3.2", cell.Shape, perToken)
		}
	}
}

// TestLoadgenGrowth: with GrowTo, the first cell is measured idle and then while the
// fleet grows the index; every answer during the growth still matches, and the index
// holds the grown fleet's blocks at the end.
func TestLoadgenGrowth(t *testing.T) {
	c := target.StartInProcess(t)
	res, err := Run(context.Background(), Config{
		Addr: c.Addr, Instances: 2, IndexedBlocks: 1000, GrowTo: 6000, BlockSize: 16, Hash: sim.VLLMHash("sha256", "0"),
		PromptTokens: []int{512}, Shapes: []Shape{ShapeHit}, Concurrency: []int{1}, Duration: 20 * time.Millisecond, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := res.Growth
	// 512-token prompts are 32 blocks: 32 prompts indexed, 188 after the growth.
	if g == nil || g.FromBlocks != 32*32 || g.ToBlocks != 188*32 || g.Seconds <= 0 || g.BlocksPerSec <= 0 {
		t.Fatalf("growth %+v", g)
	}
	for _, cell := range []Cell{g.Idle, g.During} {
		if cell.Queries < 1 || cell.Wrong != 0 || cell.Latency.P50US <= 0 || cell.Shape != ShapeHit {
			t.Errorf("cell %+v", cell)
		}
	}
}

// TestLoadgenFloor: with a floor server, every cell is followed by its floor: the floor
// server answers as many requests as the floor cells report (each cold prompt once, as
// its cell sent them), reads every body in full, and answers with the conductor's own
// answer, which the floor measurement put there.
func TestLoadgenFloor(t *testing.T) {
	c := target.StartInProcess(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := floor.New()
	served := make(chan struct{})
	go func() { _ = fs.Serve(ln); close(served) }()
	defer func() { _ = fs.Shutdown(); <-served }()
	self := func() (uint64, time.Duration, error) {
		s, err := target.ReadProc(os.Getpid())
		return s.RSSBytes, s.CPU, err
	}
	res, err := Run(context.Background(), Config{
		Addr: c.Addr, Instances: 2, IndexedBlocks: 3000, BlockSize: 16, Hash: sim.VLLMHash("sha256_cbor", "0"),
		PromptTokens: []int{512}, Shapes: []Shape{ShapeHit, ShapeMiss}, Concurrency: []int{1, 2},
		Memo: []Memo{MemoCold, MemoWarm}, ColdPrompts: 5, Duration: 20 * time.Millisecond, Seed: 7, BinaryTokens: true,
		Sample: self, Floor: &Floor{Addr: ln.Addr().String(), Sample: self},
	})
	if err != nil {
		t.Fatal(err)
	}
	total, sent := 0, 0.0
	for _, cell := range res.Cells {
		if cell.Wrong != 0 || cell.FloorQueries < cell.Concurrency || cell.FloorCPUPerQueryUS <= 0 ||
			(cell.Memo == MemoCold && cell.FloorQueries != cell.Queries) {
			t.Errorf("cell %+v", cell)
		}
		total += cell.FloorQueries
		// Bin bodies of one length have one size.
		sent += float64(cell.FloorQueries) * cell.RequestBytes
	}
	if n := fs.Requests.Load(); n != int64(total) {
		t.Errorf("floor server answered %d requests, cells report %d", n, total)
	}
	// Bytes also holds the replies PUT (one per cell).
	if read := fs.Bytes.Load(); float64(read) < sent {
		t.Errorf("floor server read %d body bytes, the cells sent %.0f", read, sent)
	}
	// Its reply is the conductor's answer to the last cell's first prompt: a /query answer.
	cl, err := httpclient.New(ln.Addr().String(), httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got httpclient.QueryResult
	if err := cl.Query(&httpclient.QueryRequest{Model: "x", BlockSize: 16, TokenIDs: []int32{1}}, &got); err != nil {
		t.Fatalf("floor reply is not a /query answer: %v", err)
	}
	if len(got.Instances) != 2 {
		t.Errorf("floor reply names %d instances, want the conductor's 2", len(got.Instances))
	}
}

// TestSettleWaitsForAnIdleConductor: settle returns after the first window in which the
// conductor used under settleIdleShare of a CPU, and gives up (not settled) at its cap
// when every window is busy.
func TestSettleWaitsForAnIdleConductor(t *testing.T) {
	const window = 100 * time.Millisecond
	busy := 3 // windows of background work after the build
	var cpu time.Duration
	var slept time.Duration
	sleep := func(d time.Duration) {
		slept += d
		if busy > 0 {
			busy--
			cpu += window / 2 // half a CPU
		} else {
			cpu += window / 1000
		}
	}
	sample := func() (uint64, time.Duration, error) { return 0, cpu, nil }
	waited, ok := settle(sample, window, 10*window, sleep)
	if !ok || waited != 4*window || slept != waited {
		t.Fatalf("settle = %v, %v (slept %v); want idle after 4 windows", waited, ok, slept)
	}
	busy = 1 << 30
	if waited, ok := settle(sample, window, 10*window, sleep); ok || waited != 10*window {
		t.Fatalf("always busy: settle = %v, %v; want not settled at the cap", waited, ok)
	}
}
