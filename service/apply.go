package service

import "sort"

// Apply runs f with the registration lock held, for a source of registrations other than
// the protocols (the cluster registry's watch): through tx, f reads and changes the
// registrations without writing them to the store (the changes came from it). The
// store's Put and Delete run with the same lock held, so what f shares with the store
// needs no lock of its own.
func (s *Service) Apply(f func(tx *Tx)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&Tx{s: s})
}

// Tx is the registrations as Apply's function sees them; it is valid during that call.
type Tx struct{ s *Service }

// Dynamic returns the IDs of the registrations that did not come from the config file,
// in order.
func (tx *Tx) Dynamic() []ID {
	out := make([]ID, 0, len(tx.s.services))
	for id, r := range tx.s.services {
		if !r.static {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// Lookup returns the registration of id, and whether it came from the config file.
func (tx *Tx) Lookup(id ID) (cfg Config, static, ok bool) {
	r, ok := tx.s.services[id]
	if !ok {
		return Config{}, false, false
	}
	return r.cfg, r.static, true
}

// Register registers a validated configuration as Service.Register does, without
// storing it; it refuses while stopping.
func (tx *Tx) Register(cfg *Config) (isNew bool, err *Error) {
	if tx.s.stopping.Load() {
		return false, errStopping
	}
	return tx.s.registerLocked(cfg, false, false)
}

// Unregister removes a registration as Service.Unregister does, without storing the
// removal.
func (tx *Tx) Unregister(id ID) *Error {
	_, err := tx.s.unregisterLocked(id, false)
	return err
}

// Services returns every registration (static ones included), in no particular order.
func (tx *Tx) Services() []Config {
	out := make([]Config, 0, len(tx.s.services))
	for _, r := range tx.s.services {
		out = append(out, r.cfg)
	}
	return out
}

// Replace makes the registration of cfg's service cfg, without storing it: nothing when
// it already is; the adapters added and removed when only they differ (the other
// adapters' contexts keep what they hold); otherwise the old registration is
// unregistered and cfg registered. It refuses while stopping.
func (tx *Tx) Replace(cfg *Config) *Error {
	if tx.s.stopping.Load() {
		return errStopping
	}
	cur, ok := tx.s.services[cfg.ID()]
	if ok && !cur.cfg.Equal(cfg) && cur.cfg.SameEngine(cfg) && !cur.static {
		if err := tx.s.reconcileAdaptersLocked(cur, cfg); err == nil {
			return nil
		}
	}
	if ok && !cur.cfg.Equal(cfg) {
		if err := tx.Unregister(cfg.ID()); err != nil {
			return err
		}
	}
	_, err := tx.s.registerLocked(cfg, false, false)
	return err
}
