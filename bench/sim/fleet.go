package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
)

// FleetConfig describes a simulated fleet: Instances engine instances of DPRanks
// data-parallel ranks each, all in one conductor context.
type FleetConfig struct {
	Instances, DPRanks int
	Kind               publisher.Kind
	Hash               HashSpec
	// Model, Lora and Tenant select the conductor context ("" tenant = "default").
	Model, Lora, Tenant string
	BlockSize           int
	// Cache sizes every rank's tiers, in blocks.
	Cache CacheConfig
	// Style selects the optional vLLM event fields.
	Style EventStyle
	// Publish makes every rank a real ZMQ publisher. Without it the fleet is a pure
	// in-memory model (baseline routing policies need no conductor).
	Publish   bool
	Publisher PublisherConfig
	// InstancePrefix names instances Prefix0, Prefix1, ... ("" = "sim-").
	InstancePrefix string
	// MaxBatchEvents caps the events of one published batch (long prompts span several
	// batches, like chunked prefill); 0 means 1024, values below 7 mean 7.
	MaxBatchEvents int
	// DrainPoll is the longest pause between Drain's queries for its marker (they start at
	// 100 us and double); 0 means 20 ms. A shorter one times the end of a burst more
	// closely, at the cost of more queries while the conductor works.
	DrainPoll time.Duration
}

// Fleet is a set of simulated engine ranks. It is driven from one goroutine.
type Fleet struct {
	cfg    FleetConfig
	ids    []string
	index  map[string]int // instance id -> position in ids
	ranks  [][]*Rank
	hub    *Hub
	hasher *Hasher
	marker []int32
	keys   []uint64

	registered []httpclient.RegisterRequest
	markerGen  uint32
	drainRes   httpclient.QueryResult
	drainHits  []*httpclient.InstanceHit
}

// NewFleet builds the fleet and, when cfg.Publish is set, binds every rank's endpoints
// and starts serving replay requests.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Instances <= 0 || cfg.DPRanks <= 0 {
		return nil, fmt.Errorf("fleet of %d instances x %d ranks: both must be positive", cfg.Instances, cfg.DPRanks)
	}
	if !cfg.Kind.IsEngine() {
		return nil, fmt.Errorf("fleet: engine kind %v: want vLLM or SGLang", cfg.Kind)
	}
	if cfg.Tenant == "" {
		cfg.Tenant = "default"
	}
	if cfg.InstancePrefix == "" {
		cfg.InstancePrefix = "sim-"
	}
	if cfg.DrainPoll <= 0 {
		cfg.DrainPoll = 20 * time.Millisecond
	}
	h, err := NewHasher(cfg.Hash, cfg.BlockSize, cfg.Lora, "")
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	isSGLang := h.Profile().StrategyName() != "vllm_v1"
	if isSGLang != (cfg.Kind == publisher.SGLang) {
		return nil, fmt.Errorf("fleet: %s engines cannot use hash strategy %s", cfg.Kind, cfg.Hash.Strategy)
	}
	f := &Fleet{cfg: cfg, hasher: h, index: make(map[string]int, cfg.Instances)}
	if cfg.Publish {
		if f.hub, err = NewHub(); err != nil {
			return nil, err
		}
	}
	for i := 0; i < cfg.Instances; i++ {
		f.ids = append(f.ids, fmt.Sprintf("%s%d", cfg.InstancePrefix, i))
		f.index[f.ids[i]] = i
		var rs []*Rank
		for d := 0; d < cfg.DPRanks; d++ {
			var sink Sink
			if cfg.Publish {
				pub, err := f.hub.NewPublisher(cfg.Publisher)
				if err != nil {
					f.Close()
					return nil, fmt.Errorf("instance %d rank %d: %w", i, d, err)
				}
				sink = pub
			}
			r, err := newRank(i, d, cfg.Kind, cfg.BlockSize, cfg.Cache, sink, cfg.Style, cfg.Lora, cfg.MaxBatchEvents)
			if err != nil {
				f.Close()
				return nil, err
			}
			rs = append(rs, r)
		}
		f.ranks = append(f.ranks, rs)
	}
	if f.hub != nil {
		f.hub.Start()
	}
	return f, nil
}

// Config returns the fleet's configuration (with defaults filled in).
func (f *Fleet) Config() FleetConfig { return f.cfg }

// Instances is the number of instances.
func (f *Fleet) Instances() int { return len(f.ranks) }

// DPRanks is the number of ranks per instance.
func (f *Fleet) DPRanks() int { return f.cfg.DPRanks }

// InstanceID is the router-facing id of instance i.
func (f *Fleet) InstanceID(i int) string { return f.ids[i] }

