package source

// Mooncake Store master leader discovery.
//
// In HA mode several Mooncake masters elect a leader through etcd: the winner creates the
// key "mooncake-store/<cluster_id>/master_view" (cluster_id from the master's
// MC_STORE_CLUSTER_ID, default "mooncake") in a transaction that succeeds only while the
// key does not exist, bound to a lease the leader keeps alive. The value is the leader's
// address "host:port" exactly as given to the master (its RPC address; no JSON, no
// version inside). The view version Mooncake reports is the key's create revision: every
// new term creates the key afresh, so a new version always follows a deletion (the old
// leader's lease expired or was revoked). Read from kvcache-ai/Mooncake
// mooncake-store/src/ha_helper.cpp (MasterViewHelper: key, ElectLeader, GetMasterView)
// and mooncake-common/etcd/etcd_wrapper.go (EtcdStoreGetWrapper returns the create
// revision as the version; EtcdStoreCreateWithLeaseWrapper is the create-if-absent txn).
//
// A conductor registration names the leader's event stream through a locator:
//
//	etcd://<host:port>[,<host:port>...]/<cluster_id>?event_port=<port>
//
// The conductor reads and watches the key on those etcd endpoints with a client of its
// own (independent of the "cluster" config) and subscribes to tcp://<leader host>:<port>.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/conductor-go/conductor/internal/pause"
)

// MasterLocatorScheme prefixes a Mooncake master locator endpoint.
const MasterLocatorScheme = "etcd://"

// MasterViewKeyPrefix is the root of Mooncake's HA keys.
const MasterViewKeyPrefix = "mooncake-store/"

// MasterLocator is a parsed Mooncake master locator.
type MasterLocator struct {
	// Etcd is the list of etcd client addresses (host:port), in the locator's order.
	Etcd []string
	// ClusterID is the Mooncake cluster id (MC_STORE_CLUSTER_ID of the masters).
	ClusterID string
	// EventPort is the TCP port every master binds its KV-event PUB socket on.
	EventPort int
}

// IsMasterLocator reports whether an endpoint is written as a master locator (whether or
// not it is a valid one).
func IsMasterLocator(endpoint string) bool { return strings.HasPrefix(endpoint, MasterLocatorScheme) }

// ParseMasterLocator parses and strictly validates a locator. The error says what is
// wrong, for a 400 answer.
func ParseMasterLocator(s string) (MasterLocator, error) {
	var loc MasterLocator
	if !IsMasterLocator(s) {
		return loc, fmt.Errorf("must start with %s", MasterLocatorScheme)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= 0x20 || c >= 0x7f {
			return loc, fmt.Errorf("must be printable ASCII without spaces (0x%02x at byte %d)", c, i)
		}
	}
	rest := s[len(MasterLocatorScheme):]
	if strings.ContainsAny(rest, "#@%") {
		return loc, errors.New("must not contain '#', '@' or '%'")
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	hosts, path, hasPath := strings.Cut(rest, "/")
	if hosts == "" {
		return loc, errors.New("names no etcd host:port")
	}
	seen := map[string]bool{}
	for _, h := range strings.Split(hosts, ",") {
		if err := checkHostPort(h); err != nil {
			return loc, fmt.Errorf("etcd address %q: %v", h, err)
		}
		if seen[h] {
			return loc, fmt.Errorf("etcd address %q is listed twice", h)
		}
		seen[h] = true
		loc.Etcd = append(loc.Etcd, h)
	}
	if !hasPath || path == "" {
		return loc, errors.New("names no cluster id: write etcd://host:port/<cluster_id>?event_port=N (Mooncake's default cluster id is \"mooncake\")")
	}
	for _, seg := range strings.Split(path, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return loc, fmt.Errorf("cluster id %q has an empty, \".\" or \"..\" path segment", path)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				return loc, fmt.Errorf("cluster id %q: only letters, digits, '-', '_', '.' and '/' between segments are allowed", path)
			}
		}
	}
	loc.ClusterID = path
	if !hasQuery || query == "" {
		return loc, errors.New("needs ?event_port=N, the port of the masters' KV-event PUB socket")
	}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "event_port":
			if loc.EventPort != 0 {
				return loc, errors.New("event_port is given twice")
			}
			p, err := parsePort(v)
			if err != nil {
				return loc, fmt.Errorf("event_port %q: %v", v, err)
			}
			loc.EventPort = p
		default:
			return loc, fmt.Errorf("unknown parameter %q (only event_port is defined)", k)
		}
	}
	return loc, nil
}

func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return errors.New("must be host:port")
	}
	if host == "" {
		return errors.New("has an empty host")
	}
	if _, err := parsePort(port); err != nil {
		return err
	}
	return nil
}

// parsePort accepts decimal 1..65535 without sign or leading zeros.
func parsePort(v string) (int, error) {
	if v == "" || len(v) > 5 || (v[0] == '0') {
		return 0, errors.New("must be a port number 1..65535")
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, errors.New("must be a port number 1..65535")
		}
	}
	p, _ := strconv.Atoi(v)
	if p < 1 || p > 65535 {
		return 0, errors.New("must be a port number 1..65535")
	}
	return p, nil
}

