package service

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/translate"
)

// Subscription is a running event consumer for one registered service. Those of package
// ingest/source also report their handler's counters (source.Subscription) and, for a
// Mooncake master locator, the master view's (source.LeaderStatser).
type Subscription interface {
	Stop()
	Stats() ingest.SubscriberStats
}

// SubscribeFunc starts consuming the events of a validated registration. The default is
// ZMQSubscriber's (package ingest/source); tests may substitute it.
type SubscribeFunc func(cfg *Config, eng *engine.Engine, log *slog.Logger) (Subscription, error)

// Limits of the service layer (the max_services and max_registration_field_bytes keys).
const (
	DefaultMaxServices   = 1024
	DefaultMaxFieldBytes = 1024
)

// MaxIndexMedia bounds a registration's index_media list (an engine names three media;
// repeats are allowed, but not without end).
const MaxIndexMedia = 16

// Options configures a Service.
type Options struct {
	Engine    *engine.Engine
	Logger    *slog.Logger
	Subscribe SubscribeFunc // nil: ZMQSubscriber with default options
	// Store, if set, makes the services registered over HTTP or RPC (not the static
	// ones from the config file) durable: a change is acknowledged only once stored.
	Store Store
	// MaxServices caps registered services (0: DefaultMaxServices).
	MaxServices int
	// MaxFieldBytes bounds each string field of RegisterInput (0: DefaultMaxFieldBytes).
	MaxFieldBytes int
}

type registration struct {
	cfg Config
	sub Subscription
	// static: registered from the config file at start (not persisted in the state file).
	static bool
}

// Service is the business layer shared by the HTTP routes and the RPC listener: every
// registration, unregistration and query goes through it, so validation is written once.
type Service struct {
	eng       *engine.Engine
	log       *slog.Logger
	subscribe SubscribeFunc
	store     Store

	maxServices   int
	maxFieldBytes int
	// refused counts registrations refused by maxServices.
	refused atomic.Uint64

	mu        sync.Mutex
	services  map[ID]*registration // by structured service key
	endpoints map[string]ID        // endpoint -> owner
	stopping  atomic.Bool
	stopOnce  sync.Once
}

