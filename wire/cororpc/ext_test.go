package cororpc

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// The bodies of this conductor's methods round-trip, with every length width, and are
// strict as the upstream ones: another type's body, truncation, trailing bytes.
func TestExtBodiesRoundTrip(t *testing.T) {
	sc := ServiceConfig{Endpoint: "tcp://h:1", PublisherKind: publisher.VLLM, ModelName: "m", LoraName: "sql",
		TenantID: "default", InstanceID: "e", BlockSize: 16, DPRank: 2,
		HashProfile: HashProfile{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be"}}
	for _, long := range []int{0, 300, 70000} {
		sc.LoraName = "sql" + strings.Repeat("x", long)
		args := RegisterExArgs{Config: sc, Ext: ProfileExt{ExtraKeys: "tagged", LoraPath: "/adapters/sql", LookaheadTokens: 3},
			IndexMedia: []string{"GPU", "CPU"}, HasIndexMedia: true}
		body := AppendRegisterExArgs(nil, &args)
		var got RegisterExArgs
		if err := DecodeRegisterExArgs(body, &got); err != nil || !reflect.DeepEqual(got, args) {
			t.Fatalf("long %d: %+v %v", long, got, err)
		}
		args.IndexMedia, args.HasIndexMedia = nil, false
		if err := DecodeRegisterExArgs(AppendRegisterExArgs(nil, &args), &got); err != nil || !reflect.DeepEqual(got, args) {
			t.Fatalf("without index_media: %+v %v", got, err)
		}
		for n := range len(body) {
			if err := DecodeRegisterExArgs(body[:n], &got); err == nil {
				t.Fatalf("truncated to %d bytes: accepted", n)
			}
		}
		if err := DecodeRegisterExArgs(append(body, 0), &got); !errors.Is(err, ErrStructPackTrailing) {
			t.Fatalf("trailing: %v", err)
		}
		// Upstream's Register body is another type.
		if err := DecodeRegisterExArgs(AppendServiceConfig(nil, &sc), &got); !errors.Is(err, ErrStructPackTypeCode) {
			t.Fatalf("ServiceConfig as RegisterExArgs: %v", err)
		}

		ub := AppendUnregisterAdapterArgs(nil, "e", "default", 2, sc.LoraName)
		id, tenant, rank, lora, err := DecodeUnregisterAdapterArgs(ub)
		if err != nil || id != "e" || tenant != "default" || rank != 2 || lora != sc.LoraName {
			t.Fatalf("unregister adapter: %q %q %d %q %v", id, tenant, rank, lora, err)
		}
		if _, _, _, _, err := DecodeUnregisterAdapterArgs(AppendUnregisterArgs(nil, "e", "default", 2)); !errors.Is(err, ErrStructPackTypeCode) {
			t.Fatalf("Unregister args as UnregisterAdapter: %v", err)
		}

		list := []ServiceDetail{
			{Config: sc, Ext: args.Ext, IndexMedia: []string{"GPU", "CPU", "STORAGE"}, HashCheck: "mismatch (engine hashes match lookahead_tokens 1)"},
			{Config: ServiceConfig{PublisherKind: publisher.Mooncake, InstanceID: "pool"}, IndexMedia: []string{}, HashCheck: "unverified"},
		}
		db := AppendServiceDetails(nil, list)
		back, err := DecodeServiceDetails(db)
		if err != nil || !reflect.DeepEqual(back, list) {
			t.Fatalf("details: %+v %v", back, err)
		}
		if _, err := DecodeServiceDetails(db[:len(db)-2]); err == nil {
			t.Fatal("truncated details accepted")
		}
		if empty, err := DecodeServiceDetails(AppendServiceDetails(nil, nil)); err != nil || len(empty) != 0 {
			t.Fatalf("empty list: %v %v", empty, err)
		}
	}
}
