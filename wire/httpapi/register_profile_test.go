package httpapi_test

import (
	"errors"
	"math"
	"testing"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// The optional hash_profile fields of issue 25: decoded when sent, absent otherwise.
func TestDecodeRegisterProfileFields(t *testing.T) {
	prof := htProfileBase().plus("extra_keys", "tagged").plus("lora_path", "/adapters/a").plus("lookahead_tokens", 3)
	req, e := httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("hash_profile", prof)))
	if e != nil {
		t.Fatal(e)
	}
	hp := req.HashProfile
	if hp.ExtraKeys != "tagged" || hp.LoraPath != "/adapters/a" || hp.LookaheadTokens != 3 {
		t.Fatalf("decoded %+v", hp)
	}
	// Spec feeds the resolver, which accepts it and derives the profile it describes.
	p, err := hashing.ResolveSpec(hp.Spec())
	if err != nil || p.ExtraKeys != hashing.ExtraKeysTagged || p.LoraPath != "/adapters/a" || p.Lookahead != 3 || p.AlgorithmName() != "sha256_cbor" {
		t.Fatalf("resolved %+v, %v", p, err)
	}
	// Without them: zero values, which resolve exactly as before.
	req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase()))
	if e != nil || req.HashProfile.ExtraKeys != "" || req.HashProfile.LoraPath != "" || req.HashProfile.LookaheadTokens != 0 {
		t.Fatalf("defaults: %v %+v", e, req.HashProfile)
	}
	old, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if p, err = hashing.ResolveSpec(req.HashProfile.Spec()); err != nil || p != old {
		t.Fatalf("a body without the new fields resolves to %+v (%v), want %+v", p, err, old)
	}
	// Values are the resolver's: shape only here.
	req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("hash_profile",
		htProfileBase().plus("extra_keys", "sideways").plus("lookahead_tokens", uint64(math.MaxInt64)))))
	if e != nil || req.HashProfile.ExtraKeys != "sideways" {
		t.Fatalf("value checks leaked into decoding: %v", e)
	}
	var fe *hashing.FieldError
	if _, err := hashing.ResolveSpec(req.HashProfile.Spec()); !errors.As(err, &fe) || fe.Field != hashing.FieldExtraKeys {
		t.Fatalf("resolver: %v", err)
	}
}

func TestDecodeRegisterProfileFieldErrors(t *testing.T) {
	b := htRegisterBase()
	prof := htProfileBase()
	hp := func(m htMap) []byte { return htEnc(b.with("hash_profile", m)) }
	cases := []htCase{
		{"extra_keys int", hp(prof.plus("extra_keys", 1)), htWant{httpapi.ReasonInvalidType, "extra_keys", -1, "hash_profile.extra_keys must be a string"}},
		{"extra_keys nil", hp(prof.plus("extra_keys", nil)), htWant{httpapi.ReasonInvalidType, "extra_keys", -1, ""}},
		{"extra_keys empty", hp(prof.plus("extra_keys", "")), htWant{httpapi.ReasonInvalidValue, "extra_keys", -1, "hash_profile.extra_keys must not be empty"}},
		{"lora_path int", hp(prof.plus("lora_path", 7)), htWant{httpapi.ReasonInvalidType, "lora_path", -1, "hash_profile.lora_path must be a string"}},
		{"lora_path empty", hp(prof.plus("lora_path", "")), htWant{httpapi.ReasonInvalidValue, "lora_path", -1, "hash_profile.lora_path must not be empty"}},
		{"lookahead string", hp(prof.plus("lookahead_tokens", "3")), htWant{httpapi.ReasonInvalidType, "lookahead_tokens", -1, "hash_profile.lookahead_tokens must be an integer"}},
		{"lookahead float", hp(prof.plus("lookahead_tokens", 3.0)), htWant{httpapi.ReasonInvalidType, "lookahead_tokens", -1, ""}},
		{"lookahead nil", hp(prof.plus("lookahead_tokens", nil)), htWant{httpapi.ReasonInvalidType, "lookahead_tokens", -1, ""}},
		{"lookahead negative", hp(prof.plus("lookahead_tokens", -1)), htWant{httpapi.ReasonOutOfRange, "lookahead_tokens", -1, "hash_profile.lookahead_tokens must be a non-negative integer"}},
		{"lookahead above int64", hp(prof.plus("lookahead_tokens", htMaxUint64)), htWant{httpapi.ReasonOutOfRange, "lookahead_tokens", -1, ""}},
		// Order: the four upstream fields first, then extra_keys, lora_path, lookahead.
		{"projection before extra_keys", hp(prof.without("index_projection").plus("extra_keys", 1)), htWant{httpapi.ReasonMissing, "index_projection", -1, ""}},
		{"extra_keys before lora_path", hp(prof.plus("lora_path", 1).plus("extra_keys", 1)), htWant{httpapi.ReasonInvalidType, "extra_keys", -1, ""}},
		{"lora_path before lookahead", hp(prof.plus("lookahead_tokens", "x").plus("lora_path", 1)), htWant{httpapi.ReasonInvalidType, "lora_path", -1, ""}},
		{"still unknown", hp(prof.plus("lookahead", 1)), htWant{httpapi.ReasonUnknownField, "lookahead", -1, ""}},
	}
	for _, c := range cases {
		_, e := httpapi.DecodeRegisterRequest(c.body)
		htCheck(t, c.name, e, c.want)
	}
}

