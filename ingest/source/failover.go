package source

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Mooncake master failover: a Mooncake registration whose endpoint is a master locator
// (ParseMasterLocator: etcd://<etcd host:port,...>/<cluster_id>?event_port=N)
// follows the elected master instead of one fixed address. The conductor watches
// mooncake-store/<cluster_id>/master_view on those etcd endpoints and subscribes to
// tcp://<leader host>:<event_port>; on a leader change it stops the old stream and
// subscribes to the new leader.
//
// The master's stream has no replay, so whether the old leader's bindings may stay is
// decided by the first batch the new leader's stream delivers: its sequence number must
// be the old stream's last applied one plus one ("continues"): then nothing was missed and
// the bindings stay. Anything else (a new master process numbers from 1; batches sent
// before our subscription connected are lost) retracts every binding of the source first,
// as on a publisher restart, and the new stream is applied from scratch. While the key is
// missing (no leader) the registration stays, with no stream, its bindings kept until a
// new leader's first batch decides; a re-election at the same address keeps the stream
// (ingest's own sequence rules then apply, including its restart detection). A stream
// that went stale is retracted and stays so until the next leader (or term) is announced.

// contDecision is what the first batch of a new leader's stream does to the bindings.
type contDecision uint8

const (
	contFresh   contDecision = iota // nothing of an earlier stream is held
	contKeep                        // the batch continues the earlier stream: keep
	contRetract                     // it does not: retract the earlier stream's bindings
)

// streamCont is what is held of earlier leader streams: the last sequence number applied,
// when any of their bindings are still held.
type streamCont struct {
	last uint64
	has  bool
}

// firstBatch decides for the first batch (seq) of a new leader's stream.
func (c streamCont) firstBatch(seq uint64) contDecision {
	switch {
	case !c.has:
		return contFresh
	case c.last != ^uint64(0) && seq == c.last+1:
		return contKeep
	}
	return contRetract
}

// LeaderStats are the master-view counters of a locator registration.
type LeaderStats struct {
	// Missing: no usable leader (key absent or unusable, or not read yet): no stream.
	Missing bool
	// Leader and Version are the master view last subscribed to.
	Leader  string
	Version int64
	// Changes counts subscriptions after the first (a new leader, or a new term after
	// the key was missing).
	Changes uint64
	// Retractions counts new leader streams that did not continue the old one (bindings
	// retracted); Continuations those that did (bindings kept).
	Retractions, Continuations uint64
}

// LeaderStatser is implemented by the subscriptions that follow a Mooncake master view.
type LeaderStatser interface{ LeaderStats() LeaderStats }

// masterSubscription follows the elected Mooncake master of a locator registration.
type masterSubscription struct {
	spec    Spec
	loc     MasterLocator
	key     string
	log     *slog.Logger
	logs    *lograte.Limiter
	handler *translate.EventHandler
	inner   gatedHandler
	gate    *gate
	gates   *GateSet
	opts    Options
	watcher *MasterViewWatcher

	mu      sync.Mutex
	stopped bool
	cur     *ingest.Subscriber
	curEP   string
	leader  string
	version int64
	past    ingest.SubscriberStats // summed counters of the stopped subscribers

	contMu sync.Mutex
	cont   streamCont

	missing                            atomic.Bool
	changes, retractions, continuation atomic.Uint64
}

func subscribeMaster(spec Spec, eng *engine.Engine, log *slog.Logger, opts Options) (Subscription, error) {
	if spec.Kind != publisher.Mooncake {
		return nil, fmt.Errorf("master locator %s: only Mooncake registrations follow a master view", spec.Endpoint)
	}
	loc, err := ParseMasterLocator(spec.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("master locator %s: %w", spec.Endpoint, err)
	}
	key := spec.Name
	logs := lograte.New(log.Handler(), lograte.Config{Burst: opts.LogBurst, Interval: opts.LogInterval})
	log = logs.Logger()
	if spec.ReplayEndpoint != "" {
		log.Warn("replay_endpoint ignored: the Mooncake master has no replay", "service", key, "replay_endpoint", spec.ReplayEndpoint)
	}
	h := translate.NewEventHandler(spec.Source, eng, log)
	m := &masterSubscription{spec: spec, loc: loc, key: key, logs: logs, handler: h, inner: h, opts: opts, gates: opts.Gates,
		log: log.With("service", key, "master_view_key", loc.Key())}
	if opts.Gates != nil {
		m.gate = opts.Gates.add(spec.Endpoint, h)
		m.inner = m.gate
	}
	m.missing.Store(true)
	w, err := WatchMasterView(MasterViewConfig{Locator: loc, Logger: log}, m.onView)
	if err != nil {
		if m.gate != nil {
			opts.Gates.remove(spec.Endpoint, m.gate)
		}
		return nil, err
	}
	m.watcher = w
	m.log.Info("following the Mooncake master view", "etcd", loc.Etcd, "event_port", loc.EventPort)
	return m, nil
}