// New builds the service layer over an engine.
func New(opts Options) *Service {
	s := &Service{
		eng:       opts.Engine,
		log:       opts.Logger,
		subscribe: opts.Subscribe,
		store:     opts.Store,
		services:  make(map[ID]*registration),
		endpoints: make(map[string]ID),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.subscribe == nil {
		s.subscribe = ZMQSubscriber(source.Options{})
	}
	s.maxServices, s.maxFieldBytes = opts.MaxServices, opts.MaxFieldBytes
	if s.maxServices <= 0 {
		s.maxServices = DefaultMaxServices
	}
	if s.maxFieldBytes <= 0 {
		s.maxFieldBytes = DefaultMaxFieldBytes
	}
	return s
}

// RefusedServices counts the registrations refused by max_services.
func (s *Service) RefusedServices() uint64 { return s.refused.Load() }

// Engine returns the index the service serves.
func (s *Service) Engine() *engine.Engine { return s.eng }

var errStopping = StoppingError()

// RegisterInput validates raw registration input and registers it.
func (s *Service) RegisterInput(r *Registration) (cfg Config, isNew bool, err *Error) {
	for _, f := range [...]struct{ name, v string }{
		{"endpoint", r.Endpoint}, {"replay_endpoint", r.ReplayEndpoint}, {"modelname", r.ModelName},
		{"instance_id", r.InstanceID}, {"lora_name", r.LoraName}, {"tenant_id", r.TenantID},
		{"strategy", r.Strategy}, {"algorithm", r.Algorithm}, {"python_hash_seed", r.PythonHashSeed},
		{"index_projection", r.IndexProjection}, {"root_digest", r.RootDigest},
		{"extra_keys", r.ExtraKeys}, {"lora_path", r.LoraPath},
	} {
		if len(f.v) > s.maxFieldBytes {
			return cfg, false, invalidField("invalid_value", f.name,
				fmt.Sprintf("%s is %d bytes, longer than the limit of %d (max_registration_field_bytes)", f.name, len(f.v), s.maxFieldBytes))
		}
	}
	if len(r.IndexMedia) > MaxIndexMedia {
		return cfg, false, invalidField("invalid_value", "index_media",
			fmt.Sprintf("index_media has %d entries, more than the limit of %d", len(r.IndexMedia), MaxIndexMedia))
	}
	for _, m := range r.IndexMedia {
		if len(m) > s.maxFieldBytes {
			return cfg, false, invalidField("invalid_value", "index_media",
				fmt.Sprintf("an index_media entry is %d bytes, longer than the limit of %d (max_registration_field_bytes)", len(m), s.maxFieldBytes))
		}
	}
	cfg, err = r.Resolve()
	if err != nil {
		return cfg, false, err
	}
	isNew, err = s.Register(&cfg)
	return cfg, isNew, err
}

// Register registers a validated configuration and starts consuming its events. An
// identical configuration already registered succeeds with isNew false.
func (s *Service) Register(cfg *Config) (isNew bool, err *Error) {
	return s.register(cfg, false)
}

// RegisterStatic registers a service from the config file: like Register, but it is not
// written to the state file (the config file already brings it back).
func (s *Service) RegisterStatic(cfg *Config) (isNew bool, err *Error) {
	return s.register(cfg, true)
}

// Store makes dynamic registrations durable (StateFile implements it; so does the
// cluster registry's glue in package server). Each call returns once the change is on
// stable storage; on error nothing was recorded. A Put that the store refuses (the
// cluster registry's transactions find a conflict) returns a *Error, which is the
// registration's answer; any other error is answered as an internal failure. Put is
// also called for a registration repeated identically, which the store may already
// hold (it then changes nothing) or may have lost.
type Store interface {
	Put(cfg *Config) error
	Delete(id ID) error
}

// SetStore installs the store (after start-up registration).
func (s *Service) SetStore(st Store) {
	s.mu.Lock()
	s.store = st
	s.mu.Unlock()
}

// DynamicServices lists the services registered over HTTP or RPC (not static ones).
func (s *Service) DynamicServices() []Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Config
	for _, r := range s.services {
		if !r.static {
			out = append(out, r.cfg)
		}
	}
	sort.Slice(out, func(i, j int) bool { return lessConfig(&out[i], &out[j]) })
	return out
}

