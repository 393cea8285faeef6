package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster/etcdtest"
)

// TestRegistryMaxServices: MaxServices caps the registry in each registration's
// transaction. Two registries (replicas) that both validated against a count one below
// the cap cannot both commit: the second re-reads and is refused with ConflictLimit; an
// unregistration frees the slot; the count key follows every change.
func TestRegistryMaxServices(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	validated := make(chan string, 4)
	release := map[string]chan struct{}{"x": make(chan struct{}), "y": make(chan struct{})}
	hook := func(id string, attempt int) {
		if ch, ok := release[id]; ok && attempt == 0 {
			validated <- id
			<-ch
		}
	}
	ra := open(t, srv, func(c *Config) { c.MaxServices = 3; c.BeforeCommit = hook })
	rb := open(t, srv, func(c *Config) { c.MaxServices = 3; c.BeforeCommit = hook })
	for i := range 2 {
		mustPut(t, ra, rec("s"+strconv.Itoa(i), "tcp://h:"+strconv.Itoa(i), "m", "p"))
	}
	var errX, errY error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _, errX = ra.Put(ctx, rec("x", "tcp://h:10", "m", "p")) }()
	go func() { defer wg.Done(); _, _, errY = rb.Put(ctx, rec("y", "tcp://h:11", "m", "p")) }()
	<-validated
	<-validated // both saw 2 services
	close(release["x"])
	for n := 0; n != 3; { // x committed
		_, recs, err := ra.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n = len(recs)
	}
	close(release["y"])
	wg.Wait()
	if errX != nil {
		t.Fatalf("x: %v", errX)
	}
	var ce *ConflictError
	if conflictKind(errY) != ConflictLimit || !errors.As(errY, &ce) || ce.Limit != 3 {
		t.Fatalf("y: %v, want the limit of 3", errY)
	}
	if got := countKey(t, ra); got != "3" {
		t.Fatalf("count key %q", got)
	}
	if _, found, err := rb.Delete(ctx, "s0"); err != nil || !found {
		t.Fatal(found, err)
	}
	if got := countKey(t, ra); got != "2" {
		t.Fatalf("count key after delete %q", got)
	}
	if _, _, err := rb.Put(ctx, rec("y", "tcp://h:11", "m", "p")); err != nil {
		t.Fatalf("y after a slot was freed: %v", err)
	}
}

