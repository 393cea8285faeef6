// Package source runs the event sources of the registered services: for each, a
// subscriber of package ingest feeding a translate.EventHandler that applies the events
// to the engine, so that an event walks ingest → engine without passing through the
// server's packages.
//
//   - subscribe.go: Subscribe, the entry point (one source per registration).
//   - gate.go, gateset.go: the gate between a subscriber and its handler, which records
//     the last sequence number applied (read into snapshots) and, while a cluster replica
//     bootstraps, buffers batches until the peer's snapshot is loaded.
//   - failover.go, masterview.go: Mooncake master failover; a registration whose endpoint
//     is an etcd:// master locator follows the elected master's event stream.
package source
