package kvevent_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/publisher"
)

// evSeedPayloads are the fuzz seeds per publisher; TestWriteFuzzSeeds commits the
// same payloads under testdata/fuzz so `go test` replays them without -fuzz.
func evSeedPayloads(t testing.TB) map[publisher.Kind][][]byte {
	st, rm, cl := evVLLMStored(), evVLLMRemoved(), evCleared()
	return map[publisher.Kind][][]byte{
		publisher.VLLM: {
			evHex(t, evVecVLLMInt),
			evHex(t, evVecVLLMBytes),
			evHex(t, evVecVLLMLegacy),
			evBatch(evF64(1), evNil(), evHex(t, evVecVLLMOmitDefaults)),
			evMap{{"ts", evF64(2)}, {"events", evArr(st.enc(), cl.enc())}, {"data_parallel_rank", evU(1)}}.enc(),
			evBatch(evF64(1), evU(0), st.with("extra_keys", evArr(evNil(), evArr(evS("a")))).enc(),
				st.with("block_size", evS("x")).enc(), rm.enc(), evU(1), cl.with("medium", evNil()).enc()),
			evBatch(evF32(1), evNil(), st.plus("type", evS("BlockStored")).enc(), st.with("block_hashes", evArr(evBin(make([]byte, 32)))).enc()),
			// Positional events: the newest field list, an old prefix, a removal, a clear.
			evBatch(evF64(1), evU(0), evPositional(evVLLMStoredFull()), evPositional(st[:6]),
				evPositional(rm.with("group_idx", evU(0))), evPositional(cl), evVLLMStoredFull().enc()),
			// Token arrays long enough for tokenarray.DecodeVBMI, an integer after one.
			evBatch(evF64(1), evNil(), evPositional(st.with("token_ids", evTokens(60, 260))), st.with("token_ids", evTokens(0, 64)).enc()),
		},
		publisher.SGLang: {
			evHex(t, evVecSGLangLegacy),
			evHex(t, evVecSGLangSalted),
			evBatch(evF64(1), evU(0), evSGLangStored().enc(),
				evSGLangStored().with("token_ids", evArr(evArr(evU(1), evU(2)), evU(3))).with("cache_salt", evS("s")).enc(),
				evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evArr(evI(-1))}, {"medium", evS("CPU")}}.enc(), cl.enc()),
			evBatch(evF64(1), evU(0), evPositional(evSGLangStored().with("medium", evS("GPU")).
				with("metadata", evMap{{"cache_salt", evS("s")}, {"session_id", evNil()}}.enc())),
				evPositional(evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evArr(evI(-1))}}), evPositional(cl),
				evSGLangStored().with("lora_name", evS("a")).enc()),
			evBatch(evF64(1), evNil(), evSGLangStored().with("token_ids", evTokens(100, 300)).with("block_size", evU(200)).enc()),
		},
		publisher.Mooncake: {
			evBatch(evU(evMooncakeTS), evU(0), evMooncakeStored().enc(), evMooncakeRemoved().enc(), evMooncakeCommon("cleared").enc()),
			evBatch(evU(evMooncakeTS), evNil(), evMooncakeStored().with("seq_hashes", evUints(5)).with("block_hashes", evUints(5)).
				with("type", evS("BlockStored")).with("connector_block_hash", evS("0x0123456789abcdef")).enc(),
				evMooncakeStored().with("timestamp", evU(3)).enc()),
		},
	}
}

// evFingerprint renders a decode result completely (fmt calls Error on Err).
func evFingerprint(b *kvevent.Batch, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%+v", *b)
}

