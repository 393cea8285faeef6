package service

import (
	"log/slog"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/translate"
)

// SourceSpec is what a source subscription needs of a registration.
func SourceSpec(cfg *Config) source.Spec {
	spec := source.Spec{
		Source: translate.Source{Name: cfg.Key(), Kind: cfg.Kind, Endpoint: cfg.Endpoint,
			Context: cfg.Context(), Slot: cfg.Slot(), Profile: cfg.Profile, Media: cfg.Media},
		ReplayEndpoint: cfg.ReplayEndpoint,
	}
	for _, a := range cfg.Adapters {
		ac := cfg.ForAdapter(a)
		spec.Adapters = append(spec.Adapters, translate.AdapterContext{Key: ac.Context(), Profile: ac.Profile})
	}
	return spec
}

// ZMQSubscriber returns the SubscribeFunc of package ingest/source: a ZMQ subscription
// per registration (or, for a Mooncake master locator, one that follows the elected
// master), all sharing opts.
func ZMQSubscriber(opts source.Options) SubscribeFunc {
	return func(cfg *Config, eng *engine.Engine, log *slog.Logger) (Subscription, error) {
		return source.Subscribe(SourceSpec(cfg), eng, log, opts)
	}
}
