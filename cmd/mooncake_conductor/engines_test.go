package main

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/internal/enginevectors"
)

// The real engines as the oracle, through the binary: the KV events vLLM 0.23-0.34 and
// SGLang 0.5.19-0.5.23 published (testdata/engines, recorded from their wheels by make
// vectors) go over real ZMQ to a spawned conductor registered as each release needs, and
// every /query answer, per tier, is compared with the engine's own prefix lookup: which of
// its request's blocks the engine holds, on which medium, after each batch. A scenario
// without recorded event frames (cache_salt alone, PYTHONHASHSEED unset, xxhash) publishes
// events built in the release's own event form (its struct field list) from the release's
// own block hashes (hash_cases); the table marks them.
//
// Each cell is exact (every answer equal to the engine's), miss (some cached prefix not
// reported, never more than cached), wrong hit (some answer above what is cached),
// refused (the registration the release needs is refused) or n/a (the release has no
// such feature). The test fails when a cell differs from engineWant.
//
// The same harness measures an older binary: CONDUCTOR_ENGINES_BIN=<binary> runs it
// instead, registering with the best profile an older build accepts (no field of issue
// 25, python_hash_seed "random" for an unset seed, default media, each adapter a
// registration of its own) and asserting nothing. CONDUCTOR_ENGINES_TABLE=<file> writes
// the column as a markdown table (docs/engines.md holds both columns).

type engStruct struct {
	Fields       []string `json:"fields"`
	DefaultsFrom int      `json:"defaults_from"`
	ArrayLike    bool     `json:"array_like"`
}

func loadEngineFiles(t *testing.T) []*enginevectors.EngineFile {
	t.Helper()
	out := enginevectors.EngineFiles(t, filepath.Join("..", ".."), "*.json")
	if len(out) != 11 {
		t.Fatalf("%d engine vector files, want 11", len(out))
	}
	// vLLM first, releases in order.
	sort.Slice(out, func(i, j int) bool {
		if out[i].Engine != out[j].Engine {
			return out[i].Engine > out[j].Engine
		}
		return versionLess(out[i].Version, out[j].Version)
	})
	return out
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

// oracle is the engine's cache as its events describe it: for each request, which of
// its blocks are held, on which media. It knows each block by the engine's own hash.
type oracle struct {
	reqs  []*engRequest
	where map[uint64][2]int // event hash -> request, block
}

// engRequest is one prompt the engine cached: its blocks (the engine's hashes and the
// positions each block ends at) and what is held.
type engRequest struct {
	label string
	hash  []uint64
	end   []int64
	held  []uint8 // per block: mediumGPU | mediumCPU | mediumDisk
}

const (
	mediumGPU  = 1
	mediumCPU  = 2
	mediumDisk = 4
)

func newOracle(reqs ...*engRequest) *oracle {
	o := &oracle{reqs: reqs, where: map[uint64][2]int{}}
	for i, r := range reqs {
		r.held = make([]uint8, len(r.hash))
		for j, h := range r.hash {
			o.where[h] = [2]int{i, j}
		}
	}
	return o
}

// vllmRequest is a hash case as an oracle request.
func vllmRequest(hc *enginevectors.HashCase) *engRequest {
	r := &engRequest{label: hc.ID}
	for _, b := range hc.Blocks {
		r.hash = append(r.hash, b.EventHash)
		r.end = append(r.end, int64(b.TokenRange[1]))
	}
	return r
}

// sglangRequest is an SGLang event case's prompt as an oracle request.
func sglangRequest(c *enginevectors.EventCase) *engRequest {
	r := &engRequest{label: c.ID}
	var pos int64
	for _, p := range c.Pages {
		pos += int64(len(p.Units))
		r.hash = append(r.hash, uint64(p.EventI64))
		r.end = append(r.end, pos)
	}
	return r
}

// apply plays one decoded payload ([ts, [events], rank]) on the cache. Event fields
// are read by name, or by position from the release's struct for array events.
func (o *oracle) apply(t *testing.T, f *enginevectors.EngineFile, raw json.RawMessage) {
	t.Helper()
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err != nil || len(batch) < 2 {
		t.Fatalf("decoded payload %s: %v", raw, err)
	}
	var events []json.RawMessage
	if err := json.Unmarshal(batch[1], &events); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		typ, fields := o.eventFields(t, f, ev)
		switch typ {
		case "AllBlocksCleared":
			for _, r := range o.reqs {
				clear(r.held)
			}
			continue
		case "BlockStored", "BlockRemoved":
		default:
			t.Fatalf("event type %q", typ)
		}
		m := mediumOf(fields["medium"])
		var hashes []json.RawMessage
		if err := json.Unmarshal(fields["block_hashes"], &hashes); err != nil {
			t.Fatal(err)
		}
		for _, hr := range hashes {
			h := eventHash(t, hr)
			at, ok := o.where[h]
			if !ok {
				t.Fatalf("%s: the oracle has no request block with hash %d", f.Release(), h)
			}
			if typ == "BlockStored" {
				o.reqs[at[0]].held[at[1]] |= m
			} else {
				o.reqs[at[0]].held[at[1]] &^= m
			}
		}
	}
}

