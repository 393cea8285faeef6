package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/service"
)

// Cluster glue: a replica keeps its dynamic registrations in the etcd registry of package
// cluster (clusterStore, the service layer's store), and applies the registry's changes,
// its own and its peers', to its service layer (clusterSync, through service.Apply).

// registryID is the service's id in the cluster registry: its unambiguous label.
func registryID(id service.ID) string { return id.Label() }

// clusterRecord encodes a registration for the registry: the value is the state file's
// entry; the context and profile are canonical so that equal ones are equal bytes (the
// seed only counts for vllm_v1, as in hashing.Profile.Equal).
func clusterRecord(cfg *service.Config) (*cluster.Record, error) {
	val, err := service.EncodeEntry(cfg)
	if err != nil {
		return nil, err
	}
	ctx, err := json.Marshal([]any{cfg.TenantID, cfg.ModelName, cfg.LoraName, cfg.BlockSize})
	if err != nil {
		return nil, err
	}
	// The registration's hash_profile (the fields of issue 25 only where set, so that a
	// profile without them keeps the bytes replicas of earlier releases write: the
	// context pin compares bytes), its root, and the seed only where it counts.
	p := cfg.Profile
	canon := service.ProfileFields(&p)
	canon["root"] = hex.EncodeToString(p.Root[:])
	if p.StrategyName() != "vllm_v1" {
		canon["python_hash_seed"] = ""
	}
	prof, err := json.Marshal(canon)
	if err != nil {
		return nil, err
	}
	return &cluster.Record{ID: registryID(cfg.ID()), Endpoint: cfg.Endpoint, Context: string(ctx), Profile: prof, Value: val}, nil
}

// registryConflict maps a registry refusal to the same 400 a single node answers (a
// *service.Error, which the service layer answers as is); other errors are returned
// unchanged.
func registryConflict(cfg *service.Config, err error) error {
	var ce *cluster.ConflictError
	if !errors.As(err, &ce) {
		return err
	}
	switch ce.Kind {
	case cluster.ConflictService:
		return service.InvalidRegistration("conflicting registration for service key %s", cfg.Key())
	case cluster.ConflictEndpoint:
		return service.InvalidRegistration("endpoint %s is already used by service %s", cfg.Endpoint, ce.Other)
	case cluster.ConflictLimit:
		return service.InvalidRegistration("too many services: the cluster registry holds its limit of %d (max_services "+
			"less this replica's static services)", ce.Limit)
	default:
		return service.InvalidRegistration("registration conflicts with the ContextKey hash profile")
	}
}

// clusterStore is the ServiceStore of a cluster member: a change is acknowledged once the
// registry holds it. It remembers the revision of this replica's own recent writes, so
// that the watch, which reports them later, does not undo a newer local change with an
// older event.
type clusterStore struct {
	reg *cluster.Registry
	// written: registry id -> revision of this replica's last write of it, until the watch
	// has passed that revision. Read and written with the service layer's registration
	// lock held (Put and Delete are called with it, clusterSync uses it through Apply).
	written map[string]int64
}

// Put stores a registration in the registry; a conflict is refused as a single node
// refuses it.
func (c *clusterStore) Put(cfg *service.Config) error {
	rec, err := clusterRecord(cfg)
	if err != nil {
		return err
	}
	rev, _, err := c.reg.Put(context.Background(), rec)
	if err != nil {
		return registryConflict(cfg, err)
	}
	c.written[rec.ID] = rev
	return nil
}

// Update replaces a registration in the registry by another of the same service and
// endpoint (its LoRA adapters changed).
func (c *clusterStore) Update(prev, cfg *service.Config) error {
	old, err := clusterRecord(prev)
	if err != nil {
		return err
	}
	rec, err := clusterRecord(cfg)
	if err != nil {
		return err
	}
	rev, err := c.reg.Replace(context.Background(), old, rec)
	if err != nil {
		return registryConflict(cfg, err)
	}
	c.written[rec.ID] = rev
	return nil
}

// Delete removes a registration from the registry.
func (c *clusterStore) Delete(id service.ID) error {
	rid := registryID(id)
	rev, _, err := c.reg.Delete(context.Background(), rid)
	if err != nil {
		return err
	}
	c.written[rid] = rev
	return nil
}

// stale reports whether an event at rev for id predates this replica's own later write
// (then it is skipped); an event at or past that write clears the note.
func (c *clusterStore) stale(id string, rev int64) bool {
	w, ok := c.written[id]
	if !ok {
		return false
	}
	if w > rev {
		return true
	}
	delete(c.written, id)
	return false
}

