package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/conductor-go/conductor/httpclient"
)

func (c *cli) cmdRegister(g *globals, args []string) int {
	const name = "register"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var r httpclient.RegisterRequest
	file := fs.String("file", "", "JSON object in the HTTP field names (endpoint, type, modelname, hash_profile{...}, ...); \"-\" reads stdin. Flags given too override its fields")
	fs.StringVar(&r.Endpoint, "endpoint", "", "ZMQ PUB endpoint of the publisher (tcp://host:port)")
	fs.StringVar(&r.ReplayEndpoint, "replay-endpoint", "", "ZMQ replay endpoint (vLLM, SGLang)")
	fs.StringVar(&r.Type, "type", "", "publisher type: vLLM, SGLang or Mooncake")
	fs.StringVar(&r.ModelName, "model", "", "model name")
	fs.StringVar(&r.LoraName, "lora", "", "LoRA adapter name (empty: base model)")
	fs.StringVar(&r.TenantID, "tenant", "", "tenant id (empty: default)")
	fs.StringVar(&r.InstanceID, "instance", "", "router-facing instance id")
	fs.Int64Var(&r.BlockSize, "block-size", 0, "tokens per KV block")
	fs.Int64Var(&r.DPRank, "dp-rank", 0, "data-parallel rank")
	cacheGroup := fs.String("cache-group", "", "cache group (only 0 is supported; empty or nil: not sent)")
	fs.StringVar(&r.HashProfile.Strategy, "strategy", "", "hash strategy: vllm_v1, sglang or sglang_bigram (default from --type: vLLM vllm_v1, SGLang sglang)")
	fs.StringVar(&r.HashProfile.Algorithm, "algorithm", "", "hash algorithm: sha256 or sha256_cbor for vllm_v1 (required); sha256_raw for sglang (default)")
	fs.StringVar(&r.HashProfile.PythonHashSeed, "seed", "", "publisher's PYTHONHASHSEED, decimal or \"random\" (required for vllm_v1)")
	fs.StringVar(&r.HashProfile.IndexProjection, "projection", "", "index projection (default from strategy: low64_be for vllm_v1, first64_be for sglang)")
	fs.StringVar(&r.HashProfile.ExtraKeys, "extra-keys", "", "vLLM extra-key form: untagged (vLLM <= 0.30, the default) or tagged (vLLM >= 0.31)")
	fs.StringVar(&r.HashProfile.LoraPath, "lora-path", "", "the adapter path the engine was given (vLLM tagged; SGLang >= 0.5.23)")
	fs.Int64Var(&r.HashProfile.LookaheadTokens, "lookahead-tokens", 0, "vLLM num_hash_lookahead_tokens (EAGLE/MTP speculative decoding, vLLM >= 0.33)")
	indexMedia := fs.String("index-media", "", "comma-separated media to index (vLLM GPU,CPU,STORAGE; SGLang GPU,CPU_PINNED,DISK); empty: the type's default")
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	if *indexMedia != "" {
		r.IndexMedia = strings.Split(*indexMedia, ",")
	}
	if fs.NArg() > 0 {
		return c.usageError(name, fs, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	if *cacheGroup != "" && *cacheGroup != "nil" && *cacheGroup != "null" {
		v, err := strconv.ParseInt(*cacheGroup, 10, 64)
		if err != nil {
			return c.usageError(name, fs, fmt.Sprintf("--cache-group %q is not an integer", *cacheGroup))
		}
		r.CacheGroup = &v
	}
	if *file != "" {
		fromFile, err := c.readRegisterFile(*file)
		if err != nil {
			return c.inputError(err)
		}
		r = mergeRegister(fromFile, r, fs)
	}
	applyProfileDefaults(&r)
	if msg := missingRegisterField(&r); msg != "" {
		return c.usageError(name, fs, msg)
	}
	cl, code := c.client(g)
	if cl == nil {
		return code
	}
	defer cl.Close()
	res, err := cl.Register(&r)
	if err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(res)
	}
	tw := newTable(c.stdout)
	tw.row("status", res.Status)
	tw.row("instance_id", res.InstanceID)
	return tw.flush(c.stderr)
}

func (c *cli) readRegisterFile(path string) (httpclient.RegisterRequest, error) {
	var r httpclient.RegisterRequest
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(c.stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return r, fmt.Errorf("read --file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	// The server rejects unknown fields; catching them here names the file and the key.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("--file %s: %w", path, err)
	}
	if dec.More() {
		return r, fmt.Errorf("--file %s: trailing data after the JSON object", path)
	}
	return r, nil
}

// mergeRegister overlays the flags the user actually set (fs.Visit) on the file's values.
func mergeRegister(file, flags httpclient.RegisterRequest, fs *flag.FlagSet) httpclient.RegisterRequest {
	out := file
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "endpoint":
			out.Endpoint = flags.Endpoint
		case "replay-endpoint":
			out.ReplayEndpoint = flags.ReplayEndpoint
		case "type":
			out.Type = flags.Type
		case "model":
			out.ModelName = flags.ModelName
		case "lora":
			out.LoraName = flags.LoraName
		case "tenant":
			out.TenantID = flags.TenantID
		case "instance":
			out.InstanceID = flags.InstanceID
		case "block-size":
			out.BlockSize = flags.BlockSize
		case "dp-rank":
			out.DPRank = flags.DPRank
		case "cache-group":
			out.CacheGroup = flags.CacheGroup
		case "strategy":
			out.HashProfile.Strategy = flags.HashProfile.Strategy
		case "algorithm":
			out.HashProfile.Algorithm = flags.HashProfile.Algorithm
		case "seed":
			out.HashProfile.PythonHashSeed = flags.HashProfile.PythonHashSeed
		case "projection":
			out.HashProfile.IndexProjection = flags.HashProfile.IndexProjection
		case "extra-keys":
			out.HashProfile.ExtraKeys = flags.HashProfile.ExtraKeys
		case "lora-path":
			out.HashProfile.LoraPath = flags.HashProfile.LoraPath
		case "lookahead-tokens":
			out.HashProfile.LookaheadTokens = flags.HashProfile.LookaheadTokens
		case "index-media":
			out.IndexMedia = flags.IndexMedia
		}
	})
	return out
}