func (o *oracle) eventFields(t *testing.T, f *enginevectors.EngineFile, ev json.RawMessage) (string, map[string]json.RawMessage) {
	var m map[string]json.RawMessage
	if json.Unmarshal(ev, &m) == nil {
		var typ string
		_ = json.Unmarshal(m["type"], &typ)
		return typ, m
	}
	var arr []json.RawMessage
	if err := json.Unmarshal(ev, &arr); err != nil || len(arr) == 0 {
		t.Fatalf("event %s", ev)
	}
	var typ string
	_ = json.Unmarshal(arr[0], &typ)
	var st engStruct
	if err := json.Unmarshal(f.Structs[typ], &st); err != nil {
		t.Fatalf("%s: struct %s: %v", f.Release(), typ, err)
	}
	m = map[string]json.RawMessage{}
	for i, name := range st.Fields {
		if i+1 < len(arr) {
			m[name] = arr[i+1]
		}
	}
	return typ, m
}

// eventHash reads a published block hash: an integer (SGLang signed), or vLLM's raw
// digest bytes, whose index key is their last 8 bytes big-endian.
func eventHash(t *testing.T, raw json.RawMessage) uint64 {
	var b struct {
		Hex string `json:"bytes_hex"`
	}
	if json.Unmarshal(raw, &b) == nil && b.Hex != "" {
		d, err := hex.DecodeString(b.Hex)
		if err != nil || len(d) < 8 {
			t.Fatalf("hash bytes %s", raw)
		}
		return binary.BigEndian.Uint64(d[len(d)-8:])
	}
	if v, err := strconv.ParseUint(string(raw), 10, 64); err == nil {
		return v
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		t.Fatalf("hash %s", raw)
	}
	return uint64(v)
}

func mediumOf(raw json.RawMessage) uint8 {
	var s string
	_ = json.Unmarshal(raw, &s)
	switch strings.ToUpper(s) {
	case "", "GPU":
		return mediumGPU
	case "CPU", "CPU_PINNED":
		return mediumCPU
	}
	return mediumDisk // STORAGE, DISK
}

// tiers is the engine's own prefix lookup of a request: the positions covered by its
// leading blocks held on the device, on device or CPU, and anywhere.
func (r *engRequest) tiers() [3]int64 {
	var out [3]int64
	for i, mask := range [3]uint8{mediumGPU, mediumGPU | mediumCPU, mediumGPU | mediumCPU | mediumDisk} {
		for j := range r.held {
			if r.held[j]&mask == 0 {
				break
			}
			out[i] = r.end[j]
		}
	}
	return out
}

// engReg is one registration of a scenario's engine (all on its one endpoint).
type engReg struct {
	lora    string
	profile map[string]any
	media   []string
}

// engProbe is one query: a prompt in a context, and the request whose cache answers it
// (nil: nothing the engine cached answers it, as a base prompt whose only cached twin
// is a LoRA request's).
type engProbe struct {
	lora, salt string
	tokens     []int32
	truth      *engRequest
}

type engScenario struct {
	file        *enginevectors.EngineFile
	kind        string // vLLM or SGLang
	bs          int64
	regs        []engReg
	frames      [][][]byte // batches as ZMQ frames
	decoded     []json.RawMessage
	oracle      *oracle
	probes      []engProbe
	synthesized bool
}

// The table's rows, in order.
var engineRows = []string{
	"plain", "cache_salt", "LoRA", "PYTHONHASHSEED unset", "lookahead (EAGLE/MTP)", "xxhash",
	"array-encoded events", "SGLang LoRA traffic on a base-model endpoint", "multi-LoRA engine",
	"offloaded media (CPU/STORAGE, CPU_PINNED/DISK)",
}