// clusterSync applies the registry's changes to the local service layer (cluster.Applier).
type clusterSync struct {
	svc   *service.Service
	eng   *engine.Engine
	log   *slog.Logger
	store *clusterStore
	// rev is the last registry revision applied.
	rev atomic.Int64
	// mu and cond let tests wait for a revision.
	mu   sync.Mutex
	cond *sync.Cond
	// unapplied: registry entries this replica could not apply (registry id -> the
	// registration and why), retried until they apply or leave the registry. Read and
	// written with the service layer's registration lock held (inside Apply); unappliedN
	// mirrors its size for metrics and readiness.
	unapplied  map[string]*unappliedEntry
	unappliedN atomic.Int64
	// retry wakes the retry loop (a registry entry went away, so a slot may be free).
	retry chan struct{}
	// republished counts registrations written back after a registry reset.
	republished atomic.Uint64
}

// unappliedEntry is a registry entry this replica could not apply.
type unappliedEntry struct {
	cfg    service.Config
	reason string
	since  time.Time
}

// unappliedRetryPeriod is how often entries this replica could not apply are tried again
// (and also at once after any unregistration, which may free what they need).
const unappliedRetryPeriod = time.Second

func newClusterSync(svc *service.Service, eng *engine.Engine, log *slog.Logger, store *clusterStore) *clusterSync {
	c := &clusterSync{svc: svc, eng: eng, log: log, store: store, unapplied: map[string]*unappliedEntry{},
		retry: make(chan struct{}, 1)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *clusterSync) applied(rev int64) {
	c.mu.Lock()
	if rev > c.rev.Load() {
		c.rev.Store(rev)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// waitRevision blocks until the registry revision rev is applied locally or the timeout
// passes; it reports which.
func (c *clusterSync) waitRevision(rev int64, timeout time.Duration) bool {
	t := time.AfterFunc(timeout, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer t.Stop()
	deadline := time.Now().Add(timeout)
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.rev.Load() < rev {
		if time.Now().After(deadline) {
			return false
		}
		c.cond.Wait()
	}
	return true
}

func decodeRecord(rec *cluster.Record) (service.Config, error) {
	cfg, err := service.DecodeEntry("", rec.Value)
	if err != nil {
		return cfg, fmt.Errorf("registry service %s: %w", rec.ID, err)
	}
	if registryID(cfg.ID()) != rec.ID {
		return cfg, fmt.Errorf("registry service %s holds the registration of %s", rec.ID, registryID(cfg.ID()))
	}
	return cfg, nil
}

// Reset makes the dynamic services exactly those of the registry at rev (except the ones
// this replica wrote after rev). After a registry reset rev may be below the revision
// applied so far: it becomes the current one.
func (c *clusterSync) Reset(rev int64, recs []cluster.Record) {
	want := make(map[string]*service.Config, len(recs))
	for i := range recs {
		cfg, err := decodeRecord(&recs[i])
		if err != nil {
			c.log.Error("cluster: registry entry not applied", "err", err)
			continue
		}
		want[recs[i].ID] = &cfg
	}
	removed, added := 0, 0
	c.svc.Apply(func(tx *service.Tx) {
		for _, id := range tx.Dynamic() {
			rid := registryID(id)
			if want[rid] != nil || c.store.stale(rid, rev) {
				continue
			}
			if err := tx.Unregister(id); err == nil {
				removed++
			}
		}
		for rid := range c.unapplied {
			if want[rid] == nil {
				c.forget(rid)
			}
		}
		for rid, cfg := range want {
			if c.store.stale(rid, rev) {
				continue
			}
			if c.applyPut(tx, rid, cfg) {
				added++
			}
		}
		for rid, w := range c.store.written {
			if w <= rev {
				delete(c.store.written, rid)
			}
		}
	})
	c.log.Info("cluster: registry applied", "revision", rev, "services", len(want), "added", added, "removed", removed,
		"unapplied", c.unappliedN.Load())
	c.mu.Lock()
	c.rev.Store(rev)
	c.cond.Broadcast()
	c.mu.Unlock()
	c.kick()
}

// Put applies a registration another replica (or this one) wrote.
func (c *clusterSync) Put(rev int64, rec *cluster.Record) {
	cfg, err := decodeRecord(rec)
	if err != nil {
		c.log.Error("cluster: registry entry not applied", "revision", rev, "err", err)
		c.applied(rev)
		return
	}
	c.svc.Apply(func(tx *service.Tx) {
		if !c.store.stale(rec.ID, rev) {
			c.applyPut(tx, rec.ID, &cfg)
		}
	})
	c.applied(rev)
}

// Delete applies an unregistration.
func (c *clusterSync) Delete(rev int64, rid string) {
	c.svc.Apply(func(tx *service.Tx) {
		c.forget(rid)
		if c.store.stale(rid, rev) {
			return
		}
		for _, id := range tx.Dynamic() {
			if registryID(id) == rid {
				_ = tx.Unregister(id)
				return
			}
		}
	})
	c.applied(rev)
	c.kick() // a freed slot or endpoint may let an unapplied entry in
}

// Republish writes back, after a registry reset, every dynamic registration this
// replica holds (cluster.Applier). Each goes through the registry's usual transaction:
// one that conflicts with what is there already (another replica wrote back or a client
// registered something else meanwhile) is refused and, at the listing that follows,
// dropped here too, so every replica ends with what the registry holds. An etcd that
// fails again is retried until it answers or Sync stops.
func (c *clusterSync) Republish(ctx context.Context) {
	var cfgs []service.Config
	c.svc.Apply(func(tx *service.Tx) {
		for _, id := range tx.Dynamic() {
			if cfg, _, ok := tx.Lookup(id); ok {
				cfgs = append(cfgs, cfg)
			}
		}
		// Revisions of the lost registry mean nothing in the new one.
		clear(c.store.written)
		for rid := range c.unapplied {
			c.forget(rid)
		}
	})
	written, held, refused := 0, 0, 0
	for i := range cfgs {
		rec, err := clusterRecord(&cfgs[i])
		if err != nil {
			continue
		}
		for ctx.Err() == nil {
			_, existed, err := c.store.reg.Put(ctx, rec)
			var ce *cluster.ConflictError
			switch {
			case err == nil && existed:
				held++
			case err == nil:
				written++
				c.republished.Add(1)
			case errors.As(err, &ce):
				refused++
				c.log.Error("cluster: registration not written back after the registry reset: it conflicts with the "+
					"registry's; this replica drops it", "service", cfgs[i].Key(), "err", err)
			default:
				c.log.Warn("cluster: writing back a registration after the registry reset failed; retrying",
					"service", cfgs[i].Key(), "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			break
		}
	}
	c.log.Warn("cluster: registrations written back after the registry reset", "services", len(cfgs),
		"written", written, "already_there", held, "refused", refused)
}

// applyPut makes the local registration of cfg's id equal cfg; it reports whether it
// registered something. An entry it cannot apply is remembered, logged once and retried
// (retryUnapplied), and counted in unappliedN, never a silent difference between
// replicas.
func (c *clusterSync) applyPut(tx *service.Tx, rid string, cfg *service.Config) bool {
	if c.svc.Stopping() {
		return false
	}
	id := cfg.ID()
	if cur, static, ok := tx.Lookup(id); ok {
		if static {
			if cur.Equal(cfg) {
				c.forget(rid)
			} else {
				c.unable(rid, cfg, "a static service of this replica's config file has its key")
			}
			return false
		}
		if cur.Equal(cfg) {
			c.forget(rid)
			return false
		}
	}
	// Another configuration of the service replaces the local one: only its adapters
	// change when they alone differ (multi-LoRA), else it is registered anew.
	err := tx.Replace(cfg)
	if err != nil && err.Msg == "registration conflicts with the ContextKey hash profile" {
		// A context this replica still holds from services now gone may pin an old
		// profile: the registry no longer does, so drop it if it is empty and retry.
		dropped := false
		for _, a := range cfg.Loras() {
			ac := cfg.ForAdapter(a)
			dropped = c.eng.DropEmptyContext(ac.Context()) || dropped
		}
		if dropped {
			err = tx.Replace(cfg)
		}
	}
	if err != nil {
		c.unable(rid, cfg, err.Error())
		return false
	}
	if e, ok := c.unapplied[rid]; ok {
		c.log.Info("cluster: registry service applied on this replica after all", "service", cfg.Key(),
			"unapplied_for", time.Since(e.since).Round(time.Millisecond).String())
		c.forget(rid)
	}
	return true
}

// unable remembers a registry entry this replica could not apply (logged when it first
// fails or its reason changes). With the registration lock held.
func (c *clusterSync) unable(rid string, cfg *service.Config, reason string) {
	e, ok := c.unapplied[rid]
	if !ok || e.reason != reason || !e.cfg.Equal(cfg) {
		c.log.Error("cluster: registry service not applied on this replica; retrying", "service", cfg.Key(), "err", reason)
	}
	if !ok {
		e = &unappliedEntry{since: time.Now()}
		c.unapplied[rid] = e
	}
	e.cfg, e.reason = *cfg, reason
	c.unappliedN.Store(int64(len(c.unapplied)))
}

// forget drops an entry from the unapplied set. With the registration lock held.
func (c *clusterSync) forget(rid string) {
	if _, ok := c.unapplied[rid]; ok {
		delete(c.unapplied, rid)
		c.unappliedN.Store(int64(len(c.unapplied)))
	}
}

func (c *clusterSync) kick() {
	select {
	case c.retry <- struct{}{}:
	default:
	}
}

// retryUnapplied tries the unapplied entries again every unappliedRetryPeriod and when
// kicked, until ctx ends.
func (c *clusterSync) retryUnapplied(ctx context.Context) {
	t := time.NewTicker(unappliedRetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.retry:
		}
		if c.unappliedN.Load() == 0 {
			continue
		}
		c.svc.Apply(func(tx *service.Tx) {
			rids := make([]string, 0, len(c.unapplied))
			for rid := range c.unapplied {
				rids = append(rids, rid)
			}
			sort.Strings(rids)
			for _, rid := range rids {
				if e := c.unapplied[rid]; e != nil {
					cfg := e.cfg
					c.applyPut(tx, rid, &cfg)
				}
			}
		})
	}
}

// unappliedReasons lists the unapplied entries (registry id: reason), for readiness.
func (c *clusterSync) unappliedReasons() map[string]string {
	out := map[string]string{}
	if c.unappliedN.Load() == 0 {
		return out
	}
	c.svc.Apply(func(*service.Tx) {
		for rid, e := range c.unapplied {
			out[rid] = e.reason
		}
	})
	return out
}

// startCluster connects the registry, makes it the store of dynamic registrations and
// starts the watch and the member key. Readiness waits for the first registry load.
func (a *App) startCluster(cfg cluster.Config) error {
	cfg.Logger = a.log
	// The registry holds at most what every replica can apply: max_services less this
	// replica's static services (which are not in the registry).
	cfg.MaxServices = max(a.maxServices-len(a.Service.Services()), 1)
	reg, err := cluster.Open(cfg)
	if err != nil {
		return err
	}
	store := &clusterStore{reg: reg, written: make(map[string]int64)}
	a.registry = reg
	a.bootDone = make(chan struct{})
	a.clusterSync = newClusterSync(a.Service, a.Engine, a.log, store)
	a.clusterRef.Store(a.clusterSync)
	a.Service.SetStore(store)
	ctx, cancel := context.WithCancel(context.Background())
	a.clusterStop = cancel
	a.clusterWG.Add(3)
	go func() {
		defer a.clusterWG.Done()
		a.clusterSync.retryUnapplied(ctx)
	}()
	go func() {
		defer a.clusterWG.Done()
		reg.Sync(ctx, a.clusterSync, func() {
			a.clusterLoaded.Store(true)
			a.clusterWG.Add(1)
			go func() {
				defer a.clusterWG.Done()
				a.bootstrap(ctx, a.adminTok)
			}()
		})
	}()
	go func() {
		defer a.clusterWG.Done()
		reg.KeepMember(ctx)
	}()
	a.log.Info("cluster: registry in etcd", "endpoints", cfg.Endpoints, "key_prefix", reg.Config().KeyPrefix,
		"advertise_url", cfg.AdvertiseURL)
	return nil
}

// stopCluster ends the watch and the member key and closes the registry client.
func (a *App) stopCluster() {
	if a.registry == nil {
		return
	}
	a.clusterStop()
	a.clusterWG.Wait()
	if err := a.registry.Close(); err != nil {
		a.log.Warn("cluster: etcd client close", "err", err)
	}
}

// Registry is the cluster registry (nil on a single node).
func (a *App) Registry() *cluster.Registry { return a.registry }

// WaitRegistryRevision blocks until this replica has applied the registry up to rev (as
// returned by a registry write), or timeout; it reports which. Single node: true.
func (a *App) WaitRegistryRevision(rev int64, timeout time.Duration) bool {
	if a.clusterSync == nil {
		return true
	}
	return a.clusterSync.waitRevision(rev, timeout)
}

// RegistryRevision is the last registry revision applied on this replica (0: none, or a
// single node).
func (a *App) RegistryRevision() int64 {
	if a.clusterSync == nil {
		return 0
	}
	return a.clusterSync.rev.Load()
}
