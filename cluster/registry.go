// Package cluster keeps the registrations of a conductor cluster in etcd: a registry
// whose writes keep the single-node conflict rules across replicas (one configuration per
// service, one service per endpoint, one hash profile per index context), a watch that
// feeds every replica the changes in revision order, and lease-bound member keys by which
// replicas find each other.
//
// Layout under the key prefix (default "/mooncake-conductor/"), every name segment
// path-escaped:
//
//	services/<id>        a Record (JSON): the registration, its endpoint and context
//	endpoints/<endpoint> the id of the service that uses the endpoint
//	contexts/<context>   {"profile":...,"services":n}: the context's hash profile and how
//	                     many registered services are in it (deleted at 0)
//	count                how many service keys there are (decimal), so that max_services
//	                     holds across replicas
//	cluster              {"epoch":...,"snapshot_key":...}: created once, with random
//	                     values, by the first replica; a registry that no longer holds
//	                     it (etcd restored empty) has been reset
//	members/<url>        a replica's advertise URL, bound to its lease
//
// A registration is one transaction that compares the mod revisions of its service,
// endpoint, context and count keys with those it validated against, so of two
// conflicting registrations made at once on two replicas exactly one commits; the other
// re-reads and is refused with the conflict. Every registration changes the count key,
// so registrations made at once retry until each has validated against the latest count.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/internal/pause"
)

// DefaultKeyPrefix is the key prefix when none is configured.
const DefaultKeyPrefix = "/mooncake-conductor/"

// DefaultDialTimeout bounds connecting to etcd and each registry request.
const DefaultDialTimeout = 2 * time.Second

// DefaultMemberTTL is the lease time of a member key: a replica that stops renewing it
// (killed, cut off) drops out of the member list after about this long.
const DefaultMemberTTL = 10 * time.Second

// A write's read-validate-commit round is repeated when another write touched the same
// keys in between (every registration touches the count key), until the request's
// deadline (DialTimeout); between rounds it waits a random pause of up to
// min(round, maxRetryPauseSteps) × retryPauseStep, so that writers that collided do not
// collide again in step.
const (
	retryPauseStep     = time.Millisecond
	maxRetryPauseSteps = 8
)

