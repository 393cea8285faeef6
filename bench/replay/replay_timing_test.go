package replay

import (
	"context"
	"testing"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/wire/publisher"
)

// BenchmarkOfflinePolicies measures replaying a 200-request synthetic trace per policy
// on an in-memory 8-instance fleet (no conductor): the router loop's own cost.
func BenchmarkOfflinePolicies(b *testing.B) {
	w, err := NewWorkload(SyntheticTrace(200, 3), WorkloadConfig{Hash: sim.VLLMHash("sha256_cbor", "0"), BlockSize: 16, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []Policy{PolicyOracle, PolicyRandom, PolicyRoundRobin} {
		b.Run(string(p), func(b *testing.B) {
			cfg := Config{Workload: w, LoadSlack: 4, Seed: 1, Policies: []Policy{p},
				Fleet: sim.FleetConfig{Instances: 8, DPRanks: 1, Kind: publisher.VLLM, Hash: sim.VLLMHash("sha256_cbor", "0"),
					BlockSize: 16, Cache: sim.CacheConfig{Device: 4096}}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Run(context.Background(), cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*w.Len()), "ns/request")
		})
	}
}

// BenchmarkWorkload measures hashing a 200-request trace into block keys.
func BenchmarkWorkload(b *testing.B) {
	reqs := SyntheticTrace(200, 3)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewWorkload(reqs, WorkloadConfig{Hash: sim.VLLMHash("sha256_cbor", "0"), BlockSize: 16, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
