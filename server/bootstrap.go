package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/pause"
	"github.com/conductor-go/conductor/snapshot"
)

// BootstrapTimeout bounds fetching and loading one peer's snapshot at start.
const BootstrapTimeout = 5 * time.Minute

// bootstrap loads a ready peer's snapshot into this replica, whose subscriptions have
// been buffering since they started, then opens them: batches the snapshot already holds
// are dropped, the rest applied. Without a peer (the first replica) or when no peer can
// give a snapshot, the buffered batches are applied and the replica starts from live
// events and replays, as a single node does.
func (a *App) bootstrap(ctx context.Context, token string) {
	started := time.Now()
	defer close(a.bootDone)
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
			// A load applies whole or not at all: try the next peer.
			a.log.Warn("cluster: peer snapshot not loaded", "peer", m, "err", err)
			if errors.Is(err, engine.ErrIndexNotEmpty) {
				break // this replica indexes already: no peer's copy goes on top
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
	stale := a.gates.OpenAll(seqs)
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

// PeerSnapshotAttempts bounds how often a bootstrapping replica fetches a peer's
// snapshot because the copy was cut before the batches it holds of some source begin:
// the peer lagged that source by more than the source's replay ring (or was slower to
// subscribe than this replica), and loading the copy would leave a gap that marks the
// source stale. The peer goes on applying, so a later copy is cut later, and one that
// reaches the held batches loses nothing. The last attempt is loaded whatever its cut,
// and the sources it leaves a gap for go stale.
const PeerSnapshotAttempts = 5

// peerSnapshotRetryWait is the wait before a peer's snapshot is fetched the second
// time, doubled before each later attempt (3.75 s of waits in all).
const peerSnapshotRetryWait = 250 * time.Millisecond

// peerBehindError says that a peer's snapshot was cut before the batches this replica
// holds of the sources named (see PeerSnapshotAttempts).
type peerBehindError struct{ endpoints []string }

func (e *peerBehindError) Error() string {
	return fmt.Sprintf("snapshot cut before the batches held of %d sources (%s)", len(e.endpoints), strings.Join(e.endpoints, ", "))
}

// loadPeerSnapshot fetches a peer's snapshot and applies it; it returns the snapshot's
// sequence numbers per source endpoint. A copy cut before the batches the gates hold of
// some source is discarded unapplied and fetched again, up to PeerSnapshotAttempts times.
func (a *App) loadPeerSnapshot(ctx context.Context, peer, token string) (snapshot.Loaded, map[string]uint64, error) {
	wait := peerSnapshotRetryWait
	for attempt := 1; ; attempt++ {
		last := attempt == PeerSnapshotAttempts
		res, seqs, err := a.fetchPeerSnapshot(ctx, peer, token, func(seqs map[string]uint64) error {
			if behind := a.gates.Behind(seqs); len(behind) > 0 && !last {
				return &peerBehindError{behind}
			}
			return nil
		})
		var pb *peerBehindError
		if !errors.As(err, &pb) {
			return res, seqs, err
		}
		a.log.Info("cluster: peer snapshot cut before the batches held; fetching it again", "peer", peer,
			"attempt", attempt, "sources", strings.Join(pb.endpoints, ","), "wait", wait.String())
		if a.testHook != nil {
			a.testHook("behind")
		}
		if !pause.For(ctx, wait) {
			return res, nil, ctx.Err()
		}
		wait *= 2
	}
}

// fetchPeerSnapshot is one attempt of loadPeerSnapshot: accept is loadSnapshot's.
func (a *App) fetchPeerSnapshot(ctx context.Context, peer, token string, accept func(map[string]uint64) error) (snapshot.Loaded, map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, BootstrapTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+SnapshotPath, nil)
	if err != nil {
		return snapshot.Loaded{}, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return snapshot.Loaded{}, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snapshot.Loaded{}, nil, fmt.Errorf("GET %s%s: %s", peer, SnapshotPath, resp.Status)
	}
	// Accepted only if signed with the cluster's key (from the registry): a snapshot
	// from anything but a peer of this cluster is refused.
	return a.loadSnapshot(resp.Body, false, accept)
}
