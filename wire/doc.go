// Package wire is the root of the project's codecs, one package per wire format; it
// holds no code of its own:
//
//   - wire/kvevent: the ZMQ KV-event batches of vLLM, SGLang and the Mooncake Store master.
//   - wire/httpapi: the msgpack bodies of the HTTP API (requests, responses, errors).
//   - wire/cororpc: coro_rpc frames, the struct_pack codec and the RPC argument/result types.
//   - wire/objectkey: Mooncake Store object keys and connector block hashes.
//   - wire/publisher: the publisher kind enum (vLLM, Mooncake, SGLang) all of them share.
//   - wire/internal/msgpack: the one msgpack reader (skip, str/bin, ints) under kvevent
//     and httpapi.
//
// Everything under wire/ is stateless: a decoder may own reusable buffers, but nothing
// survives from one message to the next and nothing is shared between callers. None of
// it needs cgo.
package wire
