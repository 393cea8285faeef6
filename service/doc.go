// Package service is the conductor's business layer, shared by every transport (HTTP,
// RPC) and every other source of registrations (config file, state file, cluster
// registry): what they decode comes here, is validated once, and reaches the engine and
// the event sources.
//
//   - registration.go: Config, ID, Registration and Resolve, the one
//     validation of a registration; entry.go: registrations written as JSON.
//   - service.go: Service (register, unregister, list, stats, stop) over an engine and a
//     SubscribeFunc (subscribe.go: the event sources of package ingest/source).
//   - query.go: the query entry points, with the query rules applied once.
//   - errors.go: Error and Code, which each transport maps to its own status.
//   - statefile.go: the single node's store of dynamic registrations (Store);
//     apply.go: Apply, through which a cluster registry's watch changes registrations.
//
// It knows no transport: the HTTP and RPC servers (server/httpserver, server/rpcserver)
// only decode, call a Service, and encode.
package service