// Hits files a /query answer by instance: dst[i] is instance i's entry, nil when the
// answer leaves it out; entries of ids outside the fleet are ignored. It reuses dst (pass
// the previous result) and allocates nothing then; the pointers are valid until res is
// decoded again. It only reads the fleet, so concurrent callers may share it.
func (f *Fleet) Hits(dst []*httpclient.InstanceHit, res *httpclient.QueryResult) []*httpclient.InstanceHit {
	if cap(dst) < len(f.ids) {
		dst = make([]*httpclient.InstanceHit, len(f.ids))
	}
	dst = dst[:len(f.ids)]
	clear(dst)
	for j := range res.Instances {
		h := &res.Instances[j]
		if i, ok := f.index[h.InstanceID]; ok {
			dst[i] = h
		}
	}
	return dst
}

// Rank returns rank d of instance i.
func (f *Fleet) Rank(i, d int) *Rank { return f.ranks[i][d] }

// Hasher is the fleet's hasher (one context, one profile). Not safe for concurrent use.
func (f *Fleet) Hasher() *Hasher { return f.hasher }

// Registrations returns one /register request per rank.
func (f *Fleet) Registrations() []httpclient.RegisterRequest {
	var out []httpclient.RegisterRequest
	for i, rs := range f.ranks {
		for _, r := range rs {
			reg := httpclient.RegisterRequest{
				Type: f.cfg.Kind.String(), ModelName: f.cfg.Model, LoraName: f.cfg.Lora, TenantID: f.cfg.Tenant,
				InstanceID: f.ids[i], BlockSize: int64(f.cfg.BlockSize), DPRank: int64(r.dpRank),
				HashProfile: httpclient.HashProfile{
					Strategy: f.cfg.Hash.Strategy, Algorithm: f.cfg.Hash.Algorithm,
					PythonHashSeed: f.cfg.Hash.PythonHashSeed, IndexProjection: f.cfg.Hash.IndexProjection,
				},
			}
			if r.pub != nil {
				reg.Endpoint, reg.ReplayEndpoint = r.pub.Endpoint(), r.pub.ReplayEndpoint()
			}
			out = append(out, reg)
		}
	}
	return out
}

