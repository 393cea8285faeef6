// Package cororpc is the coro_rpc wire of the conductor's RPC service (yalantinglibs):
// request and response frames with their headers and framework errors (frame.go), the
// struct_pack body codec (structpack.go: width-switched lengths, type-code metainfo,
// bounds-checked reader), and the conductor's argument and result types with their
// encoders and decoders (types.go, codec.go). Byte layouts match upstream's goldens
// (golden_test.go); decoders bound every length by the bytes present, and the query hot
// path allocates nothing after warm-up.
package cororpc