// Config configures the registry (the "cluster" config key).
type Config struct {
	// Endpoints are the etcd client URLs ("etcd_endpoints").
	Endpoints []string
	// KeyPrefix is the root of every key ("key_prefix", default DefaultKeyPrefix; a
	// missing trailing "/" is added).
	KeyPrefix string
	// AdvertiseURL is this replica's URL for peers ("advertise_url"); "" publishes no
	// member key.
	AdvertiseURL string
	// DialTimeout bounds connecting and each request ("dial_timeout_ms", 0: default).
	DialTimeout time.Duration
	// MemberTTL is the member key's lease time (0: DefaultMemberTTL).
	MemberTTL time.Duration
	// MaxServices caps the services the registry holds, checked in each registration's
	// transaction against the count key (0: no cap). A replica sets it to its
	// max_services less its static services, so that every replica can apply every
	// registration the registry accepts.
	MaxServices int
	// ResetCheckInterval is how often Sync reads the cluster key to find out whether
	// etcd lost the registry (0: DefaultResetCheckInterval).
	ResetCheckInterval time.Duration
	// Logger receives watch and member-key events (nil: slog.Default()).
	Logger *slog.Logger
	// BeforeCommit, in tests, runs between a write's read-and-validate and its commit
	// (attempt counts from 0), so that tests can interleave two writes exactly.
	BeforeCommit func(id string, attempt int)
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if !strings.HasSuffix(c.KeyPrefix, "/") {
		c.KeyPrefix += "/"
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MemberTTL <= 0 {
		c.MemberTTL = DefaultMemberTTL
	}
	if c.ResetCheckInterval <= 0 {
		c.ResetCheckInterval = DefaultResetCheckInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Record is one registration as the registry stores it. Profile and Value are canonical
// JSON: two records are the same registration exactly when their bytes are equal.
type Record struct {
	// ID identifies the service (unique, any text).
	ID string `json:"id"`
	// Endpoint is the publisher endpoint; at most one service uses it.
	Endpoint string `json:"endpoint"`
	// Context names the index context; every service in it has the same Profile.
	Context string `json:"context"`
	// Profile is the context's hash profile.
	Profile json.RawMessage `json:"profile"`
	// Value is the whole registration.
	Value json.RawMessage `json:"value"`
}

func (r *Record) same(o *Record) bool {
	return r.ID == o.ID && r.Endpoint == o.Endpoint && r.Context == o.Context &&
		bytes.Equal(r.Profile, o.Profile) && bytes.Equal(r.Value, o.Value)
}

// ConflictKind says which rule a refused registration broke.
type ConflictKind int

// The conflict rules.
const (
	// ConflictService: the service is registered with another configuration.
	ConflictService ConflictKind = iota + 1
	// ConflictEndpoint: another service uses the endpoint.
	ConflictEndpoint
	// ConflictProfile: the context has another hash profile.
	ConflictProfile
	// ConflictLimit: the registry holds MaxServices services already.
	ConflictLimit
)

// ConflictError is a registration refused by the registry's rules (a client error, unlike
// an unreachable etcd).
type ConflictError struct {
	Kind ConflictKind
	// Other is the conflicting service's id (ConflictEndpoint).
	Other string
	// Endpoint is the contested endpoint (ConflictEndpoint).
	Endpoint string
	// Limit is the cap that was reached (ConflictLimit).
	Limit int
}

// Error says what the registration conflicts with, by Kind.
func (e *ConflictError) Error() string {
	switch e.Kind {
	case ConflictService:
		return "conflicting registration for this service key in the cluster registry"
	case ConflictEndpoint:
		return fmt.Sprintf("endpoint %s is already used by service %s", e.Endpoint, e.Other)
	case ConflictLimit:
		return fmt.Sprintf("too many services: the cluster registry holds its limit of %d", e.Limit)
	default:
		return "registration conflicts with the ContextKey hash profile"
	}
}

// Registry is a connection to the etcd registry.
type Registry struct {
	cli *clientv3.Client
	cfg Config
	log *slog.Logger
	// resets counts the registry resets Sync detected.
	resets atomic.Uint64
	// info is the cluster key as last read (nil before Sync read it).
	info atomic.Pointer[ClusterInfo]
}

// Open connects to etcd. It does not wait for etcd to answer: an unreachable etcd makes
// each request fail after DialTimeout, and the client reconnects by itself.
func Open(cfg Config) (*Registry, error) {
	cfg = cfg.WithDefaults()
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster: etcd_endpoints is empty")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: cfg.DialTimeout,
		Logger: nopZap()})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client for %v: %w", cfg.Endpoints, err)
	}
	return &Registry{cli: cli, cfg: cfg, log: cfg.Logger}, nil
}

// Close closes the etcd client (watches and the member lease end with it; the member key
// expires after its TTL).
func (r *Registry) Close() error { return r.cli.Close() }

// Config returns the configuration with defaults applied.
func (r *Registry) Config() Config { return r.cfg }

// Client is the underlying etcd client.
func (r *Registry) Client() *clientv3.Client { return r.cli }

func esc(s string) string { return url.PathEscape(s) }

func (r *Registry) servicesPrefix() string      { return r.cfg.KeyPrefix + "services/" }
func (r *Registry) serviceKey(id string) string { return r.servicesPrefix() + esc(id) }
func (r *Registry) endpointKey(ep string) string {
	return r.cfg.KeyPrefix + "endpoints/" + esc(ep)
}
func (r *Registry) contextKey(c string) string { return r.cfg.KeyPrefix + "contexts/" + esc(c) }
func (r *Registry) membersPrefix() string      { return r.cfg.KeyPrefix + "members/" }
func (r *Registry) countKey() string           { return r.cfg.KeyPrefix + "count" }
func (r *Registry) clusterKey() string         { return r.cfg.KeyPrefix + "cluster" }

type contextValue struct {
	Profile  json.RawMessage `json:"profile"`
	Services int             `json:"services"`
}

func (r *Registry) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.DialTimeout)
}