// index_media (an optional array of strings, names checked by the server) and the
// optional lora_name of /unregister (one adapter of a multi-LoRA registration).
func TestDecodeIndexMediaAndUnregisterLora(t *testing.T) {
	req, e := httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().plus("index_media", []any{"GPU", "cpu"})))
	if e != nil || len(req.IndexMedia) != 2 || req.IndexMedia[0] != "GPU" || req.IndexMedia[1] != "cpu" {
		t.Fatalf("index_media: %v %q", e, req.IndexMedia)
	}
	if req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase())); e != nil || req.IndexMedia != nil {
		t.Fatalf("absent index_media: %v %q", e, req.IndexMedia)
	}
	if req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().plus("index_media", []any{}))); e != nil || req.IndexMedia == nil {
		t.Fatalf("an empty list is sent to the server as one (which refuses it): %v %v", e, req.IndexMedia)
	}
	many := make([]any, 17)
	for i := range many {
		many[i] = "GPU"
	}
	for _, c := range []htCase{
		{"index_media string", htEnc(htRegisterBase().plus("index_media", "GPU")), htWant{httpapi.ReasonInvalidType, "index_media", -1, "index_media must be an array of strings"}},
		{"index_media nil", htEnc(htRegisterBase().plus("index_media", nil)), htWant{httpapi.ReasonInvalidType, "index_media", -1, ""}},
		{"index_media element", htEnc(htRegisterBase().plus("index_media", []any{"GPU", 3})), htWant{httpapi.ReasonInvalidType, "index_media", 1, "index_media elements must be strings"}},
		{"index_media too long", htEnc(htRegisterBase().plus("index_media", many)), htWant{httpapi.ReasonOutOfRange, "index_media", -1, ""}},
	} {
		_, e := httpapi.DecodeRegisterRequest(c.body)
		htCheck(t, c.name, e, c.want)
	}

	u, e := httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase()))
	if e != nil || u.HasLoraName {
		t.Fatalf("unregister without lora_name: %v %+v", e, u)
	}
	u, e = httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase().plus("lora_name", "")))
	if e != nil || !u.HasLoraName || u.LoraName != "" {
		t.Fatalf("unregister of the base adapter: %v %+v", e, u)
	}
	u, e = httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase().plus("lora_name", "adapter-a")))
	if e != nil || !u.HasLoraName || u.LoraName != "adapter-a" {
		t.Fatalf("unregister of an adapter: %v %+v", e, u)
	}
	_, e = httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase().plus("lora_name", 1)))
	htCheck(t, "unregister lora_name int", e, htWant{httpapi.ReasonInvalidType, "lora_name", -1, "lora_name must be a string"})
}