func hexFrames(t *testing.T, fr []string) [][]byte {
	out := make([][]byte, len(fr))
	for i, h := range fr {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

func vllmProfile(algo, seed string, tagged bool, lookahead int64, loraPath string) map[string]any {
	p := map[string]any{"strategy": "vllm_v1", "algorithm": algo, "python_hash_seed": seed, "index_projection": "low64_be"}
	if tagged {
		p["extra_keys"] = "tagged"
	}
	if loraPath != "" {
		p["lora_path"] = loraPath
	}
	if lookahead != 0 {
		p["lookahead_tokens"] = lookahead
	}
	return p
}

func sglangProfile(strategy, loraPath string) map[string]any {
	p := map[string]any{"strategy": strategy, "algorithm": "sha256_raw", "index_projection": "first64_be"}
	if loraPath != "" {
		p["lora_path"] = loraPath
	}
	return p
}

// recorded makes a scenario of a recorded event case: its frames (batches upTo, all when
// 0), its decoded payloads for the oracle.
func recorded(t *testing.T, c *enginevectors.EventCase, upTo int) ([][][]byte, []json.RawMessage) {
	if upTo == 0 {
		upTo = len(c.Frames)
	}
	var frames [][][]byte
	for _, fr := range c.Frames[:upTo] {
		frames = append(frames, hexFrames(t, fr))
	}
	return frames, c.Decoded[:upTo]
}

// vllmScenarios are a vLLM release's cells.
func vllmScenarios(t *testing.T, f *enginevectors.EngineFile) map[string]*engScenario {
	out := map[string]*engScenario{}
	tagged := f.Fact("tagged_extra_keys")
	e := f.EventCase("events/sha256/bs16")
	seed := e.Env["PYTHONHASHSEED"]
	reqOf := func(c *enginevectors.EventCase, j int) *engRequest {
		label := c.Requests[j].Label
		return vllmRequest(f.HashCase(t, fmt.Sprintf("%s/bs%d/%s/seed=%s/L%d", c.Algorithm, c.BlockSize, label, seed, c.Lookahead)))
	}
	adapter := func(c *enginevectors.EventCase, j int, look int64) engReg {
		l := c.Requests[j].Lora
		path := ""
		if tagged {
			path = l.Path
		}
		return engReg{lora: l.Name, profile: vllmProfile(c.Algorithm, seed, tagged, look, path)}
	}
	base := func(c *enginevectors.EventCase) engReg {
		return engReg{profile: vllmProfile(c.Algorithm, seed, tagged, c.Lookahead, "")}
	}
	probeOf := func(c *enginevectors.EventCase, j int, r *engRequest) engProbe {
		p := engProbe{salt: c.Requests[j].CacheSalt, tokens: f.Prompt, truth: r}
		if c.Requests[j].Lora != nil {
			p.lora = c.Requests[j].Lora.Name
		}
		return p
	}
	// plain and LoRA: the recorded store, eviction and reset of a plain and a LoRA (+salt)
	// request; each row registers the context it queries.
	plain, lora := reqOf(e, 0), reqOf(e, 1)
	frames, dec := recorded(t, e, 0)
	out["plain"] = &engScenario{kind: "vLLM", bs: 16, regs: []engReg{base(e)}, frames: frames, decoded: dec,
		oracle: newOracle(plain, lora), probes: []engProbe{probeOf(e, 0, plain)}}
	if f.Version == "0.23.0" {
		out["array-encoded events"] = out["plain"]
	}
	out["LoRA"] = &engScenario{kind: "vLLM", bs: 16, regs: []engReg{adapter(e, 1, 0)}, frames: frames, decoded: dec,
		oracle: newOracle(plain, lora), probes: []engProbe{probeOf(e, 1, lora)}}
	out["multi-LoRA engine"] = &engScenario{kind: "vLLM", bs: 16, regs: []engReg{base(e), adapter(e, 1, 0)}, frames: frames, decoded: dec,
		oracle: newOracle(plain, lora), probes: []engProbe{probeOf(e, 0, plain), probeOf(e, 1, lora)}}
	if l1 := f.EventCase("events/sha256/bs4/L1"); l1 != nil {
		frames, dec := recorded(t, l1, 0)
		p, l := reqOf(l1, 0), reqOf(l1, 1)
		out["lookahead (EAGLE/MTP)"] = &engScenario{kind: "vLLM", bs: 4, regs: []engReg{base(l1), adapter(l1, 1, 1)}, frames: frames, decoded: dec,
			oracle: newOracle(p, l), probes: []engProbe{probeOf(l1, 0, p), probeOf(l1, 1, l)}}
	}
	if m := f.EventCase("media/sha256/bs16"); m != nil {
		frames, dec := recorded(t, m, 0)
		p := vllmRequest(f.HashCase(t, "sha256/bs16/plain/seed=0/L0"))
		reg := base(m)
		reg.media = []string{"GPU", "CPU", "STORAGE"}
		out["offloaded media (CPU/STORAGE, CPU_PINNED/DISK)"] = &engScenario{kind: "vLLM", bs: 16, regs: []engReg{reg}, frames: frames,
			decoded: dec, oracle: newOracle(p), probes: []engProbe{{tokens: f.Prompt, truth: p}}}
	}
	// No recorded events: the release's own hashes, in its event form.
	synth := func(id string, prof map[string]any) *engScenario {
		hc := f.HashCase(t, id)
		r := vllmRequest(hc)
		frames, dec := synthVLLM(t, f, hc)
		salt := ""
		if hc.CacheSalt != nil {
			salt = *hc.CacheSalt
		}
		return &engScenario{kind: "vLLM", bs: hc.BlockSize, regs: []engReg{{profile: prof}}, frames: frames, decoded: dec,
			oracle: newOracle(r), probes: []engProbe{{salt: salt, tokens: f.Prompt, truth: r}}, synthesized: true}
	}
	out["cache_salt"] = synth("sha256/bs16/salt/seed=0/L0", vllmProfile("sha256", "0", tagged, 0, ""))
	out["xxhash"] = synth("xxhash/bs16/plain/seed=0/L0", vllmProfile("xxhash", "0", tagged, 0, ""))
	if f.Fact("fixed_default_seed") {
		out["PYTHONHASHSEED unset"] = synth("sha256/bs16/plain/seed=unset/L0", vllmProfile("sha256", "unset", tagged, 0, ""))
	}
	return out
}

// synthVLLM is a store of the hash case's blocks then a reset, as the release publishes
// them (its BlockStored fields, array or map form), with the engine's hashes and the
// extra keys it publishes.
func synthVLLM(t *testing.T, f *enginevectors.EngineFile, hc *enginevectors.HashCase) ([][][]byte, []json.RawMessage) {
	var st engStruct
	if err := json.Unmarshal(f.Structs["BlockStored"], &st); err != nil {
		t.Fatal(err)
	}
	n := hc.Blocks[len(hc.Blocks)-1].TokenRange[1]
	var hashes, extras []any
	for _, b := range hc.Blocks {
		hashes = append(hashes, b.EventHash)
		var x any
		dec := json.NewDecoder(strings.NewReader(string(b.EventExtra)))
		dec.UseNumber()
		if err := dec.Decode(&x); err != nil {
			t.Fatal(err)
		}
		extras = append(extras, msgpackable(x))
	}
	vals := map[string]any{"block_hashes": hashes, "token_ids": anys(f.Prompt[:n]), "block_size": hc.BlockSize, "medium": "GPU",
		"extra_keys": extras, "group_idx": 0}
	ev := encodeEvent("BlockStored", st, vals)
	var clr engStruct
	_ = json.Unmarshal(f.Structs["AllBlocksCleared"], &clr)
	reset := encodeEvent("AllBlocksCleared", clr, nil)
	var frames [][][]byte
	var decoded []json.RawMessage
	for i, e := range [][]byte{ev, reset} {
		b := eventBatch(1767225600.5, e)
		frames = append(frames, [][]byte{{}, binary.BigEndian.AppendUint64(nil, uint64(i)), b})
		js, err := msgpackJSON(b)
		if err != nil {
			t.Fatal(err)
		}
		decoded = append(decoded, js)
	}
	return frames, decoded
}

// msgpackable turns a JSON value decoded with UseNumber into what msgp.AppendIntf takes.
func msgpackable(v any) any {
	switch x := v.(type) {
	case json.Number:
		i, _ := x.Int64()
		return i
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = msgpackable(x[i])
		}
		return out
	}
	return v
}

// encodeEvent encodes one tagged event as the release's struct says: positional with
// every field, or a map leaving out nil fields from defaults_from on.
func encodeEvent(tag string, st engStruct, vals map[string]any) []byte {
	var b []byte
	if st.ArrayLike {
		b = msgp.AppendArrayHeader(b, uint32(1+len(st.Fields)))
		b = msgp.AppendString(b, tag)
		for _, name := range st.Fields {
			b, _ = msgp.AppendIntf(b, vals[name])
		}
		return b
	}
	var keys []string
	for i, name := range st.Fields {
		if i < st.DefaultsFrom || vals[name] != nil {
			keys = append(keys, name)
		}
	}
	b = msgp.AppendMapHeader(b, uint32(1+len(keys)))
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, tag)
	for _, k := range keys {
		b = msgp.AppendString(b, k)
		b, _ = msgp.AppendIntf(b, vals[k])
	}
	return b
}

