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
	var r httpclient.RegisterRequest
	var file, cacheGroup string
	fs := registerFlags(&r, &file, &cacheGroup)
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		return c.usageError(name, fs, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	if file != "" {
		fromFile, err := c.readRegisterFile(file)
		if err != nil {
			return c.inputError(err)
		}
		// The flags given override the file's fields: parse them again onto its values
		// (they parsed once already, so they parse again).
		r = fromFile
		again := registerFlags(&r, &file, &cacheGroup)
		(&globals{}).register(again)
		again.SetOutput(io.Discard)
		_ = again.Parse(args)
	}
	if cacheGroup != "" && cacheGroup != "nil" && cacheGroup != "null" {
		v, err := strconv.ParseInt(cacheGroup, 10, 64)
		if err != nil {
			return c.usageError(name, fs, fmt.Sprintf("--cache-group %q is not an integer", cacheGroup))
		}
		r.CacheGroup = &v
	}
	applyProfileDefaults(&r)
	if msg := missingRegisterField(&r); msg != "" {
		return c.usageError(name, fs, msg)
	}
	return call(c, g, func(cl *httpclient.Client) (httpclient.RegisterResult, error) { return cl.Register(&r) },
		func(res httpclient.RegisterResult) int {
			return c.printRows([2]string{"status", res.Status}, [2]string{"instance_id", res.InstanceID})
		})
}

// call makes one request of the conductor at g.addr (do) and prints its answer: as JSON
// with --json, otherwise with human. Failures print the reason and map to the exit status.
func call[T any](c *cli, g *globals, do func(*httpclient.Client) (T, error), human func(T) int) int {
	cl, code := c.client(g)
	if cl == nil {
		return code
	}
	defer cl.Close()
	res, err := do(cl)
	if err != nil {
		return c.callError(err)
	}
	if g.json {
		return c.printJSON(res)
	}
	return human(res)
}

// printRows prints name, value rows as an aligned table.
func (c *cli) printRows(rows ...[2]string) int {
	tw := newTable(c.stdout)
	for _, r := range rows {
		tw.row(r[0], r[1])
	}
	return tw.flush(c.stderr)
}

// readInput reads the file at path, or stdin for "-".
func (c *cli) readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(c.stdin)
	}
	return os.ReadFile(path)
}