// applyProfileDefaults fills in only what the contract leaves no choice about: the
// strategy an engine type implies, sglang's only algorithm, and each strategy's only
// projection. The vLLM algorithm and seed are never guessed, because a wrong guess does
// not fail: it silently produces hashes that never match.
func applyProfileDefaults(r *httpclient.RegisterRequest) {
	p := &r.HashProfile
	if p.Strategy == "" {
		switch r.Type {
		case "vLLM":
			p.Strategy = "vllm_v1"
		case "SGLang":
			p.Strategy = "sglang"
		}
	}
	switch p.Strategy {
	case "vllm_v1":
		if p.IndexProjection == "" {
			p.IndexProjection = "low64_be"
		}
	case "sglang", "sglang_bigram":
		if p.Algorithm == "" {
			p.Algorithm = "sha256_raw"
		}
		if p.IndexProjection == "" {
			p.IndexProjection = "first64_be"
		}
	}
}

func missingRegisterField(r *httpclient.RegisterRequest) string {
	p := &r.HashProfile
	switch {
	case r.Endpoint == "":
		return "missing --endpoint"
	case r.Type == "":
		return "missing --type (vLLM, SGLang or Mooncake)"
	case r.ModelName == "":
		return "missing --model"
	case r.InstanceID == "":
		return "missing --instance"
	case r.BlockSize <= 0:
		return "missing or non-positive --block-size"
	case p.Strategy == "":
		return "missing --strategy (vllm_v1, sglang or sglang_bigram)"
	case p.Algorithm == "":
		return "missing --algorithm (sha256 or sha256_cbor for vllm_v1)"
	case p.IndexProjection == "":
		return "missing --projection"
	case p.Strategy == "vllm_v1" && p.PythonHashSeed == "":
		return "missing --seed (the publisher's PYTHONHASHSEED, or \"random\"), required for vllm_v1"
	}
	return ""
}