// WaitSubscribed waits until every rank's PUB socket has a subscriber.
func (f *Fleet) WaitSubscribed(timeout time.Duration) error {
	if f.hub == nil {
		return errors.New("wait subscribed: fleet does not publish")
	}
	deadline := time.Now().Add(timeout)
	for _, rs := range f.ranks {
		for _, r := range rs {
			if err := r.pub.WaitSubscribed(time.Until(deadline)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stats sums every rank's counters.
func (f *Fleet) Stats() RankStats {
	var s RankStats
	for _, rs := range f.ranks {
		for _, r := range rs {
			s.add(r.stats)
		}
	}
	return s
}

// UnionBlocks is the number of distinct block keys held anywhere in the fleet: what the
// conductor's prefix_count must equal once it has applied every event.
func (f *Fleet) UnionBlocks() int {
	seen := make(map[uint64]struct{})
	for _, rs := range f.ranks {
		for _, r := range rs {
			r.eachKey(func(k uint64) { seen[k] = struct{}{} })
		}
	}
	return len(seen)
}

// publishMarker makes every rank publish a BlockStored for the marker block of
// generation gen (outside the simulated caches) and returns the marker prompt. Events of
// a stream are applied in order, so once a query for the prompt shows the marker on every
// rank, the conductor has applied everything published before it.
func (f *Fleet) publishMarker(gen uint32) ([]int32, error) {
	key, err := f.markerKey(gen)
	if err != nil {
		return nil, err
	}
	ts := Now()
	for _, rs := range f.ranks {
		for _, r := range rs {
			if err := r.publishOne(key, f.marker, true, ts); err != nil {
				return nil, err
			}
		}
	}
	return f.marker, nil
}

// retractMarker publishes the BlockRemoved that undoes publishMarker(gen).
func (f *Fleet) retractMarker(gen uint32) error {
	key, err := f.markerKey(gen)
	if err != nil {
		return err
	}
	ts := Now()
	for _, rs := range f.ranks {
		for _, r := range rs {
			if err := r.publishOne(key, nil, false, ts); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *Fleet) markerKey(gen uint32) (uint64, error) {
	f.marker = AppendMarkerPrompt(f.marker[:0], gen, f.cfg.BlockSize)
	var err error
	f.keys, err = f.hasher.AppendKeys(f.keys[:0], f.marker)
	if err != nil {
		return 0, fmt.Errorf("marker key: %w", err)
	}
	if len(f.keys) != 1 {
		return 0, fmt.Errorf("marker key: %d blocks, want 1", len(f.keys))
	}
	return f.keys[0], nil
}

// Close closes every socket. The fleet's caches stay readable.
func (f *Fleet) Close() {
	if f.hub != nil {
		f.hub.Close()
	}
}

// Now is the batch timestamp vLLM writes: seconds since the epoch as a float.
func Now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// Register registers every rank with the conductor and waits for its subscriptions.
// On error the ranks registered so far stay registered; call Unregister.
func (f *Fleet) Register(cl *httpclient.Client, timeout time.Duration) error {
	regs := f.Registrations()
	for i := range regs {
		if _, err := cl.Register(&regs[i]); err != nil {
			return fmt.Errorf("register %s rank %d: %w", regs[i].InstanceID, regs[i].DPRank, err)
		}
		f.registered = append(f.registered, regs[i])
	}
	if err := f.WaitSubscribed(timeout); err != nil {
		return fmt.Errorf("conductor did not subscribe: %w", err)
	}
	return nil
}

// Unregister removes every rank Register registered, so an external conductor can be
// reused; errors are ignored because the conductor may already be gone.
func (f *Fleet) Unregister(cl *httpclient.Client) {
	for i := range f.registered {
		r := &f.registered[i]
		_, _ = cl.Unregister(&httpclient.UnregisterRequest{InstanceID: r.InstanceID, TenantID: r.TenantID, DPRank: r.DPRank})
	}
	f.registered = f.registered[:0]
}

// Attach opens a client of the conductor at addr and registers the fleet there
// (Register, waiting up to timeout for the subscriptions); detach unregisters it and
// closes the client. A failed registration is undone before Attach returns.
func (f *Fleet) Attach(addr string, opts httpclient.Options, timeout time.Duration) (cl *httpclient.Client, detach func(), err error) {
	if cl, err = httpclient.New(addr, opts); err != nil {
		return nil, nil, err
	}
	detach = func() {
		f.Unregister(cl)
		cl.Close()
	}
	if err := f.Register(cl, timeout); err != nil {
		detach()
		return nil, nil, err
	}
	return cl, detach, nil
}

// Drain waits until the conductor has applied every event published so far: it
// publishes a marker block on every rank and polls until the conductor reports the
// marker on all of them (each stream is applied in order). It returns the context's
// prefix_count at that moment, not counting the marker, and then retracts the marker.
func (f *Fleet) Drain(cl *httpclient.Client, timeout time.Duration) (uint64, error) {
	return f.DrainContext(context.Background(), cl, timeout)
}

// DrainContext is Drain that also gives up when ctx is done (the marker stays published
// then: a later drain's marker is another block).
func (f *Fleet) DrainContext(ctx context.Context, cl *httpclient.Client, timeout time.Duration) (uint64, error) {
	f.markerGen++
	marker, err := f.publishMarker(f.markerGen)
	if err != nil {
		return 0, err
	}
	q := httpclient.QueryRequest{Model: f.cfg.Model, LoraName: f.cfg.Lora, TenantID: f.cfg.Tenant,
		BlockSize: int64(f.cfg.BlockSize), TokenIDs: marker}
	deadline := time.Now().Add(timeout)
	pause := 100 * time.Microsecond
	for {
		if err := cl.Query(&q, &f.drainRes); err != nil {
			return 0, fmt.Errorf("drain: %w", err)
		}
		if f.markerEverywhere() {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("marker %d not applied on every rank after %v", f.markerGen, timeout)
		}
		if err := context.Cause(ctx); err != nil {
			return 0, fmt.Errorf("drain: marker %d not applied on every rank: %w", f.markerGen, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, f.cfg.DrainPoll)
	}
	count, err := f.prefixCount(cl)
	if err != nil {
		return 0, fmt.Errorf("drain: %w", err)
	}
	if err := f.retractMarker(f.markerGen); err != nil {
		return 0, err
	}
	if count == 0 {
		return 0, errors.New("drain: prefix_count 0 while the marker is indexed")
	}
	return count - 1, nil
}

// markerEverywhere reports whether the last drain answer shows the marker block on the
// device of every rank.
func (f *Fleet) markerEverywhere() bool {
	bs := int64(f.cfg.BlockSize)
	f.drainHits = f.Hits(f.drainHits, &f.drainRes)
	for _, h := range f.drainHits {
		if h == nil {
			return false
		}
		for d := 0; d < f.cfg.DPRanks; d++ {
			if r := h.Rank(int64(d)); r == nil || r.Device < bs {
				return false
			}
		}
	}
	return true
}

// prefixCount reads the fleet's context's prefix_count from /global_view.
func (f *Fleet) prefixCount(cl *httpclient.Client) (uint64, error) {
	view, err := cl.GlobalView()
	if err != nil {
		return 0, err
	}
	for i := range view.Contexts {
		c := &view.Contexts[i]
		if c.ModelName == f.cfg.Model && c.LoraName == f.cfg.Lora && c.TenantID == f.cfg.Tenant &&
			c.BlockSize == int64(f.cfg.BlockSize) {
			return uint64(c.PrefixCount), nil
		}
	}
	return 0, fmt.Errorf("context model %q lora %q tenant %q block_size %d not in /global_view",
		f.cfg.Model, f.cfg.Lora, f.cfg.Tenant, f.cfg.BlockSize)
}
