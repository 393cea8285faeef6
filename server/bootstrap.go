package server

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// BootstrapTimeout bounds fetching and loading one peer's snapshot at start.
const BootstrapTimeout = 5 * time.Minute

// gateSet holds the gate of every subscription. While closing (a replica bootstrapping),
// new gates start closed.
type gateSet struct {
	mu      sync.Mutex
	closing bool
	gates   map[ServiceID]*gate
	endp    map[ServiceID]string
}

func newGateSet(closing bool) *gateSet {
	return &gateSet{closing: closing, gates: map[ServiceID]*gate{}, endp: map[ServiceID]string{}}
}

func (s *gateSet) add(cfg *ServiceConfig, inner gatedHandler) *gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := newGate(inner, s.closing)
	s.gates[cfg.ID()] = g
	s.endp[cfg.ID()] = cfg.Endpoint
	return g
}

func (s *gateSet) remove(id ServiceID, g *gate) {
	s.mu.Lock()
	if s.gates[id] == g {
		delete(s.gates, id)
		delete(s.endp, id)
	}
	s.mu.Unlock()
}

// sequences returns, per source endpoint, the last sequence number applied.
func (s *gateSet) sequences() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.gates))
	for id, g := range s.gates {
		if seq, ok := g.lastApplied(); ok {
			out[s.endp[id]] = seq
		}
	}
	return out
}

// openAll stops closing new gates and opens every gate: a source in seqs from the batch
// after its sequence number, the others with everything buffered. It returns the
// endpoints that went stale, with the reasons.
func (s *gateSet) openAll(seqs map[string]uint64) map[string]string {
	s.mu.Lock()
	s.closing = false
	type one struct {
		ep string
		g  *gate
	}
	all := make([]one, 0, len(s.gates))
	for id, g := range s.gates {
		all = append(all, one{s.endp[id], g})
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].ep < all[j].ep })
	stale := map[string]string{}
	for _, o := range all {
		seq, have := seqs[o.ep]
		if st, reason := o.g.open(seq, have); st {
			stale[o.ep] = reason
		}
	}
	return stale
}

// bootstrap loads a ready peer's snapshot into this replica, whose subscriptions have
// been buffering since they started, then opens them: batches the snapshot already holds
// are dropped, the rest applied. Without a peer (the first replica) or when no peer can
// give a snapshot, the buffered batches are applied and the replica starts from live
// events and replays, as a single node does.
func (a *App) bootstrap(ctx context.Context, token string) {
	started := time.Now()
	defer a.bootstrapped.Store(true)
	if a.testHook != nil {
		a.testHook("subscribed")
	}
	a.waitCatchUps(ctx, BootstrapCatchUpLimit)
	self := a.registry.Config().AdvertiseURL
	members, err := a.registry.Members(ctx)
	if err != nil {
		a.log.Warn("cluster: bootstrap cannot list peers; starting from live events", "err", err)
	}
	var seqs map[string]uint64
	from := ""
	for _, m := range members {
		if m == self || ctx.Err() != nil {
			continue
		}
		res, s, err := a.loadPeerSnapshot(ctx, m, token)
		if err != nil {
			a.log.Warn("cluster: peer snapshot not loaded", "peer", m, "err", err)
			if res.Applied > 0 {
				// Partly applied: another peer's copy must not be added on top.
				break
			}
			continue
		}
		seqs, from = s, m
		a.log.Info("cluster: peer snapshot loaded", "peer", m, "bytes", res.Bytes, "contexts", res.Contexts,
			"entries", res.Entries, "bindings", res.Bindings, "applied", res.Applied, "skipped", res.Skipped)
		break
	}
	if a.testHook != nil {
		a.testHook("loaded")
	}
	stale := a.gates.openAll(seqs)
	for ep, reason := range stale {
		a.log.Error("cluster: source stale after bootstrap", "endpoint", ep, "reason", reason)
	}
	if from == "" {
		a.log.Info("cluster: no peer snapshot; indexing from live events and replays", "peers", len(members))
	}
	a.log.Info("cluster: bootstrap done", "peer", from, "sources_stale", len(stale), "took", time.Since(started).String())
}

// BootstrapCatchUpLimit bounds how long a bootstrapping replica waits for its
// subscriptions' first catch-up before it fetches a peer's snapshot.
const BootstrapCatchUpLimit = 10 * time.Second

// waitCatchUps waits (at most limit) until every subscription with a replay endpoint has
// ended its first catch-up (done, failed, or stale). The peer's snapshot is fetched after
// it, so the batches the gates hold reach back to the start of each publisher's replay
// ring, which is older than the snapshot's sequence numbers unless the peer lags by more
// than the ring. Fetched before (a SUB socket and replay request slow to connect on a
// loaded machine), the held batches could start after the snapshot's sequence numbers
// and the source went stale.
func (a *App) waitCatchUps(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		pending := 0
		for _, st := range a.Service.Stats() {
			s := &st.Stats
			if st.Config.ReplayEndpoint != "" && s.CatchUps+s.CatchUpsFailed == 0 && !s.Stale {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			a.log.Warn("cluster: bootstrap goes on before every subscription caught up", "pending", pending, "limit", limit.String())
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (a *App) loadPeerSnapshot(ctx context.Context, peer, token string) (SnapshotLoad, map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, BootstrapTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+SnapshotPath, nil)
	if err != nil {
		return SnapshotLoad{}, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return SnapshotLoad{}, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return SnapshotLoad{}, nil, fmt.Errorf("GET %s%s: %s", peer, SnapshotPath, resp.Status)
	}
	return a.loadSnapshot(resp.Body)
}
