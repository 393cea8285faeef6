package source

import (
	"sort"
	"sync"
)

// GateSet holds the gate of every subscription, by source endpoint (the service layer
// gives each endpoint to one registration). While closing (a replica bootstrapping), new
// gates start closed. Its methods are safe for concurrent use.
type GateSet struct {
	mu      sync.Mutex
	closing bool
	gates   map[string]*gate
}

// NewGateSet returns an empty set; closing: new gates buffer until OpenAll.
func NewGateSet(closing bool) *GateSet {
	return &GateSet{closing: closing, gates: map[string]*gate{}}
}

func (s *GateSet) add(endpoint string, inner gatedHandler) *gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := newGate(inner, s.closing)
	s.gates[endpoint] = g
	return g
}

func (s *GateSet) remove(endpoint string, g *gate) {
	s.mu.Lock()
	if s.gates[endpoint] == g {
		delete(s.gates, endpoint)
	}
	s.mu.Unlock()
}

// Sequences returns, per source endpoint, the last sequence number applied (a snapshot
// cut at these numbers holds every batch up to them).
func (s *GateSet) Sequences() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.gates))
	for ep, g := range s.gates {
		if seq, ok := g.lastApplied(); ok {
			out[ep] = seq
		}
	}
	return out
}

// Behind returns, sorted, the endpoints in seqs whose gates hold batches that begin
// after the one following seqs[endpoint]: opening them at seqs would mark them stale
// (OpenAll), where a snapshot cut later, once its peer has caught up, would not.
func (s *GateSet) Behind(seqs map[string]uint64) []string {
	s.mu.Lock()
	var behind []string
	for ep, g := range s.gates {
		if seq, have := seqs[ep]; have && !g.reachesBack(seq) {
			behind = append(behind, ep)
		}
	}
	s.mu.Unlock()
	sort.Strings(behind)
	return behind
}

// OpenAll stops closing new gates and opens every gate: a source in seqs from the batch
// after its sequence number, the others with everything buffered. It returns the
// endpoints that went stale, with the reasons.
func (s *GateSet) OpenAll(seqs map[string]uint64) map[string]string {
	s.mu.Lock()
	s.closing = false
	type one struct {
		ep string
		g  *gate
	}
	all := make([]one, 0, len(s.gates))
	for ep, g := range s.gates {
		all = append(all, one{ep, g})
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].ep < all[j].ep })
	stale := map[string]string{}
	for _, o := range all {
		seq, have := seqs[o.ep]
		if st, reason := o.g.open(seq, have); st {
			stale[o.ep] = reason
		}
	}
	return stale
}
