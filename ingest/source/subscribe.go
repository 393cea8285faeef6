package source

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Spec is what a subscription needs of a validated registration: the source whose events
// it applies (translate.Source: service key, kind, endpoint, context, slot, profile) and
// the replay endpoint.
type Spec struct {
	translate.Source
	ReplayEndpoint string
}

// Subscription is a running source: its subscriber (or, for a master locator, the
// subscriber of the current leader) and the handler that applies its events.
type Subscription interface {
	// Stop stops consuming; the batch in flight is applied first.
	Stop()
	// Stats returns the subscriber's counters.
	Stats() ingest.SubscriberStats
	// HandlerStats returns the event handler's counters.
	HandlerStats() translate.HandlerStats
}

// Options are the ingest settings every subscription of a process shares.
type Options struct {
	// Transport is the shared ZMQ context; nil gives each subscriber its own.
	Transport *zmqtransport.Transport
	// MaxMessageSize bounds one ZMQ message (0: ingest.DefaultMaxMessageSize, -1: none).
	MaxMessageSize int64
	// BufferBytes is each subscriber's byte budget for messages queued in libzmq
	// (ingest.SubscriberConfig.BufferBytes; 0: ingest.DefaultBufferBytes).
	BufferBytes int64
	// JoinCheckDelay is ingest.SubscriberConfig.JoinCheckDelay (0: the default, 1 s;
	// negative: no join check).
	JoinCheckDelay time.Duration
	// LogBurst and LogInterval rate-limit each subscription's log lines per kind
	// (0: lograte.DefaultBurst, lograte.DefaultInterval; LogBurst -1: no limit).
	LogBurst    int
	LogInterval time.Duration
	// Gates, when set, puts a gate between each subscriber and its handler (gate.go).
	Gates *GateSet
	// MasterHook, in tests, hears the steps of master-locator subscriptions (failover.go),
	// with the service key of the registration.
	MasterHook func(service, event string)
	// HashCheckOff turns the profile self-check of engine sources off (the hash_check
	// key); HashCheckLogInterval spaces its mismatch warnings (0: the default).
	HashCheckOff         bool
	HashCheckLogInterval time.Duration
}

// zmqSubscription pairs a ZMQ subscriber with the handler that applies its events, and
// the limiter of their log lines.
type zmqSubscription struct {
	sub     *ingest.Subscriber
	handler *translate.EventHandler
	logs    *lograte.Limiter
	// gate and its set, when the subscription is gated (see gate.go).
	gate     *gate
	gates    *GateSet
	endpoint string
}

// Stop stops the subscriber, then reports the log lines its limiter held back.
func (z *zmqSubscription) Stop() {
	z.sub.Stop()
	if z.gates != nil {
		z.gates.remove(z.endpoint, z.gate)
	}
	z.logs.Flush(context.Background())
}

// Stats returns the subscriber's counters; the source is stale also when its gate made
// it stale at the end of a bootstrap (the subscriber itself saw no gap).
func (z *zmqSubscription) Stats() ingest.SubscriberStats {
	st := z.sub.Stats()
	st.Stale = st.Stale || z.gate.isStale()
	return st
}

// SubscriberConfig is the subscriber's configuration with its defaults filled in.
func (z *zmqSubscription) SubscriberConfig() ingest.SubscriberConfig { return z.sub.Config() }

// HandlerStats exposes the event handler's counters (for metrics).
func (z *zmqSubscription) HandlerStats() translate.HandlerStats { return z.handler.Stats() }

// AddContext routes the events of another adapter of the engine to its context
// (translate.EventHandler.AddContext).
func (z *zmqSubscription) AddContext(key engine.ContextKey, p hashing.Profile) error {
	return z.handler.AddContext(key, p)
}

// RemoveContext stops routing the events of an adapter (translate.EventHandler.RemoveContext).
func (z *zmqSubscription) RemoveContext(loraName string) bool {
	return z.handler.RemoveContext(loraName)
}

// CheckStats returns the profile self-check of an adapter's context.
func (z *zmqSubscription) CheckStats(loraName string) (hashing.CheckStats, bool) {
	return z.handler.CheckStats(loraName)
}

// Subscribe starts consuming a source: a ZMQ SUB subscriber (with DEALER replay for vLLM
// and SGLang when a replay endpoint is registered) feeding a translate.EventHandler, or,
// for a Mooncake master locator, the subscription that follows the elected master.
func Subscribe(spec Spec, eng *engine.Engine, log *slog.Logger, opts Options) (Subscription, error) {
	if IsMasterLocator(spec.Endpoint) {
		return subscribeMaster(spec, eng, log, opts) // follows the elected Mooncake master
	}
	key := spec.Name
	logs := lograte.New(log.Handler(), lograte.Config{Burst: opts.LogBurst, Interval: opts.LogInterval})
	log = logs.Logger()
	replay := spec.ReplayEndpoint
	if spec.Kind == publisher.Mooncake && replay != "" {
		log.Warn("replay_endpoint ignored: the Mooncake master has no replay", "service", key, "replay_endpoint", replay)
		replay = ""
	}
	src := spec.Source
	src.CheckOff = src.CheckOff || opts.HashCheckOff
	if src.CheckLogInterval == 0 {
		src.CheckLogInterval = opts.HashCheckLogInterval
	}
	h := translate.NewEventHandler(src, eng, log)
	var handler ingest.Handler = h
	var g *gate
	if opts.Gates != nil {
		g = opts.Gates.add(spec.Endpoint, h)
		handler = g
	}
	sub, err := ingest.NewSubscriber(ingest.SubscriberConfig{
		Name: key, Endpoint: spec.Endpoint, ReplayEndpoint: replay, Logger: log,
		// Ask the publisher for what it still buffers as soon as we subscribe (after a
		// restart of the conductor, or a new registration): a warm index at once. Best
		// effort: an unanswered catch-up never marks the source stale.
		CatchUpOnStart: replay != "",
		Transport:      opts.Transport, MaxMessageSize: opts.MaxMessageSize, BufferBytes: opts.BufferBytes,
		JoinCheckDelay: opts.JoinCheckDelay,
	}, handler)
	if err == nil {
		err = sub.Start() // its errors already say "failed to start ZMQ client: ..."
	} else {
		err = fmt.Errorf("failed to start ZMQ client: %w", err)
	}
	if err != nil {
		if g != nil {
			opts.Gates.remove(spec.Endpoint, g)
		}
		return nil, err
	}
	return &zmqSubscription{sub: sub, handler: h, logs: logs, gate: g, gates: opts.Gates, endpoint: spec.Endpoint}, nil
}