// msgpackJSON is a payload as the vector files' decoded view (for the oracle).
func msgpackJSON(b []byte) (json.RawMessage, error) {
	var sb strings.Builder
	if _, err := msgp.UnmarshalAsJSON(&sb, b); err != nil {
		return nil, err
	}
	return json.RawMessage(sb.String()), nil
}

// sglangScenarios are an SGLang release's cells.
func sglangScenarios(t *testing.T, f *enginevectors.EngineFile) map[string]*engScenario {
	out := map[string]*engScenario{}
	namespaced := f.Fact("default_format_namespaces_registered_lora")
	withCase := func(id string, upTo int) (*enginevectors.EventCase, [][][]byte, []json.RawMessage, *engRequest) {
		c := f.EventCase(id)
		frames, dec := recorded(t, c, upTo)
		return c, frames, dec, sglangRequest(c)
	}
	c, frames, dec, r := withCase("events/default/ps16/plain+media", 2)
	out["plain"] = &engScenario{kind: "SGLang", bs: c.PageSize, regs: []engReg{{profile: sglangProfile("sglang", "")}},
		frames: frames, decoded: dec, oracle: newOracle(r), probes: []engProbe{{tokens: c.Tokens, truth: r}}}
	if f.Facts["event_form"] == "array" {
		out["array-encoded events"] = out["plain"]
	}
	c, frames, dec, r = withCase("events/default/ps16/plain+media", 0)
	out["offloaded media (CPU/STORAGE, CPU_PINNED/DISK)"] = &engScenario{kind: "SGLang", bs: c.PageSize,
		regs: []engReg{{profile: sglangProfile("sglang", "")}}, frames: frames, decoded: dec, oracle: newOracle(r),
		probes: []engProbe{{tokens: c.Tokens, truth: r}}}
	c, frames, dec, r = withCase("events/default/ps4/salt", 0)
	out["cache_salt"] = &engScenario{kind: "SGLang", bs: c.PageSize, regs: []engReg{{profile: sglangProfile("sglang", "")}},
		frames: frames, decoded: dec, oracle: newOracle(r), probes: []engProbe{{salt: *c.CacheSalt, tokens: c.Tokens, truth: r}}}
	c, frames, dec, r = withCase("events/default/ps4/bigram", 0)
	out["lookahead (EAGLE/MTP)"] = &engScenario{kind: "SGLang", bs: c.PageSize, regs: []engReg{{profile: sglangProfile("sglang_bigram", "")}},
		frames: frames, decoded: dec, oracle: newOracle(r), probes: []engProbe{{tokens: c.Tokens, truth: r}}}
	// LoRA pages: namespaced with lora_name from 0.5.23 (lora_path registered), base
	// hashes without lora_name before (Python TreeCore, as recorded).
	c, frames, dec, r = withCase("events/default/ps16/lora", 0)
	path := ""
	if namespaced {
		path = c.Lora.Path
	}
	adapter := engReg{lora: c.Lora.Name, profile: sglangProfile("sglang", path)}
	loraProbe := engProbe{lora: c.Lora.Name, tokens: c.Tokens, truth: r}
	baseProbe := engProbe{tokens: c.Tokens} // the base prompt: never cached
	out["LoRA"] = &engScenario{kind: "SGLang", bs: c.PageSize, regs: []engReg{adapter}, frames: frames, decoded: dec,
		oracle: newOracle(r), probes: []engProbe{loraProbe}}
	out["SGLang LoRA traffic on a base-model endpoint"] = &engScenario{kind: "SGLang", bs: c.PageSize,
		regs: []engReg{{profile: sglangProfile("sglang", "")}}, frames: frames, decoded: dec, oracle: newOracle(r),
		probes: []engProbe{baseProbe}}
	out["multi-LoRA engine"] = &engScenario{kind: "SGLang", bs: c.PageSize,
		regs: []engReg{{profile: sglangProfile("sglang", "")}, adapter}, frames: frames, decoded: dec, oracle: newOracle(r),
		probes: []engProbe{baseProbe, loraProbe}}
	return out
}

