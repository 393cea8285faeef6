// Package snapshot copies a conductor's index to a peer: format.go is the stream (a
// versioned, checksummed sequence of context headers and chunks of engine records, each
// context cut at the sequence numbers of the sources it holds), snapshot.go writes one
// from an engine (Write) and applies one to an engine (Load), skipping what this node's
// registrations do not own. A snapshot is data from a peer, not from an engine: it is
// bounded while read, verified whole before anything is applied, and applied through the
// engine's normal write path.
package snapshot