// read returns the service, endpoint, context and count keys of a write at one revision
// (nil when absent), and how many service keys there are (the count key's value, or,
// when a registry written before the count key existed has none, the keys counted).
func (r *Registry) read(ctx context.Context, svcKey, epKey, ctxKey string) (svc, ep, cx, cnt *kv, services int, err error) {
	resp, err := r.cli.Txn(ctx).Then(clientv3.OpGet(svcKey), clientv3.OpGet(epKey), clientv3.OpGet(ctxKey),
		clientv3.OpGet(r.countKey()), clientv3.OpGet(r.servicesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return nil, nil, nil, nil, 0, err
	}
	one := func(i int) *kv {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil
		}
		return &kv{value: kvs[0].Value, mod: kvs[0].ModRevision}
	}
	cnt = one(3)
	if cnt == nil {
		return one(0), one(1), one(2), nil, int(resp.Responses[4].GetResponseRange().Count), nil
	}
	n, perr := strconv.Atoi(string(cnt.value))
	if perr != nil || n < 0 {
		return nil, nil, nil, nil, 0, fmt.Errorf("count key %s is corrupt: %q", r.countKey(), cnt.value)
	}
	return one(0), one(1), one(2), cnt, n, nil
}

// retryPause waits before another round of a write that collided (false: ctx ended).
func retryPause(ctx context.Context, attempt int) bool {
	steps := min(attempt+1, maxRetryPauseSteps)
	return pause.For(ctx, time.Duration(rand.Int64N(int64(steps)*int64(retryPauseStep))))
}

type kv struct {
	value []byte
	mod   int64
}

func (k *kv) modRev() int64 {
	if k == nil {
		return 0
	}
	return k.mod
}

// Put registers rec under the cluster rules and returns the revision at which the registry
// holds it. An identical record already registered succeeds with existed true. A broken
// rule (MaxServices reached included) is a *ConflictError; any other error means etcd
// did not answer in time (the record may or may not have been committed when the error
// is a timeout: the watch reports it either way).
func (r *Registry) Put(ctx context.Context, rec *Record) (rev int64, existed bool, err error) {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	val, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("cluster: encode record %s: %w", rec.ID, err)
	}
	sk, ek, ck := r.serviceKey(rec.ID), r.endpointKey(rec.Endpoint), r.contextKey(rec.Context)
	for attempt := 0; ; attempt++ {
		svc, ep, cx, cnt, services, err := r.read(ctx, sk, ek, ck)
		if err != nil {
			return 0, false, fmt.Errorf("cluster: read registry: %w", err)
		}
		if svc != nil {
			var cur Record
			if err := json.Unmarshal(svc.value, &cur); err == nil && cur.same(rec) {
				return svc.mod, true, nil
			}
			return 0, false, &ConflictError{Kind: ConflictService}
		}
		if ep != nil && string(ep.value) != rec.ID {
			return 0, false, &ConflictError{Kind: ConflictEndpoint, Other: string(ep.value), Endpoint: rec.Endpoint}
		}
		n := 0
		if cx != nil {
			var cv contextValue
			if err := json.Unmarshal(cx.value, &cv); err != nil {
				return 0, false, fmt.Errorf("cluster: context key %s is corrupt: %w", ck, err)
			}
			if !bytes.Equal(cv.Profile, rec.Profile) {
				return 0, false, &ConflictError{Kind: ConflictProfile}
			}
			n = cv.Services
		}
		if r.cfg.MaxServices > 0 && services >= r.cfg.MaxServices {
			return 0, false, &ConflictError{Kind: ConflictLimit, Limit: r.cfg.MaxServices}
		}
		cval, err := json.Marshal(contextValue{Profile: rec.Profile, Services: n + 1})
		if err != nil {
			return 0, false, err
		}
		if r.cfg.BeforeCommit != nil {
			r.cfg.BeforeCommit(rec.ID, attempt)
		}
		resp, err := r.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(sk), "=", 0),
			clientv3.Compare(clientv3.ModRevision(ek), "=", ep.modRev()),
			clientv3.Compare(clientv3.ModRevision(ck), "=", cx.modRev()),
			clientv3.Compare(clientv3.ModRevision(r.countKey()), "=", cnt.modRev()),
		).Then(
			clientv3.OpPut(sk, string(val)), clientv3.OpPut(ek, rec.ID), clientv3.OpPut(ck, string(cval)),
			clientv3.OpPut(r.countKey(), strconv.Itoa(services+1)),
		).Commit()
		if err != nil {
			return 0, false, fmt.Errorf("cluster: commit registration %s: %w", rec.ID, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, false, nil
		}
		// Another write changed one of the keys since the read: validate again.
		if !retryPause(ctx, attempt) {
			return 0, false, fmt.Errorf("cluster: registration %s kept racing other writes (%d attempts): %w", rec.ID, attempt+1, ctx.Err())
		}
	}
}