// engineRun is one binary serving the cells.
type engineRun struct {
	t      *testing.T
	base   string
	legacy bool // an older binary: no field of issue 25
	n      int
	checks map[string]string // the last cell's HashCheck by lora_name
}

// legacyReg is what an older build accepts of a registration: the four selectors, and
// "random" for an unset seed (it refuses "unset").
func legacyReg(r engReg) engReg {
	p := map[string]any{}
	for _, k := range []string{"strategy", "algorithm", "python_hash_seed", "index_projection"} {
		if v, ok := r.profile[k]; ok {
			p[k] = v
		}
	}
	if p["python_hash_seed"] == "unset" {
		p["python_hash_seed"] = "random"
	}
	return engReg{lora: r.lora, profile: p}
}

// cell runs one scenario and returns its verdict and what it saw; e.checks holds the
// HashCheck /services showed for each of its adapters at the end.
func (e *engineRun) cell(s *engScenario) (verdict, detail string) {
	t := e.t
	e.n++
	model := "m" + strconv.Itoa(e.n)
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	defer call(t, http.MethodPost, e.base+"/unregister", mp("instance_id", "e", "dp_rank", 0))
	for _, r := range s.oracle.reqs {
		clear(r.held)
	}
	var notes []string
	for i, r := range s.regs {
		if e.legacy {
			r = legacyReg(r)
		}
		kv := []any{"endpoint", pub.Endpoint(), "type", s.kind, "modelname", model, "instance_id", "e",
			"block_size", s.bs, "dp_rank", 0, "hash_profile", r.profile}
		if r.lora != "" {
			kv = append(kv, "lora_name", r.lora)
		}
		if r.media != nil && !e.legacy {
			kv = append(kv, "index_media", anys(r.media))
		}
		code, resp := call(t, http.MethodPost, e.base+"/register", mp(kv...))
		if code == http.StatusOK {
			continue
		}
		if i == 0 || !e.legacy {
			return "refused", fmt.Sprintf("registration %d (lora %q): %v", i, r.lora, resp["error"])
		}
		// An older build takes one adapter per endpoint: the others stay unregistered.
		notes = append(notes, fmt.Sprintf("adapter %q refused (%v)", r.lora, resp["error"]))
	}
	if err := pub.WaitSubscribers(1, time.Minute); err != nil {
		t.Fatal(err)
	}
	verdict = "exact"
	for b, frames := range s.frames {
		if err := pub.SendRaw(frames...); err != nil {
			t.Fatal(err)
		}
		e.waitApplied(b + 1)
		s.oracle.apply(t, s.file, s.decoded[b])
		for _, p := range s.probes {
			var want [3]int64
			if p.truth != nil {
				want = p.truth.tiers()
			}
			got := e.query(model, s.bs, p)
			for i, tier := range []string{"device", "cpu_local", "disk"} {
				switch {
				case got[i] > want[i]:
					verdict = "wrong hit"
				case got[i] < want[i] && verdict == "exact":
					verdict = "miss"
				}
				if got[i] != want[i] {
					notes = append(notes, fmt.Sprintf("batch %d lora %q %s: %d, engine %d", b, p.lora, tier, got[i], want[i]))
				}
			}
		}
	}
	if !e.legacy {
		e.checks = e.hashChecks()
	}
	return verdict, strings.Join(notes, "; ")
}

