package service

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Config is one validated publisher registration.
type Config struct {
	Endpoint       string
	ReplayEndpoint string
	Kind           publisher.Kind
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int64
	DPRank         int
	// CacheGroup is nil when absent; only 0 is accepted otherwise.
	CacheGroup *int64
	// Profile is the hash profile of the registration's adapter (LoraName): its
	// LoraPath is that adapter's.
	Profile hashing.Profile
	// Media is what the source indexes (index_media); the zero value is the contract's
	// default for the kind.
	Media translate.MediaSet
	// Adapters are the other LoRA adapters of the same engine registered on this
	// service (multi-LoRA: one event stream, a context per lora_name), sorted by name,
	// none named LoraName. Each shares the registration but for its lora_name and
	// lora_path.
	Adapters []Adapter
}

// Adapter is one more LoRA adapter of a multi-LoRA engine's registration.
type Adapter struct {
	LoraName string
	// LoraPath is the adapter's lora_path ("" when its profile has none).
	LoraPath string
}

// Key is the service key `instance_id|tenant_id|dp_rank`, as upstream prints it (in
// logs, `removed_key` and error texts). It is ambiguous when an id contains `|`; the
// service layer identifies services by ID, never by this text.
func (c *Config) Key() string {
	return Key(c.InstanceID, c.TenantID, c.DPRank)
}

// ID identifies a registration: the structured form of the service key, so that
// instance "a|b" in tenant "c" and instance "a" in tenant "b|c" stay two services.
type ID struct {
	InstanceID string
	TenantID   string
	DPRank     int
}

// ID is the registration's structured identity.
func (c *Config) ID() ID {
	return ID{InstanceID: c.InstanceID, TenantID: c.TenantID, DPRank: c.DPRank}
}

// String is the upstream text form `instance_id|tenant_id|dp_rank`.
func (id ID) String() string { return Key(id.InstanceID, id.TenantID, id.DPRank) }

// Label is the service's metrics label: the text key, except that `\` and `|` inside
// the ids are escaped with a backslash, so two services never share a label set.
func (id ID) Label() string {
	if !strings.ContainsAny(id.InstanceID, "|\\") && !strings.ContainsAny(id.TenantID, "|\\") {
		return id.String()
	}
	esc := strings.NewReplacer("\\", "\\\\", "|", "\\|")
	return esc.Replace(id.InstanceID) + "|" + esc.Replace(id.TenantID) + "|" + strconv.Itoa(id.DPRank)
}

// Less orders IDs field by field (instance, tenant, rank): a total order, unlike the text.
func (id ID) Less(o ID) bool {
	if id.InstanceID != o.InstanceID {
		return id.InstanceID < o.InstanceID
	}
	if id.TenantID != o.TenantID {
		return id.TenantID < o.TenantID
	}
	return id.DPRank < o.DPRank
}

// Key builds the service key `instance_id|tenant_id|dp_rank`.
func Key(instanceID, tenantID string, dpRank int) string {
	return instanceID + "|" + tenantID + "|" + strconv.Itoa(dpRank)
}

// Context is the registration's index context.
func (c *Config) Context() engine.ContextKey {
	return engine.ContextKey{TenantID: c.TenantID, ModelName: c.ModelName, LoraName: c.LoraName, BlockSize: c.BlockSize}
}

// Slot is the registration's (instance, rank) slot in its context.
func (c *Config) Slot() engine.Slot {
	return engine.Slot{InstanceID: c.InstanceID, DPRank: c.DPRank}
}

// Equal reports whether two registrations are the same configuration, adapters
// included (an identical re-registration is idempotent; anything else under the same
// key is a conflict, or, for another adapter of the same engine, an added adapter).
func (c *Config) Equal(o *Config) bool {
	return c.SameEngine(o) && c.LoraName == o.LoraName && c.Profile.Equal(o.Profile) &&
		slices.Equal(c.Adapters, o.Adapters)
}

// SameEngine reports whether two registrations describe the same engine stream, as
// the registrations of several adapters of one multi-LoRA engine do: equal but for
// their lora_name and lora_path (and adapters).
func (c *Config) SameEngine(o *Config) bool {
	if (c.CacheGroup == nil) != (o.CacheGroup == nil) {
		return false
	}
	if c.CacheGroup != nil && *c.CacheGroup != *o.CacheGroup {
		return false
	}
	return c.Endpoint == o.Endpoint && c.ReplayEndpoint == o.ReplayEndpoint && c.Kind == o.Kind &&
		c.ModelName == o.ModelName && c.TenantID == o.TenantID &&
		c.InstanceID == o.InstanceID && c.BlockSize == o.BlockSize && c.DPRank == o.DPRank &&
		c.Profile.SameEngine(o.Profile) && c.Profile.Seed == o.Profile.Seed && c.Media == o.Media
}

