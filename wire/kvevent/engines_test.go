package kvevent_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Tests over testdata/engines: every payload the real vLLM 0.23–0.34 and SGLang
// 0.5.19–0.5.23 publishers sent (make vectors runs their own code), live and replayed,
// decodes, and each event's fields are what the engine put in it (the generator's
// generic decode of the same bytes, stored beside them).

type engineFile struct {
	Engine  string `json:"engine"`
	Version string `json:"version"`
	Facts   struct {
		EventForm string `json:"event_form"`
	} `json:"facts"`
	Structs map[string]json.RawMessage `json:"structs"`
	Events  []struct {
		ID           string     `json:"id"`
		Frames       [][]string `json:"frames"`
		ReplayFrames [][]string `json:"replay_frames"`
		Decoded      []any      `json:"decoded"`
	} `json:"event_cases"`
}

// fieldsOf returns a struct's declaration order from the file's structs.
func (f *engineFile) fieldsOf(t *testing.T, name string) []string {
	t.Helper()
	var s struct {
		Fields []string `json:"fields"`
	}
	raw, ok := f.Structs[name]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s.Fields
}

// asMap is an event of the generic decode as field → value, positional ones named by the
// release's struct (SGLang's 8th element is BlockStoredWithMetadata's metadata).
func (f *engineFile) asMap(t *testing.T, ev any) map[string]any {
	t.Helper()
	if m, ok := ev.(map[string]any); ok {
		return m
	}
	arr := ev.([]any)
	tag := arr[0].(string)
	fields := f.fieldsOf(t, tag)
	if meta := f.fieldsOf(t, "BlockStoredWithMetadata"); tag == "BlockStored" && len(arr)-1 > len(fields) && meta != nil {
		fields = meta
	}
	m := map[string]any{"type": tag}
	for i, v := range arr[1:] {
		m[fields[i]] = v
	}
	if meta, ok := m["metadata"].(map[string]any); ok {
		m["cache_salt"] = meta["cache_salt"]
	}
	return m
}

func loadEngineFiles(t *testing.T) []*engineFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "testdata", "engines", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no engine vectors: %v", err)
	}
	var out []*engineFile
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var f engineFile
		if err := dec.Decode(&f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, &f)
	}
	return out
}

// wantHash is a generic block hash as the index keys it: an int's bit pattern, or a
// digest's last 8 bytes.
func wantHash(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case json.Number:
		if strings.HasPrefix(string(x), "-") {
			i, err := x.Int64()
			if err != nil {
				t.Fatal(err)
			}
			return uint64(i)
		}
		var u uint64
		if err := json.Unmarshal([]byte(x), &u); err != nil {
			t.Fatal(err)
		}
		return u
	case map[string]any:
		b, err := hex.DecodeString(x["bytes_hex"].(string))
		if err != nil || len(b) < 8 {
			t.Fatalf("hash %v", x)
		}
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	t.Fatalf("hash of type %T", v)
	return 0
}

