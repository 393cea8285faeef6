package server

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
	"github.com/conductor-go/conductor/wire/publisher"
)

// failoverRig is a conductor service layer with an engine registration (context default/m/16)
// and a Mooncake registration that follows a master view on a real etcd; its masters are
// zmqtest publishers on 127.0.0.2, 127.0.0.3, ... all on the same event port, as Mooncake
// masters on different hosts bind the same --kv_events_bind_endpoint.
type failoverRig struct {
	t      *testing.T
	cli    *clientv3.Client
	eng    *engine.Engine
	svc    *service.Service
	loc    source.MasterLocator
	locStr string
	port   int
	events chan string
	lease  clientv3.LeaseID
}

const failoverLocatorID = "pool"

func newFailoverRig(t *testing.T) *failoverRig {
	t.Helper()
	srv := etcdtest.Start(t)
	r := &failoverRig{t: t, cli: srv.Client(), events: make(chan string, 4096)}
	r.eng = engine.New(engine.Config{Logger: testLogger()})
	t.Cleanup(r.eng.Close)
	r.svc = service.New(service.Options{Engine: r.eng, Logger: testLogger(), Subscribe: service.ZMQSubscriber(source.Options{
		MasterHook: func(name, ev string) {
			if name == service.Key(failoverLocatorID, "default", 0) {
				r.events <- ev
			}
		}})})
	t.Cleanup(r.svc.Stop)
	eng := newPublisher(t, false)
	if _, _, err := r.svc.RegisterInput(r.reg(eng.Endpoint(), "vLLM", "a")); err != nil {
		t.Fatal(err)
	}
	loc := "etcd://" + strings.TrimPrefix(srv.Endpoint(), "http://") + "/test-cluster?event_port="
	r.port = r.freeEventPort()
	var err error
	r.locStr = loc + strconv.Itoa(r.port)
	if r.loc, err = source.ParseMasterLocator(r.locStr); err != nil {
		t.Fatal(err)
	}
	return r
}

// freeEventPort finds a port free on 127.0.0.2 (the masters then bind it on their own IPs).
func (r *failoverRig) freeEventPort() int {
	p, err := zmqtest.NewPublisher(zmqtest.Config{Endpoint: "tcp://127.0.0.2:*"})
	if err != nil {
		r.t.Skip(err)
	}
	ep := p.Endpoint()
	p.Close()
	port, err := strconv.Atoi(ep[strings.LastIndexByte(ep, ':')+1:])
	if err != nil {
		r.t.Fatal(ep, err)
	}
	return port
}

func (r *failoverRig) reg(endpoint, typ, instance string) *service.Registration {
	return &service.Registration{Endpoint: endpoint, Type: typ, ModelName: "m", InstanceID: instance, BlockSize: 16,
		Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}
}

func (r *failoverRig) register() {
	r.t.Helper()
	if _, isNew, err := r.svc.RegisterInput(r.reg(r.locStr, "Mooncake", failoverLocatorID)); err != nil || !isNew {
		r.t.Fatalf("register locator %s: %v %v", r.locStr, isNew, err)
	}
}

// master starts a master's event publisher on 127.0.0.<n> whose first batch is firstSeq.
func (r *failoverRig) master(n int, firstSeq uint64) *zmqtest.Publisher {
	r.t.Helper()
	p, err := zmqtest.NewPublisher(zmqtest.Config{Endpoint: fmt.Sprintf("tcp://127.0.0.%d:%d", n, r.port)})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { p.Close() })
	p.Skip(firstSeq)
	return p
}

// elect makes 127.0.0.<n> the leader the way Mooncake does: create-if-absent with a lease.
func (r *failoverRig) elect(n int) {
	r.t.Helper()
	ctx := context.Background()
	l, err := r.cli.Grant(ctx, 60)
	if err != nil {
		r.t.Fatal(err)
	}
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.loc.Key()), "=", 0)).
		Then(clientv3.OpPut(r.loc.Key(), fmt.Sprintf("127.0.0.%d:50051", n), clientv3.WithLease(l.ID))).Commit()
	if err != nil || !resp.Succeeded {
		r.t.Fatalf("elect 127.0.0.%d: %v %v", n, resp, err)
	}
	r.lease = l.ID
}

