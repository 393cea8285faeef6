// Package replicas measures replica clusters of spawned conductors on a real etcd
// (cluster/etcdtest) in the scenes where replicas used to disagree: registrations racing
// for the last max_services slots on several replicas at once (Race), and etcd restored
// with an empty data directory under running replicas (EtcdReset). Each scene reports
// counts and verdicts: what was acknowledged, what etcd holds, what every replica lists.
package replicas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/conductor-go/conductor/internal/syncbuf"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/httpclient"
)

// replicaSet is one etcd member and the replicas on it.
type replicaSet struct {
	dir      string
	etcd     *etcdtest.Server
	cli      *clientv3.Client
	replicas []*replica
}

// replica is one spawned conductor in cluster mode.
type replica struct {
	name string
	c    *target.Conductor
	cl   *httpclient.Client
	log  *syncbuf.Buffer
}

// startReplicaSet starts etcd and n replicas of bin on it, one after the other, each
// ready before the next starts. config adds configuration keys to every replica's.
func startReplicaSet(ctx context.Context, bin string, n int, config map[string]any, progress io.Writer) (_ *replicaSet, err error) {
	if bin == "" {
		return nil, errors.New("replica scenes spawn their conductors: a binary is needed (--conductor-bin)")
	}
	dir, err := os.MkdirTemp("", "conductor-bench-etcd-")
	if err != nil {
		return nil, err
	}
	s := &replicaSet{dir: dir}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.etcd, err = etcdtest.Launch(dir); err != nil {
		return nil, err
	}
	if s.cli, err = s.etcd.NewClient(); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		conf := map[string]any{
			"http_bind_address":  "127.0.0.1",
			"query_memo_entries": 0, // nothing is queried: no memory for the memo
			"cluster":            map[string]any{"etcd_endpoints": s.etcd.Endpoints(), "dial_timeout_ms": 10000},
		}
		for k, v := range config {
			conf[k] = v
		}
		r := &replica{name: fmt.Sprintf("replica %d", i+1), log: &syncbuf.Buffer{}}
		if r.c, err = target.SpawnWith(bin, r.log, target.SpawnOptions{Config: conf}); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", r.name, err, r.log.String())
		}
		s.replicas = append(s.replicas, r)
		if r.cl, err = httpclient.New(r.c.Addr, httpclient.Options{Timeout: 30 * time.Second}); err != nil {
			return nil, err
		}
		if err = target.WaitReady(ctx, r.c.Addr, 60*time.Second); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", r.name, err, r.log.String())
		}
	}
	progressf(progress, "etcd at %s, %d replicas ready", s.etcd.Endpoint(), n)
	return s, nil
}

// close stops the replicas, then etcd, and removes etcd's directory.
func (s *replicaSet) close() {
	for _, r := range s.replicas {
		if r.cl != nil {
			r.cl.Close()
		}
		r.c.Stop()
	}
	if s.cli != nil {
		_ = s.cli.Close()
	}
	if s.etcd != nil {
		s.etcd.Stop()
	}
	_ = os.RemoveAll(s.dir)
}

// registryIDs lists the instance ids of the services etcd holds, sorted.
func (s *replicaSet) registryIDs(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	prefix := cluster.DefaultKeyPrefix + "services/"
	g, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list the registry: %w", err)
	}
	out := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		// The key's last segment is the path-escaped "instance|tenant|rank".
		id, err := url.PathUnescape(strings.TrimPrefix(string(kv.Key), prefix))
		if err != nil {
			return nil, fmt.Errorf("registry key %q: %w", kv.Key, err)
		}
		inst, _, _ := strings.Cut(id, "|")
		out = append(out, inst)
	}
	sort.Strings(out)
	return out, nil
}

// serviceIDs lists the instance ids r serves, sorted.
func (r *replica) serviceIDs() ([]string, error) {
	l, err := r.cl.Services()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.name, err)
	}
	out := make([]string, 0, len(l.Services))
	for _, svc := range l.Services {
		out = append(out, svc.InstanceID)
	}
	sort.Strings(out)
	return out, nil
}

// everyReplicaLists reports whether every replica lists exactly want (sorted), and
// what each lists.
func (s *replicaSet) everyReplicaLists(want []string) (bool, [][]string, error) {
	lists := make([][]string, len(s.replicas))
	same := true
	for i, r := range s.replicas {
		ids, err := r.serviceIDs()
		if err != nil {
			return false, nil, err
		}
		lists[i] = ids
		same = same && slices.Equal(ids, want)
	}
	return same, lists, nil
}

// poll calls cond until it reports true, an error, or limit passes (then false).
func poll(ctx context.Context, limit time.Duration, cond func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for {
		ok, err := cond()
		if ok || err != nil {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if err := target.Sleep(ctx, pause); err != nil {
			return false, err
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// linesWith counts the lines of log containing s.
func linesWith(log *syncbuf.Buffer, s string) int {
	n := 0
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