// Key is the etcd key holding the master view.
func (l *MasterLocator) Key() string { return MasterViewKeyPrefix + l.ClusterID + "/master_view" }

// EtcdURLs are the etcd client URLs of the locator.
func (l *MasterLocator) EtcdURLs() []string {
	out := make([]string, len(l.Etcd))
	for i, h := range l.Etcd {
		out[i] = "http://" + h
	}
	return out
}

// EventEndpoint is the ZMQ endpoint of the leader's KV-event stream: the host of the
// master view's "host:port" value with the locator's event port. A value that is not
// host:port, or whose host is unspecified (0.0.0.0, ::: a master started with its default
// local_hostname publishes it), cannot be connected to and is an error.
func (l *MasterLocator) EventEndpoint(leader string) (string, error) {
	for i := 0; i < len(leader); i++ {
		if c := leader[i]; c <= 0x20 || c >= 0x7f {
			return "", fmt.Errorf("master view %q is not a printable host:port", leader)
		}
	}
	host, _, err := net.SplitHostPort(leader)
	if err != nil || host == "" {
		return "", fmt.Errorf("master view %q is not host:port", leader)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "", fmt.Errorf("master view %q names an unspecified address (set the masters' local_hostname to a reachable address)", leader)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(l.EventPort)), nil
}

// MasterView is one state of the master view key.
type MasterView struct {
	// Present: the key exists (a leader is elected).
	Present bool
	// Leader is the key's value, the leader's "host:port".
	Leader string
	// Version is the key's create revision: Mooncake's view version id.
	Version int64
}

// DefaultMasterViewDialTimeout bounds connecting to a master locator's etcd and each read.
const DefaultMasterViewDialTimeout = 2 * time.Second

// MasterViewConfig configures a MasterViewWatcher.
type MasterViewConfig struct {
	Locator MasterLocator
	// DialTimeout bounds connecting and each read (0: DefaultMasterViewDialTimeout).
	DialTimeout time.Duration
	// RetryDelay is the pause after a failed read or a broken watch (0: one second).
	RetryDelay time.Duration
	Logger     *slog.Logger
}

// MasterViewWatcher follows the master view key and reports each change, in order, to
// its callback (one call at a time, on the watcher's goroutine): the current state once
// it is first read, then every state that differs from the last one reported. While etcd
// cannot be reached it retries; the last reported state stands meanwhile.
type MasterViewWatcher struct {
	cfg    MasterViewConfig
	cli    *clientv3.Client
	fn     func(MasterView)
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	last     MasterView
	reported bool
}

// WatchMasterView starts following the locator's master view key. It fails only when the
// etcd client cannot be created; etcd being down is not an error (reads are retried).
func WatchMasterView(cfg MasterViewConfig, fn func(MasterView)) (*MasterViewWatcher, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultMasterViewDialTimeout
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Locator.EtcdURLs(), DialTimeout: cfg.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for master view %s: %w", cfg.Locator.Key(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &MasterViewWatcher{cfg: cfg, cli: cli, fn: fn, log: log.With("master_view_key", cfg.Locator.Key()),
		cancel: cancel, done: make(chan struct{})}
	go w.run(ctx)
	return w, nil
}

// Close stops the watcher and waits until its callback has returned for the last time.
func (w *MasterViewWatcher) Close() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		_ = w.cli.Close()
	})
}

func (w *MasterViewWatcher) report(v MasterView) {
	if w.reported && v == w.last {
		return
	}
	w.reported, w.last = true, v
	w.fn(v)
}

func (w *MasterViewWatcher) run(ctx context.Context) {
	defer close(w.done)
	key := w.cfg.Locator.Key()
	failures := 0
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.DialTimeout)
		resp, err := w.cli.Get(rctx, key)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 || failures%60 == 0 {
				w.log.Warn("cannot read the Mooncake master view from etcd; retrying", "etcd", w.cfg.Locator.Etcd, "err", err, "failures", failures)
			}
			if !pause.For(ctx, w.cfg.RetryDelay) {
				return
			}
			continue
		}
		if failures > 0 {
			w.log.Info("Mooncake master view readable again", "after_failures", failures)
			failures = 0
		}
		v := MasterView{}
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			v = MasterView{Present: true, Leader: string(kv.Value), Version: kv.CreateRevision}
		}
		w.report(v)
		if !w.watch(ctx, key, resp.Header.Revision+1) {
			return
		}
	}
}

// watch follows the key from rev on; it returns false when the watcher is closed, true
// when the watch broke (compaction, etcd restart) and the key must be read again.
func (w *MasterViewWatcher) watch(ctx context.Context, key string, rev int64) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range w.cli.Watch(wctx, key, clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			if ctx.Err() != nil {
				return false
			}
			w.log.Warn("Mooncake master view watch broken; reading the key again", "err", err)
			return pause.For(ctx, w.cfg.RetryDelay)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				w.report(MasterView{})
				continue
			}
			w.report(MasterView{Present: true, Leader: string(ev.Kv.Value), Version: ev.Kv.CreateRevision})
		}
	}
	if ctx.Err() != nil {
		return false
	}
	return pause.For(ctx, w.cfg.RetryDelay)
}
