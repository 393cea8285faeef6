package translate

import (
	"encoding/binary"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/internal/enginevectors"
	"github.com/conductor-go/conductor/wire/publisher"
)

// The events the real engines published (testdata/engines, from make vectors) through
// the handler: indexed where the profile the release needs says, the self-check ok under
// that profile, and a mismatch diagnosed under the profile a user had before issue 25.

func loadVectorFiles(t *testing.T, engineName string) []*enginevectors.EngineFile {
	return enginevectors.EngineFiles(t, filepath.Join("..", ".."), engineName+"-*.json")
}

// fileCase is an event case with its vector file.
type fileCase struct {
	file  *enginevectors.EngineFile
	event *enginevectors.EventCase
}

// vectorCases returns the event cases of the engine's vector files that keep accepts.
func vectorCases(t *testing.T, engineName string, keep func(c *enginevectors.EventCase) bool) []fileCase {
	var out []fileCase
	for _, f := range loadVectorFiles(t, engineName) {
		for i := range f.EventCases {
			if keep(&f.EventCases[i]) {
				out = append(out, fileCase{f, &f.EventCases[i]})
			}
		}
	}
	return out
}

func framePayload(t *testing.T, fr []string) (uint64, []byte) {
	t.Helper()
	seq, err := hex.DecodeString(fr[1])
	if err != nil || len(seq) != 8 {
		t.Fatalf("seq frame %q", fr[1])
	}
	p, err := hex.DecodeString(fr[2])
	if err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.Uint64(seq), p
}

// keysOf are a prompt's block keys under a profile.
func keysOf(t *testing.T, p hashing.Profile, bs int, lora, salt string, toks []int32) []uint64 {
	t.Helper()
	return chainOf(t, p, bs, lora, salt, toks)
}

func TestEngineVectorsVLLMThroughHandler(t *testing.T) {
	cases := 0
	for _, fc := range vectorCases(t, "vllm", func(c *enginevectors.EventCase) bool { return c.Kind == "events" }) {
		f, c := fc.file, fc.event
		for _, upToDate := range []bool{true, false} {
			name := f.Version + " " + c.ID
			spec := hashing.Spec{Strategy: "vllm_v1", Algorithm: c.Algorithm, PythonHashSeed: c.Env["PYTHONHASHSEED"],
				IndexProjection: "low64_be"}
			if upToDate {
				spec.LookaheadTokens = c.Lookahead
				if f.Fact("tagged_extra_keys") {
					spec.ExtraKeys = "tagged"
				}
			} else if !f.Fact("tagged_extra_keys") && c.Lookahead == 0 {
				continue // nothing changed for this release
			}
			r := newTestRig(t)
			base := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: c.BlockSize}
			bp, err := hashing.ResolveSpec(spec)
			if err != nil {
				t.Fatal(err)
			}
			r.register(base, bp)
			h := NewEventHandler(Source{Name: name, Kind: publisher.VLLM, Context: base, Slot: r.slot, Profile: bp}, r.eng, r.log)
			type ctx struct {
				key  engine.ContextKey
				keys []uint64
			}
			var ctxs []ctx
			for _, req := range c.Requests {
				key, p := base, bp
				if req.Lora != nil {
					key.LoraName = req.Lora.Name
					if spec.ExtraKeys == "tagged" {
						ls := spec
						ls.LoraPath = req.Lora.Path
						p, err = hashing.ResolveSpec(ls)
						if err != nil {
							t.Fatal(err)
						}
					}
					r.register(key, p)
					if err := h.AddContext(key, p); err != nil {
						t.Fatal(err)
					}
				}
				ctxs = append(ctxs, ctx{key, keysOf(t, p, int(c.BlockSize), key.LoraName, req.CacheSalt, f.Prompt)})
			}
			for i, fr := range c.Frames {
				seq, payload := framePayload(t, fr)
				if err := h.HandleBatch(seq, payload); err != nil {
					t.Fatalf("%s batch %d: %v", name, i, err)
				}
				if i != len(ctxs)-1 {
					continue
				}
				// Every request stored: up to date, a query of each prompt hits all its
				// blocks; before issue 25, the requests whose hashes changed miss.
				for j, cx := range ctxs {
					tr := r.tiers(cx.key, cx.keys)
					full := int64(len(cx.keys)) * c.BlockSize
					changed := c.Lookahead > 0 || (f.Fact("tagged_extra_keys") && (c.Requests[j].Lora != nil || c.Requests[j].CacheSalt != ""))
					if upToDate && tr.Device != full || !upToDate && changed && tr.Device != 0 {
						t.Errorf("%s (up to date %v) request %s: device %d of %d tokens", name, upToDate, c.Requests[j].Label, tr.Device, full)
					}
					// The engine's own query walk over the prompt's tokens (its chain, its
					// block count with lookahead) finds the same.
					var res engine.Result
					q := engine.Query{Key: cx.key, Tokens: f.Prompt, CacheSalt: c.Requests[j].CacheSalt}
					if err := r.eng.Query(&q, &res); err != nil || len(res.Instances) != 1 || res.Instances[0].Tiers != tr {
						t.Errorf("%s request %s: engine query %+v (%v), keys query %+v", name, c.Requests[j].Label, res.Instances, err, tr)
					}
				}
			}
			if st := h.Stats(); st.EventsRejected != 0 || st.BatchesDropped != 0 {
				t.Errorf("%s: stats %+v", name, st)
			}
			for j, cx := range ctxs {
				st, _ := h.CheckStats(cx.key.LoraName)
				switch {
				case upToDate:
					if st.String() != "ok" {
						t.Errorf("%s request %s: hash_check %s", name, c.Requests[j].Label, st)
					}
				case c.Requests[j].Lora != nil:
					// The adapter's path is on no wire: the check can only say it is needed.
					if st.Status != hashing.CheckStatusMismatch || !strings.Contains(st.Suggestion, `need extra_keys "tagged" and lora_path`) {
						t.Errorf("%s LoRA request untagged: hash_check %s", name, st)
					}
				case c.Lookahead > 0:
					if st.Status != hashing.CheckStatusMismatch || !strings.Contains(st.Suggestion, "lookahead_tokens 1") {
						t.Errorf("%s request %s without lookahead: hash_check %s", name, c.Requests[j].Label, st)
					}
				default:
					if st.String() != "ok" { // a plain prompt hashes as before
						t.Errorf("%s plain request untagged: hash_check %s", name, st)
					}
				}
			}
			cases++
		}
	}
	if cases < 15 {
		t.Errorf("%d cases", cases)
	}
}

