package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster/etcdtest"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func open(t *testing.T, srv *etcdtest.Server, mod func(*Config)) *Registry {
	t.Helper()
	cfg := Config{Endpoints: srv.Endpoints(), KeyPrefix: "/t/", DialTimeout: 5 * time.Second, Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	r, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func rec(id, ep, ctx, profile string) *Record {
	return &Record{ID: id, Endpoint: ep, Context: ctx, Profile: json.RawMessage(`"` + profile + `"`),
		Value: json.RawMessage(fmt.Sprintf(`{"id":%q,"ep":%q,"ctx":%q,"p":%q}`, id, ep, ctx, profile))}
}

// mustPut registers rec through r, failing the test on an error.
func mustPut(t *testing.T, r *Registry, rec *Record) {
	t.Helper()
	if _, _, err := r.Put(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

func conflictKind(err error) ConflictKind {
	var ce *ConflictError
	if errors.As(err, &ce) {
		return ce.Kind
	}
	return 0
}

func TestRegistryRules(t *testing.T) {
	srv := etcdtest.Start(t)
	r := open(t, srv, nil)
	ctx := context.Background()
	a := rec("a", "tcp://h:1", "m", "p1")
	rev, existed, err := r.Put(ctx, a)
	if err != nil || existed || rev == 0 {
		t.Fatalf("put a: rev %d existed %v err %v", rev, existed, err)
	}
	if rev2, existed, err := r.Put(ctx, rec("a", "tcp://h:1", "m", "p1")); err != nil || !existed || rev2 != rev {
		t.Fatalf("identical put: rev %d (want %d) existed %v err %v", rev2, rev, existed, err)
	}
	if _, _, err := r.Put(ctx, rec("a", "tcp://h:9", "m", "p1")); conflictKind(err) != ConflictService {
		t.Fatalf("same id, other config: %v", err)
	}
	_, _, err = r.Put(ctx, rec("b", "tcp://h:1", "m", "p1"))
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Kind != ConflictEndpoint || ce.Other != "a" {
		t.Fatalf("endpoint in use: %v", err)
	}
	if _, _, err := r.Put(ctx, rec("b", "tcp://h:2", "m", "p2")); conflictKind(err) != ConflictProfile {
		t.Fatalf("profile conflict: %v", err)
	}
	mustPut(t, r, rec("b", "tcp://h:2", "m", "p1"))
	_, recs, err := r.List(ctx)
	if err != nil || len(recs) != 2 || recs[0].ID != "a" || recs[1].ID != "b" {
		t.Fatalf("list: %+v %v", recs, err)
	}
	// The context keeps its profile while one service is in it, and forgets it after the last.
	if _, found, err := r.Delete(ctx, "a"); err != nil || !found {
		t.Fatalf("delete a: %v %v", found, err)
	}
	if _, _, err := r.Put(ctx, rec("c", "tcp://h:1", "m", "p2")); conflictKind(err) != ConflictProfile {
		t.Fatalf("profile still pinned by b: %v", err)
	}
	if _, found, err := r.Delete(ctx, "b"); err != nil || !found {
		t.Fatalf("delete b: %v %v", found, err)
	}
	if _, found, err := r.Delete(ctx, "b"); err != nil || found {
		t.Fatalf("delete b again: %v %v", found, err)
	}
	if _, _, err := r.Put(ctx, rec("c", "tcp://h:1", "m", "p2")); err != nil {
		t.Fatalf("empty context takes a new profile, freed endpoint reusable: %v", err)
	}
}

// TestRegistryConcurrentConflict interleaves two conflicting registrations exactly: both
// validate against the same registry state before either commits. The first to commit
// wins; the other's transaction fails its compare, it validates again and is refused.
func TestRegistryConcurrentConflict(t *testing.T) {
	srv := etcdtest.Start(t)
	for _, tc := range []struct {
		name string
		a, b *Record
		kind ConflictKind
	}{
		{"same id", rec("x", "tcp://h:1", "m", "p"), rec("x", "tcp://h:2", "m", "p"), ConflictService},
		{"same endpoint", rec("x", "tcp://h:1", "m", "p"), rec("y", "tcp://h:1", "m", "p"), ConflictEndpoint},
		{"profile", rec("x", "tcp://h:1", "m", "p"), rec("y", "tcp://h:2", "m", "q"), ConflictProfile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/" + tc.name + "/"
			validated := make(chan string, 4)
			release := map[string]chan struct{}{tc.a.Endpoint + tc.a.ID: make(chan struct{}), tc.b.Endpoint + tc.b.ID: make(chan struct{})}
			hook := func(tag string) func(string, int) {
				return func(_ string, attempt int) {
					if attempt == 0 {
						validated <- tag
						<-release[tag]
					}
				}
			}
			ta, tb := tc.a.Endpoint+tc.a.ID, tc.b.Endpoint+tc.b.ID
			ra := open(t, srv, func(c *Config) { c.KeyPrefix = prefix; c.BeforeCommit = hook(ta) })
			rb := open(t, srv, func(c *Config) { c.KeyPrefix = prefix; c.BeforeCommit = hook(tb) })
			var errA, errB error
			doneA, doneB := make(chan struct{}), make(chan struct{})
			go func() { defer close(doneA); _, _, errA = ra.Put(context.Background(), tc.a) }()
			go func() { defer close(doneB); _, _, errB = rb.Put(context.Background(), tc.b) }()
			<-validated
			<-validated // both validated against the empty registry
			close(release[ta])
			<-doneA // a's Put returned: it committed (or failed) before b is released
			close(release[tb])
			<-doneB
			if errA != nil {
				t.Fatalf("first commit refused: %v", errA)
			}
			if conflictKind(errB) != tc.kind {
				t.Fatalf("second: %v, want conflict kind %d", errB, tc.kind)
			}
			_, recs, err := ra.List(context.Background())
			if err != nil || len(recs) != 1 || !recs[0].same(tc.a) {
				t.Fatalf("registry holds %+v (%v)", recs, err)
			}
		})
	}
}

type event struct {
	kind string
	rev  int64
	id   string
	n    int
}

type recorder struct {
	ch chan event
	// republish, when set, runs on Republish (after the event is sent).
	republish func(ctx context.Context)
}

func (r *recorder) Reset(rev int64, recs []Record) {
	r.ch <- event{kind: "reset", rev: rev, n: len(recs)}
}
func (r *recorder) Put(rev int64, rec *Record)  { r.ch <- event{kind: "put", rev: rev, id: rec.ID} }
func (r *recorder) Delete(rev int64, id string) { r.ch <- event{kind: "del", rev: rev, id: id} }
func (r *recorder) Republish(ctx context.Context) {
	r.ch <- event{kind: "republish"}
	if r.republish != nil {
		r.republish(ctx)
	}
}

func next(t *testing.T, ch chan event) event {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("no registry event")
		return event{}
	}
}

// TestSyncWatchOutageAndCompaction: changes arrive in order; while etcd is down writes
// fail (and nothing is recorded); once it is back the watch resumes from its revision; a
// compaction past the watch's revision makes Sync list again.
func TestSyncWatchOutageAndCompaction(t *testing.T) {
	srv := etcdtest.Start(t)
	r := open(t, srv, nil)
	w := open(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	rc := &recorder{ch: make(chan event, 64)}
	loaded := make(chan struct{})
	done := make(chan struct{})
	mustPut(t, w, rec("pre", "tcp://h:0", "m", "p"))
	go func() { defer close(done); r.Sync(ctx, rc, func() { close(loaded) }) }()
	defer func() { cancel(); <-done }()
	if e := next(t, rc.ch); e.kind != "reset" || e.n != 1 {
		t.Fatalf("first event %+v", e)
	}
	<-loaded
	rev, _, err := w.Put(ctx, rec("a", "tcp://h:1", "m", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, rc.ch); e != (event{kind: "put", rev: rev, id: "a"}) {
		t.Fatalf("got %+v want put a@%d", e, rev)
	}

	srv.Stop()
	if _, _, err := w.Put(ctx, rec("b", "tcp://h:2", "m", "p")); err == nil || conflictKind(err) != 0 {
		t.Fatalf("put with etcd down: %v", err)
	}
	srv.Restart()
	_, recs, err := w.List(ctx)
	if err != nil || len(recs) != 2 {
		t.Fatalf("after the outage the registry holds %d records (%v), want pre and a only", len(recs), err)
	}
	rev, _, err = w.Put(ctx, rec("b", "tcp://h:2", "m", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, rc.ch); e != (event{kind: "put", rev: rev, id: "b"}) {
		t.Fatalf("after restart got %+v want put b@%d", e, rev)
	}

}

// TestWatchCompacted: a watch whose next revision was compacted away asks for a new
// listing (returns 0) and hands nothing to the applier; Sync then resets.
func TestWatchCompacted(t *testing.T) {
	srv := etcdtest.Start(t)
	r := open(t, srv, nil)
	ctx := context.Background()
	rev1, _, err := r.Put(ctx, rec("a", "tcp://h:1", "m", "p"))
	if err != nil {
		t.Fatal(err)
	}
	rev2, _, err := r.Put(ctx, rec("b", "tcp://h:2", "m", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Client().Compact(ctx, rev2); err != nil {
		t.Fatal(err)
	}
	rc := &recorder{ch: make(chan event, 8)}
	seen := rev2
	if got, why := r.watch(ctx, rc, rev1-1, "", &seen); got != 0 || why != "" {
		t.Fatalf("watch from compacted revision returned %d, want 0 (list again)", got)
	}
	if len(rc.ch) != 0 {
		t.Fatalf("compacted watch handed %+v", <-rc.ch)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Sync(sctx, rc, nil) }()
	if e := next(t, rc.ch); e.kind != "reset" || e.n != 2 || e.rev < rev2 {
		t.Fatalf("sync: %+v", e)
	}
	cancel()
	<-done
}

func TestMembers(t *testing.T) {
	srv := etcdtest.Start(t)
	r1 := open(t, srv, func(c *Config) { c.AdvertiseURL = "http://10.0.0.1:13333"; c.MemberTTL = 2 * time.Second })
	r2 := open(t, srv, func(c *Config) { c.AdvertiseURL = "http://10.0.0.2:13333"; c.MemberTTL = 2 * time.Second })
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	d1, d2 := make(chan struct{}), make(chan struct{})
	go func() { defer close(d1); r1.KeepMember(ctx1) }()
	go func() { defer close(d2); r2.KeepMember(ctx2) }()
	defer func() { cancel2(); <-d2 }()
	// The member keys are published by KeepMember's goroutines: ask until both are
	// there. The sleep only paces the asking; the bound only ends a run that would hang.
	waitMembers := func(want int) []string {
		for i := 0; ; i++ {
			m, err := r1.Members(context.Background())
			if err == nil && len(m) == want {
				return m
			}
			if i > 2000 {
				t.Fatalf("members %v (%v), want %d", m, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if m := waitMembers(2); m[0] != "http://10.0.0.1:13333" || m[1] != "http://10.0.0.2:13333" {
		t.Fatalf("members %v", m)
	}
	cancel1()
	<-d1 // KeepMember deleted its key before it returned
	if m, err := r1.Members(context.Background()); err != nil || len(m) != 1 || m[0] != "http://10.0.0.2:13333" {
		t.Fatalf("after one left: %v (%v)", m, err)
	}
}