func (s *Service) register(cfg *Config, static bool) (isNew bool, err *Error) {
	if s.stopping.Load() {
		return false, errStopping
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping.Load() {
		return false, errStopping
	}
	return s.registerLocked(cfg, static, !static)
}

// registerLocked is register with s.mu held; persist says whether the store must record
// it (false for static services and for registrations the cluster registry reports).
// A registration of another adapter of a registered engine (same service but for its
// lora_name and lora_path) adds that adapter (addAdaptersLocked).
func (s *Service) registerLocked(cfg *Config, static, persist bool) (isNew bool, err *Error) {
	key := cfg.Key()
	id := cfg.ID()
	if cur, ok := s.services[id]; ok {
		if !cur.cfg.Equal(cfg) {
			return s.addAdaptersLocked(cur, cfg, static, persist)
		}
		if persist && !cur.static && s.store != nil {
			// Stored again: the store may have lost it (an etcd restored empty, before the
			// replica noticed), and a registration answered 200 must be in the store.
			if perr := s.store.Put(cfg); perr != nil {
				var refused *Error
				if errors.As(perr, &refused) {
					return false, refused
				}
				s.log.Error("repeated registration could not be made durable", "service", key, "err", perr)
				return false, &Error{Code: CodeInternal, Msg: "Failed to persist registration: " + perr.Error()}
			}
		}
		return false, nil
	}
	if len(s.services) >= s.maxServices {
		s.refused.Add(1)
		return false, invalidRegistration("too many services: the limit is %d (max_services)", s.maxServices)
	}
	if other, ok := s.endpoints[cfg.Endpoint]; ok {
		return false, invalidRegistration("endpoint %s is already used by service %s", cfg.Endpoint, other.String())
	}
	for _, a := range cfg.Loras() {
		ac := cfg.ForAdapter(a)
		if perr := s.eng.CheckProfile(ac.Context(), ac.Profile); perr != nil {
			return false, invalidRegistration("registration conflicts with the ContextKey hash profile")
		}
	}
	// The slots are registered before the subscriber starts, so that no event (a catch-up
	// replay can arrive at once) finds one missing. If subscribing fails, the slots go
	// again, and so does a context this registration created: it would otherwise pin this
	// (possibly wrong) hash profile until restart.
	var undo contextUndo
	if cfg.Kind.IsEngine() {
		for _, a := range cfg.Loras() {
			ac := cfg.ForAdapter(a)
			if rerr := s.registerSlot(&ac, key, &undo); rerr != nil {
				undo.run(s.eng)
				return false, rerr
			}
		}
	} else {
		undo.track(s.eng, cfg.Context())
	}
	sub, serr := s.subscribe(cfg, s.eng, s.log)
	if serr != nil {
		undo.run(s.eng)
		s.log.Error("subscribe failed; registration rolled back", "service", key, "endpoint", cfg.Endpoint, "err", serr)
		return false, &Error{Code: CodeInternal, Msg: "Failed to subscribe: " + serr.Error()}
	}
	if persist && s.store != nil {
		// Durable before acknowledged: a registration that could not be stored is undone
		// whole (subscriber stopped, anything it indexed retracted, slots and new contexts
		// removed) and answered 500.
		if perr := s.store.Put(cfg); perr != nil {
			sub.Stop()
			if !cfg.Kind.IsEngine() {
				s.eng.RetractSource(cfg.Endpoint)
			}
			undo.run(s.eng)
			return false, s.storeRefusal(key, "registration", perr)
		}
	}
	s.services[id] = &registration{cfg: *cfg, sub: sub, static: static}
	s.endpoints[cfg.Endpoint] = id
	s.log.Info("service registered", "service", key, "type", cfg.Kind.String(), "endpoint", cfg.Endpoint,
		"replay_endpoint", cfg.ReplayEndpoint, "model", cfg.ModelName, "lora", loraNames(cfg),
		"block_size", cfg.BlockSize, "strategy", cfg.Profile.StrategyName(), "algorithm", cfg.Profile.AlgorithmName(),
		"extra_keys", cfg.Profile.ExtraKeysName(), "lookahead_tokens", cfg.Profile.Lookahead,
		"index_media", cfg.Media.Names(cfg.Kind))
	return true, nil
}

// storeRefusal answers a store's failure to record a change (what is the change, for
// logs): a refusal by the store's rules (a *Error) is the answer as is; anything else is
// an internal failure. The caller has undone the change.
func (s *Service) storeRefusal(key, what string, perr error) *Error {
	var refused *Error
	if errors.As(perr, &refused) {
		s.log.Info(what+" refused by the store; rolled back", "service", key, "err", perr)
		return refused
	}
	s.log.Error(what+" could not be made durable; rolled back", "service", key, "err", perr)
	return &Error{Code: CodeInternal, Msg: "Failed to persist " + what + ": " + perr.Error()}
}

// contextUndo remembers what a registration created in the engine (slots, contexts), so
// that a registration that fails half-way leaves nothing behind.
type contextUndo struct {
	slots    []engine.ContextKey // contexts where the slot was registered by us
	slot     engine.Slot
	newCtxes []engine.ContextKey // contexts that did not exist before
}

// track notes whether the context of key exists before the registration touches it.
func (u *contextUndo) track(eng *engine.Engine, key engine.ContextKey) {
	if _, ok := eng.ContextProfile(key); !ok {
		u.newCtxes = append(u.newCtxes, key)
	}
}

// run unregisters the slots and drops the contexts that are empty again, newest first.
func (u *contextUndo) run(eng *engine.Engine) {
	for i := len(u.slots) - 1; i >= 0; i-- {
		eng.UnregisterSlot(u.slots[i], u.slot)
	}
	for i := len(u.newCtxes) - 1; i >= 0; i-- {
		eng.DropEmptyContext(u.newCtxes[i])
	}
	*u = contextUndo{}
}

// loraNames lists a registration's adapters for logs, quoted (the base model's is "").
func loraNames(cfg *Config) string {
	out := make([]string, 0, 1+len(cfg.Adapters))
	for _, a := range cfg.Loras() {
		out = append(out, strconv.Quote(a.LoraName))
	}
	return strings.Join(out, ",")
}

// registerSlot adds an engine registration's (instance, rank) to its context (one
// adapter's), creating the context on first use; undo learns what to take back.
func (s *Service) registerSlot(cfg *Config, key string, undo *contextUndo) *Error {
	ctx := cfg.Context()
	undo.track(s.eng, ctx)
	created, rerr := s.eng.RegisterSlot(ctx, cfg.Profile, cfg.Slot())
	if rerr != nil {
		if errors.Is(rerr, engine.ErrProfileConflict) {
			return invalidRegistration("registration conflicts with the ContextKey hash profile")
		}
		return &Error{Code: CodeInternal, Msg: fmt.Sprintf("register %s: %v", key, rerr)}
	}
	if created {
		undo.slot = cfg.Slot()
		undo.slots = append(undo.slots, ctx)
	}
	return nil
}

// Unregister stops consuming a service's events (waiting for its in-flight batch) and
// removes what it contributed to the index. It returns the removed service key.
func (s *Service) Unregister(instanceID, tenantID string, dpRank int) (string, *Error) {
	id, err := s.unregisterID(instanceID, tenantID, dpRank)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unregisterLocked(id, true)
}

// unregisterID validates the identity an unregistration names ("" tenant: "default").
func (s *Service) unregisterID(instanceID, tenantID string, dpRank int) (ID, *Error) {
	if tenantID == "" {
		tenantID = "default"
	}
	if instanceID == "" {
		return ID{}, invalidField("invalid_value", "instance_id", "instance_id must not be empty")
	}
	if dpRank < 0 {
		return ID{}, invalidField("invalid_value", "dp_rank", "dp_rank must be a non-negative int")
	}
	if s.stopping.Load() {
		return ID{}, errStopping
	}
	return ID{InstanceID: instanceID, TenantID: tenantID, DPRank: dpRank}, nil
}

// unregisterLocked is Unregister with s.mu held; persist false leaves the store alone
// (the cluster registry reported the unregistration).
func (s *Service) unregisterLocked(id ID, persist bool) (string, *Error) {
	key := id.String()
	reg, ok := s.services[id]
	if !ok {
		return "", &Error{Code: CodeNotFound, Msg: "service not found: " + key}
	}
	if persist && !reg.static && s.store != nil {
		// Recorded first: if the removal cannot be made durable, nothing changes and the
		// caller gets 500 (the service would otherwise come back at restart).
		if perr := s.store.Delete(id); perr != nil {
			s.log.Error("unregistration could not be made durable; service kept", "service", key, "err", perr)
			return "", &Error{Code: CodeInternal, Msg: "Failed to persist unregistration: " + perr.Error()}
		}
	}
	reg.sub.Stop()
	s.retract(&reg.cfg)
	delete(s.services, id)
	delete(s.endpoints, reg.cfg.Endpoint)
	s.log.Info("service unregistered", "service", key, "endpoint", reg.cfg.Endpoint)
	return key, nil
}

// retract removes everything a stopped service contributed, in every adapter's context.
func (s *Service) retract(cfg *Config) {
	if !cfg.Kind.IsEngine() {
		s.eng.RetractSource(cfg.Endpoint)
		return
	}
	for _, a := range cfg.Loras() {
		ac := cfg.ForAdapter(a)
		s.eng.UnregisterSlot(ac.Context(), cfg.Slot())
	}
}

// Subscription returns the running subscription of a registration.
func (s *Service) Subscription(id ID) (Subscription, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.services[id]
	if !ok {
		return nil, false
	}
	return r.sub, true
}

// Services lists the active registrations ordered by service key.
func (s *Service) Services() []Config {
	s.mu.Lock()
	out := make([]Config, 0, len(s.services))
	for _, r := range s.services {
		out = append(out, r.cfg)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return lessConfig(&out[i], &out[j]) })
	return out
}

