package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
}

func newClusterSync(svc *service.Service, eng *engine.Engine, log *slog.Logger, store *clusterStore) *clusterSync {
	c := &clusterSync{svc: svc, eng: eng, log: log, store: store}
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
// this replica wrote after rev).
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
		for rid, cfg := range want {
			if c.store.stale(rid, rev) {
				continue
			}
			if c.applyPut(tx, cfg) {
				added++
			}
		}
		for rid, w := range c.store.written {
			if w <= rev {
				delete(c.store.written, rid)
			}
		}
	})
	c.log.Info("cluster: registry applied", "revision", rev, "services", len(want), "added", added, "removed", removed)
	c.applied(rev)
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
			c.applyPut(tx, &cfg)
		}
	})
	c.applied(rev)
}

// Delete applies an unregistration.
func (c *clusterSync) Delete(rev int64, rid string) {
	c.svc.Apply(func(tx *service.Tx) {
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
}

// applyPut makes the local registration of cfg's id equal cfg; it reports whether it
// registered something.
func (c *clusterSync) applyPut(tx *service.Tx, cfg *service.Config) bool {
	if c.svc.Stopping() {
		return false
	}
	id := cfg.ID()
	if cur, static, ok := tx.Lookup(id); ok {
		if static {
			if !cur.Equal(cfg) {
				c.log.Error("cluster: registry service not applied: a static service of this replica has its key", "service", cfg.Key())
			}
			return false
		}
		if cur.Equal(cfg) {
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
		c.log.Error("cluster: registry service not applied on this replica", "service", cfg.Key(), "err", err.Error())
		return false
	}
	return true
}

// startCluster connects the registry, makes it the store of dynamic registrations and
// starts the watch and the member key. Readiness waits for the first registry load.
func (a *App) startCluster(cfg cluster.Config) error {
	cfg.Logger = a.log
	reg, err := cluster.Open(cfg)
	if err != nil {
		return err
	}
	store := &clusterStore{reg: reg, written: make(map[string]int64)}
	a.registry = reg
	a.bootDone = make(chan struct{})
	a.clusterSync = newClusterSync(a.Service, a.Engine, a.log, store)
	a.Service.SetStore(store)
	ctx, cancel := context.WithCancel(context.Background())
	a.clusterStop = cancel
	a.clusterWG.Add(2)
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
