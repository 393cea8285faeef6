package cluster

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/conductor-go/conductor/cluster/etcdtest"
)

// withValue is rec with another registration value (its adapters changed).
func withValue(r *Record, v string) *Record {
	out := *r
	out.Value = json.RawMessage(`"` + v + `"`)
	return &out
}

// contextServices is the service count the registry keeps for context c (0: no key).
func contextServices(t *testing.T, r *Registry, c string) (int, string) {
	t.Helper()
	g, err := r.cli.Get(context.Background(), r.contextKey(c))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) == 0 {
		return 0, ""
	}
	var cv contextValue
	if err := json.Unmarshal(g.Kvs[0].Value, &cv); err != nil {
		t.Fatal(err)
	}
	return cv.Services, string(cv.Profile)
}

// seededRegistry starts etcd and opens a registry holding one service, a (context m,
// profile p1).
func seededRegistry(t *testing.T) (srv *etcdtest.Server, r *Registry, a *Record) {
	t.Helper()
	srv = etcdtest.Start(t)
	r = open(t, srv, nil)
	a = rec("a", "tcp://h:1", "m", "p1")
	mustPut(t, r, a)
	return srv, r, a
}

// TestRegistryReplace: a service's record changes in place (same id and endpoint); the
// context pin moves with it; a replacement of a record the registry no longer holds,
// or into a context pinned to another profile, is refused.
func TestRegistryReplace(t *testing.T) {
	_, r, a := seededRegistry(t)
	ctx := context.Background()
	a2 := withValue(a, "two adapters")
	if _, err := r.Replace(ctx, a, a2); err != nil {
		t.Fatal(err)
	}
	_, recs, err := r.List(ctx)
	if err != nil || len(recs) != 1 || string(recs[0].Value) != `"two adapters"` {
		t.Fatalf("list %+v %v", recs, err)
	}
	if n, _ := contextServices(t, r, "m"); n != 1 {
		t.Fatalf("context m counts %d services", n)
	}
	// prev is what the caller registered: a stale one is refused.
	if _, err := r.Replace(ctx, a, withValue(a, "three")); conflictKind(err) != ConflictService {
		t.Fatalf("stale prev: %v", err)
	}
	// The context moves (the registration's own adapter changed): the old pin goes with
	// its last service, the new one is taken.
	a3 := rec("a", "tcp://h:1", "m/lora", "p1-lora")
	if _, err := r.Replace(ctx, a2, a3); err != nil {
		t.Fatal(err)
	}
	if n, _ := contextServices(t, r, "m"); n != 0 {
		t.Fatalf("old context still counts %d", n)
	}
	if n, p := contextServices(t, r, "m/lora"); n != 1 || p != `"p1-lora"` {
		t.Fatalf("new context %d %s", n, p)
	}
	// Into a context another service pins to another profile: refused, nothing changes.
	mustPut(t, r, rec("b", "tcp://h:2", "n", "p2"))
	if _, err := r.Replace(ctx, a3, rec("a", "tcp://h:1", "n", "p3")); conflictKind(err) != ConflictProfile {
		t.Fatalf("pinned context: %v", err)
	}
	if n, _ := contextServices(t, r, "m/lora"); n != 1 {
		t.Fatal("a refused replacement changed the pins")
	}
	if _, err := r.Replace(ctx, a3, rec("a", "tcp://h:9", "m/lora", "p1-lora")); err == nil {
		t.Fatal("a replacement moving the endpoint was accepted")
	}
	// Deleting the replaced record releases what it holds.
	if _, found, err := r.Delete(ctx, "a"); err != nil || !found {
		t.Fatal(found, err)
	}
	if n, _ := contextServices(t, r, "m/lora"); n != 0 {
		t.Fatal("delete after replace left the context pin")
	}
}

// TestRegistryReplaceRace: two replicas replace the same record from the same state,
// both validated before either commits (held by the commit hook): the first commits,
// the second's compare fails, it reads again and is refused (its prev is gone).
func TestRegistryReplaceRace(t *testing.T) {
	srv, seed, a := seededRegistry(t)
	ctx := context.Background()
	var validated sync.WaitGroup
	validated.Add(2)
	hold := make(chan struct{})
	hook := func(_ string, attempt int) {
		if attempt == 0 {
			validated.Done()
			<-hold
		}
	}
	r1 := open(t, srv, func(c *Config) { c.BeforeCommit = hook })
	r2 := open(t, srv, func(c *Config) { c.BeforeCommit = hook })
	errs := make(chan error, 2)
	go func() { _, err := r1.Replace(ctx, a, withValue(a, "one")); errs <- err }()
	go func() { _, err := r2.Replace(ctx, a, withValue(a, "two")); errs <- err }()
	validated.Wait()
	close(hold)
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("both or neither committed: %v, %v", e1, e2)
	}
	lost := e1
	if lost == nil {
		lost = e2
	}
	if conflictKind(lost) != ConflictService {
		t.Fatalf("loser: %v", lost)
	}
	if n, _ := contextServices(t, seed, "m"); n != 1 {
		t.Fatalf("context counts %d services", n)
	}
}
