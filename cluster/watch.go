package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/conductor-go/conductor/internal/pause"
)

// nopZap silences the etcd client's own logger (the registry logs what matters).
func nopZap() *zap.Logger { return zap.NewNop() }

// Applier receives the registry's changes in revision order (from one goroutine).
type Applier interface {
	// Reset says that the registry holds exactly recs at revision rev: at start, after a
	// compaction removed the revisions the watch needed, after the watch was lost, or
	// after a reset (then rev may be lower than revisions handed over before).
	Reset(rev int64, recs []Record)
	// Put says that rec was registered at revision rev.
	Put(rev int64, rec *Record)
	// Delete says that the service id was unregistered at revision rev.
	Delete(rev int64, id string)
	// Republish says that the registry was reset (etcd lost what it held): before Sync
	// lists it again, the applier writes back the registrations it holds (Registry.Put,
	// conflicts refused as usual), so that no acknowledged registration is lost. Every
	// replica that finds the reset does so; identical records are written once.
	Republish(ctx context.Context)
}

// retryDelay bounds how fast Sync and KeepMember retry an unreachable etcd.
const retryDelay = 500 * time.Millisecond

// Sync reads (creating it if needed) the cluster key, lists the registry and hands it
// to a.Reset, calls loaded once that first Reset is done, then watches the services from
// the next revision and hands each change to a, until ctx ends. A dropped watch resumes
// from the last revision seen (the client reconnects by itself while etcd is away);
// when etcd has compacted that revision away, Sync lists again and resets. An
// unreachable etcd is retried every retryDelay.
//
// Every ResetCheckInterval, and on every watch response, Sync checks that etcd still
// holds the registry it follows: the cluster key's epoch unchanged and no revision below
// one already seen. A watch resumed on an etcd restored from an empty data directory
// waits for a revision the new etcd has not reached and would report nothing. When it
// finds a reset, Sync logs it, counts it (Resets), lets a.Republish write back what the
// replica holds, and lists the registry again.
func (r *Registry) Sync(ctx context.Context, a Applier, loaded func()) {
	var rev, seen int64
	epoch, reset := "", ""
	first := true
	failures := 0
	for ctx.Err() == nil {
		if rev == 0 {
			info, _, err := r.EnsureCluster(ctx)
			if err == nil && epoch != "" && info.Epoch != epoch && reset == "" {
				reset = fmt.Sprintf("the cluster key holds epoch %q, not %q", info.Epoch, epoch)
			}
			if err == nil && reset != "" {
				r.resets.Add(1)
				r.log.Error("cluster: the etcd registry was reset (restored empty or from an older backup); "+
					"writing back this replica's registrations and listing it again", "reason", reset, "epoch", info.Epoch)
				a.Republish(ctx)
				reset = ""
			}
			var lrev int64
			var recs []Record
			if err == nil {
				lrev, recs, err = r.List(ctx)
			}
			if err != nil {
				if failures == 0 || failures%20 == 0 {
					r.log.Warn("cluster: registry not readable; retrying", "err", err, "attempts", failures+1)
				}
				failures++
				pause.For(ctx, retryDelay)
				continue
			}
			failures = 0
			r.info.Store(&info)
			epoch = info.Epoch
			a.Reset(lrev, recs)
			rev, seen = lrev, lrev
			if first {
				first = false
				r.log.Info("cluster: registry loaded", "revision", lrev, "services", len(recs), "epoch", epoch)
				if loaded != nil {
					loaded()
				}
			}
		}
		var why string
		rev, why = r.watch(ctx, a, rev, epoch, &seen)
		if why != "" {
			reset, rev = why, 0
			continue
		}
		if rev != 0 && ctx.Err() == nil {
			pause.For(ctx, retryDelay)
		}
	}
}