// TestRegistryCountWithoutCountKey: a registry written before the count key existed (or
// whose key was lost) is counted from its service keys on the next write.
func TestRegistryCountWithoutCountKey(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	r := open(t, srv, func(c *Config) { c.MaxServices = 2 })
	for i := range 2 {
		mustPut(t, r, rec("s"+strconv.Itoa(i), "tcp://h:"+strconv.Itoa(i), "m", "p"))
	}
	if _, err := r.Client().Delete(ctx, r.countKey()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Put(ctx, rec("s2", "tcp://h:2", "m", "p")); conflictKind(err) != ConflictLimit {
		t.Fatalf("third service without a count key: %v", err)
	}
	if _, _, err := r.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got := countKey(t, r); got != "1" {
		t.Fatalf("count key rebuilt as %q", got)
	}
}

// TestRegistryManyConcurrentWriters: writers that all touch the count key at once each
// retry until they commit or meet the cap; exactly the cap commit.
func TestRegistryManyConcurrentWriters(t *testing.T) {
	srv := etcdtest.Start(t)
	const writers, limit = 24, 10
	regs := []*Registry{open(t, srv, func(c *Config) { c.MaxServices = limit; c.DialTimeout = 20 * time.Second }),
		open(t, srv, func(c *Config) { c.MaxServices = limit; c.DialTimeout = 20 * time.Second })}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	start := make(chan struct{})
	for i := range writers {
		wg.Go(func() {
			<-start
			_, _, errs[i] = regs[i%2].Put(context.Background(), rec(fmt.Sprint("w", i), fmt.Sprint("tcp://h:", i), "m", "p"))
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case conflictKind(err) != ConflictLimit:
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	_, recs, err := regs[0].List(context.Background())
	if ok != limit || err != nil || len(recs) != limit || countKey(t, regs[0]) != strconv.Itoa(limit) {
		t.Fatalf("%d acknowledged, registry holds %d (%v), count %s; want %d", ok, len(recs), err, countKey(t, regs[0]), limit)
	}
}

func countKey(t *testing.T, r *Registry) string {
	t.Helper()
	g, err := r.Client().Get(context.Background(), r.countKey())
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) == 0 {
		return ""
	}
	return string(g.Kvs[0].Value)
}

// TestSyncDetectsRegistryReset: etcd restarted with an empty data directory (same
// cluster id, revisions from 1 again). Sync notices (the cluster key is gone), counts it,
// asks the applier to write back what it holds, lists the registry again and follows the
// registrations made after the reset, which a watch resumed at the old revision would
// never report.
func TestSyncDetectsRegistryReset(t *testing.T) {
	srv := etcdtest.Start(t)
	r := open(t, srv, func(c *Config) { c.ResetCheckInterval = 50 * time.Millisecond })
	w := open(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	rc := &recorder{ch: make(chan event, 64)}
	rc.republish = func(ctx context.Context) {
		// What the replica held: a and b. Written back through the same rules.
		for _, x := range []*Record{rec("a", "tcp://h:1", "m", "p"), rec("b", "tcp://h:2", "m", "p")} {
			if _, _, err := r.Put(ctx, x); err != nil {
				t.Errorf("republish %s: %v", x.ID, err)
			}
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); r.Sync(ctx, rc, nil) }()
	defer func() { cancel(); <-done }()
	if e := next(t, rc.ch); e.kind != "reset" || e.n != 0 {
		t.Fatalf("first event %+v", e)
	}
	info, ok := r.Info()
	if !ok || len(info.Key()) != 32 {
		t.Fatalf("cluster info %+v %v", info, ok)
	}
	for _, x := range []*Record{rec("a", "tcp://h:1", "m", "p"), rec("b", "tcp://h:2", "m", "p"), rec("c", "tcp://h:3", "m", "p")} {
		rev, _, err := w.Put(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		if e := next(t, rc.ch); e.kind != "put" || e.id != x.ID || e.rev != rev {
			t.Fatalf("got %+v, want put %s", e, x.ID)
		}
	}
	srv.Stop()
	srv.RestartEmpty()
	if e := next(t, rc.ch); e.kind != "republish" {
		t.Fatalf("after the reset: %+v, want republish", e)
	}
	if e := next(t, rc.ch); e.kind != "reset" || e.n != 2 {
		t.Fatalf("after republish: %+v, want a reset to the 2 written back", e)
	}
	if r.Resets() != 1 {
		t.Fatalf("resets %d", r.Resets())
	}
	if info2, _ := r.Info(); info2.Epoch == info.Epoch || info2.SnapshotKey == info.SnapshotKey {
		t.Fatalf("cluster key not made again: %+v then %+v", info, info2)
	}
	// Registrations after the reset are seen.
	rev, _, err := w.Put(ctx, rec("d", "tcp://h:4", "m", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, rc.ch); e.kind != "put" || e.id != "d" || e.rev != rev {
		t.Fatalf("after the reset: %+v, want put d@%d", e, rev)
	}
}

// TestResetReasons: what checkReset reads as a reset.
func TestResetReasons(t *testing.T) {
	srv := etcdtest.Start(t)
	r := open(t, srv, nil)
	ctx := context.Background()
	info, rev, err := r.EnsureCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := r.EnsureCluster(ctx)
	if err != nil || again != info {
		t.Fatalf("second EnsureCluster %+v %v, want %+v", again, err, info)
	}
	if why := r.checkReset(ctx, info.Epoch, rev); why != "" {
		t.Fatalf("same registry: %s", why)
	}
	if why := r.checkReset(ctx, "other", rev); why == "" {
		t.Fatal("another epoch not a reset")
	}
	if why := r.checkReset(ctx, info.Epoch, rev+1000); why == "" {
		t.Fatal("a revision below one seen not a reset")
	}
	if _, err := r.Client().Delete(ctx, r.clusterKey()); err != nil {
		t.Fatal(err)
	}
	if why := r.checkReset(ctx, info.Epoch, 0); why == "" {
		t.Fatal("no cluster key not a reset")
	}

}
