package kvevent

import "github.com/conductor-go/conductor/wire/internal/msgpack"

// TextExtraKeys reads a vLLM BlockStored's extra_keys (Event.ExtraKeys) for what a hash
// check can reproduce: vLLM publishes them untagged, per block (lora_name if the request
// has a LoRA adapter, then multimodal pairs, then the cache salt on the request's block
// 0, then prompt-embedding digests). It returns the salt of the event's first block, and
// ok false when any block carries a key other than the event's lora_name and that salt
// (multimodal or prompt embeddings, whose inputs events do not carry), or when the
// entries do not have that shape. raw nil (no extra keys) is ok with no salt. The salt
// aliases raw.
func TextExtraKeys(raw, loraName []byte) (salt []byte, hasSalt, ok bool) {
	if raw == nil {
		return nil, false, true
	}
	r := msgpack.Reader{Buf: raw}
	n, err := r.ReadArrayHeader()
	if err != nil {
		return nil, false, false
	}
	for i := 0; i < n; i++ {
		if r.ReadNil() {
			if len(loraName) > 0 {
				return nil, false, false // a LoRA request's blocks all carry its name
			}
			continue
		}
		m, err := r.ReadArrayHeader()
		if err != nil {
			return nil, false, false
		}
		j := 0
		if len(loraName) > 0 {
			s, err := r.ReadStr()
			if err != nil || string(s) != string(loraName) {
				return nil, false, false
			}
			j = 1
		}
		switch {
		case m == j:
		case m == j+1 && i == 0:
			s, err := r.ReadStr()
			if err != nil {
				return nil, false, false
			}
			salt, hasSalt = s, true
		default:
			return nil, false, false
		}
	}
	return salt, hasSalt, r.Pos == len(raw)
}