// watch follows the services from rev+1 until the watch ends; it returns the last
// revision handed to a, or 0 when the registry must be listed again (compacted), and,
// when it found the registry reset, why. seen is the highest revision seen so far.
func (r *Registry) watch(ctx context.Context, a Applier, rev int64, epoch string, seen *int64) (int64, string) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := r.cli.Watch(wctx, r.servicesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	check := time.NewTicker(r.cfg.ResetCheckInterval)
	defer check.Stop()
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return rev, ""
		case <-check.C:
			if why := r.checkReset(ctx, epoch, *seen); why != "" {
				return rev, why
			}
			continue
		case resp, ok = <-wch:
			if !ok {
				return rev, ""
			}
		}
		if h := resp.Header.Revision; h != 0 && h < *seen {
			return rev, fmt.Sprintf("a watch response at revision %d, below %d, already seen", h, *seen)
		}
		*seen = max(*seen, resp.Header.Revision)
		if resp.CompactRevision != 0 {
			r.log.Warn("cluster: watch revision compacted; listing the registry again", "revision", rev,
				"compacted", resp.CompactRevision)
			return 0, ""
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("cluster: watch ended; resuming", "revision", rev, "err", err)
			}
			return rev, ""
		}
		for _, ev := range resp.Events {
			switch ev.Type {
			case clientv3.EventTypePut:
				var rec Record
				if err := json.Unmarshal(ev.Kv.Value, &rec); err != nil {
					r.log.Error("cluster: corrupt service key ignored", "key", string(ev.Kv.Key), "err", err)
					break
				}
				a.Put(ev.Kv.ModRevision, &rec)
			case clientv3.EventTypeDelete:
				id, err := r.idOfKey(ev.Kv.Key)
				if err != nil {
					r.log.Error("cluster: unexpected key deleted", "key", string(ev.Kv.Key), "err", err)
					break
				}
				a.Delete(ev.Kv.ModRevision, id)
			}
			rev = ev.Kv.ModRevision
			*seen = max(*seen, rev)
		}
	}
}

// KeepMember publishes this replica's member key (its AdvertiseURL) under a lease and
// keeps the lease alive until ctx ends; after a lost lease or an etcd outage it publishes
// the key again. Without an AdvertiseURL it returns at once.
func (r *Registry) KeepMember(ctx context.Context) {
	if r.cfg.AdvertiseURL == "" {
		return
	}
	key := r.membersPrefix() + esc(r.cfg.AdvertiseURL)
	ttl := int64(r.cfg.MemberTTL / time.Second)
	if ttl < 1 {
		ttl = 1
	}
	for ctx.Err() == nil {
		id, err := r.grantMember(ctx, key, ttl)
		if err != nil {
			r.log.Warn("cluster: member key not published; retrying", "key", key, "err", err)
			pause.For(ctx, retryDelay)
			continue
		}
		ka, err := r.cli.KeepAlive(ctx, id)
		if err != nil {
			pause.For(ctx, retryDelay)
			continue
		}
		r.log.Info("cluster: member key published", "key", key, "lease", int64(id))
		for range ka {
		}
		if ctx.Err() == nil {
			r.log.Warn("cluster: member lease lost; publishing again", "key", key)
		}
	}
	// Revoke on the way out so that peers stop listing this replica at once.
	rctx, cancel := context.WithTimeout(context.Background(), r.cfg.DialTimeout)
	defer cancel()
	_, _ = r.cli.Delete(rctx, key)
}

func (r *Registry) grantMember(ctx context.Context, key string, ttl int64) (clientv3.LeaseID, error) {
	octx, cancel := r.opContext(ctx)
	defer cancel()
	lease, err := r.cli.Grant(octx, ttl)
	if err != nil {
		return 0, err
	}
	if _, err := r.cli.Put(octx, key, r.cfg.AdvertiseURL, clientv3.WithLease(lease.ID)); err != nil {
		return 0, err
	}
	return lease.ID, nil
}

// Members returns the advertise URLs of the live replicas, sorted.
func (r *Registry) Members(ctx context.Context) ([]string, error) {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	g, err := r.cli.Get(ctx, r.membersPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		out = append(out, string(kv.Value))
	}
	sort.Strings(out)
	return out, nil
}