func (m *masterSubscription) hook(event string) {
	if m.opts.MasterHook != nil {
		m.opts.MasterHook(m.key, event)
	}
}

// onView runs on the watcher's goroutine, once per change of the master view.
func (m *masterSubscription) onView(v MasterView) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	if !v.Present {
		m.stopCurLocked()
		m.missing.Store(true)
		m.log.Warn("Mooncake master leader key missing: no stream; waiting for a leader (bindings kept until the next leader's stream shows whether it continues)",
			"last_leader", m.leader, "last_version", m.version)
		m.hook("waiting")
		return
	}
	ep, err := m.loc.EventEndpoint(v.Leader)
	if err != nil {
		m.stopCurLocked()
		m.missing.Store(true)
		m.log.Error("Mooncake master view unusable: no stream; waiting for a usable one", "version", v.Version, "err", err)
		m.hook("waiting")
		return
	}
	if m.cur != nil && ep == m.curEP && !m.cur.Stats().Stale {
		m.log.Info("Mooncake master re-elected at the same address: stream kept", "leader", v.Leader, "version", v.Version, "old_version", m.version)
		m.leader, m.version = v.Leader, v.Version
		m.hook("kept")
		return
	}
	hadLeader := m.leader != ""
	m.stopCurLocked()
	sub, err := ingest.NewSubscriber(ingest.SubscriberConfig{
		Name: m.key, Endpoint: ep, Logger: m.log,
		Transport: m.opts.Transport, MaxMessageSize: m.opts.MaxMessageSize, BufferBytes: m.opts.BufferBytes,
	}, &leaderStream{m: m, first: true})
	if err == nil {
		err = sub.Start()
	}
	if err != nil {
		m.missing.Store(true)
		m.log.Error("cannot subscribe to the Mooncake master leader; waiting for the next master view", "leader", v.Leader, "event_endpoint", ep, "err", err)
		m.hook("waiting")
		return
	}
	if hadLeader {
		m.changes.Add(1)
	}
	m.cur, m.curEP, m.leader, m.version = sub, ep, v.Leader, v.Version
	m.missing.Store(false)
	m.log.Info("subscribed to the Mooncake master leader", "leader", v.Leader, "version", v.Version, "event_endpoint", ep)
	m.hook("subscribed " + ep)
}

// stopCurLocked stops the current stream (waiting for its in-flight batch) and keeps
// its counters.
func (m *masterSubscription) stopCurLocked() {
	if m.cur == nil {
		return
	}
	m.cur.Stop()
	addSubscriberStats(&m.past, m.cur.Stats())
	m.cur, m.curEP = nil, ""
}

// Stop stops following the master view and the current stream.
func (m *masterSubscription) Stop() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.watcher.Close() // after it returns, onView runs no more
	m.mu.Lock()
	m.stopCurLocked()
	m.mu.Unlock()
	if m.gates != nil {
		m.gates.remove(m.spec.Endpoint, m.gate)
	}
	m.logs.Flush(context.Background())
}

// Stats sums the counters of every leader stream; the gauges are the current stream's.
func (m *masterSubscription) Stats() ingest.SubscriberStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.past
	st.Waiting, st.Stale, st.RecvBufferBytes = false, false, 0
	if m.cur != nil {
		addSubscriberStats(&st, m.cur.Stats())
	}
	st.Stale = st.Stale || m.gate.isStale() // made stale at the end of a bootstrap
	return st
}