// Loras lists the registration's adapters: its own (LoraName) first, then Adapters.
func (c *Config) Loras() []Adapter {
	out := make([]Adapter, 0, 1+len(c.Adapters))
	out = append(out, Adapter{LoraName: c.LoraName, LoraPath: c.Profile.LoraPath})
	return append(out, c.Adapters...)
}

// Lora returns the adapter named name, if the registration has it.
func (c *Config) Lora(name string) (Adapter, bool) {
	for _, a := range c.Loras() {
		if a.LoraName == name {
			return a, true
		}
	}
	return Adapter{}, false
}

// ForAdapter is the registration of one of its adapters alone: its lora_name, its
// lora_path in the profile, and no Adapters.
func (c *Config) ForAdapter(a Adapter) Config {
	out := *c
	out.LoraName = a.LoraName
	out.Profile.LoraPath = a.LoraPath
	out.Adapters = nil
	return out
}

// MaxAdapters bounds the adapters of one multi-LoRA registration (each is a context).
const MaxAdapters = 256

// errSGLangAmbiguousLora is the refusal of an SGLang registration that puts the base
// model and a LoRA adapter without lora_path on one engine (docs/engines.md).
const errSGLangAmbiguousLora = "SGLang engine registered for the base model (lora_name \"\") and for adapter %q " +
	"without lora_path: SGLang before 0.5.23 publishes LoRA pages with the base pages' hashes, and unless its Rust " +
	"TreeCore marks them (0.5.22) nothing tells them apart, so base prompts would get wrong hits. Register lora_path " +
	"(SGLang >= 0.5.23, adapters from --lora-paths: their pages are namespaced), or register the base model and " +
	"the adapters of older releases on separate engines"

// WithAdapters returns the registration with the adapters loras (non-empty): the first
// becomes its own (LoraName, the profile's lora_path), the others its Adapters, sorted
// by name. It refuses what no registration of one adapter could be: two adapters of one
// name, an adapter whose lora_path the profile refuses (Profile.CheckLora), adapters on
// a Mooncake source, more than MaxAdapters, and the SGLang setup whose LoRA pages
// cannot be told from base pages (errSGLangAmbiguousLora).
func (c *Config) WithAdapters(loras []Adapter) (Config, *Error) {
	if len(loras) > 1 && !c.Kind.IsEngine() {
		return Config{}, invalidField("invalid_value", "lora_name",
			"a Mooncake source has no LoRA adapters: its events name their own contexts")
	}
	if len(loras) > MaxAdapters {
		return Config{}, invalidRegistration("service %s would have %d LoRA adapters, more than the limit of %d", c.Key(), len(loras), MaxAdapters)
	}
	base := c.Profile.Spec()
	hasBase := false
	for i, a := range loras {
		if !utf8.ValidString(a.LoraName) {
			return Config{}, invalidField("invalid_value", "lora_name", "lora_name must be valid UTF-8")
		}
		for _, b := range loras[:i] {
			if b.LoraName == a.LoraName {
				return Config{}, invalidRegistration("lora_name %q is listed twice", a.LoraName)
			}
		}
		spec := base
		spec.LoraPath = a.LoraPath
		if _, err := resolveProfile(spec, a.LoraName, fmt.Sprintf("adapter %q: ", a.LoraName)); err != nil {
			return Config{}, err
		}
		hasBase = hasBase || a.LoraName == ""
	}
	if c.Kind == publisher.SGLang && hasBase {
		for _, a := range loras {
			if a.LoraName != "" && a.LoraPath == "" {
				return Config{}, invalidRegistration(errSGLangAmbiguousLora, a.LoraName)
			}
		}
	}
	out := c.ForAdapter(loras[0])
	if len(loras) > 1 {
		out.Adapters = append([]Adapter(nil), loras[1:]...)
		slices.SortFunc(out.Adapters, func(a, b Adapter) int { return strings.Compare(a.LoraName, b.LoraName) })
	}
	return out, nil
}