func (c *cli) cmdUnregister(g *globals, args []string) int {
	const name = "unregister"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var r httpclient.UnregisterRequest
	fs.StringVar(&r.InstanceID, "instance", "", "instance id (required)")
	fs.StringVar(&r.TenantID, "tenant", "", "tenant id (empty: default)")
	fs.Int64Var(&r.DPRank, "dp-rank", 0, "data-parallel rank")
	lora := fs.String("lora", "", "unregister only this LoRA adapter of a multi-LoRA registration (\"\": the base model's); without it, the whole service")
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "lora" {
			r.LoraName = lora
		}
	})
	if fs.NArg() > 0 {
		return c.usageError(name, fs, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	if r.InstanceID == "" {
		return c.usageError(name, fs, "missing --instance")
	}
	cl, code := c.client(g)
	if cl == nil {
		return code
	}
	defer cl.Close()
	res, err := cl.Unregister(&r)
	if err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(res)
	}
	tw := newTable(c.stdout)
	tw.row("status", res.Status)
	tw.row("removed_instances", strings.Join(res.RemovedInstances, ", "))
	return tw.flush(c.stderr)
}

// cmdNoArgs runs a command that takes no flags of its own (services, view).
func (c *cli) cmdNoArgs(name string, g *globals, args []string) (*httpclient.Client, int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return nil, code
	}
	if fs.NArg() > 0 {
		return nil, c.usageError(name, fs, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	return c.client(g)
}

func (c *cli) cmdServices(g *globals, args []string) int {
	cl, code := c.cmdNoArgs("services", g, args)
	if cl == nil {
		return code
	}
	defer cl.Close()
	l, err := cl.Services()
	if err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(l)
	}
	writeServices(c.stdout, l, true)
	return exitOK
}

func (c *cli) cmdView(g *globals, args []string) int {
	cl, code := c.cmdNoArgs("view", g, args)
	if cl == nil {
		return code
	}
	defer cl.Close()
	v, err := cl.GlobalView()
	if err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(v)
	}
	writeView(c.stdout, v, false, nil)
	return exitOK
}

// queryFlags are the flags of a query, shared by query and watch's probe.
type queryFlags struct {
	q      httpclient.QueryRequest
	tokens tokenFlags
}

func (f *queryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.q.Model, "model", "", "model name")
	fs.Int64Var(&f.q.BlockSize, "block-size", 0, "tokens per KV block")
	fs.StringVar(&f.q.LoraName, "lora", "", "LoRA adapter name (empty: base model)")
	fs.StringVar(&f.q.TenantID, "tenant", "", "tenant id (empty: default)")
	fs.StringVar(&f.q.InstanceID, "instance", "", "only report this instance")
	fs.StringVar(&f.q.CacheSalt, "salt", "", "cache salt the engines folded into their hashes")
	fs.BoolVar(&f.q.BinaryTokens, "binary", false, "send token_ids as a bin of little-endian int32 instead of an array")
	f.tokens.register(fs)
}

// load checks the query's required flags and reads its tokens.
func (f *queryFlags) load(stdin io.Reader, rest []string) error {
	if f.q.Model == "" {
		return usageErr("missing --model")
	}
	if f.q.BlockSize <= 0 {
		return usageErr("missing or non-positive --block-size")
	}
	toks, err := f.tokens.read(stdin, rest)
	if err != nil {
		return err
	}
	f.q.TokenIDs = toks
	return nil
}

func (c *cli) cmdQuery(g *globals, args []string) int {
	const name = "query"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var f queryFlags
	f.register(fs)
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	if err := f.load(c.stdin, fs.Args()); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return c.usageError(name, fs, ue.msg)
		}
		return c.inputError(err)
	}
	cl, code := c.client(g)
	if cl == nil {
		return code
	}
	defer cl.Close()
	var res httpclient.QueryResult
	if err := cl.Query(&f.q, &res); err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(res)
	}
	writeQuery(c.stdout, &res, len(f.q.TokenIDs))
	return exitOK
}