// HandlerStats exposes the event handler's counters (for metrics).
func (m *masterSubscription) HandlerStats() translate.HandlerStats { return m.handler.Stats() }

// LeaderStats returns the master-view counters.
func (m *masterSubscription) LeaderStats() LeaderStats {
	m.mu.Lock()
	leader, version := m.leader, m.version
	m.mu.Unlock()
	return LeaderStats{Missing: m.missing.Load(), Leader: leader, Version: version, Changes: m.changes.Load(),
		Retractions: m.retractions.Load(), Continuations: m.continuation.Load()}
}

// addSubscriberStats adds b's counters to a and takes b's gauges.
func addSubscriberStats(a *ingest.SubscriberStats, b ingest.SubscriberStats) {
	a.Received += b.Received
	a.Applied += b.Applied
	a.Dropped += b.Dropped
	a.Duplicates += b.Duplicates
	a.Gaps += b.Gaps
	a.ReplaysOK += b.ReplaysOK
	a.ReplaysFailed += b.ReplaysFailed
	a.ReplayRetries += b.ReplayRetries
	a.ConsumeErrors += b.ConsumeErrors
	a.Rejected += b.Rejected
	a.Restarts += b.Restarts
	a.Reconnects += b.Reconnects
	a.CatchUps += b.CatchUps
	a.CatchUpsFailed += b.CatchUpsFailed
	a.JoinChecks += b.JoinChecks
	a.JoinChecksFailed += b.JoinChecksFailed
	a.HolesTaken += b.HolesTaken
	a.ProtocolErrors += b.ProtocolErrors
	a.OpenFailures += b.OpenFailures
	a.Waiting, a.Stale, a.RecvBufferBytes = b.Waiting, b.Stale, b.RecvBufferBytes
	if b.LastEventUnixNano > a.LastEventUnixNano {
		a.LastEventUnixNano = b.LastEventUnixNano
	}
}

// leaderStream is the ingest handler of one leader's stream: it decides on its first
// batch whether the bindings of earlier streams stay, then passes everything on.
type leaderStream struct {
	m     *masterSubscription
	first bool // only on the subscriber's goroutine
}

func (s *leaderStream) HandleBatch(seq uint64, payload []byte) error {
	m := s.m
	m.contMu.Lock()
	defer m.contMu.Unlock()
	if s.first {
		s.first = false
		switch m.cont.firstBatch(seq) {
		case contKeep:
			m.continuation.Add(1)
			m.log.Info("new Mooncake leader's stream continues the previous one: bindings kept", "last_seq", m.cont.last, "first_seq", seq)
			m.hook("continued")
		case contRetract:
			m.retractions.Add(1)
			m.log.Warn("new Mooncake leader's stream does not continue the previous one: its bindings are retracted",
				"last_seq", m.cont.last, "first_seq", seq)
			m.inner.OnPublisherRestart(m.cont.last, seq)
			m.cont.has = false
			m.hook("retracted")
		}
	}
	err := m.inner.HandleBatch(seq, payload)
	if err == nil {
		m.cont.last, m.cont.has = seq, true
	}
	if m.opts.MasterHook != nil {
		m.hook(fmt.Sprintf("applied %d", seq))
	}
	return err
}

// OnStale retracts the stream's bindings. The source recovers with the next leader (or
// term): unlike a fixed endpoint, a new stream is coming. The retraction goes through
// OnPublisherRestart so that a bootstrap gate stays usable for that next stream.
func (s *leaderStream) OnStale(reason string) {
	m := s.m
	m.contMu.Lock()
	defer m.contMu.Unlock()
	m.log.Error("Mooncake leader stream stale: its bindings are retracted until the next leader or term", "reason", reason)
	m.inner.OnPublisherRestart(m.cont.last, 0)
	m.cont.has = false
	m.hook("stale")
}

// OnPublisherRestart: the leader's process restarted at the same address (ingest's
// sequence rules saw it); its earlier bindings go.
func (s *leaderStream) OnPublisherRestart(lastSeq, firstSeq uint64) {
	m := s.m
	m.contMu.Lock()
	defer m.contMu.Unlock()
	m.inner.OnPublisherRestart(lastSeq, firstSeq)
	m.cont.has = false
}