// hashChecks is the HashCheck of every adapter of instance e, by lora_name.
func (e *engineRun) hashChecks() map[string]string {
	code, resp := call(e.t, http.MethodGet, e.base+"/services", nil)
	if code != http.StatusOK {
		e.t.Fatalf("/services: %d %v", code, resp)
	}
	out := map[string]string{}
	for _, v := range resp["services"].([]any) {
		svc := v.(map[string]any)
		if svc["InstanceID"] == "e" {
			out[svc["LoraName"].(string)], _ = svc["HashCheck"].(string)
		}
	}
	return out
}

// query asks the conductor for a probe's prompt: the device, cpu_local and disk counts
// of instance e (0 when it is not in the answer).
func (e *engineRun) query(model string, bs int64, p engProbe) [3]int64 {
	kv := []any{"model", model, "block_size", bs, "token_ids", anys(p.tokens)}
	if p.lora != "" {
		kv = append(kv, "lora_name", p.lora)
	}
	if p.salt != "" {
		kv = append(kv, "cache_salt", p.salt)
	}
	code, resp := call(e.t, http.MethodPost, e.base+"/query", mp(kv...))
	if code != http.StatusOK {
		e.t.Fatalf("query: %d %v", code, resp)
	}
	inst, _ := resp["instances"].(map[string]any)["e"].(map[string]any)
	var out [3]int64
	if inst != nil {
		out = [3]int64{num(inst["device"]), num(inst["cpu_local"]), num(inst["disk"])}
	}
	return out
}

