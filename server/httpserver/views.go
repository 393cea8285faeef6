package httpserver

import (
	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/service"
)

// appendProfile writes the resolved profile map, root_digest included.
func appendProfile(b []byte, p *hashing.Profile) []byte {
	b = msgp.AppendMapHeader(b, 5)
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
	return b
}

// appendGlobalView writes the /global_view body.
func appendGlobalView(b []byte, views []engine.ContextView) []byte {
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "context_count")
	b = msgp.AppendUint64(b, uint64(len(views)))
	b = msgp.AppendString(b, "contexts")
	b = msgp.AppendArrayHeader(b, uint32(len(views)))
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

// appendServices writes the /services body with the PascalCase keys of the contract.
func appendServices(b []byte, svcs []service.Config) []byte {
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "count")
	b = msgp.AppendUint64(b, uint64(len(svcs)))
	b = msgp.AppendString(b, "services")
	b = msgp.AppendArrayHeader(b, uint32(len(svcs)))
	for i := range svcs {
		c := &svcs[i]
		b = msgp.AppendMapHeader(b, 11)
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
	}
	return b
}