// Delete unregisters the service id and returns the revision of the deletion; found is
// false (and rev the current revision) when the registry does not hold it.
func (r *Registry) Delete(ctx context.Context, id string) (rev int64, found bool, err error) {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	sk := r.serviceKey(id)
	for attempt := 0; ; attempt++ {
		g, err := r.cli.Get(ctx, sk)
		if err != nil {
			return 0, false, fmt.Errorf("cluster: read registry: %w", err)
		}
		if len(g.Kvs) == 0 {
			return g.Header.Revision, false, nil
		}
		var rec Record
		if err := json.Unmarshal(g.Kvs[0].Value, &rec); err != nil {
			return 0, false, fmt.Errorf("cluster: service key %s is corrupt: %w", sk, err)
		}
		ek, ck := r.endpointKey(rec.Endpoint), r.contextKey(rec.Context)
		svc, ep, cx, cnt, services, err := r.read(ctx, sk, ek, ck)
		if err != nil {
			return 0, false, fmt.Errorf("cluster: read registry: %w", err)
		}
		if svc == nil || svc.mod != g.Kvs[0].ModRevision {
			continue
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(sk), "=", svc.mod),
			clientv3.Compare(clientv3.ModRevision(ek), "=", ep.modRev()),
			clientv3.Compare(clientv3.ModRevision(ck), "=", cx.modRev()),
			clientv3.Compare(clientv3.ModRevision(r.countKey()), "=", cnt.modRev()),
		}
		ops := []clientv3.Op{clientv3.OpDelete(sk), clientv3.OpPut(r.countKey(), strconv.Itoa(max(services-1, 0)))}
		if ep != nil && string(ep.value) == id {
			ops = append(ops, clientv3.OpDelete(ek))
		}
		if cx != nil {
			op, err := unpinOp(ck, cx)
			if err != nil {
				return 0, false, err
			}
			ops = append(ops, op)
		}
		if r.cfg.BeforeCommit != nil {
			r.cfg.BeforeCommit(id, attempt)
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return 0, false, fmt.Errorf("cluster: commit unregistration %s: %w", id, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, true, nil
		}
		if !retryPause(ctx, attempt) {
			return 0, false, fmt.Errorf("cluster: unregistration %s kept racing other writes (%d attempts): %w", id, attempt+1, ctx.Err())
		}
	}
}

// List returns every registered record and the revision of the read.
func (r *Registry) List(ctx context.Context) (rev int64, recs []Record, err error) {
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	g, err := r.cli.Get(ctx, r.servicesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return 0, nil, fmt.Errorf("cluster: list registry: %w", err)
	}
	for _, kv := range g.Kvs {
		var rec Record
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			r.log.Error("cluster: corrupt service key skipped", "key", string(kv.Key), "err", err)
			continue
		}
		recs = append(recs, rec)
	}
	return g.Header.Revision, recs, nil
}

// idOfKey returns the service id of a service key.
func (r *Registry) idOfKey(key []byte) (string, error) {
	s, ok := strings.CutPrefix(string(key), r.servicesPrefix())
	if !ok {
		return "", fmt.Errorf("key %q is not a service key", key)
	}
	return url.PathUnescape(s)
}