// waitApplied waits until the conductor applied n batches of service e of the current
// cell (each cell's service has the same key, one at a time).
func (e *engineRun) waitApplied(n int) {
	deadline := time.Now().Add(time.Minute)
	for {
		v, _ := metricSum(e.t, e.base, "conductor_service_messages_applied_total", `service="e|default|0"`)
		if v >= float64(n) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("batch %d never applied (applied %v)", n, v)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// engineCell is one cell of the table.
type engineCell struct {
	verdict, detail string
	synthesized     bool
}

func TestEnginesThroughBinary(t *testing.T) {
	bin, legacy := binPath, false
	if b := os.Getenv("CONDUCTOR_ENGINES_BIN"); b != "" {
		bin, legacy = b, true
	}
	files := loadEngineFiles(t)
	httpPort, rpcPort := freePort(t), freePort(t)
	config := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": rpcPort,
		"kvevent_instance": map[string]any{}})
	c := startBinary(t, bin, config)
	base := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	c.waitHTTP("127.0.0.1:" + strconv.Itoa(httpPort))
	run := &engineRun{t: t, base: base, legacy: legacy}
	cells := map[string]map[string]engineCell{}
	var releases []string
	for _, f := range files {
		var sc map[string]*engScenario
		if f.Engine == "vllm" {
			sc = vllmScenarios(t, f)
		} else {
			sc = sglangScenarios(t, f)
		}
		rel := f.Release()
		releases = append(releases, rel)
		cells[rel] = map[string]engineCell{}
		for _, row := range engineRows {
			s := sc[row]
			if s == nil {
				cells[rel][row] = engineCell{verdict: "n/a"}
				continue
			}
			s.file = f
			v, d := run.cell(s)
			cells[rel][row] = engineCell{verdict: v, detail: d, synthesized: s.synthesized}
			t.Logf("%-13s | %-46s | %-9s | %v %s", rel, row, v, run.checks, d)
			// The profile each release needs never reads as a mismatch.
			for lora, check := range run.checks {
				if strings.HasPrefix(check, "mismatch") {
					t.Errorf("%s, %s: the right profile of adapter %q reads %s", rel, row, lora, check)
				}
			}
			run.checks = nil
		}
	}
	if path := os.Getenv("CONDUCTOR_ENGINES_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(engineTable(releases, cells)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if legacy {
		return
	}
	for _, rel := range releases {
		for _, row := range engineRows {
			want := engineWant(rel, row)
			if got := cells[rel][row]; got.verdict != want {
				t.Errorf("%s, %s: %s (%s), want %s", rel, row, got.verdict, got.detail, want)
			}
		}
	}
}