// resign revokes the leader's lease: the key goes, as when a master dies.
func (r *failoverRig) resign() {
	r.t.Helper()
	if _, err := r.cli.Revoke(context.Background(), r.lease); err != nil {
		r.t.Fatal(err)
	}
}

// wait reads hook events until one equals want.
func (r *failoverRig) wait(want string) {
	r.t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev := <-r.events:
			if ev == want {
				return
			}
		case <-timeout:
			r.t.Fatalf("no %q event", want)
		}
	}
}

func (r *failoverRig) subscribed(n int) string {
	return fmt.Sprintf("subscribed tcp://127.0.0.%d:%d", n, r.port)
}

// publish sends one Mooncake batch storing key (object obj) in the cpu tier.
func (r *failoverRig) publish(p *zmqtest.Publisher, key uint64, obj string) uint64 {
	r.t.Helper()
	const ts = int64(1757500000250)
	return mustPublish(r.t, p, mcBatch(ts, mcStored(key, ts, "cpu", obj)))
}

// followed waits until the service subscribed to master n and publisher p has seen its
// subs-th subscription.
func (r *failoverRig) followed(n int, p *zmqtest.Publisher, subs int) {
	r.t.Helper()
	r.wait(r.subscribed(n))
	waitSub(r.t, p, subs)
}

// follow starts master n (its stream from 1), elects it, registers the locator and waits
// until the service follows it.
func (r *failoverRig) follow(n int) *zmqtest.Publisher {
	r.t.Helper()
	p := r.master(n, 1)
	r.elect(n)
	r.register()
	r.followed(n, p, 1)
	return p
}

// publishApplied publishes like publish and waits until the service applied the batch.
func (r *failoverRig) publishApplied(p *zmqtest.Publisher, key uint64, obj string) uint64 {
	r.t.Helper()
	seq := r.publish(p, key, obj)
	r.waitApplied(seq)
	return seq
}

// waitApplied waits until the service applied the batch numbered seq.
func (r *failoverRig) waitApplied(seq uint64) {
	r.t.Helper()
	r.wait(fmt.Sprintf("applied %d", seq))
}

// held reports whether block key is in the shared CPU tier for the engine instance.
func (r *failoverRig) held(key uint64) bool {
	r.t.Helper()
	var res engine.Result
	if err := r.eng.QueryKeys(engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, []uint64{key}, 16, "", &res); err != nil {
		r.t.Fatal(err)
	}
	for _, in := range res.Instances {
		if in.InstanceID == "a" {
			return in.CPUShare == 16
		}
	}
	r.t.Fatalf("instance a missing: %+v", res.Instances)
	return false
}

// svcStats returns the locator registration's stats.
func (r *failoverRig) svcStats() service.Stats {
	r.t.Helper()
	for _, s := range r.svc.Stats() {
		if s.Config.InstanceID == failoverLocatorID {
			return s
		}
	}
	r.t.Fatal("locator registration missing")
	return service.Stats{}
}

// leader returns the locator registration's leader stats.
func (r *failoverRig) leader() source.LeaderStats {
	r.t.Helper()
	s := r.svcStats()
	if !s.HasLeader {
		r.t.Fatal("locator registration has no leader stats")
	}
	return s.Leader
}