func wantInt(t *testing.T, v any) int64 {
	t.Helper()
	i, err := v.(json.Number).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// wantTokens flattens token ids ([a, b] pairs included).
func wantTokens(t *testing.T, v any) (out []int32, pairs bool) {
	t.Helper()
	for _, x := range v.([]any) {
		if p, ok := x.([]any); ok {
			pairs = true
			for _, y := range p {
				out = append(out, int32(wantInt(t, y)))
			}
			continue
		}
		out = append(out, int32(wantInt(t, x)))
	}
	return out, pairs
}

func checkNullStr(t *testing.T, where, field string, got kvevent.NullBytes, want any, present bool) {
	t.Helper()
	s, isStr := want.(string)
	if !present || want == nil {
		if got.Valid {
			t.Errorf("%s: %s %q, engine sent none", where, field, got.Bytes)
		}
		return
	}
	if !isStr || !got.Valid || string(got.Bytes) != s {
		t.Errorf("%s: %s %q (valid %v), engine sent %v", where, field, got.Bytes, got.Valid, want)
	}
}

func checkEvent(t *testing.T, where string, kind publisher.Kind, got *kvevent.Event, want map[string]any) {
	t.Helper()
	if got.Err != nil {
		t.Errorf("%s: rejected: %v", where, got.Err)
		return
	}
	if got.Type.String() != want["type"] {
		t.Errorf("%s: type %s, want %v", where, got.Type, want["type"])
		return
	}
	if hs, ok := want["block_hashes"].([]any); ok {
		if len(hs) != len(got.BlockHashes) {
			t.Errorf("%s: %d hashes, want %d", where, len(got.BlockHashes), len(hs))
			return
		}
		for i, h := range hs {
			if got.BlockHashes[i] != wantHash(t, h) {
				t.Errorf("%s: hash %d = %d, want %v", where, i, got.BlockHashes[i], h)
			}
		}
	}
	if p, ok := want["parent_block_hash"]; ok {
		if (p == nil) == got.ParentBlockHash.Valid || (p != nil && got.ParentBlockHash.Uint != wantHash(t, p)) {
			t.Errorf("%s: parent %+v, want %v", where, got.ParentBlockHash, p)
		}
	}
	if toks, ok := want["token_ids"]; ok && toks != nil {
		wt, pairs := wantTokens(t, toks)
		if len(wt) != len(got.TokenIDs) || pairs != got.TokenPairs {
			t.Errorf("%s: %d tokens (pairs %v), want %d (%v)", where, len(got.TokenIDs), got.TokenPairs, len(wt), pairs)
		} else {
			for i := range wt {
				if wt[i] != got.TokenIDs[i] {
					t.Errorf("%s: token %d = %d, want %d", where, i, got.TokenIDs[i], wt[i])
					break
				}
			}
		}
	}
	if bs, ok := want["block_size"]; ok && got.BlockSize.Int != wantInt(t, bs) {
		t.Errorf("%s: block_size %d, want %v", where, got.BlockSize.Int, bs)
	}
	if id, ok := want["lora_id"]; ok && (id == nil) == got.LoraID.Valid {
		t.Errorf("%s: lora_id %+v, want %v", where, got.LoraID, id)
	}
	m, present := want["medium"]
	checkNullStr(t, where, "medium", got.Medium, m, present)
	ln, present := want["lora_name"]
	checkNullStr(t, where, "lora_name", got.LoraName, ln, present)
	if kind == publisher.SGLang {
		cs, present := want["cache_salt"]
		checkNullStr(t, where, "cache_salt", got.CacheSalt, cs, present)
	}
	if g, ok := want["group_idx"]; ok && g != nil && (!got.GroupIdx.Valid || got.GroupIdx.Int != wantInt(t, g)) {
		t.Errorf("%s: group_idx %+v, want %v", where, got.GroupIdx, g)
	}
	if ek, ok := want["extra_keys"].([]any); ok {
		// The raw array the decoder kept re-decodes to the engine's entries.
		if got.ExtraKeys == nil {
			t.Errorf("%s: extra_keys lost", where)
		} else if n := len(ek); n != len(got.BlockHashes) {
			t.Errorf("%s: %d extra_keys for %d hashes", where, n, len(got.BlockHashes))
		}
		var salt any
		if first, ok := ek[0].([]any); ok && len(first) > 0 {
			salt = first[len(first)-1]
		}
		lora := ""
		if s, ok := want["lora_name"].(string); ok {
			lora = s
		}
		s, hasSalt, plain := kvevent.TextExtraKeys(got.ExtraKeys, []byte(lora))
		if !plain {
			t.Errorf("%s: extra_keys %v not read as lora/salt", where, ek)
		} else if hasSalt && salt != string(s) {
			t.Errorf("%s: salt %q, want %v", where, s, salt)
		}
	}
	if la, ok := want["lookahead_token_ids"].([]any); ok {
		var flat []int32
		for _, l := range la {
			ts, _ := wantTokens(t, l)
			flat = append(flat, ts...)
		}
		if !got.HasLookahead || len(flat) != len(got.LookaheadTokenIDs) || got.LookaheadPerBlock*len(la) != len(flat) {
			t.Errorf("%s: lookahead %v (%d per block), want %v", where, got.LookaheadTokenIDs, got.LookaheadPerBlock, la)
		}
	}
}

func TestEngineVectorsDecode(t *testing.T) {
	payloads := map[string]int{}
	for _, f := range loadEngineFiles(t) {
		kind := publisher.VLLM
		if f.Engine == "sglang" {
			kind = publisher.SGLang
		}
		for _, c := range f.Events {
			if len(c.Frames) != len(c.Decoded) {
				t.Fatalf("%s %s: %d frames, %d decoded", f.Version, c.ID, len(c.Frames), len(c.Decoded))
			}
			var d kvevent.Decoder
			for i, fr := range c.Frames {
				payload, err := hex.DecodeString(fr[2])
				if err != nil {
					t.Fatal(err)
				}
				where := f.Engine + " " + f.Version + " " + c.ID
				b, err := d.Decode(kind, payload)
				if err != nil {
					t.Errorf("%s batch %d: %v", where, i, err)
					continue
				}
				batch := c.Decoded[i].([]any)
				evs := batch[1].([]any)
				if len(b.Events) != len(evs) {
					t.Errorf("%s batch %d: %d events, want %d", where, i, len(b.Events), len(evs))
					continue
				}
				if f.Facts.EventForm == "array" && b.ArrayEvents != len(evs) || f.Facts.EventForm == "map" && b.MapEvents != len(evs) {
					t.Errorf("%s batch %d: forms %d map %d array, release publishes %s", where, i, b.MapEvents, b.ArrayEvents, f.Facts.EventForm)
				}
				if batch[2] != nil && (!b.HasDPRank || b.DPRank != wantInt(t, batch[2])) {
					t.Errorf("%s batch %d: dp rank %d/%v, want %v", where, i, b.DPRank, b.HasDPRank, batch[2])
				}
				for j, ev := range evs {
					checkEvent(t, where, kind, &b.Events[j], f.asMap(t, ev))
				}
				payloads[f.Engine+" "+f.Facts.EventForm]++
			}
			// Replayed batches carry the same payloads (the end marker's is empty).
			for i, fr := range c.ReplayFrames {
				payload, err := hex.DecodeString(fr[len(fr)-1])
				if err != nil {
					t.Fatal(err)
				}
				if len(payload) == 0 {
					continue
				}
				if _, err := d.Decode(kind, payload); err != nil {
					t.Errorf("%s %s replay %d: %v", f.Version, c.ID, i, err)
				}
			}
		}
	}
	t.Logf("payloads decoded: %v", payloads)
	for _, k := range []string{"vllm array", "vllm map", "sglang array", "sglang map"} {
		if payloads[k] == 0 {
			t.Errorf("no %s payloads decoded: %v", k, payloads)
		}
	}
}
