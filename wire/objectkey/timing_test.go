package objectkey_test

import (
	"testing"

	"github.com/conductor-go/conductor/wire/objectkey"
)

func BenchmarkParseObjectKeys(b *testing.B) {
	vk := []byte("Qwen3-8B@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + okVecVLLMHash)
	sk := []byte("tagA_Qwen-Qwen3-8B_" + okVecSGLangHash + "_0_k")
	ch := []byte("0x" + okVecVLLMHash)
	b.Run("vLLM-Ascend", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := objectkey.ParseVLLM(vk); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("SGLang", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, _, err := objectkey.ParseSGLang(sk); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("connector", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := objectkey.ParseConnectorBlockHash(ch); err != nil {
				b.Fatal(err)
			}
		}
	})
}
