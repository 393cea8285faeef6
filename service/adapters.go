package service

import (
	"sort"
	"strconv"
	"strings"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// Multi-LoRA: an engine serving several LoRA adapters publishes all their blocks on one
// event stream, each BlockStored naming its lora_name. Each adapter is registered as
// the same service (instance, tenant, rank, endpoint, model, block size, an engine
// profile) with its own lora_name and lora_path, and gets its own context; the service
// keeps one subscription whose events go to the context of their adapter. Unregistering
// one adapter leaves the others; unregistering the last, or the service without naming
// an adapter, stops the subscription.

// AdapterRouter is implemented by the subscriptions of engine sources (package
// ingest/source): they route each adapter's events to its context.
type AdapterRouter interface {
	// AddContext routes the events of lora_name key.LoraName to key (profile p).
	AddContext(key engine.ContextKey, p hashing.Profile) error
	// RemoveContext stops routing an adapter's events; false if it had no context.
	RemoveContext(loraName string) bool
	// CheckStats is the profile self-check of an adapter's context (false: none).
	CheckStats(loraName string) (hashing.CheckStats, bool)
}

// Updater is implemented by stores whose Put does not replace a stored registration
// (the cluster registry, whose transactions keep one configuration per service):
// Update replaces the stored prev by cfg, the same service on the same endpoint with
// other adapters. Stores without it get Put, which replaces (the state file).
type Updater interface {
	Update(prev, cfg *Config) error
}

// storeUpdate records that the registration prev is now cfg.
func (s *Service) storeUpdate(prev, cfg *Config) error {
	if u, ok := s.store.(Updater); ok {
		return u.Update(prev, cfg)
	}
	return s.store.Put(cfg)
}

// addAdaptersLocked registers, on the registered service cur, the adapters of cfg it
// does not have yet. cfg must be the same engine (Config.SameEngine); an adapter cur
// has must be registered with the same lora_path. Registering only adapters cur has is
// idempotent (isNew false).
func (s *Service) addAdaptersLocked(cur *registration, cfg *Config, static, persist bool) (isNew bool, err *Error) {
	key := cfg.Key()
	if !cur.cfg.SameEngine(cfg) || !cfg.Kind.IsEngine() {
		// A Mooncake master's events name their own contexts: it has no adapters.
		return false, invalidRegistration("conflicting registration for service key %s", key)
	}
	var added []Adapter
	for _, a := range cfg.Loras() {
		have, ok := cur.cfg.Lora(a.LoraName)
		switch {
		case !ok:
			added = append(added, a)
		case have.LoraPath != a.LoraPath:
			return false, invalidRegistration("conflicting registration for service key %s: adapter %q is registered with another lora_path",
				key, a.LoraName)
		}
	}
	if len(added) == 0 {
		return false, nil
	}
	if cur.static != static {
		return false, invalidRegistration("service %s is registered %s: register its LoRA adapters there too", key, origin(cur.static))
	}
	next, verr := cur.cfg.WithAdapters(append(cur.cfg.Loras(), added...))
	if verr != nil {
		return false, verr
	}
	router, ok := cur.sub.(AdapterRouter)
	if !ok {
		return false, &Error{Code: CodeInternal, Msg: "the subscription of service " + key + " cannot route LoRA adapters"}
	}
	var undo contextUndo
	for _, a := range added {
		ac := cfg.ForAdapter(a)
		if perr := s.eng.CheckProfile(ac.Context(), ac.Profile); perr != nil {
			undo.run(s.eng)
			return false, invalidRegistration("registration conflicts with the ContextKey hash profile")
		}
		if rerr := s.registerSlot(&ac, key, &undo); rerr != nil {
			undo.run(s.eng)
			return false, rerr
		}
	}
	if persist && s.store != nil {
		if perr := s.storeUpdate(&cur.cfg, &next); perr != nil {
			undo.run(s.eng)
			return false, s.storeRefusal(key, "adapter registration", perr)
		}
	}
	// Routed last: the adapter's events find its slot registered, and until here they
	// were refused as of an unknown adapter.
	for _, a := range added {
		ac := cfg.ForAdapter(a)
		if rerr := router.AddContext(ac.Context(), ac.Profile); rerr != nil {
			// Cannot happen for a validated adapter (same tenant, model, block size, a new
			// name); say so loudly rather than serve a context nothing feeds.
			s.log.Error("adapter context not routed", "service", key, "lora_name", a.LoraName, "err", rerr)
		}
	}
	cur.cfg = next
	s.log.Info("LoRA adapters registered", "service", key, "added", adapterNames(added), "lora", loraNames(&next))
	return true, nil
}

// UnregisterAdapter removes one adapter of a multi-LoRA registration: its events are no
// longer routed and what its context holds from the service is retracted; the other
// adapters stay. Removing the last adapter unregisters the service (Unregister). It
// returns the service key.
func (s *Service) UnregisterAdapter(instanceID, tenantID string, dpRank int, loraName string) (string, *Error) {
	id, err := s.unregisterID(instanceID, tenantID, dpRank)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unregisterAdapterLocked(id, loraName, true)
}

// unregisterAdapterLocked is UnregisterAdapter with s.mu held; persist false leaves the
// store alone.
func (s *Service) unregisterAdapterLocked(id ID, loraName string, persist bool) (string, *Error) {
	key := id.String()
	reg, ok := s.services[id]
	if !ok {
		return "", &Error{Code: CodeNotFound, Msg: "service not found: " + key}
	}
	if _, ok := reg.cfg.Lora(loraName); !ok {
		return "", &Error{Code: CodeNotFound, Msg: "service " + key + " has no LoRA adapter " + strconv.Quote(loraName)}
	}
	if len(reg.cfg.Adapters) == 0 {
		return s.unregisterLocked(id, persist)
	}
	var rest []Adapter
	for _, a := range reg.cfg.Loras() {
		if a.LoraName != loraName {
			rest = append(rest, a)
		}
	}
	next, verr := reg.cfg.WithAdapters(rest) // a subset of a valid set is valid
	if verr != nil {
		return "", verr
	}
	router, ok := reg.sub.(AdapterRouter)
	if !ok {
		return "", &Error{Code: CodeInternal, Msg: "the subscription of service " + key + " cannot route LoRA adapters"}
	}
	if persist && !reg.static && s.store != nil {
		if perr := s.storeUpdate(&reg.cfg, &next); perr != nil {
			s.log.Error("adapter unregistration could not be made durable; adapter kept", "service", key, "lora_name", loraName, "err", perr)
			return "", &Error{Code: CodeInternal, Msg: "Failed to persist unregistration: " + perr.Error()}
		}
	}
	// Unrouted first, then retracted: a batch handled meanwhile that still routes to the
	// context either applies before the retraction (and is retracted with the rest) or
	// after it, when the slot is gone and its stores are refused.
	router.RemoveContext(loraName)
	ac := reg.cfg.ForAdapter(Adapter{LoraName: loraName})
	s.eng.UnregisterSlot(ac.Context(), reg.cfg.Slot())
	reg.cfg = next
	s.log.Info("LoRA adapter unregistered", "service", key, "lora_name", loraName, "lora", loraNames(&next))
	return key, nil
}

// reconcileAdaptersLocked makes the adapters of the registered service cur those of
// cfg, the same engine (a change reported by the cluster registry): it adds the missing
// ones and removes the others, without writing to the store.
func (s *Service) reconcileAdaptersLocked(cur *registration, cfg *Config) *Error {
	if _, err := s.addAdaptersLocked(cur, cfg, cur.static, false); err != nil {
		return err
	}
	for _, a := range cur.cfg.Loras() {
		if _, ok := cfg.Lora(a.LoraName); !ok {
			if _, err := s.unregisterAdapterLocked(cfg.ID(), a.LoraName, false); err != nil {
				return err
			}
		}
	}
	// The adapter that is the registration's own may differ (the first of cfg's).
	if next, err := cur.cfg.WithAdapters(cfg.Loras()); err == nil {
		cur.cfg = next
	}
	return nil
}

func origin(static bool) string {
	if static {
		return "in the config file"
	}
	return "over HTTP or RPC"
}

func adapterNames(as []Adapter) string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = strconv.Quote(a.LoraName)
	}
	return strings.Join(out, ",")
}

