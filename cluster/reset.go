package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultResetCheckInterval is how often Sync checks that etcd still holds the registry
// it follows.
const DefaultResetCheckInterval = 2 * time.Second

// ClusterInfo is the value of the cluster key: random values created by the first
// replica that found the key absent. A registry whose cluster key is gone or different
// has been reset (etcd restored from an empty data directory, or from a backup taken
// before the key was made again).
type ClusterInfo struct {
	// Epoch names this incarnation of the registry.
	Epoch string `json:"epoch"`
	// SnapshotKey (hex, 32 bytes) authenticates snapshots between the replicas: only a
	// process that can read the registry can make or check one (package snapshot).
	SnapshotKey string `json:"snapshot_key"`
}

// Key returns the snapshot key's bytes.
func (c ClusterInfo) Key() []byte {
	b, err := hex.DecodeString(c.SnapshotKey)
	if err != nil {
		return nil
	}
	return b
}

func newClusterInfo() (ClusterInfo, error) {
	var e [16]byte
	var k [32]byte
	if _, err := rand.Read(e[:]); err != nil {
		return ClusterInfo{}, err
	}
	if _, err := rand.Read(k[:]); err != nil {
		return ClusterInfo{}, err
	}
	return ClusterInfo{Epoch: hex.EncodeToString(e[:]), SnapshotKey: hex.EncodeToString(k[:])}, nil
}

// EnsureCluster reads the cluster key, creating it (in a transaction that only creates
// an absent key, so every replica adopts the first one made) when it is absent. It also
// returns the revision of the read.
func (r *Registry) EnsureCluster(ctx context.Context) (ClusterInfo, int64, error) {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	fresh, err := newClusterInfo()
	if err != nil {
		return ClusterInfo{}, 0, fmt.Errorf("cluster: random cluster key: %w", err)
	}
	val, err := json.Marshal(fresh)
	if err != nil {
		return ClusterInfo{}, 0, err
	}
	key := r.clusterKey()
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return ClusterInfo{}, 0, fmt.Errorf("cluster: read cluster key: %w", err)
	}
	if resp.Succeeded {
		r.log.Info("cluster: cluster key created", "epoch", fresh.Epoch)
		return fresh, resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return ClusterInfo{}, 0, fmt.Errorf("cluster: cluster key %s vanished while read", key)
	}
	var info ClusterInfo
	if err := json.Unmarshal(kvs[0].Value, &info); err != nil || info.Epoch == "" || len(info.Key()) != 32 {
		return ClusterInfo{}, 0, fmt.Errorf("cluster: cluster key %s is corrupt (%q)", key, kvs[0].Value)
	}
	return info, resp.Header.Revision, nil
}

// Info returns the cluster key as Sync last read it; ok is false before the first read.
func (r *Registry) Info() (info ClusterInfo, ok bool) {
	p := r.info.Load()
	if p == nil {
		return ClusterInfo{}, false
	}
	return *p, true
}

// Resets counts the registry resets Sync detected.
func (r *Registry) Resets() uint64 { return r.resets.Load() }

// checkReset reports why the registry is not the one this replica follows ("" when it
// is, or when etcd cannot be read now): the cluster key is gone or holds another epoch
// (etcd restored empty, and maybe another replica already made the key again), or the
// store's revision is below one this replica has seen (etcd restored from an older
// backup).
func (r *Registry) checkReset(ctx context.Context, epoch string, seen int64) string {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	g, err := r.cli.Get(ctx, r.clusterKey())
	if err != nil {
		return ""
	}
	return resetReason(g, epoch, seen)
}

func resetReason(g *clientv3.GetResponse, epoch string, seen int64) string {
	if len(g.Kvs) == 0 {
		return "the cluster key is gone"
	}
	var info ClusterInfo
	if err := json.Unmarshal(g.Kvs[0].Value, &info); err != nil || info.Epoch != epoch {
		return fmt.Sprintf("the cluster key holds epoch %q, not %q", info.Epoch, epoch)
	}
	if g.Header.Revision < seen {
		return fmt.Sprintf("etcd's revision %d is below %d, already seen", g.Header.Revision, seen)
	}
	return ""
}
