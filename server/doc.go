// Package server assembles a conductor process: Start builds the engine, the service
// layer (package service) with its event sources (package ingest/source), the HTTP and
// RPC transports (server/httpserver, server/rpcserver) and the metrics, binds the
// listeners and registers the static services; Stop takes them down in order.
//
//   - app.go: AppConfig, App, Start and Stop; the state file of a single node.
//   - config.go, setting.go, settings.go: the configuration file, read through one
//     table of settings (every key with its type, default, bounds and documentation);
//     configdoc.go renders docs/configuration.md from it (`go generate ./server`).
//   - cluster.go, bootstrap.go, snapshot.go: a cluster replica's glue: the etcd
//     registry as the service layer's store and the source of its registrations, the
//     bootstrap from a peer's snapshot, and the snapshot route.
//   - health.go, metrics.go: /healthz, /readyz and the Prometheus metrics.
//
// The transports share what bounds clients (server/internal/limits) and the access log
// (internal/accesslog); they hold no business logic, which is the service layer's.
package server
