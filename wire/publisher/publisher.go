// Package publisher defines the one enum of KV-event publisher kinds (vLLM, SGLang, the
// Mooncake Store master) that the event decoder (wire/kvevent), the RPC codec
// (wire/cororpc), the server's registrations and the bench simulator share. The numeric
// values are upstream's RPC wire enum (PublisherKind: vLLM 0, Mooncake 1, SGLang 2), so
// a Kind goes on the coro_rpc wire as it is.
package publisher

import "strconv"

// Kind is the kind of KV-event stream a service was registered as. The registration,
// never the topic or the payload, picks the decoder (reference notes §5.1). It is an
// int32 like upstream's enum, so that an unknown value read off the RPC wire survives to
// the service layer (see Valid) instead of failing the decode.
type Kind int32

// The publisher kinds, numbered as upstream.
const (
	// VLLM is a vLLM engine: float ts, tagged-map events with uint or bin hashes.
	VLLM Kind = 0
	// Mooncake is the Mooncake Store master: integer ms ts, `event_type` maps.
	Mooncake Kind = 1
	// SGLang is an SGLang engine: float ts, tagged-map events with int64 hashes.
	SGLang Kind = 2
)

// Valid reports whether k is one of the three known kinds.
func (k Kind) Valid() bool { return k >= VLLM && k <= SGLang }

// IsEngine reports whether the kind publishes engine-local tiers for a query instance
// (vLLM, SGLang), as opposed to shared Mooncake Store objects.
func (k Kind) IsEngine() bool { return k == VLLM || k == SGLang }

// String returns the contract's name of the kind, as the registration `type` spells it.
func (k Kind) String() string {
	switch k {
	case VLLM:
		return "vLLM"
	case Mooncake:
		return "Mooncake"
	case SGLang:
		return "SGLang"
	}
	return "PublisherKind(" + strconv.Itoa(int(k)) + ")"
}

// Parse maps the case-sensitive type names of the contract ("vLLM", "Mooncake",
// "SGLang") to a kind.
func Parse(s string) (Kind, bool) {
	switch s {
	case "vLLM":
		return VLLM, true
	case "Mooncake":
		return Mooncake, true
	case "SGLang":
		return SGLang, true
	}
	return 0, false
}