// engineTable renders the cells as a markdown table, rows by scenario, a column per
// release; * marks cells whose events were built from the release's hashes.
func engineTable(releases []string, cells map[string]map[string]engineCell) string {
	var b strings.Builder
	b.WriteString("| scenario | " + strings.Join(releases, " | ") + " |\n|---|")
	b.WriteString(strings.Repeat("---|", len(releases)) + "\n")
	for _, row := range engineRows {
		b.WriteString("| " + row + " |")
		for _, rel := range releases {
			c := cells[rel][row]
			v := c.verdict
			if c.synthesized {
				v += "*"
			}
			b.WriteString(" " + v + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// engineWant is what each cell must be with this build (docs/engines.md says why).
func engineWant(release, row string) string {
	vllm := strings.HasPrefix(release, "vLLM ")
	version := strings.TrimPrefix(strings.TrimPrefix(release, "vLLM "), "SGLang ")
	switch row {
	case "PYTHONHASHSEED unset":
		// Before vLLM 0.29 an unset seed is random per process: no indexer can follow.
		if !vllm || versionLess(version, "0.29") {
			return "n/a"
		}
	case "lookahead (EAGLE/MTP)":
		if vllm && versionLess(version, "0.33") {
			return "n/a"
		}
	case "xxhash":
		if !vllm {
			return "n/a"
		}
	case "array-encoded events":
		if release != "vLLM 0.23" && release != "SGLang 0.5.19" {
			return "n/a"
		}
	case "SGLang LoRA traffic on a base-model endpoint":
		switch {
		case vllm:
			return "n/a"
		case versionLess(version, "0.5.23"):
			// The documented limit: these releases publish LoRA pages with the base
			// pages' hashes and nothing else (Python TreeCore): indistinguishable.
			return "wrong hit"
		}
	case "multi-LoRA engine":
		if !vllm && versionLess(version, "0.5.23") {
			return "refused" // the ambiguous setup, refused loudly
		}
	}
	return "exact"
}

// TestEnginesMismatchDiagnosed: a registration whose profile does not reproduce the
// engine's block hashes is told apart by the profile self-check, through the binary, for
// every difference the check must diagnose: /services shows HashCheck "mismatch (...)"
// naming the field that would reproduce the engine's own hashes (the events are the
// releases' recorded ones, or built from their hashes where none were recorded).
func TestEnginesMismatchDiagnosed(t *testing.T) {
	byRelease := map[string]*enginevectors.EngineFile{}
	for _, f := range loadEngineFiles(t) {
		byRelease[f.Release()] = f
	}
	httpPort, rpcPort := freePort(t), freePort(t)
	config := writeJSON(t, t.TempDir(), map[string]any{"http_server_port": httpPort, "rpc_server_port": rpcPort})
	c := startConductor(t, config)
	c.waitHTTP("127.0.0.1:" + strconv.Itoa(httpPort))
	run := &engineRun{t: t, base: "http://127.0.0.1:" + strconv.Itoa(httpPort)}
	for _, tc := range []struct {
		release, row string
		// reg replaces the scenario's registrations (nil: its first with profile).
		profile map[string]any
		lora    string
		want    string
	}{
		{"vLLM 0.29", "PYTHONHASHSEED unset", vllmProfile("sha256", "0", false, 0, ""), "",
			`mismatch (engine hashes match python_hash_seed "unset")`},
		{"vLLM 0.28", "plain", vllmProfile("sha256", "42", false, 0, ""), "",
			`mismatch (engine hashes match python_hash_seed "0")`},
		{"vLLM 0.31", "cache_salt", vllmProfile("sha256", "0", false, 0, ""), "",
			`mismatch (engine hashes match extra_keys "tagged")`},
		{"vLLM 0.24", "cache_salt", vllmProfile("sha256", "0", true, 0, ""), "",
			`mismatch (engine hashes match extra_keys "untagged")`},
		{"vLLM 0.33", "lookahead (EAGLE/MTP)", vllmProfile("sha256", "0", true, 0, ""), "",
			`mismatch (engine hashes match lookahead_tokens 1)`},
		{"vLLM 0.34", "lookahead (EAGLE/MTP)", vllmProfile("sha256", "0", true, 3, ""), "",
			`mismatch (engine hashes match lookahead_tokens 1)`},
		{"vLLM 0.31", "xxhash", vllmProfile("sha256", "0", true, 0, ""), "",
			`mismatch (engine hashes match algorithm "xxhash")`},
		{"vLLM 0.28", "plain", vllmProfile("sha256_cbor", "0", false, 0, ""), "",
			`mismatch (engine hashes match algorithm "sha256")`},
		{"vLLM 0.31", "LoRA", vllmProfile("sha256", "0", false, 0, ""), "adapter-a",
			`LoRA blocks of vLLM >= 0.31 need extra_keys "tagged" and lora_path`},
		{"vLLM 0.34", "LoRA", vllmProfile("sha256", "0", true, 0, "/adapters/other"), "adapter-a",
			"tagged LoRA blocks hash the adapter's path: is lora_path the path the engine was given?"},
		{"SGLang 0.5.23", "LoRA", sglangProfile("sglang", ""), "adapter-a",
			"LoRA pages of SGLang >= 0.5.23 need lora_path"},
	} {
		f := byRelease[tc.release]
		var sc map[string]*engScenario
		if f.Engine == "vllm" {
			sc = vllmScenarios(t, f)
		} else {
			sc = sglangScenarios(t, f)
		}
		s := *sc[tc.row]
		s.file = f
		s.regs = []engReg{{lora: tc.lora, profile: tc.profile}}
		// Only the probes of the registered context: the others are not registered here.
		var probes []engProbe
		for _, p := range s.probes {
			if p.lora == tc.lora {
				probes = append(probes, p)
			}
		}
		s.probes = probes
		verdict, _ := run.cell(&s)
		got := run.checks[tc.lora]
		if !strings.HasPrefix(got, "mismatch (") || !strings.Contains(got, tc.want) {
			t.Errorf("%s %s registered %v: HashCheck %q, want %q", tc.release, tc.row, tc.profile, got, tc.want)
		}
		if verdict == "wrong hit" {
			t.Errorf("%s %s: a mismatching profile gave a wrong hit", tc.release, tc.row)
		}
		t.Logf("%s %s: %s (queries: %s)", tc.release, tc.row, got, verdict)
	}
}