func (c *cli) readRegisterFile(path string) (httpclient.RegisterRequest, error) {
	var r httpclient.RegisterRequest
	data, err := c.readInput(path)
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

// registerFlags is register's flag set, writing into r (whose values are the defaults),
// file and cacheGroup.
func registerFlags(r *httpclient.RegisterRequest, file, cacheGroup *string) *flag.FlagSet {
	fs := flag.NewFlagSet("register", flag.ContinueOnError)
	fs.StringVar(file, "file", *file, "JSON object in the HTTP field names (endpoint, type, modelname, hash_profile{...}, ...); \"-\" reads stdin. Flags given too override its fields")
	fs.StringVar(&r.Endpoint, "endpoint", r.Endpoint, "ZMQ PUB endpoint of the publisher (tcp://host:port)")
	fs.StringVar(&r.ReplayEndpoint, "replay-endpoint", r.ReplayEndpoint, "ZMQ replay endpoint (vLLM, SGLang)")
	fs.StringVar(&r.Type, "type", r.Type, "publisher type: vLLM, SGLang or Mooncake")
	contextFlags(fs, &r.ModelName, &r.LoraName, &r.TenantID, &r.BlockSize)
	fs.StringVar(&r.InstanceID, "instance", r.InstanceID, "router-facing instance id")
	fs.Int64Var(&r.DPRank, "dp-rank", r.DPRank, "data-parallel rank")
	fs.StringVar(cacheGroup, "cache-group", *cacheGroup, "cache group (only 0 is supported; empty or nil: not sent)")
	p := &r.HashProfile
	fs.StringVar(&p.Strategy, "strategy", p.Strategy, "hash strategy: vllm_v1, sglang or sglang_bigram (default from --type: vLLM vllm_v1, SGLang sglang)")
	fs.StringVar(&p.Algorithm, "algorithm", p.Algorithm, "hash algorithm: sha256 or sha256_cbor for vllm_v1 (required); sha256_raw for sglang (default)")
	fs.StringVar(&p.PythonHashSeed, "seed", p.PythonHashSeed, "publisher's PYTHONHASHSEED, decimal or \"random\" (required for vllm_v1)")
	fs.StringVar(&p.IndexProjection, "projection", p.IndexProjection, "index projection (default from strategy: low64_be for vllm_v1, first64_be for sglang)")
	fs.StringVar(&p.ExtraKeys, "extra-keys", p.ExtraKeys, "vLLM extra-key form: untagged (vLLM <= 0.30, the default) or tagged (vLLM >= 0.31)")
	fs.StringVar(&p.LoraPath, "lora-path", p.LoraPath, "the adapter path the engine was given (vLLM tagged; SGLang >= 0.5.23)")
	fs.Int64Var(&p.LookaheadTokens, "lookahead-tokens", p.LookaheadTokens, "vLLM num_hash_lookahead_tokens (EAGLE/MTP speculative decoding, vLLM >= 0.33)")
	fs.Func("index-media", "comma-separated media to index (vLLM GPU,CPU,STORAGE; SGLang GPU,CPU_PINNED,DISK); empty: the type's default",
		func(v string) error {
			r.IndexMedia = nil
			if v != "" {
				r.IndexMedia = strings.Split(v, ",")
			}
			return nil
		})
	return fs
}

// contextFlags registers the flags naming an index context (register, query): --model,
// --lora, --tenant and --block-size, defaulting to the values they point at.
func contextFlags(fs *flag.FlagSet, model, lora, tenant *string, blockSize *int64) {
	fs.StringVar(model, "model", *model, "model name")
	fs.StringVar(lora, "lora", *lora, "LoRA adapter name (empty: base model)")
	fs.StringVar(tenant, "tenant", *tenant, "tenant id (empty: default)")
	fs.Int64Var(blockSize, "block-size", *blockSize, "tokens per KV block")
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

// missingRegisterField returns the message for the first required field r lacks, or "".
func missingRegisterField(r *httpclient.RegisterRequest) string {
	p := &r.HashProfile
	for _, check := range [...]struct {
		missing bool
		msg     string
	}{
		{r.Endpoint == "", "missing --endpoint"},
		{r.Type == "", "missing --type (vLLM, SGLang or Mooncake)"},
		{r.ModelName == "", "missing --model"},
		{r.InstanceID == "", "missing --instance"},
		{r.BlockSize <= 0, "missing or non-positive --block-size"},
		{p.Strategy == "", "missing --strategy (vllm_v1, sglang or sglang_bigram)"},
		{p.Algorithm == "", "missing --algorithm (sha256 or sha256_cbor for vllm_v1)"},
		{p.IndexProjection == "", "missing --projection"},
		{p.Strategy == "vllm_v1" && p.PythonHashSeed == "", "missing --seed (the publisher's PYTHONHASHSEED, or \"random\"), required for vllm_v1"},
	} {
		if check.missing {
			return check.msg
		}
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
	return call(c, g, func(cl *httpclient.Client) (httpclient.UnregisterResult, error) { return cl.Unregister(&r) },
		func(res httpclient.UnregisterResult) int {
			return c.printRows([2]string{"status", res.Status},
				[2]string{"removed_instances", strings.Join(res.RemovedInstances, ", ")})
		})
}

// noArgs parses the flags of a command that takes none of its own (services, view). It
// returns -1 to go on, or the exit status when parsing ended the command.
func (c *cli) noArgs(name string, g *globals, args []string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if code := c.parseFlags(name, fs, g, args); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		return c.usageError(name, fs, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	return -1
}

func (c *cli) cmdServices(g *globals, args []string) int {
	if code := c.noArgs("services", g, args); code >= 0 {
		return code
	}
	return call(c, g, (*httpclient.Client).Services, func(l httpclient.ServiceList) int {
		writeServices(c.stdout, l, true)
		return exitOK
	})
}

func (c *cli) cmdView(g *globals, args []string) int {
	if code := c.noArgs("view", g, args); code >= 0 {
		return code
	}
	return call(c, g, (*httpclient.Client).GlobalView, func(v httpclient.GlobalView) int {
		writeView(c.stdout, v, false, nil)
		return exitOK
	})
}

// queryFlags are the flags of a query, shared by query and watch's probe.
type queryFlags struct {
	q      httpclient.QueryRequest
	tokens tokenFlags
}

func (f *queryFlags) register(fs *flag.FlagSet) {
	contextFlags(fs, &f.q.Model, &f.q.LoraName, &f.q.TenantID, &f.q.BlockSize)
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
	query := func(cl *httpclient.Client) (*httpclient.QueryResult, error) {
		var res httpclient.QueryResult
		return &res, cl.Query(&f.q, &res)
	}
	return call(c, g, query, func(res *httpclient.QueryResult) int {
		writeQuery(c.stdout, res, len(f.q.TokenIDs))
		return exitOK
	})
}