// Registration is unvalidated registration input, whichever protocol or file it came from.
// Resolve validates it once for all of them.
type Registration struct {
	Endpoint       string
	ReplayEndpoint string
	Type           string
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int64
	DPRank         int64
	CacheGroup     *int64

	Strategy        string
	Algorithm       string
	PythonHashSeed  string
	IndexProjection string
	// ExtraKeys, LoraPath and LookaheadTokens are the optional hash_profile fields of
	// issue 25 (zero: their defaults, untagged, none, 0).
	ExtraKeys       string
	LoraPath        string
	LookaheadTokens int64
	// RootDigest is only carried by the RPC wire: empty, or it must equal the derived root.
	RootDigest string
	// IndexMedia is index_media: nil for the kind's default media.
	IndexMedia []string
}

// Spec is the registration's hash_profile as hashing.ResolveSpec takes it.
func (r *Registration) Spec() hashing.Spec {
	return hashing.Spec{Strategy: r.Strategy, Algorithm: r.Algorithm, PythonHashSeed: r.PythonHashSeed,
		IndexProjection: r.IndexProjection, ExtraKeys: r.ExtraKeys, LoraPath: r.LoraPath,
		LookaheadTokens: r.LookaheadTokens}
}

const maxDPRank = 1<<31 - 1

// Resolve validates the registration and resolves its hash profile. Field names in errors
// are the HTTP names (modelname, type, and the bare hash-profile key such as strategy).
func (r *Registration) Resolve() (Config, *Error) {
	var cfg Config
	for _, f := range [...]struct{ name, v string }{
		{"endpoint", r.Endpoint}, {"type", r.Type}, {"modelname", r.ModelName}, {"instance_id", r.InstanceID},
	} {
		if f.v == "" {
			return cfg, invalidField("invalid_value", f.name, f.name+" must not be empty")
		}
	}
	for _, f := range [...]struct{ name, v string }{
		{"endpoint", r.Endpoint}, {"replay_endpoint", r.ReplayEndpoint}, {"modelname", r.ModelName},
		{"instance_id", r.InstanceID}, {"lora_name", r.LoraName}, {"tenant_id", r.TenantID},
	} {
		if !utf8.ValidString(f.v) {
			return cfg, invalidField("invalid_value", f.name, f.name+" must be valid UTF-8")
		}
	}
	if err := checkServiceEndpoint(r.Endpoint, r.Type); err != "" {
		return cfg, invalidField("invalid_value", "endpoint", "endpoint "+err)
	}
	if r.ReplayEndpoint != "" {
		if err := checkEndpoint(r.ReplayEndpoint); err != "" {
			return cfg, invalidField("invalid_value", "replay_endpoint", "replay_endpoint "+err)
		}
	}
	kind, ok := publisher.Parse(r.Type)
	if !ok {
		return cfg, invalidField("invalid_value", "type", "type must be vLLM, SGLang or Mooncake")
	}
	if r.BlockSize <= 0 {
		return cfg, invalidField("out_of_range", "block_size", "block_size must be greater than zero")
	}
	if r.DPRank < 0 || r.DPRank > maxDPRank {
		return cfg, invalidField("out_of_range", "dp_rank", "dp_rank must be in 0..2147483647")
	}
	if r.CacheGroup != nil && *r.CacheGroup != 0 {
		return cfg, invalidField("unsupported", "cache_group", "cache_group: only 0 is supported")
	}
	profile, verr := resolveProfile(r.Spec(), r.LoraName, "")
	if verr != nil {
		return cfg, verr
	}
	if r.RootDigest != "" && r.RootDigest != profile.RootHex() {
		return cfg, invalidField("invalid_value", "root_digest",
			"root_digest does not match python_hash_seed and hash selectors")
	}
	media, err := translate.ParseIndexMedia(kind, r.IndexMedia)
	if err != nil {
		return cfg, invalidField("invalid_value", "index_media", err.Error())
	}
	tenant := r.TenantID
	if tenant == "" {
		tenant = "default"
	}
	cfg = Config{
		Endpoint:       r.Endpoint,
		ReplayEndpoint: r.ReplayEndpoint,
		Kind:           kind,
		ModelName:      r.ModelName,
		LoraName:       r.LoraName,
		TenantID:       tenant,
		InstanceID:     r.InstanceID,
		BlockSize:      r.BlockSize,
		DPRank:         int(r.DPRank),
		Profile:        profile,
		Media:          media,
	}
	if r.CacheGroup != nil {
		g := *r.CacheGroup
		cfg.CacheGroup = &g
	}
	return cfg, nil
}