// View is one entry of the services views (/services, ListServiceDetails): one adapter
// of a registration (a registration without adapters is one entry) and the profile
// self-check of that adapter's context.
type View struct {
	// Config is the adapter's registration (Config.ForAdapter).
	Config Config
	// HashCheck is "ok", "unverified" or "mismatch (<suggestion>)" (hashing.CheckStats),
	// "off" where the self-check is turned off; Mooncake sources, whose events carry no
	// tokens, are "unverified".
	HashCheck string
}

// Views lists every adapter of every registration, ordered by service key, then
// structured ID, then lora_name.
func (s *Service) Views() []View {
	s.mu.Lock()
	var out []View
	for _, r := range s.services {
		var router AdapterRouter
		if r.cfg.Kind.IsEngine() {
			router, _ = r.sub.(AdapterRouter)
		}
		for _, a := range r.cfg.Loras() {
			v := View{Config: r.cfg.ForAdapter(a), HashCheck: "unverified"}
			if router != nil {
				if st, ok := router.CheckStats(a.LoraName); ok {
					v.HashCheck = st.String()
				} else {
					v.HashCheck = "off"
				}
			}
			out = append(out, v)
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := &out[i].Config, &out[j].Config
		if a.ID() != b.ID() {
			return lessConfig(a, b)
		}
		return a.LoraName < b.LoraName
	})
	return out
}
