package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
)

// replica is one real mooncake_conductor binary in cluster mode.
type replica struct {
	t      *testing.T
	name   string
	c      *conductor
	port   int
	base   string
	config string
	cl     *httpclient.Client
}

// writeReplicaConfig writes the config of a replica on port whose registry is etcd.
func writeReplicaConfig(t *testing.T, etcd *etcdtest.Server, port int, dialMS int) string {
	t.Helper()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	return writeJSON(t, t.TempDir(), map[string]any{
		"http_server_port": port, "rpc_server_port": 0,
		"cluster": map[string]any{"etcd_endpoints": etcd.Endpoints(), "advertise_url": base, "dial_timeout_ms": dialMS},
	})
}

// startReplica starts a replica with config on port (not waiting for readiness).
func startReplica(t *testing.T, name, config string, port int) *replica {
	t.Helper()
	r := &replica{t: t, name: name, port: port, base: "http://127.0.0.1:" + strconv.Itoa(port), config: config}
	r.c = startConductor(t, config)
	cl, err := httpclient.New(r.base, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.cl = cl
	t.Cleanup(cl.Close)
	return r
}

// startReplicas starts n replicas on one etcd and waits until all are ready.
func startReplicas(t *testing.T, etcd *etcdtest.Server, n int) []*replica {
	t.Helper()
	return startReplicasDialing(t, etcd, n, 2000)
}

// startReplicasDialing is startReplicas with etcd dial timeout dialMS.
func startReplicasDialing(t *testing.T, etcd *etcdtest.Server, n, dialMS int) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	for i := range rs {
		port := freePort(t)
		rs[i] = startReplica(t, fmt.Sprintf("replica-%d", i+1), writeReplicaConfig(t, etcd, port, dialMS), port)
		// One after the other: each is ready (bootstrapped) before the next starts.
		rs[i].waitReady(30 * time.Second)
	}
	return rs
}