// Replace changes the record of a registered service in place (the adapters of a
// multi-LoRA engine come and go while its subscription stays): prev is the record the
// caller registered, which the registry must still hold, and rec keeps its ID and
// endpoint. The context pin moves from prev's context to rec's when they differ (rec's
// profile must match a pinned one). A broken rule is a *ConflictError: ConflictService
// when the registry holds something else than prev (another write came first).
func (r *Registry) Replace(ctx context.Context, prev, rec *Record) (rev int64, err error) {
	if prev.ID != rec.ID || prev.Endpoint != rec.Endpoint {
		return 0, fmt.Errorf("cluster: replace %s: the id and endpoint must stay", prev.ID)
	}
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	val, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("cluster: encode record %s: %w", rec.ID, err)
	}
	sk, ek := r.serviceKey(rec.ID), r.endpointKey(rec.Endpoint)
	oldCK, newCK := r.contextKey(prev.Context), r.contextKey(rec.Context)
	for attempt := 0; ; attempt++ {
		svc, ep, oldCX, _, _, err := r.read(ctx, sk, ek, oldCK)
		if err != nil {
			return 0, fmt.Errorf("cluster: read registry: %w", err)
		}
		var cur Record
		if svc == nil || json.Unmarshal(svc.value, &cur) != nil || !cur.same(prev) || ep == nil || string(ep.value) != rec.ID {
			return 0, &ConflictError{Kind: ConflictService}
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(sk), "=", svc.mod),
			clientv3.Compare(clientv3.ModRevision(ek), "=", ep.mod),
			clientv3.Compare(clientv3.ModRevision(oldCK), "=", oldCX.modRev()),
		}
		ops := []clientv3.Op{clientv3.OpPut(sk, string(val))}
		if newCK != oldCK {
			_, _, newCX, _, _, err := r.read(ctx, sk, ek, newCK)
			if err != nil {
				return 0, fmt.Errorf("cluster: read registry: %w", err)
			}
			ctxOps, err := r.moveContextPin(oldCK, oldCX, newCK, newCX, rec.Profile)
			if err != nil {
				return 0, err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(newCK), "=", newCX.modRev()))
			ops = append(ops, ctxOps...)
		}
		if r.cfg.BeforeCommit != nil {
			r.cfg.BeforeCommit(rec.ID, attempt)
		}
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return 0, fmt.Errorf("cluster: commit replacement %s: %w", rec.ID, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		// Another write changed one of the keys since the read: validate again.
		if !retryPause(ctx, attempt) {
			return 0, fmt.Errorf("cluster: replacement %s kept racing other writes (%d attempts): %w", rec.ID, attempt+1, ctx.Err())
		}
	}
}

// unpinOp returns the operation that takes one service off context key ck (read as cx):
// the key goes with its last service, else its count drops by one.
func unpinOp(ck string, cx *kv) (clientv3.Op, error) {
	var cv contextValue
	if err := json.Unmarshal(cx.value, &cv); err != nil {
		return clientv3.Op{}, fmt.Errorf("cluster: context key %s is corrupt: %w", ck, err)
	}
	if cv.Services <= 1 {
		return clientv3.OpDelete(ck), nil
	}
	cv.Services--
	b, err := json.Marshal(cv)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(ck, string(b)), nil
}

// moveContextPin returns the operations that move one service from the context key
// oldCK to newCK (profile prof), refusing a newCK pinned to another profile.
func (r *Registry) moveContextPin(oldCK string, oldCX *kv, newCK string, newCX *kv, prof json.RawMessage) ([]clientv3.Op, error) {
	var ops []clientv3.Op
	if oldCX != nil {
		op, err := unpinOp(oldCK, oldCX)
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	n := 0
	if newCX != nil {
		var cv contextValue
		if err := json.Unmarshal(newCX.value, &cv); err != nil {
			return nil, fmt.Errorf("cluster: context key %s is corrupt: %w", newCK, err)
		}
		if !bytes.Equal(cv.Profile, prof) {
			return nil, &ConflictError{Kind: ConflictProfile}
		}
		n = cv.Services
	}
	b, err := json.Marshal(contextValue{Profile: prof, Services: n + 1})
	if err != nil {
		return nil, err
	}
	return append(ops, clientv3.OpPut(newCK, string(b))), nil
}