func evFuzzDecode(t *testing.T, kind publisher.Kind, payload, other []byte) {
	var d kvevent.Decoder
	b, err := d.Decode(kind, payload)
	if (b == nil) == (err == nil) {
		t.Fatalf("batch %v with error %v", b, err)
	}
	events, hashes, tokens, errs := d.BufferCaps()
	limit := 2*len(payload) + 64
	if events > limit || hashes > limit || tokens > limit || errs > limit {
		t.Fatalf("buffers grew to %d/%d/%d/%d for %d bytes", events, hashes, tokens, errs, len(payload))
	}
	fp := evFingerprint(b, err)
	if err == nil {
		evCheckBatch(t, kind, b)
	}
	evCheckSkipTokens(t, kind, payload, b, err)
	evCheckExactPath(t, kind, payload, fp)
	// Same answer from a decoder that has just decoded something else.
	var warm kvevent.Decoder
	warm.Decode(kind, other)
	if got := evFingerprint(warm.Decode(kind, payload)); got != fp {
		t.Fatalf("warm decoder differs:\n%s\n%s", got, fp)
	}
	if err != nil {
		return
	}
	// msgpack is prefix-free: a shorter or longer payload cannot be accepted.
	if _, err := d.Decode(kind, payload[:len(payload)-1]); err == nil {
		t.Fatal("truncated payload accepted")
	}
	if _, err := d.Decode(kind, append(payload[:len(payload):len(payload)], 0xc0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
}

// evCheckSkipTokens: a decoder with SkipTokenIDs, on the fast path or the exact one alone,
// accepts and rejects exactly what a full one does (batch and every event, same errors)
// and returns the same batch but for Event.TokenIDs and Event.LookaheadTokenIDs, which it
// leaves nil.
func evCheckSkipTokens(t *testing.T, kind publisher.Kind, payload []byte, full *kvevent.Batch, fullErr error) {
	t.Helper()
	var want string
	if fullErr != nil {
		want = evFingerprint(nil, fullErr)
	} else {
		cp := *full
		cp.Events = slices.Clone(full.Events)
		for i := range cp.Events {
			cp.Events[i].TokenIDs = nil
			cp.Events[i].LookaheadTokenIDs = nil
		}
		want = evFingerprint(&cp, nil)
	}
	// The fast path and the exact path alone (no tokenarray.DecodeVBMI) alike.
	for _, skip := range []*kvevent.Decoder{{SkipTokenIDs: true}, (&kvevent.Decoder{SkipTokenIDs: true}).WithoutVBMI()} {
		b, err := skip.Decode(kind, payload)
		if err == nil {
			for i := range b.Events {
				if b.Events[i].TokenIDs != nil || b.Events[i].LookaheadTokenIDs != nil {
					t.Fatalf("skipping decoder kept the token ids of event %d", i)
				}
			}
		}
		if got := evFingerprint(b, err); got != want {
			t.Fatalf("skipping decoder differs:\n%s\n%s", got, want)
		}
	}
}

// evCheckExactPath: a decoder whose token arrays take only the exact path (no
// tokenarray.DecodeVBMI) gives the batch (or error) fp; evCheckSkipTokens checks the
// same of skipping decoders.
func evCheckExactPath(t *testing.T, kind publisher.Kind, payload []byte, fp string) {
	t.Helper()
	if got := evFingerprint(new(kvevent.Decoder).WithoutVBMI().Decode(kind, payload)); got != fp {
		t.Fatalf("exact-path decoder differs:\n%s\n%s", got, fp)
	}
}

func evCheckBatch(t *testing.T, kind publisher.Kind, b *kvevent.Batch) {
	if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) || b.DPRank < 0 || (!b.HasDPRank && b.DPRank != 0) {
		t.Fatalf("envelope %+v", b)
	}
	for i := range b.Events {
		e := b.Events[i]
		if (e.Err == nil) == (e.Type == kvevent.EventInvalid) {
			t.Fatalf("event %d: type %v err %v", i, e.Type, e.Err)
		}
		if e.Err != nil {
			var ee *kvevent.EventError
			if !errors.As(e.Err, &ee) || ee.Index != i {
				t.Fatalf("event %d: error %v", i, e.Err)
			}
			e.Err = nil
			if !reflect.DeepEqual(e, kvevent.Event{}) {
				t.Fatalf("invalid event %d keeps fields %+v", i, e)
			}
			continue
		}
		switch kind {
		case publisher.Mooncake:
			if e.Timestamp != b.TSMillis || e.DPRank < 0 || e.BlockHashes != nil || e.TenantID == nil || e.BackendID == nil {
				t.Fatalf("mooncake event %d: %+v", i, e)
			}
			if e.Type == kvevent.EventAllBlocksCleared && (e.SeqHashes != nil || e.ObjectKey.Valid || e.GroupID.Valid) {
				t.Fatalf("mooncake cleared event %d has object fields", i)
			}
		default:
			if e.Type == kvevent.EventBlockStored && !e.BlockSize.Valid {
				t.Fatalf("event %d stored without block_size", i)
			}
			if kind == publisher.SGLang && e.Type == kvevent.EventBlockStored && e.BlockSize.Int <= 0 {
				t.Fatalf("event %d SGLang block_size %d", i, e.BlockSize.Int)
			}
			if e.Type == kvevent.EventAllBlocksCleared && (e.BlockHashes != nil || e.Medium.Valid) {
				t.Fatalf("cleared event %d has fields", i)
			}
			if e.SeqHashes != nil || e.TenantID != nil {
				t.Fatalf("engine event %d has Mooncake fields", i)
			}
		}
		if !e.HasTokenIDs && e.TokenIDs != nil {
			t.Fatalf("event %d tokens without HasTokenIDs", i)
		}
	}
}

func evFuzz(f *testing.F, kind publisher.Kind) {
	seeds := evSeedPayloads(f)[kind]
	for _, s := range seeds {
		f.Add(s)
	}
	other := seeds[0]
	f.Fuzz(func(t *testing.T, payload []byte) { evFuzzDecode(t, kind, payload, other) })
}

func FuzzDecodeVLLM(f *testing.F)     { evFuzz(f, publisher.VLLM) }
func FuzzDecodeSGLang(f *testing.F)   { evFuzz(f, publisher.SGLang) }
func FuzzDecodeMooncake(f *testing.F) { evFuzz(f, publisher.Mooncake) }

// TestWriteFuzzSeeds rewrites the committed seed corpora from the builders above;
// run with EV_WRITE_FUZZ_SEEDS=1 after changing them.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("EV_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set EV_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz seeds")
	}
	write := func(target string, i int, data []byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	names := map[publisher.Kind]string{
		publisher.VLLM: "FuzzDecodeVLLM", publisher.SGLang: "FuzzDecodeSGLang", publisher.Mooncake: "FuzzDecodeMooncake",
	}
	for kind, payloads := range evSeedPayloads(t) {
		for i, p := range payloads {
			write(names[kind], i, p)
		}
	}
}