// ready reports whether GET /readyz answers 200.
func (r *replica) ready() bool {
	resp, err := http.Get(r.base + "/readyz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady polls /readyz until 200, failing when the process exits or the limit passes.
func (r *replica) waitReady(limit time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(limit)
	for !r.ready() {
		select {
		case <-r.c.exited:
			r.t.Fatalf("%s exited before ready: %v\n%s", r.name, r.c.err, r.c.out.String())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s not ready after %v:\n%s", r.name, limit, r.c.out.String())
		}
		time.Sleep(10 * time.Millisecond) // paces the polling
	}
}

// kill9 kills the process with SIGKILL and waits for it to exit.
func (r *replica) kill9() {
	r.t.Helper()
	if err := r.c.cmd.Process.Kill(); err != nil {
		r.t.Fatal(err)
	}
	r.c.waitExit(exitWait)
}

// postRaw posts a msgpack body and returns the status and the raw response body.
func postRaw(base, path string, body []byte) (int, []byte, error) {
	resp, err := http.Post(base+path, "application/msgpack", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// canonical turns a msgpack /query answer into JSON with sorted map keys, so that two
// answers with the same content compare equal byte for byte whatever order each server
// wrote its map entries in.
func canonical(t *testing.T, raw []byte) string {
	t.Helper()
	v, rest, err := msgp.ReadIntfBytes(raw)
	if err != nil || len(rest) != 0 {
		t.Fatalf("answer %x is not one msgpack value: %v", raw, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// answer is the canonical /query answer of r for body.
func (r *replica) answer(body []byte) string {
	r.t.Helper()
	code, raw, err := postRaw(r.base, "/query", body)
	if err != nil || code != http.StatusOK {
		r.t.Fatalf("%s /query: %d %v %s", r.name, code, err, raw)
	}
	return canonical(r.t, raw)
}

// serviceIDs lists the instance ids (with dp rank) registered on r, sorted.
func (r *replica) serviceIDs() []string {
	r.t.Helper()
	l, err := r.cl.Services()
	if err != nil {
		r.t.Fatalf("%s /services: %v", r.name, err)
	}
	out := make([]string, 0, len(l.Services))
	for _, s := range l.Services {
		out = append(out, fmt.Sprintf("%s/%d@%s", s.InstanceID, s.DPRank, s.Endpoint))
	}
	sort.Strings(out)
	return out
}

// waitFor polls cond until it holds, failing with what() after limit.
func waitFor(t *testing.T, limit time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, what())
		}
		time.Sleep(pause) // paces the polling
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// waitSameServices waits until every replica lists exactly want.
func waitSameServices(t *testing.T, rs []*replica, want []string) {
	t.Helper()
	var got [][]string
	waitFor(t, 15*time.Second, func() string { return fmt.Sprintf("services %v, want %v on every replica", got, want) }, func() bool {
		got = got[:0]
		same := true
		for _, r := range rs {
			ids := r.serviceIDs()
			got = append(got, ids)
			same = same && strings.Join(ids, ",") == strings.Join(want, ",")
		}
		return same
	})
}

// newFleet builds a published vLLM fleet (one context, model "m", block size 16).
func newFleet(t *testing.T, instances int, device int, ring int) *sim.Fleet {
	t.Helper()
	f, err := sim.NewFleet(sim.FleetConfig{Instances: instances, DPRanks: 1, Kind: publisher.VLLM,
		Hash: sim.VLLMHash("sha256_cbor", "0"), Model: "m", BlockSize: 16, Cache: sim.CacheConfig{Device: device},
		Publish: true, Publisher: sim.PublisherConfig{BufferSteps: ring}, MaxBatchEvents: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// prompt is one simulated request: its tokens and block keys.
type prompt struct {
	tokens []int32
	keys   []uint64
	body   []byte // the /query request
}

// makePrompts makes n prompts of 2..blocks blocks; every third shares the first half of
// an earlier one, so that answers have partial matches.
func makePrompts(t *testing.T, f *sim.Fleet, rng *rand.Rand, n, blocks int) []prompt {
	t.Helper()
	out := make([]prompt, n)
	for i := range out {
		nb := 2 + rng.IntN(blocks-1)
		toks := make([]int32, 0, nb*16)
		if i%3 == 2 {
			prev := out[rng.IntN(i)].tokens
			toks = append(toks, prev[:len(prev)/32*16]...)
		}
		for len(toks) < nb*16 {
			toks = append(toks, int32(rng.IntN(100000)))
		}
		keys, err := f.Hasher().AppendKeys(nil, toks)
		if err != nil {
			t.Fatal(err)
		}
		body := httpclient.AppendQueryRequest(nil, &httpclient.QueryRequest{Model: "m", BlockSize: 16, TokenIDs: toks})
		out[i] = prompt{tokens: toks, keys: keys, body: body}
	}
	return out
}

// store lands prompt p on instance i's rank 0 (publishing its events).
func store(t *testing.T, f *sim.Fleet, i int, p *prompt) {
	t.Helper()
	if _, err := f.Rank(i, 0).Store(p.tokens, p.keys, sim.Now()); err != nil {
		t.Fatal(err)
	}
}

// markerSeq numbers the marker prompts of settle.
var markerSeq int32

// settle waits until every replica has applied everything instances published: each
// instance's rank stores a fresh one-block prompt (a real cached block, so the model
// holds it too), and every replica is polled until it shows each marker on its instance;
// a stream is applied in order, so everything published before is applied then.
//
// A subscriber learns of batches it missed (published after it read the replay ring,
// before its SUB socket had joined) only from the next batch, as with any ZMQ stream: a
// marker not seen within a second is followed by a newer one (as a live engine keeps
// publishing), whose arrival makes the replica recover the missed batches through
// replay; the pass over every replica then starts again, since the newer marker is a
// new cached block (it can evict) that replicas already checked may not have applied.
func settle(t *testing.T, f *sim.Fleet, rs []*replica, instances ...int) {
	t.Helper()
	markers := make([]prompt, len(instances))
	mark := func(k int) {
		markerSeq++
		toks := make([]int32, 16)
		for j := range toks {
			toks[j] = -1 - markerSeq // negative ids: never in a generated prompt
		}
		keys, err := f.Hasher().AppendKeys(nil, toks)
		if err != nil {
			t.Fatal(err)
		}
		markers[k] = prompt{tokens: toks, keys: keys}
		store(t, f, instances[k], &markers[k])
	}
	for k := range instances {
		mark(k)
	}
	var res httpclient.QueryResult
	deadline := time.Now().Add(30 * time.Second)
	for pass := 0; ; pass++ {
		nudged := false
		for _, r := range rs {
			for k, i := range instances {
				nudge := time.Now().Add(time.Second)
				pause := time.Millisecond
				for {
					if err := r.cl.Query(&httpclient.QueryRequest{Model: "m", BlockSize: 16, TokenIDs: markers[k].tokens}, &res); err != nil {
						t.Fatalf("%s: %v", r.name, err)
					}
					if h := res.Instance(f.InstanceID(i)); h != nil && h.Device == 16 {
						break
					}
					now := time.Now()
					if now.After(deadline) {
						t.Fatalf("%s: marker of %s not applied after %d passes: %+v\n%s", r.name, f.InstanceID(i), pass, res, r.c.out.String())
					}
					if now.After(nudge) {
						t.Logf("%s: marker of %s not applied after 1 s: %s publishes another", r.name, f.InstanceID(i), f.InstanceID(i))
						mark(k)
						nudged = true
						nudge = now.Add(time.Second)
					}
					time.Sleep(pause) // paces the polling
					pause = min(2*pause, 50*time.Millisecond)
				}
			}
		}
		if !nudged {
			return
		}
	}
}

// registerOnFirst registers f's services through rs[0], waits until every replica lists
// them and has applied what their instances published, and returns the services
// (instance/rank@endpoint, sorted).
func registerOnFirst(t *testing.T, f *sim.Fleet, rs []*replica) []string {
	t.Helper()
	if err := f.Register(rs[0].cl, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, reg := range f.Registrations() {
		want = append(want, fmt.Sprintf("%s/%d@%s", reg.InstanceID, reg.DPRank, reg.Endpoint))
	}
	sort.Strings(want)
	waitSameServices(t, rs, want)
	// Every replica subscribed and caught up before the engines publish in earnest: a
	// subscription that starts after its engine overran the replay ring misses what the
	// ring no longer holds, on a replica as on a single node.
	settle(t, f, rs, allInstances(f)...)
	return want
}

// sameAnswers requires every replica's /query answer for every prompt to equal rs[0]'s
// (stage names the check in failures) and returns how many prompts rs[0] answers with a
// hit.
func sameAnswers(t *testing.T, rs []*replica, ps []prompt, stage string) int {
	t.Helper()
	hits := 0
	for pi := range ps {
		a := rs[0].answer(ps[pi].body)
		for _, r := range rs[1:] {
			if b := r.answer(ps[pi].body); b != a {
				t.Fatalf("%s: prompt %d: %s answers %s, %s answers %s", stage, pi, rs[0].name, a, r.name, b)
			}
		}
		if strings.Contains(a, `"longest_matched":`) && !strings.Contains(a, `"longest_matched":0`) {
			hits++
		}
	}
	return hits
}

// checkModel compares r's answer for every prompt with what the simulated engines hold
// (the differential check): every rank's device count and the instance's longest match.
// Instances not in live must be absent from the answers.
func checkModel(t *testing.T, f *sim.Fleet, r *replica, ps []prompt, live []int) {
	t.Helper()
	var res httpclient.QueryResult
	var hits []*httpclient.InstanceHit
	bad := 0
	for pi := range ps {
		p := &ps[pi]
		if err := r.cl.Query(&httpclient.QueryRequest{Model: "m", BlockSize: 16, TokenIDs: p.tokens}, &res); err != nil {
			t.Fatalf("%s query: %v", r.name, err)
		}
		hits = f.Hits(hits, &res)
		for i, h := range hits {
			want := int64(f.Rank(i, 0).Match(p.keys).Device) * 16
			if !contains(live, i) {
				if h != nil {
					t.Fatalf("%s prompt %d: unregistered instance %s answered: %+v", r.name, pi, f.InstanceID(i), h)
				}
				continue
			}
			var got int64 = -1
			if h != nil {
				if rh := h.Rank(0); rh != nil {
					got = rh.Device
				}
			}
			if got != want || (h != nil && h.LongestMatched != want) {
				bad++
				if bad <= 10 {
					t.Errorf("%s prompt %d instance %s: conductor device %d (entry %+v), engine holds %d", r.name, pi, f.InstanceID(i), got, h, want)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d answers differ from the simulated engines", r.name, bad)
	}
}

// TestReplicasRegistryAgree: three real binaries on one etcd. Services registered on
// replica 1 are served by all three, whose /query answers are equal at quiescent points;
// an unregistration on replica 3 is gone everywhere; of two conflicting registrations
// sent to replicas 1 and 2 at once exactly one is acknowledged, and every replica ends
// with that one.
func TestReplicasRegistryAgree(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := startReplicas(t, etcd, 3)
	f := newFleet(t, 3, 4096, 0)
	want := registerOnFirst(t, f, rs)

	rng := rand.New(rand.NewPCG(1, 2))
	ps := makePrompts(t, f, rng, 30, 12)
	for i := range ps {
		store(t, f, i%3, &ps[i])
		if i%4 == 0 { // the same prompt on a second instance
			store(t, f, (i+1)%3, &ps[i])
		}
	}
	live := []int{0, 1, 2}
	compare := func(stage string) {
		t.Helper()
		settle(t, f, rs, live...)
		if sameAnswers(t, rs, ps, stage) == 0 {
			t.Fatalf("%s: no prompt has a hit: the comparison proves nothing", stage)
		}
		checkModel(t, f, rs[1], ps, live)
	}
	compare("after register on replica 1")

	// Unregister instance sim-1 on replica 3: gone from every replica's services and answers.
	if _, err := rs[2].cl.Unregister(&httpclient.UnregisterRequest{InstanceID: f.InstanceID(1), DPRank: 0}); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, w := range want {
		if !strings.HasPrefix(w, f.InstanceID(1)+"/") {
			left = append(left, w)
		}
	}
	waitSameServices(t, rs, left)
	for _, r := range rs {
		for pi := range ps {
			if a := r.answer(ps[pi].body); strings.Contains(a, `"`+f.InstanceID(1)+`"`) {
				t.Fatalf("%s still answers with the unregistered %s: %s", r.name, f.InstanceID(1), a)
			}
		}
	}
	live = []int{0, 2}
	// More events after the unregistration: answers still agree.
	for i := range ps[:10] {
		store(t, f, 2*(i%2), &ps[len(ps)-1-i])
	}
	compare("after unregister on replica 3")

	// Conflicting registrations sent to replicas 1 and 2 at once, several rounds and two
	// kinds of conflict: one endpoint for two instances, one service key with two endpoints.
	base := append([]string(nil), left...)
	for round := 0; round < 6; round++ {
		a, b := vllmEntry("tcp://127.0.0.1:"+strconv.Itoa(freePort(t))), vllmEntry("")
		a["instance_id"] = fmt.Sprintf("conflict-a-%d", round)
		if round%2 == 0 { // same endpoint, two instances
			b = vllmEntry(a["endpoint"].(string))
			b["instance_id"] = fmt.Sprintf("conflict-b-%d", round)
		} else { // same service key, two endpoints
			b = vllmEntry("tcp://127.0.0.1:" + strconv.Itoa(freePort(t)))
			b["instance_id"] = a["instance_id"]
		}
		bodies := [2][]byte{mp(flatten(a)...), mp(flatten(b)...)}
		type result struct {
			code int
			raw  []byte
			err  error
		}
		results := make(chan result, 2)
		start := make(chan struct{})
		for k := 0; k < 2; k++ {
			go func(k int) {
				<-start
				code, raw, err := postRaw(rs[k].base, "/register", bodies[k])
				results <- result{code, raw, err}
			}(k)
		}
		close(start)
		var codes [2]int
		var winner map[string]any
		for k := 0; k < 2; k++ {
			res := <-results
			if res.err != nil {
				t.Fatal(res.err)
			}
			codes[k] = res.code
		}
		// Which one won is read from the registry's outcome, not from timing.
		ok := 0
		for _, c := range codes {
			if c == http.StatusOK {
				ok++
			} else if c != http.StatusBadRequest {
				t.Fatalf("round %d: status %d, want 200 or 400", round, c)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d registrations acknowledged (codes %v), want exactly 1", round, ok, codes)
		}
		ids := rs[2].serviceIDs()
		waitFor(t, 15*time.Second, func() string { return fmt.Sprintf("round %d: replica 3 services %v", round, ids) }, func() bool {
			ids = rs[2].serviceIDs()
			return len(ids) == len(base)+1
		})
		for _, e := range []map[string]any{a, b} {
			id := fmt.Sprintf("%s/0@%s", e["instance_id"], e["endpoint"])
			for _, have := range ids {
				if have == id {
					winner = e
				}
			}
		}
		if winner == nil {
			t.Fatalf("round %d: replica 3 holds %v: neither contender", round, ids)
		}
		now := append(append([]string(nil), base...), fmt.Sprintf("%s/0@%s", winner["instance_id"], winner["endpoint"]))
		sort.Strings(now)
		waitSameServices(t, rs, now)
		// Clean up through replica 2.
		if _, err := rs[1].cl.Unregister(&httpclient.UnregisterRequest{InstanceID: winner["instance_id"].(string), DPRank: 0}); err != nil {
			t.Fatal(err)
		}
		waitSameServices(t, rs, base)
	}
	for _, r := range rs {
		r.c.terminate()
	}
}

// flatten turns a map into mp's ordered key/value list (sorted keys).
func flatten(m map[string]any) []any {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]any, 0, 2*len(m))
	for _, k := range keys {
		out = append(out, k, m[k])
	}
	return out
}

var bootstrapDone = regexp.MustCompile(`cluster: bootstrap done.*peer=(\S*).*sources_stale=(\d+).*took=(\S+)`)

// bootstrapLine returns the replica's "bootstrap done" log fields (peer, stale, took).
// bootstrapLineAfterReady is bootstrapLine for a replica that is ready: the process logs
// the line before it sets readiness, but the output reaches r.c.out through a pipe that
// exec copies on a goroutine of its own, which may not have copied the line yet when the
// readiness probe answers; it waits for it (at most 30 s: only a line never written
// takes that long).
func (r *replica) bootstrapLineAfterReady() (peer string, stale int, took string, ok bool) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if peer, stale, took, ok = r.bootstrapLine(); ok || time.Now().After(deadline) {
			return peer, stale, took, ok
		}
		time.Sleep(5 * time.Millisecond) // paces the polling
	}
}

func (r *replica) bootstrapLine() (peer string, stale int, took string, ok bool) {
	m := bootstrapDone.FindStringSubmatch(r.c.out.String())
	if m == nil {
		return "", 0, "", false
	}
	stale, _ = strconv.Atoi(m[2])
	return m[1], stale, m[3], true
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// queryLoad sends /query requests for ps to every replica in rs from two goroutines each
// until stop is closed; it counts answers and failures per replica.
type queryLoad struct {
	stop     chan struct{}
	done     chan struct{}
	ok, fail []atomic.Int64
	lastErr  []atomic.Value
}

func startQueryLoad(rs []*replica, ps []prompt) *queryLoad {
	l := &queryLoad{stop: make(chan struct{}), done: make(chan struct{}),
		ok: make([]atomic.Int64, len(rs)), fail: make([]atomic.Int64, len(rs)), lastErr: make([]atomic.Value, len(rs))}
	var wg sync.WaitGroup
	for ri, r := range rs {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func(ri, g int, base string) {
				defer wg.Done()
				for n := g; ; n++ {
					select {
					case <-l.stop:
						return
					default:
					}
					code, raw, err := postRaw(base, "/query", ps[n%len(ps)].body)
					if err != nil || code != http.StatusOK {
						l.fail[ri].Add(1)
						l.lastErr[ri].Store(fmt.Sprintf("%d %v %q", code, err, raw))
						continue
					}
					l.ok[ri].Add(1)
				}
			}(ri, g, r.base)
		}
	}
	go func() { wg.Wait(); close(l.done) }()
	return l
}

func (l *queryLoad) end() { close(l.stop); <-l.done }

// TestReplicasKill9AndRestart: three replicas answer queries under load; replica 3 is
// killed with SIGKILL and the other two keep answering every query. While it is down the
// engines publish more than their replay rings hold. Restarted, it is not ready until it
// has bootstrapped from a peer's snapshot, and then its answers for the prompts published
// before the kill (which no replay ring still holds) equal its peers' and the engines'.
func TestReplicasKill9AndRestart(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := startReplicas(t, etcd, 3)
	const ring = 8
	f := newFleet(t, 2, 4096, ring)
	registerOnFirst(t, f, rs)

	rng := rand.New(rand.NewPCG(3, 4))
	old := makePrompts(t, f, rng, 40, 10)
	for i := range old {
		store(t, f, i%2, &old[i])
	}
	settle(t, f, rs, 0, 1)

	load := startQueryLoad(rs[:2], old)
	waitFor(t, 30*time.Second, func() string { return "no query load" }, func() bool { return load.ok[0].Load() > 20 && load.ok[1].Load() > 20 })
	rs[2].kill9()
	before := [2]int64{load.ok[0].Load(), load.ok[1].Load()}
	// While replica 3 is down each engine publishes more batches than its ring holds.
	fresh := makePrompts(t, f, rng, 4*ring, 10)
	for i := range fresh {
		store(t, f, i%2, &fresh[i])
	}
	for i := 0; i < 2; i++ {
		if s := f.Rank(i, 0).Publisher().Seq(); s < 3*ring {
			t.Fatalf("instance %d published %d batches, not enough to overrun a ring of %d", i, s, ring)
		}
	}
	waitFor(t, 30*time.Second, func() string { return "query load stalled after the kill" }, func() bool {
		return load.ok[0].Load() > before[0]+20 && load.ok[1].Load() > before[1]+20
	})

	started := time.Now()
	r3 := startReplica(t, "replica-3", rs[2].config, rs[2].port)
	rs[2] = r3
	r3.waitReady(60 * time.Second)
	readyAfter := time.Since(started)
	// Ready implies bootstrapped: the log line is written before readiness is set (and
	// reaches the captured output soon after).
	peer, stale, took, ok := r3.bootstrapLineAfterReady()
	if !ok || peer == `""` || peer == "" || stale != 0 || !strings.Contains(r3.c.out.String(), "cluster: peer snapshot loaded") {
		t.Fatalf("restarted replica did not bootstrap from a peer (peer %q, stale %d):\n%s", peer, stale, r3.c.out.String())
	}
	t.Logf("restarted replica ready %v after start; bootstrap from %s took %s", readyAfter.Round(time.Millisecond), peer, took)
	load.end()
	for i := 0; i < 2; i++ {
		if n := load.fail[i].Load(); n != 0 {
			t.Errorf("%s: %d of %d queries failed while a peer was killed and restarted: %v", rs[i].name, n, n+load.ok[i].Load(), load.lastErr[i].Load())
		}
	}
	t.Logf("queries answered during kill and restart: %s %d, %s %d", rs[0].name, load.ok[0].Load(), rs[1].name, load.ok[1].Load())

	// The prompts published before the kill are older than every ring: replica 3 has them
	// from the snapshot only. Compare before any new event (quiescent already), then after
	// settling.
	sameAnswers(t, []*replica{rs[0], r3}, old, "old prompts, restarted "+r3.name)
	checkModel(t, f, r3, old, []int{0, 1})
	settle(t, f, rs, 0, 1)
	all := append(append([]prompt(nil), old...), fresh...)
	sameAnswers(t, rs, all, "after the restart")
	checkModel(t, f, r3, all, []int{0, 1})
	for _, r := range rs {
		r.c.terminate()
	}
}

// TestReplicaJoinsUnderFullRateStream: four simulated engines with small caches (so that
// evictions publish BlockRemoved) stream at full rate into replica 1; replica 2 starts in
// the middle of the stream and bootstraps from replica 1. Once the stream ends and both
// have applied everything, both answer exactly what the engines hold for every prompt,
// and both count exactly the blocks the engines hold: no event lost or applied twice
// across the join (a lost BlockStored would under-report, a lost or doubled BlockRemoved
// would leave or drop a block). The bootstrap time is logged.
func TestReplicaJoinsUnderFullRateStream(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := startReplicas(t, etcd, 1)
	// Replay rings of 900 batches, overrun before the join: what was published before
	// can only reach the new replica through the snapshot. (Much smaller rings are
	// overrun at this rate while a replica on a loaded 2-core machine recovers a gap, and
	// a replay of more than 1000 batches loses some at the ROUTER socket's default
	// high-water mark: either way the source goes stale, as it should.)
	const ring = 900
	f := newFleet(t, 4, 96, ring)
	if err := f.Register(rs[0].cl, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	pool := makePrompts(t, f, rng, 150, 16)

	var published atomic.Int64
	stop := make(chan struct{})
	streamed := make(chan error, 1)
	const maxPrompts = 500_000 // bounds the test if the join never completes
	go func() {
		r := rand.New(rand.NewPCG(7, 8))
		for n := 0; n < maxPrompts; n++ {
			select {
			case <-stop:
				streamed <- nil
				return
			default:
			}
			p := &pool[r.IntN(len(pool))]
			if _, err := f.Rank(r.IntN(4), 0).Store(p.tokens, p.keys, sim.Now()); err != nil {
				streamed <- err
				return
			}
			published.Add(1)
		}
		streamed <- nil
	}()
	waitFor(t, 30*time.Second, func() string { return "stream did not overrun the rings" }, func() bool {
		for i := 0; i < 4; i++ {
			if f.Rank(i, 0).Publisher().Seq() < ring+256 {
				return false
			}
		}
		return true
	})
	atJoin := published.Load()
	port := freePort(t)
	joinStart := time.Now()
	r2 := startReplica(t, "replica-2", writeReplicaConfig(t, etcd, port, 2000), port)
	r2.waitReady(60 * time.Second)
	readyAfter := time.Since(joinStart)
	atReady := published.Load()
	// Keep streaming after the join for as many prompts again.
	waitFor(t, 60*time.Second, func() string { return "stream stalled after the join" }, func() bool {
		return published.Load() >= atReady+500
	})
	close(stop)
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	streamTime := time.Since(joinStart)
	rs = append(rs, r2)

	peer, stale, took, ok := r2.bootstrapLineAfterReady()
	if !ok || peer != rs[0].base || stale != 0 || !strings.Contains(r2.c.out.String(), "cluster: peer snapshot loaded") {
		t.Fatalf("joining replica did not bootstrap from %s (peer %q, stale %d):\n%s", rs[0].base, peer, stale, r2.c.out.String())
	}
	st := f.Stats()
	t.Logf("join: ready %v after start, bootstrap took %s; prompts published %d before start, %d by ready, %d in all (%d batches, %d stored, %d removed block hashes; %.0f prompts/s from the join to the end)",
		readyAfter.Round(time.Millisecond), took, atJoin, atReady, published.Load(), st.Batches, st.Stored, st.Removed,
		float64(published.Load()-atJoin)/streamTime.Seconds())
	if st.Removed == 0 {
		t.Fatal("no BlockRemoved published: caches too large for the check to cover removals")
	}

	settle(t, f, rs, 0, 1, 2, 3)
	union := uint64(f.UnionBlocks())
	for _, r := range rs {
		n, err := f.Drain(r.cl, 20*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if n != union {
			t.Errorf("%s: prefix_count %d, the engines hold %d distinct blocks", r.name, n, union)
		}
	}
	all := []int{0, 1, 2, 3}
	for _, r := range rs {
		checkModel(t, f, r, pool, all)
	}
	sameAnswers(t, rs, pool, "after the join")
	for _, r := range rs {
		if n := r.metricSum("conductor_service_stale"); n != 0 {
			t.Errorf("%s: %v sources stale", r.name, n)
		}
		t.Logf("%s: sequence gaps %v (recovered by replay), batches applied %v", r.name,
			r.metricSum("conductor_service_sequence_gaps_total"), r.metricSum("conductor_service_messages_applied_total"))
		r.c.terminate()
	}
}

// metricSum sums every sample of the metric name in r's /metrics.
func (r *replica) metricSum(name string) float64 {
	r.t.Helper()
	sum, found := metricSum(r.t, r.base, name)
	if !found {
		r.t.Fatalf("%s: metric %s not exported", r.name, name)
	}
	return sum
}

// registryServices lists the registry's service keys in etcd (ids after the prefix).
func registryServices(t *testing.T, etcd *etcdtest.Server) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := etcd.Client().Get(ctx, "/mooncake-conductor/services/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		out = append(out, strings.TrimPrefix(string(kv.Key), "/mooncake-conductor/services/"))
	}
	sort.Strings(out)
	return out
}

// TestReplicaJoinHoleHeldBySnapshot: a batch the joining replica can get neither live
// (published before it subscribed) nor from the engine's replay ring (which no longer
// has it, as a ring that moved on under a full-rate stream) does not make the source
// stale: replica 1 applied it, and the snapshot replica 2 loads holds it. Replica 2
// answers every prompt as the engine holds it, counts the gap as covered, and follows
// the stream after the join.
func TestReplicaJoinHoleHeldBySnapshot(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := startReplicas(t, etcd, 1)
	f := newFleet(t, 1, 4096, 0)
	if err := f.Register(rs[0].cl, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	ps := makePrompts(t, f, rng, 8, 8)
	for i := range ps[:6] { // batches 0..5, one per prompt
		store(t, f, 0, &ps[i])
	}
	settle(t, f, rs, 0)
	f.Rank(0, 0).Publisher().LoseFromRing(2)
	port := freePort(t)
	r2 := startReplica(t, "replica-2", writeReplicaConfig(t, etcd, port, 2000), port)
	r2.waitReady(60 * time.Second)
	rs = append(rs, r2)
	// Known once ready: the hole was met by the catch-up, before the snapshot loaded.
	if n := r2.metricSum("conductor_service_stale"); n != 0 {
		t.Fatalf("replica-2: %v sources stale:\n%s", n, r2.c.out.String())
	}
	if n := r2.metricSum("conductor_service_gaps_covered_total"); n != 1 {
		t.Fatalf("replica-2: %v gaps covered by the snapshot, want 1:\n%s", n, r2.c.out.String())
	}
	for i := range ps[6:] { // after the join
		store(t, f, 0, &ps[6+i])
	}
	settle(t, f, rs, 0)
	for _, r := range rs {
		checkModel(t, f, r, ps, []int{0})
	}
	sameAnswers(t, rs, ps, "after the join")
}

// TestReplicasEtcdOutageDuringRegistrations: registrations and unregistrations go to
// three replicas in turn while etcd is killed and restarted. While it is down each one
// answers 500 and changes nothing on the replica that took it (nor anywhere else), and
// queries keep answering from the index; once etcd is back registrations succeed again
// and every replica converges on exactly the registry: everything acknowledged, nothing
// that failed.
func TestReplicasEtcdOutageDuringRegistrations(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := startReplicasDialing(t, etcd, 3, 500)
	f := newFleet(t, 1, 4096, 0)
	if err := f.Register(rs[0].cl, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 10))
	ps := makePrompts(t, f, rng, 5, 8)
	for i := range ps {
		store(t, f, 0, &ps[i])
	}
	settle(t, f, rs, 0)

	fleetReg := f.Registrations()[0]
	acked := map[string]bool{fmt.Sprintf("%s/0@%s", fleetReg.InstanceID, fleetReg.Endpoint): true}
	n := 0
	register := func(r *replica) (string, int, string) {
		n++
		e := vllmEntry("tcp://127.0.0.1:" + strconv.Itoa(20000+n))
		e["instance_id"] = fmt.Sprintf("outage-%d", n)
		code, raw, err := postRaw(r.base, "/register", mp(flatten(e)...))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("outage-%d/0@%s", n, e["endpoint"]), code, string(raw)
	}
	for i := 0; i < 6; i++ {
		id, code, body := register(rs[i%3])
		if code != http.StatusOK {
			t.Fatalf("register %s with etcd up: %d %s", id, code, body)
		}
		acked[id] = true
	}

	etcd.Stop()
	failed, refusedDown := map[string]bool{}, map[string]bool{}
	for i := 0; i < 6; i++ {
		r := rs[i%3]
		id, code, body := register(r)
		if code != http.StatusInternalServerError || !strings.Contains(body, "Failed to persist registration") {
			t.Fatalf("register %s on %s with etcd down: %d %s, want 500 Failed to persist", id, r.name, code, body)
		}
		failed[id] = true
		refusedDown[id] = true
		for _, have := range r.serviceIDs() {
			if have == id {
				t.Fatalf("%s: the refused registration %s is applied locally", r.name, id)
			}
		}
		// Unregistering an acknowledged service fails too and keeps it.
		victim := fmt.Sprintf("outage-%d", i+1)
		code, raw, err := postRaw(r.base, "/unregister", mp("instance_id", victim, "dp_rank", 0))
		if err != nil || code != http.StatusInternalServerError || !strings.Contains(string(raw), "Failed to persist unregistration") {
			t.Fatalf("unregister %s on %s with etcd down: %d %v %s, want 500", victim, r.name, code, err, raw)
		}
		found := false
		for _, have := range r.serviceIDs() {
			found = found || strings.HasPrefix(have, victim+"/")
		}
		if !found {
			t.Fatalf("%s: %s was removed locally by a failed unregistration", r.name, victim)
		}
		// Queries keep working from the index on every replica.
		for _, q := range rs {
			if a := q.answer(ps[i%len(ps)].body); !strings.Contains(a, `"`+f.InstanceID(0)+`"`) {
				t.Fatalf("%s answers without the indexed engine while etcd is down: %s", q.name, a)
			}
		}
	}

	etcd.Restart()
	// Registrations succeed again once the replicas' clients have reconnected.
	for i := 0; i < 6; i++ {
		r := rs[i%3]
		var id string
		var code int
		var body string
		waitFor(t, 30*time.Second, func() string { return fmt.Sprintf("register on %s after etcd restart: %d %s", r.name, code, body) }, func() bool {
			id, code, body = register(r)
			if code == http.StatusInternalServerError {
				failed[id] = true
				return false
			}
			if code != http.StatusOK {
				t.Fatalf("register %s after etcd restart: %d %s", id, code, body)
			}
			return true
		})
		acked[id] = true
	}
	// A failed request may still have reached etcd (timeout after sending): the registry
	// is the truth. It must hold everything acknowledged, and nothing refused while etcd
	// was down (those requests never reached it).
	reg := registryServices(t, etcd) // "<instance>|default|<rank>", path-escaped
	regSet := map[string]bool{}
	for _, k := range reg {
		regSet[k] = true
	}
	label := func(id string) string { // "inst/0@ep" -> escaped "inst|default|0"
		inst, rest, _ := strings.Cut(id, "/")
		rank, _, _ := strings.Cut(rest, "@")
		return url.PathEscape(inst + "|default|" + rank)
	}
	for id := range acked {
		if !regSet[label(id)] {
			t.Fatalf("acknowledged %s missing from the registry %v", id, reg)
		}
	}
	for id := range refusedDown {
		if regSet[label(id)] {
			t.Fatalf("%s, refused while etcd was down, is in the registry %v", id, reg)
		}
	}
	// Every replica converges on exactly the registry.
	var first []string
	waitFor(t, 30*time.Second, func() string { return fmt.Sprintf("replicas do not converge: %v (registry %v)", first, reg) }, func() bool {
		first = rs[0].serviceIDs()
		if len(first) != len(reg) {
			return false
		}
		for _, id := range first {
			if !regSet[label(id)] {
				return false
			}
		}
		for _, r := range rs[1:] {
			if strings.Join(r.serviceIDs(), ",") != strings.Join(first, ",") {
				return false
			}
		}
		return true
	})
	t.Logf("%d acknowledged, %d refused with 500; registry and replicas hold %d", len(acked), len(failed), len(first))
	for _, r := range rs {
		r.c.terminate()
	}
}

// allInstances lists 0..f.Instances()-1.
func allInstances(f *sim.Fleet) []int {
	out := make([]int, f.Instances())
	for i := range out {
		out[i] = i
	}
	return out
}
