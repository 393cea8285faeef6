// Package wire holds the project's codecs: the msgpack HTTP request and response
// bodies, the ZMQ KV-event batch decoders (vLLM, SGLang, Mooncake Store master), the
// Mooncake object-key parsers and the coro_rpc/struct_pack frames. Everything here is
// stateless: a decoder may own reusable buffers, but nothing survives from one message
// to the next and nothing is shared between callers.
package wire