// TestMasterFailoverRetractsWhenNotContinued: the locator resolves to the leader, whose
// events are indexed; the leader dies (key deleted: waiting, bindings kept); a new master
// is elected whose stream starts at 1 (a new process): the old bindings are retracted and
// the new leader's events indexed.
func TestMasterFailoverRetractsWhenNotContinued(t *testing.T) {
	r := newFailoverRig(t)
	const k0, k1, k2 = 0x1111, 0x2222, 0x3333
	a := r.follow(2)
	b := r.master(3, 1)
	r.publishApplied(a, k0, "obj-0")
	r.publishApplied(a, k1, "obj-1")
	if !r.held(k0) || !r.held(k1) {
		t.Fatal("leader's events not indexed")
	}
	if l := r.leader(); l.Missing || l.Leader != "127.0.0.2:50051" || l.Changes != 0 {
		t.Fatalf("leader stats %+v", l)
	}

	r.resign()
	r.wait("waiting")
	if l := r.leader(); !l.Missing {
		t.Fatalf("key deleted, stats %+v", l)
	}
	if !r.held(k0) || !r.held(k1) {
		t.Fatal("bindings dropped while waiting for a leader")
	}
	// The old master is no longer followed: what it still publishes is not indexed.
	r.publish(a, k2, "obj-2")

	r.elect(3)
	r.followed(3, b, 1)
	seq := r.publish(b, k2, "obj-2b")
	if seq != 1 {
		t.Fatalf("new master's first seq %d", seq)
	}
	r.wait("retracted")
	r.wait("applied 1")
	if r.held(k0) || r.held(k1) {
		t.Error("old leader's bindings kept although the new stream does not continue it")
	}
	if !r.held(k2) {
		t.Error("new leader's event not indexed")
	}
	if l := r.leader(); l.Missing || l.Leader != "127.0.0.3:50051" || l.Changes != 1 || l.Retractions != 1 || l.Continuations != 0 {
		t.Errorf("leader stats %+v", l)
	}
	// The handler counts a batch before the hook hears of it (the subscriber's own
	// counter is bumped after).
	if st := r.svcStats(); st.Handler.Batches != 3 {
		t.Errorf("batches handled over both streams: %d, want 3", st.Handler.Batches)
	}

	// Unregistering removes what the new leader contributed, and stops following.
	if _, err := r.svc.Unregister(failoverLocatorID, "", 0); err != nil {
		t.Fatal(err)
	}
	if r.held(k2) {
		t.Error("binding kept after unregister")
	}
}

// TestMasterFailoverKeepsWhenContinued: the new leader's first batch continues the old
// stream's sequence, so the old bindings stay; a re-election at the same address keeps
// the stream itself.
func TestMasterFailoverKeepsWhenContinued(t *testing.T) {
	r := newFailoverRig(t)
	const k0, k1, k2 = 0x1111, 0x2222, 0x3333
	a := r.follow(2)
	var last uint64
	for i, k := range []uint64{k0, k1} {
		last = r.publish(a, k, "obj-"+strconv.Itoa(i))
	}
	r.waitApplied(last)

	// A new term at the same address: same stream, nothing re-subscribed.
	r.resign()
	r.wait("waiting")
	r.elect(2)
	r.followed(2, a, 2) // the stream was stopped while no leader was known
	last = r.publish(a, k2, "obj-2")
	r.wait("continued")
	r.waitApplied(last)
	if !r.held(k0) || !r.held(k1) || !r.held(k2) {
		t.Fatal("bindings lost across a continued stream")
	}

	// Leader moves to another master whose stream continues the sequence.
	b := r.master(3, last+1)
	r.resign()
	r.wait("waiting")
	r.elect(3)
	r.followed(3, b, 1)
	const k3 = 0x4444
	seq := r.publish(b, k3, "obj-3")
	r.wait("continued")
	r.waitApplied(seq)
	for _, k := range []uint64{k0, k1, k2, k3} {
		if !r.held(k) {
			t.Errorf("block %x not held after a continued failover", k)
		}
	}
	if l := r.leader(); l.Retractions != 0 || l.Continuations != 2 || l.Changes != 2 {
		t.Errorf("leader stats %+v", l)
	}
}

