package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/wire/publisher"
)

// zmqSubscription pairs a ZMQ subscriber with the handler that applies its events, and
// the limiter of their log lines.
type zmqSubscription struct {
	sub     *ingest.Subscriber
	handler *translate.EventHandler
	logs    *lograte.Limiter
	// gate and its set, when the subscription is gated (see gate.go).
	gate  *gate
	gates *gateSet
	id    ServiceID
}

// Stop stops the subscriber, then reports the log lines its limiter held back.
func (z *zmqSubscription) Stop() {
	z.sub.Stop()
	if z.gates != nil {
		z.gates.remove(z.id, z.gate)
	}
	z.logs.Flush(context.Background())
}

func (z *zmqSubscription) Stats() ingest.SubscriberStats { return z.sub.Stats() }

// HandlerStats exposes the event handler's counters (for metrics).
func (z *zmqSubscription) HandlerStats() translate.HandlerStats { return z.handler.Stats() }

// SubscribeZMQ is the default SubscribeFunc: a ZMQ SUB subscriber (with DEALER replay for
// vLLM and SGLang when a replay endpoint is registered) feeding an translate.EventHandler,
// with a private ZMQ context and default limits. A process uses ZMQSubscriber instead.
func SubscribeZMQ(cfg *ServiceConfig, eng *engine.Engine, log *slog.Logger) (Subscription, error) {
	return subscribeZMQ(cfg, eng, log, ZMQOptions{})
}

// ZMQOptions are the ingest settings every subscription of a process shares.
type ZMQOptions struct {
	// Transport is the shared ZMQ context; nil gives each subscriber its own.
	Transport *zmqtransport.Transport
	// MaxMessageSize bounds one ZMQ message (0: ingest.DefaultMaxMessageSize, -1: none).
	MaxMessageSize int64
	// JoinCheckDelay is ingest.SubscriberConfig.JoinCheckDelay (0: the default, 1 s;
	// negative: no join check).
	JoinCheckDelay time.Duration
	// LogBurst and LogInterval rate-limit each subscription's log lines per kind
	// (0: lograte.DefaultBurst, lograte.DefaultInterval; LogBurst -1: no limit).
	LogBurst    int
	LogInterval time.Duration
	// gates, when set, puts a gate between each subscriber and its handler.
	gates *gateSet
	// masterHook, in tests, hears the steps of master-locator subscriptions (failover.go).
	masterHook func(id ServiceID, event string)
}

// ZMQSubscriber returns a SubscribeFunc whose subscribers share opts.
func ZMQSubscriber(opts ZMQOptions) SubscribeFunc {
	return func(cfg *ServiceConfig, eng *engine.Engine, log *slog.Logger) (Subscription, error) {
		return subscribeZMQ(cfg, eng, log, opts)
	}
}

func subscribeZMQ(cfg *ServiceConfig, eng *engine.Engine, log *slog.Logger, opts ZMQOptions) (Subscription, error) {
	if cluster.IsMasterLocator(cfg.Endpoint) {
		return subscribeMaster(cfg, eng, log, opts) // follows the elected Mooncake master
	}
	key := cfg.Key()
	logs := lograte.New(log.Handler(), lograte.Config{Burst: opts.LogBurst, Interval: opts.LogInterval})
	log = logs.Logger()
	replay := cfg.ReplayEndpoint
	if cfg.Kind == publisher.Mooncake && replay != "" {
		log.Warn("replay_endpoint ignored: the Mooncake master has no replay", "service", key, "replay_endpoint", replay)
		replay = ""
	}
	h := translate.NewEventHandler(translate.Source{
		Name: key, Kind: cfg.Kind, Endpoint: cfg.Endpoint,
		Context: cfg.Context(), Slot: cfg.Slot(), Profile: cfg.Profile,
	}, eng, log)
	var handler ingest.Handler = h
	var g *gate
	if opts.gates != nil {
		g = opts.gates.add(cfg, h)
		handler = g
	}
	sub, err := ingest.NewSubscriber(ingest.SubscriberConfig{
		Name: key, Endpoint: cfg.Endpoint, ReplayEndpoint: replay, Logger: log,
		// Ask the publisher for what it still buffers as soon as we subscribe (after a
		// restart of the conductor, or a new registration): a warm index at once. Best
		// effort: an unanswered catch-up never marks the source stale.
		CatchUpOnStart: replay != "",
		Transport:      opts.Transport, MaxMessageSize: opts.MaxMessageSize,
		JoinCheckDelay: opts.JoinCheckDelay,
	}, handler)
	if err != nil {
		if g != nil {
			opts.gates.remove(cfg.ID(), g)
		}
		return nil, fmt.Errorf("failed to start ZMQ client: %w", err)
	}
	if err := sub.Start(); err != nil {
		if g != nil {
			opts.gates.remove(cfg.ID(), g)
		}
		return nil, err // already "failed to start ZMQ client: ..."
	}
	return &zmqSubscription{sub: sub, handler: h, logs: logs, gate: g, gates: opts.gates, id: cfg.ID()}, nil
}