// Stats is one service's key, configuration and subscriber counters.
type Stats struct {
	Key string
	// Label is the unambiguous metrics label (ID.Label).
	Label  string
	Config Config
	Stats  ingest.SubscriberStats
	// Handler holds the event handler's counters when HasHandler (ZMQ subscriptions).
	Handler    translate.HandlerStats
	HasHandler bool
	// Leader holds the master-view counters when HasLeader (Mooncake master locators).
	Leader    source.LeaderStats
	HasLeader bool
	// Checks are the profile self-checks of an engine service's adapters (one per
	// lora_name; none when the check is off).
	Checks []AdapterCheck
}

// AdapterCheck is the profile self-check of one adapter's context.
type AdapterCheck struct {
	LoraName string
	Stats    hashing.CheckStats
}

// handlerStatser is implemented by subscriptions that expose their event handler's counters.
type handlerStatser interface{ HandlerStats() translate.HandlerStats }

// Stats returns every service's subscriber counters, ordered by service key.
func (s *Service) Stats() []Stats {
	s.mu.Lock()
	out := make([]Stats, 0, len(s.services))
	for _, r := range s.services {
		st := Stats{Key: r.cfg.Key(), Label: r.cfg.ID().Label(), Config: r.cfg, Stats: r.sub.Stats()}
		if hs, ok := r.sub.(handlerStatser); ok {
			st.Handler, st.HasHandler = hs.HandlerStats(), true
		}
		if ls, ok := r.sub.(source.LeaderStatser); ok {
			st.Leader, st.HasLeader = ls.LeaderStats(), true
		}
		if router, ok := r.sub.(AdapterRouter); ok && r.cfg.Kind.IsEngine() {
			for _, a := range r.cfg.Loras() {
				if cs, ok := router.CheckStats(a.LoraName); ok {
					st.Checks = append(st.Checks, AdapterCheck{LoraName: a.LoraName, Stats: cs})
				}
			}
		}
		out = append(out, st)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return lessConfig(&out[i].Config, &out[j].Config) })
	return out
}

// GlobalView returns the indexed contexts.
func (s *Service) GlobalView() ([]engine.ContextView, *Error) {
	if s.stopping.Load() {
		return nil, errStopping
	}
	return s.eng.GlobalView(), nil
}

// Stopping reports whether Stop has begun.
func (s *Service) Stopping() bool { return s.stopping.Load() }

// BeginStop makes every later request answer "unavailable" (HTTP 503, RPC
// CONDUCTOR_UNAVAILABLE) while in-flight ones finish.
func (s *Service) BeginStop() { s.stopping.Store(true) }

// Stop refuses new work and stops every subscriber, once. Registrations are kept in memory
// (the process is exiting); the engine is closed by its owner.
func (s *Service) Stop() {
	s.stopping.Store(true)
	s.stopOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, r := range s.services {
			r.sub.Stop()
		}
		s.log.Info("service layer stopped", "services", len(s.services))
	})
}

// lessConfig orders services by their text key, as upstream lists them, then by the
// structured ID where two texts coincide.
func lessConfig(a, b *Config) bool {
	ka, kb := a.Key(), b.Key()
	if ka != kb {
		return ka < kb
	}
	return a.ID().Less(b.ID())
}
