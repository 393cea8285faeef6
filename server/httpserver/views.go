package httpserver

import (
	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/service"
)

// appendProfile writes the resolved profile map, root_digest included; the fields of
// issue 25 only where they differ from their defaults (extra_keys "tagged", a
// lora_path, lookahead_tokens > 0), so a profile without them reads as before.
func appendProfile(b []byte, p *hashing.Profile) []byte {
	n := uint32(5)
	tagged := p.ExtraKeys != hashing.ExtraKeysUntagged
	for _, set := range []bool{tagged, p.LoraPath != "", p.Lookahead != 0} {
		if set {
			n++
		}
	}
	b = msgp.AppendMapHeader(b, n)
	b = msgp.AppendString(b, "strategy")
	b = msgp.AppendString(b, p.StrategyName())
	b = msgp.AppendString(b, "algorithm")
	b = msgp.AppendString(b, p.AlgorithmName())
	b = msgp.AppendString(b, "python_hash_seed")
	b = msgp.AppendString(b, p.Seed)
	b = msgp.AppendString(b, "root_digest")
	b = msgp.AppendString(b, p.RootHex())
	b = msgp.AppendString(b, "index_projection")
	b = msgp.AppendString(b, p.ProjectionName())
	if tagged {
		b = msgp.AppendString(b, "extra_keys")
		b = msgp.AppendString(b, p.ExtraKeysName())
	}
	if p.LoraPath != "" {
		b = msgp.AppendString(b, "lora_path")
		b = msgp.AppendString(b, p.LoraPath)
	}
	if p.Lookahead != 0 {
		b = msgp.AppendString(b, "lookahead_tokens")
		b = msgp.AppendInt(b, p.Lookahead)
	}
	return b
}

// appendListHead starts a listing body: a map of countKey, the count n, and listKey, whose
// array of n entries the caller appends.
func appendListHead(b []byte, countKey, listKey string, n int) []byte {
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, countKey)
	b = msgp.AppendUint64(b, uint64(n))
	b = msgp.AppendString(b, listKey)
	return msgp.AppendArrayHeader(b, uint32(n))
}

// appendGlobalView writes the /global_view body.
func appendGlobalView(b []byte, views []engine.ContextView) []byte {
	b = appendListHead(b, "context_count", "contexts", len(views))
	for i := range views {
		v := &views[i]
		b = msgp.AppendMapHeader(b, 7)
		b = msgp.AppendString(b, "model_name")
		b = msgp.AppendString(b, v.Key.ModelName)
		b = msgp.AppendString(b, "lora_name")
		b = msgp.AppendString(b, v.Key.LoraName)
		b = msgp.AppendString(b, "block_size")
		b = msgp.AppendInt64(b, v.Key.BlockSize)
		b = msgp.AppendString(b, "tenant_id")
		b = msgp.AppendString(b, v.Key.TenantID)
		b = msgp.AppendString(b, "prefix_count")
		b = msgp.AppendUint64(b, v.PrefixCount)
		b = msgp.AppendString(b, "hash_profile")
		b = appendProfile(b, &v.Profile)
		b = msgp.AppendString(b, "instances")
		b = msgp.AppendMapHeader(b, uint32(len(v.Instances)))
		for _, inst := range v.Instances {
			b = msgp.AppendString(b, inst.InstanceID)
			b = msgp.AppendArrayHeader(b, uint32(len(inst.Ranks)))
			for _, r := range inst.Ranks {
				b = msgp.AppendInt(b, r)
			}
		}
	}
	return b
}

// appendServices writes the /services body with the PascalCase keys of the contract,
// one entry per adapter of a multi-LoRA registration, and two keys of this conductor:
// IndexMedia (the event media indexed) and HashCheck (the profile self-check of the
// entry's context).
func appendServices(b []byte, views []service.View) []byte {
	b = appendListHead(b, "count", "services", len(views))
	for i := range views {
		c := &views[i].Config
		b = msgp.AppendMapHeader(b, 13)
		b = msgp.AppendString(b, "Endpoint")
		b = msgp.AppendString(b, c.Endpoint)
		b = msgp.AppendString(b, "ReplayEndpoint")
		b = msgp.AppendString(b, c.ReplayEndpoint)
		b = msgp.AppendString(b, "Type")
		b = msgp.AppendString(b, c.Kind.String())
		b = msgp.AppendString(b, "ModelName")
		b = msgp.AppendString(b, c.ModelName)
		b = msgp.AppendString(b, "LoraName")
		b = msgp.AppendString(b, c.LoraName)
		b = msgp.AppendString(b, "TenantID")
		b = msgp.AppendString(b, c.TenantID)
		b = msgp.AppendString(b, "InstanceID")
		b = msgp.AppendString(b, c.InstanceID)
		b = msgp.AppendString(b, "BlockSize")
		b = msgp.AppendInt64(b, c.BlockSize)
		b = msgp.AppendString(b, "DPRank")
		b = msgp.AppendInt(b, c.DPRank)
		b = msgp.AppendString(b, "CacheGroup")
		if c.CacheGroup == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendInt64(b, *c.CacheGroup)
		}
		b = msgp.AppendString(b, "HashProfile")
		b = appendProfile(b, &c.Profile)
		b = msgp.AppendString(b, "IndexMedia")
		media := c.Media.Names(c.Kind)
		b = msgp.AppendArrayHeader(b, uint32(len(media)))
		for _, m := range media {
			b = msgp.AppendString(b, m)
		}
		b = msgp.AppendString(b, "HashCheck")
		b = msgp.AppendString(b, views[i].HashCheck)
	}
	return b
}