// TestMasterFailoverSameAddressKept: a view change that names the leader already followed
// (a new term of the same master) keeps the running stream.
func TestMasterFailoverSameAddressKept(t *testing.T) {
	r := newFailoverRig(t)
	a := r.follow(2)
	// The value changes (another RPC port) but names the same host: same event endpoint.
	ctx := context.Background()
	if _, err := r.cli.Put(ctx, r.loc.Key(), "127.0.0.2:50052", clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	r.wait("kept")
	r.publishApplied(a, 0x1111, "obj-0")
	if !r.held(0x1111) {
		t.Fatal("event not indexed on the kept stream")
	}
	if l := r.leader(); l.Changes != 0 || l.Leader != "127.0.0.2:50052" {
		t.Errorf("leader stats %+v", l)
	}
}

// TestMasterFailoverKeyMissingThenAppears: registered before any master is elected, the
// service waits (stat and metric), then subscribes once the key appears.
func TestMasterFailoverKeyMissingThenAppears(t *testing.T) {
	r := newFailoverRig(t)
	r.register()
	r.wait("waiting")
	if l := r.leader(); !l.Missing || l.Leader != "" {
		t.Fatalf("leader stats before election %+v", l)
	}
	if len(r.svc.Services()) != 2 {
		t.Fatalf("services %v", r.svc.Services())
	}
	// An unusable view (the master's default local_hostname 0.0.0.0) keeps it waiting.
	if _, err := r.cli.Put(context.Background(), r.loc.Key(), "0.0.0.0:50051"); err != nil {
		t.Fatal(err)
	}
	r.wait("waiting")
	if _, err := r.cli.Delete(context.Background(), r.loc.Key()); err != nil {
		t.Fatal(err)
	}
	r.wait("waiting")
	a := r.master(2, 1)
	r.elect(2)
	r.followed(2, a, 1)
	r.publishApplied(a, 0x1111, "obj-0")
	if !r.held(0x1111) {
		t.Fatal("event not indexed after the leader appeared")
	}
	if l := r.leader(); l.Missing || l.Changes != 0 {
		t.Errorf("leader stats %+v", l)
	}
}

// TestMasterFailoverStaleRecoversWithNextLeader: a gap makes the leader's stream stale
// (bindings retracted); the next leader's stream is indexed again.
func TestMasterFailoverStaleRecoversWithNextLeader(t *testing.T) {
	r := newFailoverRig(t)
	a := r.follow(2)
	r.publishApplied(a, 0x1111, "obj-0")
	a.Lose(mcBatch(1, nil...))
	r.publish(a, 0x2222, "obj-1")
	r.wait("stale")
	if r.held(0x1111) || r.held(0x2222) {
		t.Fatal("stale stream's bindings kept")
	}
	b := r.master(3, 1)
	r.resign()
	r.elect(3)
	r.followed(3, b, 1)
	r.publishApplied(b, 0x3333, "obj-3")
	if !r.held(0x3333) {
		t.Fatal("next leader's stream not indexed after a stale one")
	}
	if l := r.leader(); l.Retractions != 0 {
		t.Errorf("a stale stream has nothing left to retract: %+v", l)
	}
}

// TestMasterLocatorRegistrationErrors: malformed locators, and locators on other types,
// are 400 invalid_value on the endpoint field, over HTTP.
func TestMasterLocatorRegistrationErrors(t *testing.T) {
	app := startApp(t, false)
	for _, c := range []struct{ ep, typ string }{
		{"etcd://127.0.0.1:2379/mooncake", "Mooncake"},
		{"etcd://127.0.0.1:2379/mooncake?event_port=0", "Mooncake"},
		{"etcd://127.0.0.1:2379/mooncake?event_port=5557&x=1", "Mooncake"},
		{"etcd://127.0.0.1:2379?event_port=5557", "Mooncake"},
		{"etcd://127.0.0.1/mooncake?event_port=5557", "Mooncake"},
		{"etcd://127.0.0.1:2379/moon cake?event_port=5557", "Mooncake"},
		{"etcd://127.0.0.1:2379/mooncake?event_port=5557", "vLLM"},
		{"etcd://127.0.0.1:2379/mooncake?event_port=5557", "SGLang"},
	} {
		code, resp := msgpackPost(t, app, "/register", registerBody(c.ep, "mc", 0, "type", c.typ))
		wantRequestError(t, c.typ+" "+c.ep, code, resp, "invalid_value", "endpoint", -1)
		if msg, _ := resp["error"].(string); !strings.Contains(msg, "locator") {
			t.Errorf("%s: message %q does not say what is wrong", c.ep, msg)
		}
	}
	code, resp := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:1", "e", 0, "replay_endpoint", "etcd://127.0.0.1:2379/m?event_port=1"))
	wantRequestError(t, "locator as replay endpoint", code, resp, "invalid_value", "replay_endpoint", -1)
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 0 {
		t.Errorf("services after refused registrations: %v", svcs)
	}
}

// TestClusterMasterLocatorOnReplicas: a locator registered on one replica is followed by
// every replica (each through its own bootstrap gate), and a leader change whose stream
// does not continue the old one retracts the old bindings on all of them.
func TestClusterMasterLocatorOnReplicas(t *testing.T) {
	srv := etcdtest.Start(t)
	ra, rb := startReplicaPair(t, srv, "/fo/")
	r := &failoverRig{t: t, cli: srv.Client()}
	r.port = r.freeEventPort()
	r.locStr = "etcd://" + strings.TrimPrefix(srv.Endpoint(), "http://") + "/ha?event_port=" + strconv.Itoa(r.port)
	var err error
	if r.loc, err = source.ParseMasterLocator(r.locStr); err != nil {
		t.Fatal(err)
	}
	m1, m2 := r.master(2, 1), r.master(3, 1)
	r.elect(2)
	eng := newPublisher(t, false)
	for _, body := range [][]byte{registerBody(eng.Endpoint(), "a", 0), registerBody(r.locStr, failoverLocatorID, 0, "type", "Mooncake")} {
		mustRegister(t, ra, "", body)
	}
	converge(t, srv, ra, rb)
	waitSub(t, m1, 2)
	held := func(app *App, key uint64) bool {
		var res engine.Result
		if err := app.Engine.QueryKeys(engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, []uint64{key}, 16, "", &res); err != nil {
			t.Fatal(err)
		}
		return len(res.Instances) == 1 && res.Instances[0].CPUShare == 16
	}
	both := func(what string, key uint64, want bool) {
		t.Helper()
		eventually(t, what, func() error {
			for i, app := range []*App{ra, rb} {
				if held(app, key) != want {
					return errf("replica %d: block %x held=%v, want %v", i, key, !want, want)
				}
			}
			return nil
		})
	}
	r.publish(m1, 0x1111, "obj-0")
	both("first leader's event on both replicas", 0x1111, true)
	r.resign()
	r.elect(3)
	waitSub(t, m2, 2)
	r.publish(m2, 0x2222, "obj-1")
	both("new leader's event on both replicas", 0x2222, true)
	both("old leader's binding retracted on both replicas", 0x1111, false)
}

// TestMasterLocatorOverRPC: the RPC wire carries the locator in its endpoint string; a
// malformed one is INVALID_PARAMS, a valid one registers (and waits for its etcd).
func TestMasterLocatorOverRPC(t *testing.T) {
	app, _ := startRPCTestApp(t)
	cl, ctx := dialRPC(t, app, 20*time.Second)
	reg := func(ep string, kind publisher.Kind) cororpc.ErrorCode {
		cfg := cororpc.ServiceConfig{Endpoint: ep, PublisherKind: kind, ModelName: "m", TenantID: "default",
			InstanceID: "pool", BlockSize: 16, HashProfile: rgVLLMProfile}
		_, code, err := cl.Register(ctx, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if c := reg("etcd://127.0.0.1:1/mooncake?event_port=0", publisher.Mooncake); c != cororpc.CodeInvalidParams {
		t.Errorf("bad event_port: %v", c)
	}
	if c := reg("etcd://127.0.0.1:1/mooncake?event_port=5557", publisher.VLLM); c != cororpc.CodeInvalidParams {
		t.Errorf("locator on vLLM: %v", c)
	}
	// Nothing listens on port 1: the registration stands, without a leader.
	if c := reg("etcd://127.0.0.1:1/mooncake?event_port=5557", publisher.Mooncake); c != cororpc.CodeOK {
		t.Fatalf("valid locator: %v", c)
	}
	stats := app.Service.Stats()
	if len(stats) != 1 {
		t.Fatalf("services: %d, want 1", len(stats))
	}
	for _, s := range stats {
		if !s.HasLeader || !s.Leader.Missing {
			t.Errorf("%s: leader stats %+v (has %v)", s.Key, s.Leader, s.HasLeader)
		}
	}
	_, body := httpGet(t, app, "/metrics")
	for _, want := range []string{
		`conductor_service_master_leader_missing{service="pool|default|0",type="Mooncake"} 1`,
		`conductor_service_master_leader_changes_total{service="pool|default|0",type="Mooncake"} 0`,
		`conductor_service_master_leader_streams_total{outcome="retracted",service="pool|default|0",type="Mooncake"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