// TestEngineVectorsVLLMMedia: offloaded blocks (vLLM's offloading connector, every
// medium the release has) reach cpu_local and disk when indexed.
func TestEngineVectorsVLLMMedia(t *testing.T) {
	checked := 0
	for _, fc := range vectorCases(t, "vllm", func(c *enginevectors.EventCase) bool { return c.Kind == "media" }) {
		f, c := fc.file, fc.event
		r := newTestRig(t)
		p, _ := hashing.Resolve("vllm_v1", c.Algorithm, "0", "low64_be")
		key := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: c.BlockSize}
		r.register(key, p)
		media, err := ParseIndexMedia(publisher.VLLM, []string{"GPU", "CPU", "STORAGE"})
		if err != nil {
			t.Fatal(err)
		}
		h := NewEventHandler(Source{Kind: publisher.VLLM, Context: key, Slot: r.slot, Profile: p, Media: media}, r.eng, r.log)
		keys := keysOf(t, p, int(c.BlockSize), "", "", f.Prompt)
		for _, fr := range c.Frames {
			seq, payload := framePayload(t, fr)
			if err := h.HandleBatch(seq, payload); err != nil {
				t.Fatal(err)
			}
		}
		// Stored then the last block evicted, on each medium: block 0 remains offloaded.
		tr := r.tiers(key, keys)
		bs := c.BlockSize
		wantDisk := bs // STORAGE (>= 0.27), or CPU below the disk tier
		if tr.Device != 0 || tr.CPULocal != bs || tr.Disk != wantDisk {
			t.Errorf("%s %s: tiers %+v", f.Version, c.ID, tr)
		}
		if st := h.Stats(); st.EventsRejected != 0 || st.EventsApplied == 0 {
			t.Errorf("%s %s: stats %+v", f.Version, c.ID, st)
		}
		checked++
	}
	if checked != 7 {
		t.Errorf("%d media cases", checked)
	}
}

func TestEngineVectorsSGLangThroughHandler(t *testing.T) {
	cases := 0
	// The dynamo format namespaces every salted page: not a profile here.
	for _, fc := range vectorCases(t, "sglang", func(c *enginevectors.EventCase) bool { return c.Format == "default" }) {
		f, c := fc.file, fc.event
		strategy := "sglang"
		if c.Bigram {
			strategy = "sglang_bigram"
		}
		spec := hashing.Spec{Strategy: strategy, Algorithm: "sha256_raw", IndexProjection: "first64_be"}
		key := engine.ContextKey{TenantID: "default", ModelName: "s", BlockSize: c.PageSize}
		salt := ""
		if c.CacheSalt != nil {
			salt = *c.CacheSalt
		}
		for _, withPath := range []bool{true, false} {
			if c.Lora == nil && !withPath {
				continue
			}
			r := newTestRig(t)
			s := spec
			if c.Lora != nil {
				key.LoraName = c.Lora.Name
				if withPath {
					s.LoraPath = c.Lora.Path
				}
			}
			p, err := hashing.ResolveSpec(s)
			if err != nil {
				t.Fatal(err)
			}
			r.register(key, p)
			h := NewEventHandler(Source{Kind: publisher.SGLang, Context: key, Slot: r.slot, Profile: p}, r.eng, r.log)
			keys := keysOf(t, p, int(c.PageSize), key.LoraName, salt, c.Tokens)
			_, payload := framePayload(t, c.Frames[0])
			if err := h.HandleBatch(0, payload); err != nil {
				t.Fatal(err)
			}
			// A LoRA page is published namespaced from 0.5.23 (and with lora_name from
			// 0.5.22), with base hashes before: exact when the profile says which.
			exact := c.Lora == nil || withPath == f.Fact("default_format_namespaces_registered_lora")
			routed := c.Lora == nil || f.Fact("default_format_namespaces_registered_lora") // earlier releases: no lora_name
			tr := r.tiers(key, keys)
			full := int64(len(c.Tokens))
			if c.Bigram {
				full--
			}
			name := f.Version + " " + c.ID
			switch {
			case exact && routed && tr.Device != full:
				t.Errorf("%s (path %v): device %d of %d", name, withPath, tr.Device, full)
			case !exact && tr.Device != 0:
				t.Errorf("%s (path %v): a hit under the wrong profile: %+v", name, withPath, tr)
			}
			st, _ := h.CheckStats(key.LoraName)
			if routed {
				want := "ok"
				if !exact {
					want = "mismatch"
				}
				if st.Status.String() != want {
					t.Errorf("%s (path %v): hash_check %s, want %s", name, withPath, st, want)
				}
			}
			cases++
		}
	}
	if cases < 12 {
		t.Errorf("%d cases", cases)
	}
}