// resolveProfile resolves a hash_profile for an adapter (loraName) and checks that it
// fits it (Profile.CheckLora). A refusal names the bare key as its field, as upstream
// does (strategy, algorithm, index_projection, python_hash_seed, and the optional
// extra_keys, lora_path, lookahead_tokens): clients switch on it; what prefixes the
// message.
func resolveProfile(spec hashing.Spec, loraName, what string) (hashing.Profile, *Error) {
	p, err := hashing.ResolveSpec(spec)
	if err == nil {
		err = p.CheckLora(loraName)
	}
	if err != nil {
		field := "hash_profile"
		if fe, ok := err.(*hashing.FieldError); ok {
			field = fe.Field
		}
		return p, invalidField("invalid_value", field, what+"hash_profile: "+err.Error())
	}
	return p, nil
}

// checkServiceEndpoint validates a registration's endpoint: a master locator (only for
// type Mooncake) or a ZMQ endpoint (checkEndpoint).
func checkServiceEndpoint(ep, typ string) string {
	if !source.IsMasterLocator(ep) {
		return checkEndpoint(ep)
	}
	if k, ok := publisher.Parse(typ); ok && k != publisher.Mooncake {
		return "is an etcd:// Mooncake master locator, which only type Mooncake may use"
	}
	if _, err := source.ParseMasterLocator(ep); err != nil {
		return "is not a valid Mooncake master locator (etcd://host:port[,host:port]/<cluster_id>?event_port=N): " + err.Error()
	}
	return ""
}

// checkEndpoint returns why a ZMQ endpoint cannot be subscribed to ("" when it can):
// the conductor connects, so the endpoint must name one publisher, as tcp://host:port
// (a host name, an IPv4 address or a bracketed IPv6 address, and a port in 1..65535,
// nothing after it) or ipc://path. Anything else is refused here, with the field, rather
// than by libzmq at subscribe time (which upstream answers as an internal error):
// libzmq refuses some (no "://", "tcp://*:5555" which only binds, a path after the port)
// and silently accepts others (a port above 65535 wraps). Control bytes are refused:
// libzmq stops at a NUL, so "tcp://h:1\x00A" would connect to tcp://h:1 while escaping
// the endpoint-in-use check, which compares the whole string. Of the transports, only
// tcp:// and ipc:// reach a publisher in another process (inproc:// never does, and the
// multicast ones are not what engines bind). libzmq's "source;host:port" form is not
// accepted.
func checkEndpoint(ep string) string {
	for i := 0; i < len(ep); i++ {
		if c := ep[i]; c < 0x20 || c == 0x7f {
			return fmt.Sprintf("must not contain control bytes (0x%02x at byte %d)", c, i)
		}
	}
	scheme, addr, found := strings.Cut(ep, "://")
	if !found {
		return "is not a ZMQ endpoint: use tcp://host:port or ipc://path"
	}
	switch scheme {
	case "tcp":
		if addr == "" {
			return "has no address after tcp://"
		}
		return checkTCPAddress(addr)
	case "ipc":
		switch addr {
		case "":
			return "has no address after ipc://"
		case "*":
			return "is the wildcard ipc://*, which only binds: name the publisher's socket path"
		}
		return ""
	}
	return "transport " + strconv.Quote(scheme) + " cannot reach a publisher: use tcp:// or ipc://"
}

// checkTCPAddress checks the host:port of a tcp:// endpoint.
func checkTCPAddress(addr string) string {
	var host, port string
	if strings.HasPrefix(addr, "[") {
		end := strings.IndexByte(addr, ']')
		if end < 0 {
			return "has an IPv6 address without its closing ]"
		}
		host = addr[1:end]
		rest := addr[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return "has no :port after the IPv6 address (tcp://[addr]:port)"
		}
		port = rest[1:]
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() {
			return "has an invalid IPv6 address " + strconv.Quote(host)
		}
	} else {
		i := strings.LastIndexByte(addr, ':')
		if i < 0 {
			return "has no port (tcp://host:port)"
		}
		host, port = addr[:i], addr[i+1:]
		switch {
		case host == "":
			return "has no host (tcp://host:port)"
		case host == "*":
			return "has the wildcard host *, which only binds: name the publisher's host"
		}
		for j := 0; j < len(host); j++ {
			c := host[j]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
				return fmt.Sprintf("has an invalid host %q (a name, an IPv4 address or [IPv6]; %q is not allowed in it)", host, string(c))
			}
		}
	}
	n, err := strconv.ParseUint(port, 10, 32)
	if err != nil {
		if i := strings.IndexAny(port, "/?#;"); i >= 0 {
			return fmt.Sprintf("has %q after the port: tcp://host:port names a publisher, nothing follows it", port[i:])
		}
		return fmt.Sprintf("has an invalid port %q (a number in 1..65535)", port)
	}
	if n < 1 || n > 65535 {
		return fmt.Sprintf("has port %d, outside 1..65535", n)
	}
	return ""
}
